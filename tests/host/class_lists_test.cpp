// The lists of the size classes (class_lists.hpp) over a set of small slabs in host memory: where
// frees and closes put a slab that no slot holds, and what takes it off its list again; from one
// thread, step by step, and from many std::threads freeing at once.

#include "test_slabs.hpp"
#include "tsan.hpp"

#include <devmr/detail/heap/class_lists.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

using namespace devmr::detail::heap;
using devmr_test::test_slab_memory;
using devmr_test::test_slabs;
using devmr_test::under_tsan;

/// Class 3 of test_slabs: 128 blocks of 128 bytes a slab, listed from 16 free blocks.
constexpr unsigned cls = 3;

struct lists_fixture {
  test_slab_memory memory{8};
  class_lists<test_slabs> lists{test_slabs{&memory}};
  std::uint32_t const blocks = lists.slabs().blocks(cls);

  /// A slab off the stack of empty ones, formatted for the class and opened fresh, as a slot's
  /// install opens it, with its first `claimed` blocks handed out; then its slot gives it up
  /// (the blocks promised and not claimed get their bits back and are counted free).
  std::uint32_t closed_slab(std::uint32_t claimed) {
    std::uint32_t const id = memory.empty().pop();
    lists.slabs().format(id, cls);
    lists.bitmap(id, cls).clear();
    lists.avail(id, cls).open_fresh();
    lists.bitmap(id, cls).give_range(claimed, blocks);
    lists.close(id, cls, blocks - claimed, 0);
    return id;
  }
  bool listed(std::uint32_t id) const { return in(lists.slabs().listed(cls, 0), id); }
  bool below(std::uint32_t id) const { return in(lists.slabs().below(cls, 0), id); }
  static bool in(slab_set const& set, std::uint32_t id) {
    return (set.words[id / bitmap_word_bits] >> (id % bitmap_word_bits) & 1u) != 0;
  }
  bool emptied(std::uint32_t id) const { return memory.cls[id] == 0xffu; }
};

TEST_CASE("a closed slab goes where its count says: below the threshold, listed, or emptied",
          "[reuse][lists]") {
  lists_fixture f;
  std::uint32_t const threshold = reuse_threshold(f.blocks);
  std::uint32_t const full = f.closed_slab(f.blocks);  // every block out
  CHECK(f.below(full));
  CHECK_FALSE(f.listed(full));
  std::uint32_t const few = f.closed_slab(f.blocks - threshold + 1);
  CHECK(f.below(few));
  CHECK_FALSE(f.listed(few));
  CHECK((f.lists.avail(few, cls).peek() & avail_count_mask) == threshold - 1);
  std::uint32_t const many = f.closed_slab(f.blocks - threshold);
  CHECK(f.listed(many));
  CHECK_FALSE(f.below(many));
  std::uint32_t const none = f.closed_slab(0);  // nothing handed out
  CHECK(f.emptied(none));
  CHECK_FALSE(f.listed(none));
  CHECK_FALSE(f.below(none));
  CHECK(f.memory.empties.load() == 1);
  CHECK(f.memory.moves == 4);  // each close put its slab somewhere
}

TEST_CASE("frees list a closed slab once past the threshold and empty it with the last block",
          "[reuse][lists]") {
  lists_fixture f;
  std::uint32_t const threshold = reuse_threshold(f.blocks);
  std::uint32_t const id = f.closed_slab(f.blocks);
  for (std::uint32_t b = 0; b < f.blocks; ++b) {
    f.lists.free_block(id, cls, b, 0);
    INFO("freed " << b + 1);
    CHECK(f.listed(id) == (b + 1 >= threshold && b + 1 < f.blocks));
    CHECK(f.emptied(id) == (b + 1 == f.blocks));
  }
  CHECK(f.memory.empties.load() == 1);
  CHECK(f.memory.empty().pop() == id);  // back on the stack of empty slabs
}

TEST_CASE("a slab's frees from many threads list it once and empty it once", "[reuse][lists]") {
  int const rounds = under_tsan ? 20 : 200;
  for (int round = 0; round < rounds; ++round) {
    lists_fixture f;
    std::uint32_t const id = f.closed_slab(f.blocks);
    unsigned const threads = 8;
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (std::uint32_t b = t; b < f.blocks; b += threads) {
          f.lists.free_block(id, cls, b, t);
        }
      });
    }
    for (auto& t : pool) {
      t.join();
    }
    REQUIRE(f.emptied(id));
    REQUIRE_FALSE(f.listed(id));
    REQUIRE(f.memory.empties.load() == 1);
  }
}

TEST_CASE(
    "a search out of slabs takes a listed slab before one below, and none with every block out",
    "[reuse][lists]") {
  lists_fixture f;
  std::uint32_t const threshold = reuse_threshold(f.blocks);
  std::uint32_t const full = f.closed_slab(f.blocks);
  std::uint32_t const few = f.closed_slab(f.blocks - 3);
  std::uint32_t const many = f.closed_slab(f.blocks - threshold - 8);
  // The listed slab, opened: three quarters of its free blocks promised (slab_avail).
  std::uint64_t const first = f.lists.take_any(cls, 0);
  CHECK(static_cast<std::uint32_t>(first) == many);
  CHECK((first >> 32) == reuse_promise(threshold + 8));
  CHECK_FALSE(f.listed(many));
  // Then the one below the threshold, every free block promised.
  std::uint64_t const second = f.lists.take_any(cls, 0);
  CHECK(static_cast<std::uint32_t>(second) == few);
  CHECK((second >> 32) == 3);
  CHECK_FALSE(f.below(few));
  // The slab with every block out stays on the list below, for the frees to come.
  CHECK(f.lists.take_any(cls, 0) == no_slab);
  CHECK(f.below(full));
  f.lists.free_block(full, cls, 5, 0);
  std::uint64_t const third = f.lists.take_any(cls, 0);
  CHECK(static_cast<std::uint32_t>(third) == full);
  CHECK((third >> 32) == 1);
}

TEST_CASE("an install takes a listed slab off the list and opens it on its count as it is now",
          "[reuse][lists]") {
  lists_fixture f;
  std::uint32_t const threshold = reuse_threshold(f.blocks);
  std::uint32_t const id = f.closed_slab(f.blocks - threshold);
  std::uint32_t const seen = f.lists.avail(id, cls).peek();
  REQUIRE(f.lists.slabs().listed(cls, 0).erase(id));
  f.lists.free_block(id, cls, 0, 0);  // a free between the look and the opening
  std::uint64_t const opened = f.lists.open_taken(cls, 0, id, seen);
  CHECK(static_cast<std::uint32_t>(opened) == id);
  CHECK((opened >> 32) == reuse_promise(threshold + 1));
  // Opened, the slab is in a slot: a look at the lists finds it no more.
  CHECK(f.lists.take_any(cls, 0) == no_slab);
}

TEST_CASE(
    "a free held up before it takes a full listed slab off the list leaves it listed there "
    "if it was listed again meanwhile",
    "[reuse][lists]") {
  lists_fixture f;
  slab_set const list = f.lists.slabs().listed(cls, 0);
  std::uint32_t const id = f.closed_slab(f.blocks - 20);  // 20 free: listed
  REQUIRE(f.listed(id));
  // A free of the other blocks fills the count (full_listed) and is held up before it acts.
  f.lists.bitmap(id, cls).give_range(20, f.blocks);
  avail_event const event = f.lists.avail(id, cls).free(f.blocks - 20);
  REQUIRE(event == avail_event::full_listed);
  // Meanwhile an install takes the slab off the list and opens it; its slot's claims take the
  // blocks it promised (their bits do not matter here), and its close lists the slab again with
  // the blocks it kept.
  REQUIRE(list.erase(id));
  std::uint64_t const opened = f.lists.open_taken(cls, 0, id, 0);
  REQUIRE(static_cast<std::uint32_t>(opened) == id);
  std::uint32_t const promised = static_cast<std::uint32_t>(opened >> 32);
  f.lists.close(id, cls, 0, 0);
  std::uint32_t const kept = f.blocks - promised;
  REQUIRE(f.lists.avail(id, cls).peek() == (avail_listed | cls << avail_class_shift | kept));
  REQUIRE(f.listed(id));
  // The free acts now: the slab is not full any more, and stays where its count says it is.
  f.lists.act(event, id, cls, 0);
  CHECK_FALSE(f.emptied(id));
  CHECK(f.listed(id));
  // So that an install finds its free blocks.
  std::uint64_t const again = f.lists.take_any(cls, 0);
  CHECK(static_cast<std::uint32_t>(again) == id);
  CHECK((again >> 32) == reuse_promise(kept));
}

TEST_CASE(
    "a free held up before it takes a full listed slab leaves nothing on the list where a slot "
    "opened the slab meanwhile",
    "[reuse][lists]") {
  lists_fixture f;
  std::uint32_t const id = f.closed_slab(f.blocks - 20);  // 20 free: listed
  REQUIRE(f.listed(id));
  f.lists.bitmap(id, cls).give_range(20, f.blocks);
  avail_event const event = f.lists.avail(id, cls).free(f.blocks - 20);
  REQUIRE(event == avail_event::full_listed);
  // An install takes the slab off the list and opens it before the free acts.
  REQUIRE(f.lists.slabs().listed(cls, 0).erase(id));
  std::uint64_t const opened = f.lists.open_taken(cls, 0, id, 0);
  REQUIRE(static_cast<std::uint32_t>(opened) == id);
  // The free's erase finds no member and its take fails: the slab stays with its slot, off the
  // list (a member put back would be stale).
  f.lists.act(event, id, cls, 0);
  CHECK_FALSE(f.emptied(id));
  CHECK_FALSE(f.listed(id));
  CHECK((f.lists.avail(id, cls).peek() & avail_open) != 0);
}

TEST_CASE("searches out of slabs from many threads lose no slab closed below the threshold",
          "[reuse][lists]") {
  // Each slab has one free block, which goes round: a search takes the slab off the list below
  // the threshold and opens it (its one block promised), its slot's claim takes the block and the
  // slot closes the slab with none free (back on the list below, for the frees to come), then the
  // block is freed. A search that finds a member which another thread took, used up and put back
  // meanwhile must not drop it: a slab closed below the threshold and off the list is lost to
  // every search until frees list it.
  lists_fixture f;
  std::uint32_t const slabs = 4;
  for (std::uint32_t s = 0; s < slabs; ++s) {
    std::uint32_t const id = f.closed_slab(f.blocks - 1);
    REQUIRE(f.below(id));
  }
  unsigned const threads = 8;
  int const takes = under_tsan ? 2'000 : 100'000;
  std::atomic<std::uint32_t> held{0};
  std::atomic<std::uint32_t> wrong{0};  // takes promised other than the one block
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int n = 0; n < takes; ++n) {
        std::uint64_t const got = f.lists.take_any(cls, t + n);
        if (got == no_slab) {
          continue;
        }
        auto const id = static_cast<std::uint32_t>(got);
        held.fetch_add(1, std::memory_order_relaxed);
        if ((got >> 32) != 1) {
          wrong.fetch_add(1, std::memory_order_relaxed);
        }
        f.lists.close(id, cls, 0, t);  // its one block claimed
        f.lists.count_freed(id, cls, 1, t);
      }
    });
  }
  for (auto& t : pool) {
    t.join();
  }
  CHECK(held.load() > 0);
  CHECK(wrong.load() == 0);
  // Every slab waits below the threshold with its one free block, on the list there.
  std::uint32_t found = 0;
  for (std::uint32_t s = 0; s < slabs; ++s) {
    std::uint64_t const got = f.lists.take_any(cls, 0);
    found += got != no_slab ? 1 : 0;
  }
  CHECK(found == slabs);
}

}  // namespace
