// The slab heap's lock-free core, driven from many std::threads on host memory: the same code
// kernels run. Blocks are tagged at both ends and marked in a granule table, so a block handed out
// twice, or two live blocks that overlap, fail the test.

#include <devmr/detail/heap/format.hpp>
#include <devmr/detail/heap/heap_core.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace {

using namespace devmr::detail::heap;

/// A heap over host memory: header, arenas and their metadata.
class host_heap {
 public:
  host_heap(std::vector<std::uint64_t> const& arena_slabs, bool checked)
      : header_{std::make_unique<heap_header>()} {
    initialize(*header_, checked);
    for (std::uint64_t slabs : arena_slabs) {
      auto* base = static_cast<std::byte*>(std::aligned_alloc(slab_bytes, slabs * slab_bytes));
      auto* meta = static_cast<slab_meta*>(
          std::aligned_alloc(alignof(slab_meta), slabs * sizeof(slab_meta)));
      // Poison what the heap must format lazily: it may not rely on zeroed memory.
      std::memset(static_cast<void*>(meta), 0xa5, slabs * sizeof(slab_meta));
      std::uint64_t* bits = nullptr;
      if (checked) {
        bits = static_cast<std::uint64_t*>(
            std::aligned_alloc(64, slabs * check_words_per_slab * sizeof(std::uint64_t)));
        std::memset(bits, 0xa5, slabs * check_words_per_slab * sizeof(std::uint64_t));
      }
      // The bitmap of empty slabs is the one thing the heap's owner clears up front.
      auto* empty = static_cast<std::uint64_t*>(
          std::aligned_alloc(64, empty_words(slabs) * sizeof(std::uint64_t)));
      std::memset(empty, 0, empty_words(slabs) * sizeof(std::uint64_t));
      add_arena(*header_, arena_desc{base, meta, bits, empty, slabs});
      memory_.push_back(base);
      memory_.push_back(meta);
      memory_.push_back(bits);
      memory_.push_back(empty);
    }
  }
  ~host_heap() {
    for (void* p : memory_) {
      std::free(p);
    }
  }
  host_heap(host_heap const&) = delete;
  host_heap& operator=(host_heap const&) = delete;

  heap_core core() const { return heap_core{header_.get()}; }
  heap_header& header() const { return *header_; }

  /// Blocks held by users, summed over every formatted slab (what the statistics kernel does).
  std::uint64_t blocks_in_use() const {
    std::uint64_t total = 0;
    for (std::uint32_t a = 0; a < header_->arena_count; ++a) {
      auto const& arena = header_->arenas[a];
      for (std::uint64_t s = 0; s < header_->frontier[a] && s < arena.slabs; ++s) {
        unsigned g;
        std::uint64_t small;
        std::uint64_t large;
        if (slab_usage(*header_, make_slab_id(a, static_cast<std::uint32_t>(s)), arena.meta[s], g,
                       small, large)) {
          total += small + large;
        }
      }
    }
    return total;
  }

  std::uint64_t total_slabs() const {
    std::uint64_t total = 0;
    for (std::uint32_t a = 0; a < header_->arena_count; ++a) {
      total += header_->arenas[a].slabs;
    }
    return total;
  }

 private:
  std::unique_ptr<heap_header> header_;
  std::vector<void*> memory_;
};

/// One byte per 16-byte granule of every arena: set while a live block starts there.
class granule_table {
 public:
  explicit granule_table(host_heap const& heap) : heap_{heap} {
    for (std::uint32_t a = 0; a < heap.header().arena_count; ++a) {
      owners_.emplace_back(heap.header().arenas[a].slabs * (slab_bytes / 16));
    }
  }
  /// False when the block starting at p was already live, or lies outside the heap.
  bool take(void* p) {
    std::atomic<bool>* const owned = slot(p);
    return owned != nullptr && !owned->exchange(true);
  }
  /// False when the block starting at p was not live, or lies outside the heap.
  bool give(void* p) {
    std::atomic<bool>* const owned = slot(p);
    return owned != nullptr && owned->exchange(false);
  }

 private:
  /// nullptr outside the heap. No Catch2 assertion here: worker threads call it, and Catch2's
  /// assertions are not thread-safe (ThreadSanitizer found the REQUIRE that was here racing).
  std::atomic<bool>* slot(void* p) {
    std::uint32_t id = 0;
    std::size_t offset = 0;
    if (!heap_.core().locate(p, id, offset)) {
      return nullptr;
    }
    return &owners_[arena_of(id)][(std::size_t{index_of(id)} * slab_bytes + offset) / 16];
  }
  host_heap const& heap_;
  std::vector<std::vector<std::atomic<bool>>> owners_;
};

struct live_block {
  std::uint32_t* first;
  std::uint32_t* last;
  std::uint32_t tag;
};

std::size_t block_size(unsigned cls) {
  return class_bytes(cls);
}

/// Tags a block at both ends; another live block overlapping it would overwrite a tag.
live_block tag_block(void* p, std::size_t bytes, std::uint32_t tag) {
  auto* first = static_cast<std::uint32_t*>(p);
  auto* last = reinterpret_cast<std::uint32_t*>(static_cast<std::byte*>(p) + bytes - 4);
  *first = tag;
  *last = ~tag;
  return {first, last, tag};
}

/// Writes `value` to every 8-byte word of [p, p + bytes), one store at a time (so that
/// ThreadSanitizer checks each, as it may not for the ranges of memset).
void fill_words(std::byte* p, std::size_t bytes, std::uint64_t value) {
  auto* const words = reinterpret_cast<std::uint64_t*>(p);
  for (std::size_t i = 0; i < bytes / 8; ++i) {
    words[i] = value;
  }
}

bool tags_intact(live_block const& b) {
  return *b.first == b.tag && *b.last == ~b.tag;
}

/// The slot word that claims of class `cls` add to in slot `slot` (their group's).
std::uint64_t& class_slot(host_heap const& heap, unsigned cls, unsigned slot) {
  return slot_word_of(heap.header(), group_of(cls), slot);
}
/// A slot word naming slab `id` with `count` blocks of class `cls` claimed (and none of the other
/// class of its group).
std::uint64_t class_slot_value(std::uint32_t id, unsigned cls, std::uint32_t count) {
  return is_large_class(cls) ? make_slot(id, 0, count) : make_slot(id, count, 0);
}
/// The blocks of class `cls` that slot word `w` counts.
std::uint32_t class_count(std::uint64_t w, unsigned cls) {
  return is_large_class(cls) ? large_count(w) : small_count(w);
}

/// Frees, one at a time, every block of class `cls` that claim `got` handed out.
void free_claimed(heap_core const& core, claim_result const& got, unsigned cls) {
  for (std::uint32_t i = 0; i < got.count; ++i) {
    core.free_one(got.first + i * class_bytes(cls), 0);
  }
}
/// The same for every claim in `taken`.
void free_claimed(heap_core const& core, std::vector<claim_result> const& taken, unsigned cls) {
  for (claim_result const& got : taken) {
    free_claimed(core, got, cls);
  }
}

}  // namespace

TEST_CASE("size classes cover 16 B to half a slab, two to a group", "[heap][core]") {
  STATIC_REQUIRE(class_bytes(0) == 16);
  STATIC_REQUIRE(class_bytes(num_classes - 1) == max_small_bytes);
  STATIC_REQUIRE(class_capacity(0) * 16 == slab_bytes);
  STATIC_REQUIRE(class_capacity(num_classes - 1) == 2);
  for (unsigned cls = 0; cls < num_classes; ++cls) {
    CHECK(group_units(group_of(cls)) == class_capacity(cls) << (is_large_class(cls) ? 1 : 0));
    CHECK(class_of_size(class_bytes(cls)) == cls);
    CHECK(class_of_size(class_bytes(cls) / 2 + 1) == (cls == 0 ? 0 : cls));
    CHECK(is_large_size(class_bytes(cls)) == is_large_class(cls));
  }
  CHECK(class_of_size(1) == 0);
  CHECK(!is_large_size(max_small_bytes + 1));  // large runs count as one unit
  CHECK(!is_large_size(0));
  for (std::size_t size = 1; size <= max_small_bytes; size += size < 5000 ? 1 : 997) {
    INFO("size " << size);
    REQUIRE(is_large_size(size) == is_large_class(class_of_size(size)));
    REQUIRE(is_large_size(size + 1) == is_large_class(class_of_size(size + 1)));
  }
  // Past the small classes nothing is large, even where the low 32 bits of the size, less one,
  // are those of a large class's size.
  for (std::uint64_t size : {max_small_bytes + 1, 2 * max_small_bytes, 3 * max_small_bytes + 32,
                             (std::uint64_t{1} << 32) + 32, (std::uint64_t{1} << 33) + 1024,
                             ~std::uint64_t{0} - 0x5555, ~std::uint64_t{0}}) {
    INFO("size " << size);
    CHECK(!is_large_size(size));
  }
  // The free folds its size and alignment into one word, (bytes - 1) | (alignment - 1): the
  // class is that of the larger of the two.
  for (std::size_t alignment = 1; alignment <= slab_bytes; alignment *= 2) {
    for (std::size_t bytes = 1; bytes <= max_small_bytes; bytes += bytes < 2100 ? 1 : 4099) {
      INFO("bytes " << bytes << ", alignment " << alignment);
      REQUIRE(is_large_last((bytes - 1) | (alignment - 1)) ==
              is_large_size(bytes > alignment ? bytes : alignment));
    }
  }
  CHECK(!is_large_last((std::size_t{0} - 1) | 15));  // bytes 0: unknown, never the fast path
  // A slot word's counts hold every unit of a slab and every warp of the largest GPUs past it.
  STATIC_REQUIRE(group_units(0) + 132 * 64 * 32 <= slot_count_mask);
  STATIC_REQUIRE(small_count(make_slot(7, 5, 9)) == 5);
  STATIC_REQUIRE(large_count(make_slot(7, 5, 9)) == 9);
  STATIC_REQUIRE(unit_count(make_slot(7, 5, 9)) == 23);
  STATIC_REQUIRE(slot_id(make_slot(installing_first, 5, 9)) == installing_first);
  CHECK(ceil_log2(1) == 0);
  CHECK(ceil_log2(17) == 5);
  CHECK(floor_log2(17) == 4);
  CHECK(floor_log2(std::uint64_t{1} << 40) == 40);
}

TEST_CASE("every slot of every group fits in the heap, one slot per SM from 2 GiB",
          "[heap][core]") {
  for (std::uint64_t slabs = 1; slabs <= (std::uint64_t{1} << 17); ++slabs) {
    std::uint64_t const slots = std::uint64_t{slot_mask_for(slabs)} + 1;
    REQUIRE((slots & (slots - 1)) == 0);  // SMs map to slots by a mask
    REQUIRE(slots <= max_slots);
    if (slabs < num_groups) {
      REQUIRE(slots == 1);  // a heap of one slab still has a slot per group
    } else {
      REQUIRE(slots * num_groups <= slabs);  // a slab in every slot of every group fits
    }
    if (slabs >= 2048) {  // 2 GiB: as many slots as the largest GPUs' SMs
      REQUIRE(slots == max_slots);
    } else if (slabs >= num_groups) {
      REQUIRE(slots * 2 * num_groups > slabs);  // no fewer than the bound allows
    }
  }
}

TEST_CASE("priming fills every slot of the smallest groups within half of the heap",
          "[heap][core]") {
  for (std::uint64_t slabs : {1, 20, 31, 32, 33, 64, 100, 128, 300, 1000, 2048}) {
    host_heap heap{{slabs}, false};
    auto core = heap.core();
    std::uint64_t const all = std::uint64_t{num_groups} * core.slots_in_use();
    std::uint32_t const primed = core.prime_count();
    CHECK(primed <= slabs / 2);
    CHECK(primed == std::min(all, slabs / 2));  // no fewer than half of the heap allows
  }
  // Grown, a heap primes as its size allows.
  host_heap grown{{16, 48}, false};
  CHECK(grown.core().prime_count() == 32);
}

TEST_CASE("a claim hands out consecutive aligned blocks of one slab", "[heap][core]") {
  host_heap heap{{20}, false};
  auto core = heap.core();
  std::vector<std::pair<std::byte*, std::size_t>> blocks;
  for (unsigned cls = 0; cls < num_classes; ++cls) {
    std::uint32_t served = 0;
    while (served < 3) {
      claim_result const got = core.claim(cls, 0, 3 - served, 0);
      REQUIRE(got.count != 0);
      CHECK(reinterpret_cast<std::uintptr_t>(got.first) % block_size(cls) == 0);
      std::uint32_t id = 0;
      std::size_t offset = 0;
      REQUIRE(core.locate(got.first, id, offset));
      CHECK(offset + got.count * block_size(cls) <= slab_bytes);
      for (std::uint32_t i = 0; i < got.count; ++i) {
        blocks.emplace_back(got.first + i * block_size(cls), block_size(cls));
      }
      served += got.count;
    }
  }
  // The two classes of a group share slabs, and no two blocks overlap.
  std::sort(blocks.begin(), blocks.end());
  for (std::size_t i = 1; i < blocks.size(); ++i) {
    CHECK(blocks[i - 1].first + blocks[i - 1].second <= blocks[i].first);
  }
  CHECK(heap.blocks_in_use() == 3 * num_classes);
  CHECK(heap.header().frontier[0] < 2 * num_groups);
}

TEST_CASE("one claim serves both classes of a group from the two ends of one slab",
          "[heap][core]") {
  host_heap heap{{4}, false};
  auto core = heap.core();
  unsigned const g = 6;  // 64 KiB and 128 KiB blocks: 16 units a slab
  pair_claim const first = core.claim_pair(g, 0, 3 | 2 << 16, 0, core.arena(0));
  REQUIRE(first.small_count() == 3);
  REQUIRE(first.large_count() == 2);
  std::uint32_t id = 0;
  std::size_t offset = 0;
  REQUIRE(core.locate(first.small_block(0, 16), id, offset));
  CHECK(offset == 0);
  REQUIRE(core.locate(first.large_block(0, 17), id, offset));
  CHECK(offset == slab_bytes - 2 * (128u << 10));
  CHECK(slot_word_of(heap.header(), g, 0) == make_slot(id, 3, 2));
  // 16 units: 3 + 2 * 2 = 7 out; a claim of 3 small and 4 large finds 9 left: it takes its 3
  // small blocks and 3 large ones (the fronts meet), records what the slab handed out, and
  // installs the next slab for its last large block.
  pair_claim const second = core.claim_pair(g, 0, 3 | 4 << 16, 0, core.arena(0));
  CHECK(second.small_count() == 3);
  CHECK(second.large_count() == 3);
  std::uint32_t second_id = 0;
  REQUIRE(core.locate(second.small_block(0, 16), second_id, offset));
  CHECK(second_id == id);
  CHECK(offset == 3 * (64u << 10));
  REQUIRE(core.locate(second.large_block(0, 17), second_id, offset));
  CHECK(offset == slab_bytes - 5 * (128u << 10));
  CHECK(heap.header().arenas[0].meta[index_of(id)].state == make_state(g, make_fronts(6, 5)));
  std::uint64_t const next = slot_word_of(heap.header(), g, 0);
  CHECK(slot_id(next) != id);
  CHECK(unit_count(next) == 0);
  CHECK(heap.blocks_in_use() == 11);
  // The claims' blocks: sizeless frees find their class from the recorded fronts, sized ones
  // from the size.
  for (std::uint32_t i = 0; i < 3; ++i) {
    core.free_one(first.small_block(0, 16) + i * (64u << 10), 0);
    core.free_one(second.small_block(0, 16) + i * (64u << 10), 0, 64u << 10);
    core.free_one(second.large_block(0, 17) + i * (128u << 10), 0);
  }
  for (std::uint32_t i = 0; i < 2; ++i) {
    core.free_one(first.large_block(0, 17) + i * (128u << 10), 0, 128u << 10);
  }
  CHECK(heap.blocks_in_use() == 0);
  CHECK(heap.header().arenas[0].empty_bits[0] == std::uint64_t{1} << index_of(id));
}

TEST_CASE("a claim for more blocks than a slab holds leaves its slot a slab with blocks left",
          "[heap][core]") {
  host_heap heap{{8}, false};
  auto core = heap.core();
  unsigned const cls = num_classes - 1;  // 512 KiB blocks, 2 per slab
  std::uint64_t const& slot = class_slot(heap, cls, 0);
  std::vector<void*> blocks;
  for (unsigned served = 0; served < 5;) {
    claim_result const got = core.claim(cls, 0, 5 - served, 0);
    REQUIRE(got.count >= 1);
    for (std::uint32_t i = 0; i < got.count; ++i) {
      blocks.push_back(got.first + i * block_size(cls));
    }
    served += got.count;
    // A claim that takes a slab's last block and wants more installs the next, which it claims
    // from at once; none leaves a used-up slab in the slot, where its own next claim would wait
    // for an installer that never comes.
    REQUIRE(is_slab(slot_id(slot)));
    CHECK(class_count(slot, cls) < class_capacity(cls));
  }
  std::sort(blocks.begin(), blocks.end());
  CHECK(std::adjacent_find(blocks.begin(), blocks.end()) == blocks.end());
  CHECK(heap.blocks_in_use() == 5);
  for (void* p : blocks) {
    core.free_one(p, 0);
  }
  CHECK(heap.blocks_in_use() == 0);
}

TEST_CASE(
    "a claim that takes a slab's last blocks and wants no more leaves the install to the next",
    "[heap][core]") {
  host_heap heap{{8}, false};
  auto core = heap.core();
  unsigned const cls = num_classes - 3;  // 128 KiB blocks, 8 per slab
  std::uint32_t const capacity = class_capacity(cls);
  std::uint64_t const& slot = class_slot(heap, cls, 0);
  std::vector<void*> blocks;
  auto take = [&](std::uint32_t want) {
    claim_result const got = core.claim(cls, 0, want, 0);
    REQUIRE(got.count == want);
    for (std::uint32_t i = 0; i < got.count; ++i) {
      blocks.push_back(got.first + i * block_size(cls));
    }
  };
  take(3);             // the vacant slot's first claim installs a slab
  take(capacity - 3);  // its last blocks, all this claim wants: nothing more is installed
  std::uint32_t const used_up = slot_id(slot);
  CHECK(slot == class_slot_value(used_up, cls, capacity));
  CHECK(heap.header().frontier[0] == 1);
  CHECK(heap.blocks_in_use() == capacity);
  take(2);  // finds the count at the capacity: installs the next slab, its blocks the first two
  CHECK(heap.header().frontier[0] == 2);
  CHECK(slot == class_slot_value(slot_id(slot), cls, 2));
  CHECK(slot_id(slot) != used_up);
  // Used up again by a claim that wants no more: the next claim installs, the one after it
  // claims from the new slab.
  take(capacity - 2);
  take(1);
  take(1);
  CHECK(heap.header().frontier[0] == 3);
  CHECK(slot == class_slot_value(slot_id(slot), cls, 2));
  std::sort(blocks.begin(), blocks.end());
  CHECK(std::adjacent_find(blocks.begin(), blocks.end()) == blocks.end());
  CHECK(heap.blocks_in_use() == 2 * capacity + 2);
  for (void* p : blocks) {
    core.free_one(p, 0);
  }
  CHECK(heap.blocks_in_use() == 0);
}

TEST_CASE("an exhausted slab is replaced and recycled once all its blocks are freed",
          "[heap][core]") {
  host_heap heap{{2}, false};  // no fresh slab left once both are handed out
  auto core = heap.core();
  unsigned const cls = num_classes - 3;  // 128 KiB blocks, 8 per slab
  std::vector<void*> blocks;
  for (int i = 0; i < 12; ++i) {
    claim_result const got = core.claim(cls, 0, 1, 0);
    REQUIRE(got.count == 1);
    blocks.push_back(got.first);
  }
  CHECK(heap.header().frontier[0] == 2);
  CHECK(heap.blocks_in_use() == 12);
  std::uint64_t const& empty = heap.header().arenas[0].empty_bits[0];
  for (int i = 0; i < 7; ++i) {  // the first slab: exhausted, one block still live
    core.free_one(blocks[i], 0);
  }
  CHECK(empty == 0);
  core.free_one(blocks[7], 0);  // now empty: marked for the next taker
  CHECK(empty == 1);
  CHECK(heap.blocks_in_use() == 4);
  // The second slab runs out: its successor is the first one again, found through the bitmap.
  for (int i = 12; i < 17; ++i) {
    claim_result const got = core.claim(cls, 0, 1, 0);
    REQUIRE(got.count == 1);
    blocks.push_back(got.first);
  }
  CHECK(empty == 0);
  std::uint32_t id = 0;
  std::size_t offset = 0;
  REQUIRE(core.locate(blocks[16], id, offset));
  CHECK(id == make_slab_id(0, 0));
  for (int i = 8; i < 17; ++i) {
    core.free_one(blocks[i], 0);
  }
  CHECK(heap.blocks_in_use() == 0);
  CHECK(empty == 2);  // the second slab is empty; the first is current in the slot
}

TEST_CASE("out of memory returns nothing, counts nothing lost, and recovers after frees",
          "[heap][core]") {
  host_heap heap{{6, 3}, false};
  auto core = heap.core();
  std::vector<void*> small;
  std::vector<void*> large;
  // Large runs first, then fill what is left with 4 KiB blocks until the heap says no.
  for (;;) {
    void* p = core.allocate_large(2 * slab_bytes, 0);
    if (p == nullptr) {
      break;
    }
    large.push_back(p);
  }
  CHECK(large.size() == 4);  // 3 runs of 2 in the first arena, 1 in the second
  for (;;) {
    claim_result const got = core.claim(8, 0, 5, 0);
    if (got.count == 0) {
      break;
    }
    for (std::uint32_t i = 0; i < got.count; ++i) {
      small.push_back(got.first + i * 4096);
    }
  }
  // 6 + 3 slabs: 8 in large runs, the last one (and the tail of the first arena) for 4 KiB blocks.
  CHECK(small.size() == class_capacity(8));
  CHECK(heap.blocks_in_use() == small.size() + large.size());
  for (void* p : large) {
    core.free_one(p, 0);
  }
  for (void* p : small) {
    core.free_one(p, 0);
  }
  CHECK(heap.blocks_in_use() == 0);
  // Everything is back: a run as long as the first arena's free slabs... and blocks again.
  void* big = core.allocate_large(2 * slab_bytes, 0);
  CHECK(big != nullptr);
  CHECK(core.claim(0, 0, 32, 0).count == 32);
}

TEST_CASE("slabs emptied by small blocks come back as long runs", "[heap][core]") {
  host_heap heap{{20, 12}, false};
  auto core = heap.core();
  std::vector<void*> small;
  for (claim_result got = core.claim(8, 0, 32, 0); got.count != 0; got = core.claim(8, 0, 32, 0)) {
    for (std::uint32_t i = 0; i < got.count; ++i) {
      small.push_back(got.first + i * 4096);
    }
  }
  REQUIRE(small.size() == heap.total_slabs() * class_capacity(8));  // every slab, none fresh
  for (void* p : small) {
    core.free_one(p, 0);
  }
  // Every slab is empty, each marked on its own: a block as long as each arena is found.
  void* whole[2] = {core.allocate_large(20 * slab_bytes, 0),
                    core.allocate_large(12 * slab_bytes, 0)};
  CHECK(whole[0] != nullptr);
  CHECK(whole[1] != nullptr);
  CHECK(core.allocate_large(slab_bytes, 0) == nullptr);
  for (void* p : whole) {
    core.free_one(p, 0);
  }
  CHECK(heap.blocks_in_use() == 0);
  // And back to small blocks, then to runs again.
  CHECK(core.claim(0, 0, 32, 0).count == 32);
  CHECK(core.allocate_large(16 * slab_bytes, 0) != nullptr);
}

TEST_CASE("a large block takes the slabs that slots hold once their blocks are all free",
          "[heap][core]") {
  host_heap heap{{16}, false};
  auto core = heap.core();
  claim_result const small = core.claim(0, 0, 10, 0);  // slab 0, current for 16 B blocks
  claim_result const large = core.claim(8, 0, 5, 0);   // slab 1, current for 4 KiB blocks
  REQUIRE(small.count == 10);
  REQUIRE(large.count == 5);
  for (std::uint32_t i = 0; i < 5; ++i) {
    core.free_one(large.first + i * 4096, 0);
  }
  for (std::uint32_t i = 1; i < 10; ++i) {
    core.free_one(small.first + i * 16, 0);
  }
  // One 16 B block is live: its slab cannot be part of a run, the fifteen others can.
  CHECK(core.allocate_large(16 * slab_bytes, 0) == nullptr);
  void* most = core.allocate_large(15 * slab_bytes, 0);
  CHECK(most != nullptr);
  core.free_one(most, 0);
  core.free_one(small.first, 0);
  CHECK(heap.blocks_in_use() == 0);
  // Its slot gave the slab up: with its last block freed, the whole heap is one run.
  void* whole = core.allocate_large(16 * slab_bytes, 0);
  CHECK(whole != nullptr);
  core.free_one(whole, 0);
  CHECK(core.claim(0, 0, 32, 0).count == 32);  // and the slot takes a slab again
}

TEST_CASE(
    "primed slots serve claims without an install and give their slabs up when memory "
    "runs short",
    "[heap][core]") {
  host_heap heap{{8}, false};
  auto core = heap.core();
  std::uint32_t const first = core.take_fresh_slabs(4);
  REQUIRE(first != no_slab);
  for (unsigned g = 0; g < 4; ++g) {
    core.prime(g, 0, first + g, 0);
    CHECK(slot_word_of(heap.header(), g, 0) == make_slot(first + g, 0));
  }
  CHECK(heap.header().idle_slots.value != 0);
  CHECK(heap.header().frontier[0] == 4);
  // A slot that holds a slab is left alone; the slab offered goes on a stack.
  core.prime(0, 0, core.take_fresh_slabs(1), 0);
  CHECK(slot_word_of(heap.header(), 0, 0) == make_slot(first, 0));
  // The first claim takes the primed slab's first blocks: nothing is installed.
  claim_result const small = core.claim(0, 0, 10, 0);
  REQUIRE(small.count == 10);
  std::uint32_t id = 0;
  std::size_t offset = 0;
  REQUIRE(core.locate(small.first, id, offset));
  CHECK(id == first);
  CHECK(offset == 0);
  CHECK(heap.header().frontier[0] == 5);
  // 4 KiB blocks until none is left: every slab but the one with live 16 B blocks serves them,
  // the three primed for groups 1 to 3 included.
  unsigned constexpr big = 8;
  std::uint32_t const capacity = class_capacity(big);
  std::vector<claim_result> taken;
  std::uint64_t blocks = 0;
  for (claim_result got = core.claim(big, 0, 64, 0); got.count != 0;
       got = core.claim(big, 0, 64, 0)) {
    taken.push_back(got);
    blocks += got.count;
  }
  CHECK(blocks == 7 * std::uint64_t{capacity});
  for (std::uint32_t i = 1; i < 4; ++i) {
    CHECK(!is_slab(slot_id(slot_word_of(heap.header(), i, 0))));
  }
  // The scan that found no more cleared the flag: a heap out of memory does not scan again.
  CHECK(heap.header().idle_slots.value == 0);
  free_claimed(core, taken, big);
  for (std::uint32_t i = 0; i < 10; ++i) {
    core.free_one(small.first + i * 16, 0);
  }
  CHECK(heap.blocks_in_use() == 0);
  CHECK(core.allocate_large(8 * slab_bytes, 0) != nullptr);  // nothing is lost
}

TEST_CASE("one-slab blocks and a new class's first claim take the slabs that idle slots hold",
          "[heap][core]") {
  // Seven groups claim a block each, so that their slot holds every slab of the heap; once the
  // blocks are freed, nothing is live, but each slab is still its group's current one.
  host_heap heap{{7}, false};
  auto core = heap.core();
  std::vector<claim_result> blocks;
  for (unsigned g = 0; g < 7; ++g) {
    blocks.push_back(core.claim(2 * g + g % 2, 0, 1, 0));  // small or large: either holds it
    REQUIRE(blocks.back().count == 1);
  }
  CHECK(core.allocate_large(slab_bytes, 0) == nullptr);  // every slab holds a live block
  CHECK(core.claim(14, 0, 1, 0).count == 0);
  for (claim_result const& got : blocks) {
    core.free_one(got.first, 0);
  }
  REQUIRE(heap.blocks_in_use() == 0);
  // A block of one whole slab takes one from a slot...
  void* run = core.allocate_large(slab_bytes, 0);
  CHECK(run != nullptr);
  // ...and so does the first claim of a class no slot has a slab for (the slots gave theirs up).
  claim_result const first = core.claim(14, 0, 2, 0);
  CHECK(first.count == 2);
  core.free_one(run, 0);
  for (std::uint32_t i = 0; i < first.count; ++i) {
    core.free_one(first.first + i * class_bytes(14), 0);
  }
  CHECK(heap.blocks_in_use() == 0);
  CHECK(heap.header().counters.failed_allocations == 0);
}

namespace {

/// Primes every slot as prime_kernel does after a heap is made or reset: the slots within half
/// of the heap, each with a spare where the heap is large enough. The spares that it gave.
std::uint32_t prime_like_kernel(heap_core const& core) {
  std::uint32_t const count = core.prime_count();
  std::uint32_t spares = core.spare_count(count);
  std::uint32_t const first = core.take_prime_slabs(count, spares);
  for (std::uint32_t i = 0; i < count; ++i) {
    core.prime_slot(i, core.slots_in_use(), first, count, spares);
  }
  return spares;
}

}  // namespace

TEST_CASE("priming gives each slot a spare while primed slabs and spares fit in half the heap",
          "[heap][core]") {
  for (std::uint64_t slabs : {16, 31, 32, 33, 64, 100, 300}) {
    for (std::uint32_t mask : {0, 1, 3, 7}) {
      host_heap heap{{slabs}, false};
      heap.header().slot_mask = mask;
      auto core = heap.core();
      std::uint32_t const count = core.prime_count();
      std::uint32_t const spares = core.spare_count(count);
      CHECK(spares == (4 * std::uint64_t{count} <= slabs ? count : 0));
      CHECK(count + spares <= slabs / 2);
      CHECK(prime_like_kernel(core) == spares);
      CHECK(heap.header().frontier[0] == count + spares);
      for (std::uint32_t i = 0; i < num_groups * (mask + 1); ++i) {
        unsigned const g = i / (mask + 1);
        unsigned const slot = i % (mask + 1);
        CHECK(slot_id(slot_word_of(heap.header(), g, slot)) == (i < count ? i : empty_id));
        CHECK(spare_word_of(heap.header(), g, slot) ==
              (i < count && spares != 0 ? count + i : no_slab));
      }
    }
  }
  // The primed slabs and the spares lie in a row: in the second arena when the first is short.
  host_heap split{{12, 20}, false};
  split.header().slot_mask = 0;
  std::uint32_t spares = split.core().spare_count(split.core().prime_count());
  REQUIRE(spares == num_groups);
  CHECK(split.core().take_prime_slabs(num_groups, spares) == make_slab_id(1, 0));
  CHECK(spares == num_groups);
  // No arena has so many fresh slabs left in a row: the slots are primed, with no spares.
  host_heap short_of_fresh{{15, 15, 15}, false};
  short_of_fresh.header().slot_mask = 0;
  auto core = short_of_fresh.core();
  spares = core.spare_count(core.prime_count());
  REQUIRE(spares == num_groups);
  CHECK(core.take_prime_slabs(num_groups, spares) == make_slab_id(0, 0));
  CHECK(spares == 0);
}

TEST_CASE("a slot's spare is its next install: no search, no format, the slab's blocks in order",
          "[heap][core]") {
  host_heap heap{{40}, false};
  heap.header().slot_mask = 0;
  auto core = heap.core();
  REQUIRE(prime_like_kernel(core) == num_groups);
  REQUIRE(heap.header().frontier[0] == 2 * num_groups);
  unsigned constexpr big = 8;  // 4 KiB blocks: group 4, primed slab 4, spare 12
  std::uint32_t const capacity = class_capacity(big);
  // The spare was formatted for its slot: open, its units unclaimed.
  CHECK(heap.header().arenas[0].meta[12].state == make_state(4, open_state | 0));
  CHECK(remaining_units(heap.header().arenas[0].meta[12].remaining) == group_units(4));
  std::vector<claim_result> taken;
  std::uint32_t blocks = 0;
  while (blocks < capacity + 3) {
    claim_result const got = core.claim(big, 0, 7, 0);
    REQUIRE(got.count != 0);
    taken.push_back(got);
    blocks += got.count;
  }
  // The primed slab's blocks, then the spare's from its start: no fresh slab was taken.
  CHECK(heap.header().frontier[0] == 2 * num_groups);
  CHECK(spare_word_of(heap.header(), 4, 0) == no_slab);
  CHECK(slot_id(slot_word_of(heap.header(), 4, 0)) == 12);
  std::uint32_t id = 0;
  std::size_t offset = 0;
  REQUIRE(core.locate(taken.back().first, id, offset));
  CHECK(id == 12);
  CHECK(offset == 0);
  CHECK(heap.header().arenas[0].meta[12].state == make_state(4, open_state | 0));
  // The next install has no spare: a fresh slab.
  while (blocks < 2 * capacity + 1) {
    claim_result const got = core.claim(big, 0, 7, 0);
    REQUIRE(got.count != 0);
    taken.push_back(got);
    blocks += got.count;
  }
  CHECK(heap.header().frontier[0] == 2 * num_groups + 1);
  CHECK(heap.blocks_in_use() == blocks);
  free_claimed(core, taken, big);
  CHECK(heap.blocks_in_use() == 0);
  // A slot that has a spare keeps it: the slab offered goes on a stack, not lost.
  std::uint32_t const spare3 = spare_word_of(heap.header(), 3, 0);
  core.add_spare(3, 0, core.take_fresh_slabs(1), 0);
  CHECK(spare_word_of(heap.header(), 3, 0) == spare3);
  // Nothing is live: the slots give up their slabs and spares to one block of the whole heap.
  CHECK(core.allocate_large(40 * slab_bytes, 0) != nullptr);
}

TEST_CASE("spares and primed slabs come back when memory runs short", "[heap][core]") {
  host_heap heap{{32}, false};
  heap.header().slot_mask = 0;
  auto core = heap.core();
  REQUIRE(prime_like_kernel(core) == num_groups);
  SECTION("to one block of the whole heap") {
    claim_result const got = core.claim(3, 0, 5, 0);  // one primed slab with freed blocks
    REQUIRE(got.count == 5);
    free_claimed(core, got, 3);
    void* whole = core.allocate_large(32 * slab_bytes, 0);
    REQUIRE(whole != nullptr);
    for (unsigned g = 0; g < num_groups; ++g) {
      CHECK(!is_slab(slot_id(slot_word_of(heap.header(), g, 0))));
      CHECK(spare_word_of(heap.header(), g, 0) == no_slab);
    }
    CHECK(heap.blocks_in_use() == 1);
    core.free_one(whole, 0);
  }
  SECTION("to one class that fills the heap") {
    unsigned constexpr big = 14;  // 256 KiB blocks, 4 a slab
    std::vector<claim_result> taken;
    std::uint64_t blocks = 0;
    for (claim_result got = core.claim(big, 0, 3, 0); got.count != 0;
         got = core.claim(big, 0, 3, 0)) {
      taken.push_back(got);
      blocks += got.count;
    }
    CHECK(blocks == 32 * std::uint64_t{class_capacity(big)});
    free_claimed(core, taken, big);
  }
  CHECK(heap.blocks_in_use() == 0);
  CHECK(core.allocate_large(32 * slab_bytes, 0) != nullptr);  // nothing is lost
}

TEST_CASE("a large block gathers the slabs primed for the slots, used or not", "[heap][core]") {
  host_heap heap{{15}, false};
  auto core = heap.core();
  REQUIRE(core.slots_in_use() == 1);
  std::uint32_t const first = core.take_fresh_slabs(num_groups);
  REQUIRE(first != no_slab);
  for (unsigned g = 0; g < num_groups; ++g) {
    core.prime(g, 0, first + g, 0);
  }
  // One group served a claim and had it freed: its slab is closed the long way, the seven
  // others, which no claim touched, are marked together.
  claim_result const got = core.claim(3, 0, 5, 0);
  REQUIRE(got.count == 5);
  free_claimed(core, got, 3);
  void* whole = core.allocate_large(15 * slab_bytes, 0);
  REQUIRE(whole != nullptr);
  for (unsigned g = 0; g < num_groups; ++g) {
    CHECK(!is_slab(slot_id(slot_word_of(heap.header(), g, 0))));
  }
  CHECK(heap.blocks_in_use() == 1);  // the large block, counted once
  core.free_one(whole, 0);
  CHECK(heap.blocks_in_use() == 0);
  CHECK(core.claim(0, 0, 32, 0).count == 32);  // the slots take slabs again
}

TEST_CASE("a full heap finds the slabs emptied anywhere in its bitmaps", "[heap][core]") {
  host_heap heap{{70, 200}, false};  // bitmaps of 2 and 4 words
  auto core = heap.core();
  unsigned const cls = num_classes - 1;  // 512 KiB blocks, 2 per slab
  std::vector<void*> blocks;
  for (;;) {
    claim_result const got = core.claim(cls, 0, 1, 0);
    if (got.count == 0) {
      break;
    }
    blocks.push_back(got.first);
  }
  REQUIRE(blocks.size() == 2 * heap.total_slabs());
  // Free the blocks of two slabs deep in the second arena, far from any cursor, and of one in
  // the first arena: one word with two marks (the second mark leaves the summary as it is).
  std::uint32_t const wanted[] = {make_slab_id(1, 170), make_slab_id(1, 171), make_slab_id(0, 3)};
  std::vector<void*> again;
  for (void* p : blocks) {
    std::uint32_t id = 0;
    std::size_t offset = 0;
    REQUIRE(core.locate(p, id, offset));
    if (std::find(std::begin(wanted), std::end(wanted), id) != std::end(wanted)) {
      core.free_one(p, 0);
      again.push_back(p);
    }
  }
  REQUIRE(again.size() == 6);
  CHECK(heap.blocks_in_use() == blocks.size() - 6);
  auto const& arena = heap.header().arenas[1];
  CHECK(arena.empty_bits[empty_word_index(empty_bitmap_words(arena.slabs))] ==
        1u << 2);  // summary: word 2
  std::vector<void*> got_back;
  for (int i = 0; i < 6; ++i) {  // from any slot: the slabs are found, formatted, handed out
    claim_result const got = core.claim(cls, 3, 1, 77);
    REQUIRE(got.count == 1);
    got_back.push_back(got.first);
  }
  CHECK(core.claim(cls, 3, 1, 77).count == 0);
  std::sort(again.begin(), again.end());
  std::sort(got_back.begin(), got_back.end());
  CHECK(got_back == again);
}

TEST_CASE("a search takes a whole word of empty slabs and keeps the rest on its stack",
          "[heap][core]") {
  host_heap heap{{70}, false};
  auto core = heap.core();
  unsigned const cls = num_classes - 1;  // 512 KiB blocks, 2 per slab
  std::vector<void*> blocks;
  for (claim_result got = core.claim(cls, 0, 1, 0); got.count != 0;
       got = core.claim(cls, 0, 1, 0)) {
    blocks.push_back(got.first);
  }
  REQUIRE(blocks.size() == 140);
  for (void* p : blocks) {
    core.free_one(p, 0);
  }
  auto const& h = heap.header();
  CHECK(h.arenas[0].empty_bits[0] == ~std::uint64_t{0});
  CHECK(h.arenas[0].empty_bits[empty_word_index(1)] == (std::uint64_t{1} << 6) - 1);
  CHECK(heap.blocks_in_use() == 0);
  // One search through another slot (and SM): it takes word 0 whole, keeps one slab and puts the
  // other 63 on its SM's stack.
  std::vector<void*> again{core.claim(cls, 1, 1, 5).first};
  REQUIRE(again.front() != nullptr);
  CHECK(h.arenas[0].empty_bits[0] == 0);
  CHECK(static_cast<std::uint32_t>(h.free_slabs[5].value) != no_slab);
  for (claim_result got = core.claim(cls, 1, 1, 5); got.count != 0;
       got = core.claim(cls, 1, 1, 5)) {
    again.push_back(got.first);
  }
  CHECK(again.size() == 140);  // every slab came back, none twice
  std::sort(again.begin(), again.end());
  CHECK(std::adjacent_find(again.begin(), again.end()) == again.end());
  CHECK(h.frontier[0] >= 70);  // a search for one slab past the end moves it on, takes nothing
}

TEST_CASE("a freed large block goes back on a stack, not into the bitmap", "[heap][core]") {
  host_heap heap{{8}, false};
  auto core = heap.core();
  void* runs[2] = {core.allocate_large(4 * slab_bytes, 0), core.allocate_large(4 * slab_bytes, 0)};
  REQUIRE(runs[0] != nullptr);
  REQUIRE(runs[1] != nullptr);
  CHECK(core.allocate_large(slab_bytes + 1, 0) == nullptr);
  // What a kernel's free does with any block: give one back to the slab that holds it.
  std::uint32_t id = 0;
  std::size_t offset = 0;
  REQUIRE(core.locate(runs[0], id, offset));
  core.free_blocks(id, 1, 0, core.arena(0));
  CHECK(heap.blocks_in_use() == 1);
  CHECK(heap.header().arenas[0].empty_bits[0] == 0);
  // A search for one slab cuts it from the run; the other three slabs serve again.
  claim_result const got = core.claim(0, 0, 1, 0);
  REQUIRE(got.count == 1);
  CHECK(got.first == runs[0]);
  for (int i = 0; i < 3; ++i) {
    void* p = core.allocate_large(slab_bytes, 0);
    REQUIRE(p != nullptr);
    CHECK(p > runs[0]);
    CHECK(static_cast<std::byte*>(p) < static_cast<std::byte*>(runs[0]) + 4 * slab_bytes);
  }
  CHECK(core.allocate_large(slab_bytes, 0) == nullptr);
  CHECK(heap.blocks_in_use() == 5);
}

TEST_CASE("checked heaps count invalid and double frees and lose nothing", "[heap][core]") {
  host_heap heap{{4}, true};
  auto core = heap.core();
  claim_result const got = core.claim(2, 0, 2, 0);  // two 64-byte blocks
  REQUIRE(got.count == 2);
  for (std::uint32_t i = 0; i < got.count; ++i) {
    std::uint32_t id = 0;
    std::size_t offset = 0;
    REQUIRE(core.locate(got.first + 64 * i, id, offset));
    core.mark_allocated(id, offset, 2);
  }
  int outside = 0;
  core.free_one(&outside, 0);            // not in the heap
  core.free_one(got.first + 8, 0);       // inside a block, not at its start
  core.free_one(got.first + 64 * 5, 0);  // a block never handed out
  core.free_one(got.first, 0);
  core.free_one(got.first, 0);  // double
  CHECK(heap.header().counters.invalid_frees == 3);
  CHECK(heap.header().counters.double_frees == 1);
  CHECK(heap.blocks_in_use() == 1);
  void* large = core.allocate_large(3 * slab_bytes, 0);
  REQUIRE(large != nullptr);
  core.free_one(large, 0);
  core.free_one(large, 0);
  CHECK(heap.header().counters.double_frees == 2);
  core.free_one(got.first + 64, 0);
  CHECK(heap.blocks_in_use() == 0);
}

TEST_CASE("checked heaps find each block's class in their bitmaps, whatever size a free says",
          "[heap][core]") {
  host_heap heap{{4}, true};
  auto core = heap.core();
  unsigned const g = 1;  // 64 B and 128 B blocks, from the two ends of one slab
  pair_claim const got = core.claim_pair(g, 0, 3 | 2 << 16, 0, core.arena(0));
  REQUIRE(got.small_count() == 3);
  REQUIRE(got.large_count() == 2);
  std::vector<std::pair<std::byte*, unsigned>> blocks;
  for (std::uint32_t i = 0; i < 3; ++i) {
    blocks.emplace_back(got.small_block(i, 6), 2);
  }
  for (std::uint32_t i = 0; i < 2; ++i) {
    blocks.emplace_back(got.large_block(i, 7), 3);
  }
  for (auto const& [p, cls] : blocks) {
    std::uint32_t id = 0;
    std::size_t offset = 0;
    REQUIRE(core.locate(p, id, offset));
    core.mark_allocated(id, offset, cls);
  }
  // The middle of a large block starts at a unit, but no block starts there.
  core.free_one(got.large_block(0, 7) + 64, 0, 128);
  CHECK(heap.header().counters.invalid_frees == 1);
  // Frees that pass the other class's size (or none) still give back the right class.
  for (auto const& [p, cls] : blocks) {
    core.free_one(p, 0, cls == 2 ? 128 : 64);
  }
  CHECK(heap.header().counters.invalid_frees == 1);
  CHECK(heap.header().counters.double_frees == 0);
  CHECK(heap.blocks_in_use() == 0);
  core.free_one(blocks[0].first, 0, 64);  // and a second free of one is a double free
  CHECK(heap.header().counters.double_frees == 1);
  CHECK(heap.blocks_in_use() == 0);
}

TEST_CASE("checked heaps reject frees into slabs not handed out since a reset", "[heap][core]") {
  // What a reset leaves behind: slab 2, past the frontier, with the metadata of a slab of 64-byte
  // blocks that handed out 5 and the bit of its first block set.
  host_heap heap{{4}, true};
  auto core = heap.core();
  REQUIRE(core.claim(2, 0, 1, 0).count == 1);  // slab 0 is handed out; the frontier is at 1
  REQUIRE(heap.header().frontier[0] == 1);
  std::uint32_t const stale = make_slab_id(0, 2);
  slab_meta& m = heap.header().arenas[0].meta[2];
  m.state = make_state(group_of(2), make_fronts(5, 0));
  m.remaining = 1;  // the free would empty it, were it trusted
  core.check_bits(stale)[0] = 1;
  core.free_one(core.data(stale), 0);
  CHECK(heap.header().counters.invalid_frees == 1);
  CHECK(heap.header().counters.double_frees == 0);
  CHECK(m.remaining == 1);
  CHECK(core.check_bits(stale)[0] == 1);
  CHECK(heap.header().arenas[0].empty_bits[0] == 0);  // not marked empty
}

namespace {

/// Each thread claims groups of blocks (like a warp's aggregated claim) of random classes, large
/// blocks of up to `large_slabs` slabs one time in `large_one_in`, tags them and frees random
/// ones; returns the number of failures seen.
void churn(host_heap& heap,
           granule_table& granules,
           unsigned thread,
           int operations,
           std::atomic<int>& errors,
           std::atomic<std::uint64_t>& handed_out,
           unsigned large_one_in,
           unsigned large_slabs) {
  auto core = heap.core();
  std::mt19937 random{thread * 7919u + 1};
  std::vector<std::pair<live_block, std::size_t>> live;
  auto give_back = [&](std::size_t i) {
    auto [block, bytes] = live[i];
    if (!tags_intact(block) || !granules.give(block.first)) {
      ++errors;
    }
    // Freed "on another SM": recycled slabs land wherever the free happened; with its size, as
    // slab_ref frees, or without, as bulk frees do.
    core.free_one(block.first, random() % 256, random() % 2 == 0 ? bytes : 0);
    live[i] = live.back();
    live.pop_back();
  };
  std::uint32_t tag = thread << 24;
  // Two threads to a slot, as the warps of an SM share its slot: claims race on one slot word
  // however many cores the machine has (a thread to a slot would race only on the stacks).
  unsigned const slot = (thread / 2) % (heap.header().slot_mask + 1);
  for (int op = 0; op < operations; ++op) {
    if (live.size() > 400 || (!live.empty() && random() % 100 < 45)) {
      give_back(random() % live.size());
      continue;
    }
    if (random() % large_one_in == 0) {
      std::size_t const bytes = max_small_bytes + 1 + random() % ((large_slabs - 1) * slab_bytes);
      void* p = core.allocate_large(bytes, thread);
      if (p != nullptr) {
        if (!granules.take(p)) {
          ++errors;
        }
        live.emplace_back(tag_block(p, bytes, ++tag), bytes);
        ++handed_out;
      }
      continue;
    }
    if (random() % 2 == 0) {
      // Both classes of a group at once, as a warp of mixed sizes claims them (16 B .. 8 KiB).
      unsigned const g = random() % 5;
      std::uint32_t small = random() % 17;
      std::uint32_t large = small == 0 ? 1 + random() % 16 : random() % 17;
      std::size_t const unit = std::size_t{1} << unit_shift(g);
      while (small + large > 0) {
        pair_claim const got = core.claim_pair(g, slot, small | large << 16, thread, core.arena(0));
        if (got.small_count() + got.large_count() == 0) {
          break;
        }
        for (std::uint32_t i = 0; i < got.small_count() + got.large_count(); ++i) {
          bool const is_large = i >= got.small_count();
          std::size_t const bytes = is_large ? 2 * unit : unit;
          void* p = is_large ? got.large_block(i - got.small_count(), unit_shift(g) + 1)
                             : got.small_block(i, unit_shift(g));
          if (!granules.take(p)) {
            ++errors;
          }
          live.emplace_back(tag_block(p, bytes, ++tag), bytes);
        }
        handed_out += got.small_count() + got.large_count();
        small -= got.small_count();
        large -= got.large_count();
      }
      continue;
    }
    unsigned const cls = random() % 9;  // 16 B .. 4 KiB, like the benchmark's mixed sizes
    std::uint32_t want = 1 + random() % 32;
    while (want > 0) {
      claim_result const got = core.claim(cls, slot, want, thread);
      if (got.count == 0) {
        break;  // out of memory: a legal answer, the live set shrinks next
      }
      for (std::uint32_t i = 0; i < got.count; ++i) {
        void* p = got.first + i * block_size(cls);
        if (!granules.take(p)) {
          ++errors;
        }
        live.emplace_back(tag_block(p, block_size(cls), ++tag), block_size(cls));
      }
      handed_out += got.count;
      want -= got.count;
    }
  }
  while (!live.empty()) {
    give_back(live.size() - 1);
  }
}

/// What the threads of run_churn saw: blocks handed out twice or overwritten, blocks handed out.
struct churn_totals {
  int errors;
  std::uint64_t handed_out;
};

/// Runs churn on max(8, cores) threads at once over one heap and waits for them.
churn_totals run_churn(host_heap& heap,
                       int operations,
                       unsigned large_one_in,
                       unsigned large_slabs) {
  unsigned const threads = std::max(8u, std::thread::hardware_concurrency());
  granule_table granules{heap};
  std::atomic<int> errors{0};
  std::atomic<std::uint64_t> handed_out{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back(churn, std::ref(heap), std::ref(granules), t, operations, std::ref(errors),
                      std::ref(handed_out), large_one_in, large_slabs);
  }
  for (auto& t : pool) {
    t.join();
  }
  return {errors.load(), handed_out.load()};
}

}  // namespace

TEST_CASE("many threads churning blocks never share one, and every block comes back",
          "[heap][core][threads]") {
  // Small enough that slabs must be recycled many times over, and that threads run out now and
  // then; two arenas, so that lookups and fresh slabs cross arena boundaries.
  host_heap heap{{160, 96}, false};
  auto const [errors, handed_out] = run_churn(heap, 400000, 512, 4);
  CHECK(errors == 0);
  CHECK(heap.blocks_in_use() == 0);
  CHECK(heap.header().counters.invalid_frees == 0);
  // Far more blocks than the heap can hold at once went through it: slabs were recycled.
  std::uint64_t const capacity_in_small_blocks = heap.total_slabs() * class_capacity(8);
  CHECK(handed_out > 4 * capacity_in_small_blocks);
  // Every slab is free again: allocated one by one, they all come back...
  auto core = heap.core();
  std::vector<void*> runs;
  for (void* p; (p = core.allocate_large(slab_bytes, 0)) != nullptr;) {
    runs.push_back(p);
  }
  // ...and, slab by slab, every slab of the heap is free (none is stuck in a slot or lost). A
  // slot holds its slab while the slab has room; a slot whose slab's fronts met exactly (the
  // last claim got all it wanted, and nobody claimed after it) still names that slab, which is
  // free once its blocks come back, and may be one of the runs.
  std::uint64_t held_by_slots = 0;
  for (unsigned g = 0; g < num_groups; ++g) {
    for (unsigned slot = 0; slot < max_slots; ++slot) {
      std::uint64_t const w = slot_word_of(heap.header(), g, slot);
      held_by_slots += is_slab(slot_id(w)) && unit_count(w) < group_units(g) ? 1 : 0;
    }
  }
  CHECK(runs.size() + held_by_slots >= heap.total_slabs() - num_groups);
  CHECK(runs.size() + held_by_slots <= heap.total_slabs());
}

TEST_CASE("threads churning a primed heap take other groups' unused slabs, never a block twice",
          "[heap][core][threads]") {
  // A heap of 12 slabs with 8 of them primed: the threads run out of fresh slabs at once, and
  // their installs take the slabs primed for the groups they do not use (5 and up), racing with
  // each other and with the claims of the slot.
  host_heap heap{{12}, false};
  auto core = heap.core();
  std::uint32_t const slots = core.slots_in_use();
  std::uint32_t const first = core.take_fresh_slabs(num_groups * slots);
  REQUIRE(first != no_slab);
  for (std::uint32_t i = 0; i < num_groups * slots; ++i) {
    core.prime(i / slots, i % slots, first + i, i % slots);
  }
  auto const [errors, handed_out] = run_churn(heap, 200000, 1024, 2);
  CHECK(errors == 0);
  CHECK(heap.blocks_in_use() == 0);
  CHECK(heap.header().counters.invalid_frees == 0);
  CHECK(handed_out > 12 * std::uint64_t{class_capacity(8)});
  // What the churn left primed goes to the last class that asks.
  std::vector<claim_result> taken;
  for (claim_result got = core.claim(8, 0, 32, 0); got.count != 0; got = core.claim(8, 0, 32, 0)) {
    taken.push_back(got);
  }
  for (unsigned g = 5; g < num_groups; ++g) {
    for (std::uint32_t slot = 0; slot < slots; ++slot) {
      CHECK(!is_slab(slot_id(slot_word_of(heap.header(), g, slot))));
    }
  }
  CHECK(heap.header().idle_slots.value == 0);
  free_claimed(core, taken, 8);
  CHECK(heap.blocks_in_use() == 0);
  CHECK(core.allocate_large(12 * slab_bytes, 0) != nullptr);  // every slab came back
}

TEST_CASE("threads churning a heap primed with spares never hand a block out twice",
          "[heap][core][threads]") {
  // 4 slots with a primed slab and a spare each per group: 64 of the 160 slabs. The threads'
  // installs take the spares as they use the primed slabs up, racing with each other, with the
  // claims of their slots and, once the fresh slabs are gone, with the searches that give the
  // spares of idle groups back.
  host_heap heap{{160}, false};
  heap.header().slot_mask = 3;
  auto core = heap.core();
  REQUIRE(prime_like_kernel(core) == 4 * num_groups);
  auto const [errors, handed_out] = run_churn(heap, 200000, 64, 4);
  CHECK(errors == 0);
  CHECK(heap.blocks_in_use() == 0);
  CHECK(heap.header().counters.invalid_frees == 0);
  CHECK(handed_out > 160 * std::uint64_t{class_capacity(8)});
  for (unsigned slot = 0; slot < 4; ++slot) {
    for (unsigned g = 0; g < 5; ++g) {  // the groups that the churn claims
      CHECK(spare_word_of(heap.header(), g, slot) == no_slab);
    }
  }
  CHECK(core.allocate_large(160 * slab_bytes, 0) != nullptr);  // every slab came back
}

TEST_CASE("large blocks among small ones find runs gathered from emptied slabs and freed pieces",
          "[heap][core][threads]") {
  // Large blocks of up to 8 slabs ask for more than the heap holds, small ones keep emptying
  // slabs: once the fresh slabs are gone, long runs come only from merged free slabs.
  host_heap heap{{72, 40}, false};
  CHECK(run_churn(heap, 100000, 8, 8).errors == 0);
  CHECK(heap.blocks_in_use() == 0);
  // Every slab is free again, none is lost, and free slabs merge: each arena is one run (the
  // slabs that slots hold are given up for it).
  auto core = heap.core();
  CHECK(core.allocate_large(72 * slab_bytes, 0) != nullptr);
  CHECK(core.allocate_large(40 * slab_bytes, 0) != nullptr);
  CHECK(core.allocate_large(slab_bytes, 0) == nullptr);
}

namespace {

/// Slot 0 of the group of 256 B blocks (its small class) in a heap of `Slabs` slabs, for the
/// tests that set the slot word by hand.
template <std::uint64_t Slabs>
struct one_slot {
  static constexpr unsigned cls = 4;  // 256 B blocks
  host_heap heap{{Slabs}, false};
  heap_core core = heap.core();
  std::uint32_t const capacity = class_capacity(cls);
  std::uint64_t& slot = class_slot(heap, cls, 0);
};

/// one_slot<4> for frees that do not know their block's size: its class's group, and the slab
/// that holds a block.
struct sizeless_slot : one_slot<4> {
  unsigned const g = group_of(cls);
  std::uint32_t const units = group_units(g);
  unsigned const shift = unit_shift(g);

  /// The metadata of the slab that holds `p`, whose id goes to `id`.
  slab_meta const& slab_of(void const* p, std::uint32_t& id) const {
    std::size_t offset = 0;
    REQUIRE(core.locate(p, id, offset));
    return heap.header().arenas[0].meta[index_of(id)];
  }
};

}  // namespace

TEST_CASE_METHOD(one_slot<4>,
                 "a claim whose slot's installer stalls takes the installation over",
                 "[heap][core]") {
  // The first claim on the empty slot found it vacant, so it installs, and it stalls there
  // (descheduled, never back).
  slot = make_slot(empty_id, 1);
  claim_result const got = core.claim(cls, 0, 3, 0);  // waits a little, then installs itself
  REQUIRE(got.count == 3);
  CHECK(is_slab(slot_id(slot)));
  CHECK(small_count(slot) == 3);
  std::uint32_t id = 0;
  std::size_t offset = 0;
  REQUIRE(core.locate(got.first, id, offset));
  CHECK(slot_id(slot) == id);
  CHECK(heap.blocks_in_use() == 3);
  // A claim takes the slab's last blocks, wants one more, and stalls before it installs the
  // next: the slot keeps the used-up slab, counted past its capacity, and the claims behind
  // wait, then one takes over. (Had it wanted no more, the next claim would install at once.)
  std::uint64_t const last = cuda::atomic_ref<std::uint64_t>{slot}.fetch_add(capacity - 3 + 1);
  REQUIRE(last == make_slot(id, 3));
  REQUIRE(small_count(slot) == capacity + 1);
  core.end_claims(id, group_of(cls), make_fronts(capacity, 0), 0);  // as its claim does first
  claim_result const next = core.claim(cls, 0, 2, 0);
  REQUIRE(next.count == 2);
  std::uint32_t next_id = 0;
  REQUIRE(core.locate(next.first, next_id, offset));
  CHECK(next_id != id);
  CHECK(slot == make_slot(next_id, 2));
  CHECK(heap.blocks_in_use() == capacity + 2);
  for (std::uint32_t i = 0; i < capacity; ++i) {  // the first slab: 3 blocks, then the rest
    core.free_one(got.first + i * class_bytes(cls), 0);
  }
  for (std::uint32_t i = 0; i < 2; ++i) {
    core.free_one(next.first + i * class_bytes(cls), 0);
  }
  CHECK(heap.blocks_in_use() == 0);
  CHECK(heap.header().arenas[0].empty_bits[0] == std::uint64_t{1} << index_of(id));
  CHECK(heap.header().counters.invalid_frees == 0);
}

TEST_CASE_METHOD(one_slot<1>,
                 "the first claim on a vacant slot installs; one that finds no slab leaves it "
                 "vacant",
                 "[heap][core]") {
  REQUIRE(is_vacant(slot));
  claim_result const got = core.claim(cls, 0, capacity, 0);  // all but one: see install
  REQUIRE(got.count == capacity - 1);
  std::uint32_t id = 0;
  std::size_t offset = 0;
  REQUIRE(core.locate(got.first, id, offset));
  CHECK(slot == make_slot(id, capacity - 1));
  // The last block uses the slab up; its claim installs, finds no slab (the heap has one), and
  // leaves the slot vacant under the next installing id, so that waiters claim again.
  claim_result const last = core.claim(cls, 0, 2, 0);
  CHECK(last.count == 1);
  CHECK(is_vacant(slot));
  CHECK(slot_id(slot) == installing_last);
  CHECK(core.claim(cls, 0, 1, 0).count == 0);  // the next claim searches in its turn, in vain
  CHECK(is_vacant(slot));
  CHECK(slot_id(slot) == installing_last - 1);
  for (std::uint32_t i = 0; i < capacity; ++i) {
    core.free_one(got.first + i * class_bytes(cls), 0);
  }
  CHECK(heap.blocks_in_use() == 0);
  claim_result const again = core.claim(cls, 0, 5, 0);  // the first claim installs the slab
  REQUIRE(again.count == 5);
  CHECK(again.first == got.first);
  CHECK(slot == make_slot(id, 5));
}

TEST_CASE_METHOD(one_slot<4>,
                 "a stalled installer's late slab replaces the one of the waiter that took over, "
                 "which is closed",
                 "[heap][core]") {
  slot = make_slot(installing_last, 1);               // an installer that took over stalls...
  claim_result const got = core.claim(cls, 0, 3, 0);  // ...a waiter takes over
  REQUIRE(got.count == 3);
  std::uint32_t taker = 0;
  std::size_t offset = 0;
  REQUIRE(core.locate(got.first, taker, offset));
  // The stalled installer comes back and publishes its own slab over the taker's, which has
  // handed out 3 blocks: it is closed with that count, its other blocks given back.
  pair_claim const late = core.install(group_of(cls), 0, 1, 0, core.arena(0));
  REQUIRE(late.small_count() == 1);
  std::uint32_t installer = 0;
  REQUIRE(core.locate(late.small_block(0, cls + min_block_shift), installer, offset));
  CHECK(installer != taker);
  CHECK(slot == make_slot(installer, 1));
  CHECK(heap.blocks_in_use() == 4);
  std::uint64_t const& empty = heap.header().arenas[0].empty_bits[0];
  for (std::uint32_t i = 0; i < 3; ++i) {
    CHECK(empty == 0);  // the taker's slab still holds blocks
    core.free_one(got.first + i * class_bytes(cls), 0);
  }
  CHECK(empty == std::uint64_t{1} << index_of(taker));  // closed: its last free empties it
  core.free_one(late.small_block(0, cls + min_block_shift), 0);
  CHECK(heap.blocks_in_use() == 0);
  CHECK(small_count(slot) < capacity);
}

TEST_CASE_METHOD(sizeless_slot,
                 "a free that does not know its block's class while its slab's fronts meet leaves "
                 "it to the claim that made them meet",
                 "[heap][core]") {
  pair_claim const got = core.claim_pair(g, 0, 3 | 2u << 16, 0, core.arena(0));
  REQUIRE(got.small_count() == 3);
  REQUIRE(got.large_count() == 2);
  std::uint32_t id = 0;
  slab_meta const& m = slab_of(got.small_block(0, shift), id);
  core.free_one(got.small_block(2, shift), 0, std::size_t{1} << shift);  // with its size
  // A claim for every unit left and one more adds to the slot and stalls before it records the
  // fronts: the slot's counts are past the slab's units, so nothing tells the blocks' classes.
  std::uint32_t const rest = units - 3 - 2 * 2;
  std::uint64_t const seen = cuda::atomic_ref<std::uint64_t>{slot}.fetch_add(rest + 1);
  REQUIRE(seen == make_slot(id, 3, 2));
  // Statistics count every unit not freed as in use meanwhile.
  CHECK(heap.blocks_in_use() == units - 1);
  // Bulk frees of a small block and a large one return at once, and wait on the slab's state.
  core.free_one(got.small_block(1, shift), 0);
  core.free_one(got.large_block(0, shift + 1), 0);
  CHECK(remaining_units(m.remaining) == units - 1);
  CHECK(pending_top(m.state) == (units - 4) + 1);  // on top: the last free's, the lower large
  CHECK(open_slot(state_fields(m.state)) == 0);
  // The claim goes on: it records the fronts, and frees the two pending blocks by their class.
  claim_end end = claim_end::none;
  pair_claim const last = core.take_blocks(seen, rest + 1, g, end, core.arena(0));
  CHECK(end == claim_end::wants_more);
  CHECK(last.small_count() == rest);
  CHECK(m.state == make_state(g, make_fronts(3 + rest, 2)));
  CHECK(remaining_units(m.remaining) == units - 4);
  CHECK(large_freed(m.remaining) == 1);
  CHECK(heap.blocks_in_use() == 3 + rest - 2 + 1);
  // Every other block, freed without its size too, empties the slab.
  core.free_one(got.small_block(0, shift), 0);
  core.free_one(got.large_block(1, shift + 1), 0);
  for (std::uint32_t i = 0; i < rest; ++i) {
    core.free_one(last.small_block(i, shift), 0);
  }
  CHECK(remaining_units(m.remaining) == 0);
  CHECK(heap.header().arenas[0].empty_bits[0] == std::uint64_t{1} << index_of(id));
  CHECK(heap.header().counters.invalid_frees == 0);
}

TEST_CASE_METHOD(sizeless_slot,
                 "a free that does not know its block's class while its slab leaves its slot "
                 "leaves it to the close",
                 "[heap][core]") {
  pair_claim const got = core.claim_pair(g, 0, 3 | 1u << 16, 0, core.arena(0));
  REQUIRE(got.counts == (3 | 1u << 16));
  std::uint32_t id = 0;
  slab_meta const& m = slab_of(got.small_block(0, shift), id);
  // Another installer swaps the slab out of its slot and stalls before it closes it.
  std::uint64_t const old =
      cuda::atomic_ref<std::uint64_t>{slot}.exchange(make_slot(installing_last, 1));
  REQUIRE(old == make_slot(id, 3, 1));
  core.free_one(got.large_block(0, shift + 1), 0);
  core.free_one(got.small_block(2, shift), 0);
  core.free_one(got.small_block(0, shift), 0);
  CHECK(remaining_units(m.remaining) == units);
  CHECK(pending_top(m.state) == 1);  // the last free's block: the slab's first
  // The close records the fronts, frees the pending blocks and gives back the unclaimed units.
  core.close(old, g);
  CHECK(m.state == make_state(g, make_fronts(3, 1)));
  CHECK(remaining_units(m.remaining) == 1);
  CHECK(large_freed(m.remaining) == 1);
  CHECK(heap.header().arenas[0].empty_bits[0] == 0);
  core.free_one(got.small_block(1, shift), 0);
  CHECK(remaining_units(m.remaining) == 0);
  CHECK(heap.header().arenas[0].empty_bits[0] == std::uint64_t{1} << index_of(id));
}

TEST_CASE("installers that stall and waiters that take over never hand a block out twice",
          "[heap][core][threads]") {
  // Many more threads than cores on one slot of a group with 16 units per slab (64 KiB and
  // 128 KiB blocks, claimed alike): installers get descheduled, waiters give up (after 4 yields
  // on the host) and take the installation over, and a stalled installer's late publication
  // replaces, and closes, the slab of the one that took over.
  unsigned const threads = 16;
  host_heap heap{{48}, false};
  granule_table granules{heap};
  std::atomic<int> errors{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto core = heap.core();
      std::mt19937 random{t};
      std::vector<live_block> live;
      for (int op = 0; op < 20000; ++op) {
        if (!live.empty() && (live.size() > 6 || random() % 2 == 0)) {
          std::size_t const i = random() % live.size();
          if (!tags_intact(live[i]) || !granules.give(live[i].first)) {
            ++errors;
          }
          core.free_one(live[i].first, t);
          live[i] = live.back();
          live.pop_back();
          continue;
        }
        unsigned const cls = num_classes - 4 + random() % 2;
        claim_result const got = core.claim(cls, t % 2, 1 + random() % 3, t);
        for (std::uint32_t i = 0; i < got.count; ++i) {
          void* p = got.first + i * class_bytes(cls);
          if (!granules.take(p)) {
            ++errors;
          }
          live.push_back(tag_block(p, class_bytes(cls), t << 20 | op));
        }
      }
      for (auto const& b : live) {
        if (!tags_intact(b) || !granules.give(b.first)) {
          ++errors;
        }
        core.free_one(b.first, t);
      }
    });
  }
  for (auto& t : pool) {
    t.join();
  }
  CHECK(errors == 0);
  CHECK(heap.blocks_in_use() == 0);
}

TEST_CASE("a run gathered from slabs that frees emptied comes after every write to their blocks",
          "[heap][core][threads]") {
  // Writers take every block of a small heap, then write all over their blocks and free them,
  // while a gatherer asks again and again for one block as large as the heap: it gets it once
  // the last free has marked the last slab, and writes all of it. The marks of emptied slabs
  // carry no release (heap_core::mark_empty): only the gather's clearing of every slab's count
  // orders the writers' writes before the gatherer's. Under ThreadSanitizer (DEVMR_TSAN) the
  // gatherer's writes race with the writers' without it; everywhere, a writer's byte found in
  // the run after all threads are done fails the test.
  constexpr std::uint64_t slabs = 8;
  constexpr unsigned cls = 6;  // 1 KiB blocks
  constexpr unsigned writers = 4;
  host_heap heap{{slabs}, false};
  auto core = heap.core();
  std::atomic<unsigned> claimed{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < writers; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::byte*> blocks;
      for (;;) {
        claim_result const got = core.claim(cls, t % (heap.header().slot_mask + 1), 32, t);
        if (got.count == 0) {
          break;
        }
        for (std::uint32_t i = 0; i < got.count; ++i) {
          blocks.push_back(got.first + i * block_size(cls));
        }
      }
      // The gatherer waits for this, which orders the claims before its search, not the writes.
      claimed.fetch_add(1, std::memory_order_release);
      for (std::byte* b : blocks) {
        fill_words(b, block_size(cls), 0x1111111111111111u * (t + 1));
        core.free_one(b, t);
      }
    });
  }
  std::byte* run = nullptr;
  threads.emplace_back([&] {
    while (claimed.load(std::memory_order_acquire) != writers) {
      std::this_thread::yield();
    }
    auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (run == nullptr && std::chrono::steady_clock::now() < deadline) {
      run = static_cast<std::byte*>(core.allocate_large(slabs * slab_bytes, 0));
    }
    if (run != nullptr) {
      fill_words(run, slabs * slab_bytes, 0x5a5a5a5a5a5a5a5au);
    }
  });
  for (auto& t : threads) {
    t.join();
  }
  REQUIRE(run != nullptr);
  CHECK(
      std::all_of(run, run + slabs * slab_bytes, [](std::byte b) { return b == std::byte{0x5a}; }));
  CHECK(heap.blocks_in_use() == 1);
  core.free_one(run, 0);
  CHECK(heap.blocks_in_use() == 0);
}

TEST_CASE("a run being split is not reported missing: a heap's worth of runs all succeed",
          "[heap][core][threads]") {
  for (int round = 0; round < 50; ++round) {
    host_heap heap{{64}, false};
    auto core = heap.core();
    void* whole = core.allocate_large(64 * slab_bytes, 0);
    REQUIRE(whole != nullptr);
    core.free_one(whole, 0);  // one free run of 64 slabs: every request below splits it
    std::atomic<int> failures{0};
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < 8; ++t) {
      pool.emplace_back([&, t] {
        for (int i = 0; i < 4; ++i) {  // 8 threads x 4 runs x 2 slabs: exactly the heap
          if (core.allocate_large(2 * slab_bytes, t) == nullptr) {
            ++failures;
          }
        }
      });
    }
    for (auto& t : pool) {
      t.join();
    }
    REQUIRE(failures == 0);
    CHECK(core.allocate_large(slab_bytes, 0) == nullptr);  // and then the heap is full
  }
}

TEST_CASE("many threads cutting runs from one long free run all find memory",
          "[heap][core][threads]") {
  for (int round = 0; round < 20; ++round) {
    host_heap heap{{600}, false};
    auto core = heap.core();
    void* whole = core.allocate_large(600 * slab_bytes, 0);
    REQUIRE(whole != nullptr);
    core.free_one(whole, 0);  // one run: every thread must cut from it (or from its pieces)
    std::atomic<int> failures{0};
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < 16; ++t) {
      pool.emplace_back([&, t] {
        for (int i = 0; i < 12; ++i) {  // 16 x 12 x 3 = 576 of 600 slabs
          if (core.allocate_large(3 * slab_bytes, t) == nullptr) {
            ++failures;
          }
        }
      });
    }
    for (auto& t : pool) {
      t.join();
    }
    REQUIRE(failures == 0);
  }
}
