// The coalescing free list under pool_resource, on plain addresses (no memory is touched).

#include <devmr/detail/pool/free_list.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

using devmr::detail::free_block;
using devmr::detail::free_list;
using devmr::detail::pool_granule;

namespace {
constexpr std::uintptr_t arena_a = std::uintptr_t{1} << 30;
constexpr std::uintptr_t arena_b = arena_a + (std::uintptr_t{64} << 20);  // right after arena a
constexpr std::size_t mib = std::size_t{1} << 20;
}  // namespace

TEST_CASE("free_list splits a range and takes the front", "[pool][free_list]") {
  free_list list;
  list.insert({arena_a, 4 * mib, arena_a});
  auto const block = list.take(1024, 256);
  REQUIRE(block);
  CHECK(block->address == arena_a);
  CHECK(block->size == 1024);
  CHECK(block->arena == arena_a);
  CHECK(list.ranges() == 1);
  CHECK(list.free_bytes() == 4 * mib - 1024);
  CHECK(list.largest() == 4 * mib - 1024);
  auto const second = list.take(pool_granule, 256);
  REQUIRE(second);
  CHECK(second->address == arena_a + 1024);
}

TEST_CASE("free_list merges with both neighbours, only within an arena", "[pool][free_list]") {
  free_list list;
  list.insert({arena_a, 256, arena_a});
  list.insert({arena_a + 512, 256, arena_a});
  CHECK(list.ranges() == 2);
  list.insert({arena_a + 256, 256, arena_a});  // fills the gap: all three become one
  CHECK(list.ranges() == 1);
  CHECK(list.largest() == 768);
  CHECK(list.free_bytes() == 768);

  // Right neighbour only, then left neighbour only.
  list.insert({arena_a + 1024, 256, arena_a});
  list.insert({arena_a + 768, 256, arena_a});
  CHECK(list.ranges() == 1);
  CHECK(list.largest() == 1280);

  // Two arenas that touch in address space never merge: each must go back to the driver whole.
  free_list two;
  two.insert({arena_b - 256, 256, arena_a});
  two.insert({arena_b, 256, arena_b});
  CHECK(two.ranges() == 2);
  CHECK(two.largest() == 256);
}

TEST_CASE("free_list picks the best fit", "[pool][free_list]") {
  free_list list;
  // Ranges of 4, 1, 2 KiB separated by gaps so that they do not merge.
  list.insert({arena_a, 4096, arena_a});
  list.insert({arena_a + 8192, 1024, arena_a});
  list.insert({arena_a + 16384, 2048, arena_a});
  auto const a = list.take(1024, 256);
  REQUIRE(a);
  CHECK(a->address == arena_a + 8192);  // exact fit
  auto const b = list.take(1536, 256);
  REQUIRE(b);
  CHECK(b->address == arena_a + 16384);  // 2 KiB is the smallest that holds 1.5 KiB
  CHECK(list.free_bytes() == 4096 + 512);
  auto const c = list.take(4096, 256);
  REQUIRE(c);
  CHECK(c->address == arena_a);
  CHECK_FALSE(list.take(1024, 256));  // only 512 bytes left
}

TEST_CASE("free_list honours alignments up to 1 MiB and keeps the padding free",
          "[pool][free_list]") {
  for (std::size_t alignment = 1; alignment <= mib; alignment *= 2) {
    CAPTURE(alignment);
    free_list list;
    // The range starts one granule past a 1 MiB boundary: every alignment above the granule
    // needs front padding.
    std::uintptr_t const start = arena_a + pool_granule;
    list.insert({start, 8 * mib, arena_a});
    auto const block = list.take(4096, alignment);
    REQUIRE(block);
    CHECK(block->address % alignment == 0);
    CHECK(block->address % pool_granule == 0);
    CHECK(block->address >= start);
    CHECK(block->address + 4096 <= start + 8 * mib);
    // Padding and tail stay free: nothing is lost.
    CHECK(list.free_bytes() == 8 * mib - 4096);
    // Giving the block back restores one whole range.
    list.insert(*block);
    CHECK(list.ranges() == 1);
    CHECK(list.largest() == 8 * mib);
  }
}

TEST_CASE("free_list finds an aligned fit past many unaligned candidates", "[pool][free_list]") {
  free_list list;
  // 64 ranges of 8 KiB that all start 256 bytes past a 64 KiB boundary: none holds 8 KiB at
  // 64 KiB alignment. Then one big range that does.
  for (std::uintptr_t i = 0; i < 64; ++i) {
    list.insert({arena_a + i * 65536 + 256, 8192, arena_a});
  }
  list.insert({arena_b + 256, 256 * 1024, arena_b});
  auto const block = list.take(8192, 65536);
  REQUIRE(block);
  CHECK(block->address % 65536 == 0);
  CHECK(block->arena == arena_b);
}

TEST_CASE("free_list takes an aligned block from the smallest range that holds it",
          "[pool][free_list]") {
  free_list list;
  // Two ranges of 8 KiB, the first unaligned for 64 KiB and the second aligned, and a big one:
  // the aligned 8 KiB range is the best fit, not the big range.
  list.insert({arena_a + 256, 8192, arena_a});
  list.insert({arena_a + 65536, 8192, arena_a});
  list.insert({arena_b + 256, 256 * 1024, arena_b});
  auto const block = list.take(8192, 65536);
  REQUIRE(block);
  CHECK(block->address == arena_a + 65536);
  CHECK(list.largest() == 256 * 1024);
}

TEST_CASE("free_list runs dry and recovers after frees", "[pool][free_list]") {
  free_list list;
  list.insert({arena_a, mib, arena_a});
  std::vector<free_block> taken;
  while (auto const block = list.take(4096, 256)) {
    taken.push_back(*block);
  }
  CHECK(taken.size() == mib / 4096);
  CHECK(list.empty());
  CHECK(list.free_bytes() == 0);
  CHECK_FALSE(list.take(256, 256));

  // Free in a random order: everything merges back into the one range.
  std::mt19937 rng{42};
  std::shuffle(taken.begin(), taken.end(), rng);
  for (auto const& block : taken) {
    list.insert(block);
  }
  CHECK(list.ranges() == 1);
  CHECK(list.largest() == mib);
  CHECK(list.remove_exact(arena_a, mib));
  CHECK(list.empty());
}

TEST_CASE("free_list absorbs another list", "[pool][free_list]") {
  free_list a;
  free_list b;
  a.insert({arena_a, 256, arena_a});
  b.insert({arena_a + 256, 256, arena_a});
  b.insert({arena_a + 4096, 256, arena_a});
  a.absorb(b);
  CHECK(b.empty());
  CHECK(b.free_bytes() == 0);
  CHECK(a.ranges() == 2);
  CHECK(a.free_bytes() == 768);
  CHECK_FALSE(a.remove_exact(arena_a, 256));  // merged: the range at arena_a is 512 bytes now
  CHECK(a.remove_exact(arena_a, 512));
}

TEST_CASE("free_list matches a granule-by-granule model under random use", "[pool][free_list]") {
  // Two arenas of 512 granules that touch in address space.
  constexpr std::size_t granules = 512;
  constexpr std::uintptr_t arena_size = granules * pool_granule;
  std::uintptr_t const arenas[] = {arena_a, arena_a + arena_size};
  std::vector<bool> free_granule(2 * granules, true);
  free_list list;
  for (auto const base : arenas) {
    list.insert({base, arena_size, base});
  }
  std::vector<free_block> live;
  std::mt19937_64 rng{7};
  auto index_of = [&](std::uintptr_t address) { return (address - arena_a) / pool_granule; };

  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      std::size_t const bytes = pool_granule * (1 + rng() % 24);
      std::size_t const alignment = std::size_t{1} << (rng() % 14);
      auto const block = list.take(bytes, alignment);
      if (!block) {
        continue;
      }
      REQUIRE(block->address % alignment == 0);
      REQUIRE(block->size == bytes);
      REQUIRE(block->address >= block->arena);
      REQUIRE(block->address + bytes <= block->arena + arena_size);
      for (auto g = index_of(block->address); g < index_of(block->address + bytes); ++g) {
        REQUIRE(free_granule[g]);
        free_granule[g] = false;
      }
      live.push_back(*block);
    } else {
      auto const i = rng() % live.size();
      for (auto g = index_of(live[i].address); g < index_of(live[i].address + live[i].size); ++g) {
        free_granule[g] = true;
      }
      list.insert(live[i]);
      live[i] = live.back();
      live.pop_back();
    }
    // The list holds exactly the model's maximal free runs, split at the arena boundary.
    std::vector<free_block> expected;
    for (std::size_t g = 0; g < free_granule.size();) {
      if (!free_granule[g]) {
        ++g;
        continue;
      }
      std::size_t const arena = g / granules;
      std::size_t end = g;
      while (end < (arena + 1) * granules && free_granule[end]) {
        ++end;
      }
      expected.push_back({arena_a + g * pool_granule, (end - g) * pool_granule, arenas[arena]});
      g = end;
    }
    std::vector<free_block> actual;
    list.for_each([&](free_block const& b) { actual.push_back(b); });
    REQUIRE(actual.size() == expected.size());
    std::size_t total = 0;
    std::size_t largest = 0;
    for (std::size_t i = 0; i < actual.size(); ++i) {
      REQUIRE(actual[i].address == expected[i].address);
      REQUIRE(actual[i].size == expected[i].size);
      REQUIRE(actual[i].arena == expected[i].arena);
      total += actual[i].size;
      largest = std::max(largest, actual[i].size);
    }
    REQUIRE(list.free_bytes() == total);
    REQUIRE(list.largest() == largest);
  }
}
