// The slots of the size classes (class_slots.hpp) over a set of small slabs in host memory, driven
// from std::threads: claims, installs, renewals, closes and the reuse of listed slabs. Every block
// is owned through a table (an exchange from "nobody" to its owner), so a block handed out twice
// fails the test at once; tags at both ends catch a block written by two owners.

#include "../slab_stack.hpp"
#include "supply_fixture.hpp"
#include "test_slabs.hpp"
#include "tsan.hpp"

#include <devmr/detail/heap/block_bitmap.hpp>
#include <devmr/detail/heap/class_slots.hpp>
#include <devmr/detail/heap/slab_avail.hpp>
#include <devmr/detail/heap/slab_set.hpp>
#include <devmr/detail/heap/slab_supply.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace {

using namespace devmr::detail::heap;
using devmr_test::test_slab_memory;
using devmr_test::test_slabs;
using devmr_test::under_tsan;

// ---- class_slots over small slabs --------------------------------------------------------------

/// The Slabs policy of class_slots over the heap's slab supply: empty slabs come from it
/// (as the heap's take_run takes one: see devmr_test::take_one) and go back to it (marked in
/// their arena's bitmap, with the release that the supply's take acquires). Slab ids name arenas of
/// `per_arena` slabs; test_slab_memory holds them arena after arena.
struct supply_slabs {
  test_slab_memory* m;
  heap_header* header;
  std::uint32_t per_arena;

  slab_supply supply() const { return slab_supply{header}; }
  std::uint32_t dense(std::uint32_t id) const { return arena_of(id) * per_arena + index_of(id); }
  std::uint32_t id_of(std::uint32_t dense) const {
    return make_slab_id(dense / per_arena, dense % per_arena);
  }
  std::uint32_t blocks(unsigned c) const { return test_slab_memory::max_blocks >> c; }
  std::uint32_t& avail(std::uint32_t id) const { return m->avail[dense(id)]; }
  std::uint32_t* bits(std::uint32_t id) const {
    return &m->bits[std::size_t{dense(id)} * bitmap_words_for(test_slab_memory::max_blocks)];
  }
  std::uint32_t list_parts() const { return header->arena_count; }
  slab_set listed(unsigned c, std::uint32_t part) const {
    return {&m->listed[(c * list_parts() + part) * slab_set_words(per_arena)],
            bitmap_words_for(per_arena)};
  }
  slab_set below(unsigned c, std::uint32_t part) const {
    return listed(test_slab_memory::list_classes + c, part);
  }
  std::uint32_t member(std::uint32_t id) const { return index_of(id); }
  std::uint32_t part_of(std::uint32_t id) const { return arena_of(id); }
  std::uint32_t slab_of(std::uint32_t part, std::uint32_t member) const {
    return make_slab_id(part, member);
  }
  void format(std::uint32_t id, unsigned c) const { atomic(m->cls[dense(id)]).store(c, relaxed); }
  bool roomy() const { return m->roomy; }
  void count_out(std::uint32_t) const { m->out.fetch_add(1, std::memory_order_relaxed); }
  bool bump_fresh() const { return true; }
  std::uint64_t& in_flight() const { return m->in_flight; }
  std::uint64_t& moves() const { return m->moves; }
  std::uint32_t take_empty(unsigned hint) const {
    return devmr_test::take_one(supply(), *header, hint);
  }
  void give_empty(std::uint32_t id, unsigned) const {
    atomic(m->cls[dense(id)]).store(0xffu, relaxed);
    m->empties.fetch_add(1, std::memory_order_relaxed);
    m->out.fetch_sub(1, std::memory_order_relaxed);
    atomic(supply().meta(id).remaining).store(0, relaxed);  // what the taker's settle reads
    // release: the emptier's acquire of every free (slab_avail::settle) is passed on to the
    // search that takes the mark.
    supply().mark(arena_of(id), index_of(id) / 64, std::uint64_t{1} << (index_of(id) % 64),
                  release);
    // Counted back (take_one counted it out), so that a search that found nothing meanwhile
    // looks again.
    supply().count_given(arena_of(id), 1);
  }
};

constexpr unsigned test_classes = 4;

/// The engine over `Slabs`, with blocks owned through a table (keys: dense slab index << 10 |
/// block) and tagged at both ends.
template <class Slabs>
struct engine_heap {
  template <class... Policy>
  engine_heap(std::uint32_t slabs, unsigned slot_count, Policy... policy)
      : memory{slabs},
        words(std::size_t{slot_count} * test_classes, vacant_class_slot),
        slots{Slabs{&memory, policy...}, words.data(), test_classes, slot_count} {}

  std::uint32_t key_of(std::uint32_t id, std::uint32_t b) const {
    return slots.slabs().dense(id) * test_slab_memory::max_blocks + b;
  }

  std::byte* block(std::uint32_t id, unsigned c, std::uint32_t b) {
    return memory.data + (std::size_t{slots.slabs().dense(id)} << test_slab_memory::slab_shift) +
           (std::size_t{b} << (c + 4));
  }

  /// Claims up to `want` blocks of class `c` through `slot` for owner `who`: the block numbers
  /// (slab << 10 | block), checked against the owner table.
  std::uint32_t allocate(unsigned c,
                         unsigned slot,
                         std::uint32_t want,
                         std::uint32_t who,
                         std::vector<std::uint32_t>& out) {
    std::uint32_t served = 0;
    while (served < want) {
      block_claim const got = slots.claim(c, slot, want - served, slot);
      if (got.count == 0) {
        break;
      }
      hold(got, c, who, out);
      served += got.count;
    }
    return served;
  }

  /// Takes the blocks of claim `got` (class `c`) for owner `who`: each checked against the owner
  /// table, tagged at both ends, its key added to `out`.
  void hold(block_claim const& got,
            unsigned c,
            std::uint32_t who,
            std::vector<std::uint32_t>& out) {
    slots.take(got, c, [&](std::uint32_t b) {
      std::uint32_t const key = key_of(got.id, b);
      std::uint32_t const was = memory.owner[key].exchange(who, std::memory_order_relaxed);
      if (was != 0) {
        double_handouts.fetch_add(1, std::memory_order_relaxed);
      }
      std::byte* p = block(got.id, c, b);
      std::memcpy(p, &who, 4);
      std::memcpy(p + (std::size_t{16} << c) - 4, &who, 4);
      out.push_back(key);
    });
  }

  void free(unsigned c, std::uint32_t key, std::uint32_t who, unsigned hint) {
    std::uint32_t const id = slots.slabs().id_of(key / test_slab_memory::max_blocks);
    std::uint32_t const b = key % test_slab_memory::max_blocks;
    std::byte* p = block(id, c, b);
    std::uint32_t head = 0;
    std::uint32_t tail = 0;
    std::memcpy(&head, p, 4);
    std::memcpy(&tail, p + (std::size_t{16} << c) - 4, 4);
    if (head != who || tail != who ||
        memory.owner[key].exchange(0, std::memory_order_relaxed) != who) {
      bad_blocks.fetch_add(1, std::memory_order_relaxed);
    }
    slots.lists().free_block(id, c, b, hint);
  }

  /// Free blocks that no slot or claim holds, over every slab of a class: what the counts say.
  std::uint64_t counted_free_blocks() const {
    std::uint64_t n = 0;
    for (std::uint32_t id = 0; id < memory.slabs; ++id) {
      if (memory.cls[id] < test_classes) {
        n += memory.avail[id] & avail_count_mask;
      }
    }
    return n;
  }

  test_slab_memory memory;
  std::vector<std::uint64_t> words;
  class_slots<Slabs> slots;
  std::atomic<std::uint64_t> double_handouts{0};
  std::atomic<std::uint64_t> bad_blocks{0};
};

using test_heap = engine_heap<test_slabs>;

TEST_CASE("a slot hands out a fresh slab in order, then its freed blocks again", "[reuse][slots]") {
  test_heap heap{4, 1};
  std::vector<std::uint32_t> got;
  // Class 3: 128 blocks a slab. Four slabs: 512 blocks, then nothing.
  REQUIRE(heap.allocate(3, 0, 512, 1, got) == 512);
  std::vector<std::uint32_t> more;
  CHECK(heap.allocate(3, 0, 1, 1, more) == 0);
  // Free every other block of the first two slabs: 128 blocks, 64 a slab, past the threshold.
  // The slabs are closed (their slot moved on), so the frees list them.
  std::vector<std::uint32_t> kept;
  std::vector<std::uint32_t> freed;
  for (std::uint32_t key : got) {
    (key < 2 * 1024 && key % 2 == 0 ? freed : kept).push_back(key);
  }
  for (std::uint32_t key : freed) {
    heap.free(3, key, 1, 0);
  }
  CHECK(heap.counted_free_blocks() == 128);
  // The same blocks come back, every one once, and no more: each slab promises three quarters
  // of its 64 free blocks, then of the 16 left (listed again at the threshold, 16), and, with
  // nothing else left, the last 4, below the threshold (reclaim).
  std::vector<std::uint32_t> again;
  CHECK(heap.allocate(3, 0, 200, 2, again) == 2 * (48 + 12 + 4));
  std::sort(again.begin(), again.end());
  std::sort(freed.begin(), freed.end());
  CHECK(std::adjacent_find(again.begin(), again.end()) == again.end());
  CHECK(std::includes(freed.begin(), freed.end(), again.begin(), again.end()));
  CHECK(heap.double_handouts == 0);
  CHECK(heap.bad_blocks == 0);
}

TEST_CASE("a claim that its slot value says a fresh slab served in full got those blocks",
          "[reuse][slots]") {
  // The warp's fast path (class_ops.cuh) takes slot_serves_fresh's word for what a claim got:
  // every claim here, of 1 to 32 blocks of class 3 (128 a slab), checks it against claim_from,
  // across installs of fresh slabs, renewals and reused slabs (the blocks held are freed, every
  // other one or all, from time to time). The first five end one block past the first slab's
  // promise (32 + 32 + 32 + 31, then 2).
  test_heap heap{4, 1};
  std::vector<std::uint32_t> held;
  std::uint64_t fast = 0;
  std::uint64_t slow = 0;
  std::uint64_t reused = 0;
  constexpr std::uint32_t first_wants[] = {32, 32, 32, 31, 2};
  std::mt19937 rng{7};
  for (std::uint32_t round = 0; round < 3000; ++round) {
    std::uint32_t const want = round < 5 ? first_wants[round] : 1 + rng() % 32;
    std::uint64_t const seen = heap.slots.claim_add(3, 0, want);
    block_claim const got = heap.slots.claim_from(3, 0, want, 0, seen);
    if (slot_serves_fresh(seen, want)) {
      ++fast;
      CHECK(got.id == slot_id(seen));
      CHECK(got.first == slot_claimed(seen));
      CHECK(got.count == want);
      CHECK(got.fresh);
    } else {
      ++slow;
      reused += got.count != 0 && !got.fresh ? 1 : 0;
    }
    heap.hold(got, 3, 1, held);
    if (held.size() > 300) {
      // Every other block held, or (one time in three) all of them.
      bool const all = rng() % 3 == 0;
      std::vector<std::uint32_t> kept;
      for (std::size_t i = 0; i < held.size(); ++i) {
        if (all || i % 2 == 0) {
          heap.free(3, held[i], 1, 0);
        } else {
          kept.push_back(held[i]);
        }
      }
      held = kept;
    }
  }
  CHECK(fast > 0);
  CHECK(slow > 0);
  CHECK(reused > 0);
  CHECK(heap.bad_blocks == 0);
  CHECK(heap.double_handouts == 0);
}

TEST_CASE("a slot opens its used-up slab again, fresh, once every block of it is free",
          "[reuse][slots][renew]") {
  test_heap heap{4, 1};
  heap.memory.roomy = true;
  std::vector<std::uint32_t> got;
  // Class 3: 128 blocks a slab. Slab 0, used up exactly; the slot still holds it.
  REQUIRE(heap.allocate(3, 0, 128, 1, got) == 128);
  REQUIRE(heap.memory.out == 1);
  // Every block freed while the slot holds it: the next claim opens it again, fresh (its blocks
  // in order from the first), with no slab taken from the supply and none emptied.
  for (std::uint32_t key : got) {
    heap.free(3, key, 1, 0);
  }
  std::vector<std::uint32_t> again;
  REQUIRE(heap.allocate(3, 0, 128, 2, again) == 128);
  for (std::uint32_t i = 0; i < 128; ++i) {
    CHECK(again[i] == i);
  }
  CHECK(heap.memory.out == 1);
  CHECK(heap.memory.empties == 0);
  // Its bitmap was cleared for the blocks to go out in order: every bit clear, a block in use.
  for (std::uint32_t w = 0; w < 128 / bitmap_word_bits; ++w) {
    CHECK(heap.memory.bits[w] == 0u);
  }
  // One block still out: the slot gives the slab up (listed, with 127 free) and a roomy heap
  // installs an empty slab.
  for (std::uint32_t key : again) {
    if (key != 77) {
      heap.free(3, key, 2, 0);
    }
  }
  std::vector<std::uint32_t> next;
  REQUIRE(heap.allocate(3, 0, 1, 3, next) == 1);
  CHECK(next[0] / 1024 == 1u);
  CHECK(heap.memory.out == 2);
  CHECK((heap.memory.avail[0] & avail_listed) != 0);
  CHECK((heap.memory.avail[0] & avail_count_mask) == 127u);
  CHECK(heap.double_handouts == 0);
  CHECK(heap.bad_blocks == 0);
}

TEST_CASE("a renewal that loses its slot to another thread gives the slab's blocks back",
          "[reuse][slots][renew]") {
  for (bool const slot_changed_first : {true, false}) {
    CAPTURE(slot_changed_first);
    test_heap heap{4, 1};
    std::vector<std::uint32_t> got;
    REQUIRE(heap.allocate(3, 0, 128, 1, got) == 128);  // slab 0, used up, in the slot
    for (std::uint32_t key : got) {
      heap.free(3, key, 1, 0);
    }
    std::uint64_t const used_up = heap.words[3];
    slab_avail const avail = heap.slots.avail(0, 3);
    if (slot_changed_first) {
      // The slot gives the slab up (as a release of slots does) before the renewal's exchange:
      // the slab left its class, and the renewal finds it so.
      heap.slots.vacate(3, 0, 0);
      CHECK(heap.memory.empties == 1);
      CHECK_FALSE(avail.renew());
      CHECK(heap.slots.renew(3, 0, used_up + 1, 1).id == no_slab);
      continue;
    }
    // The slot changed (another opening of the slab, not used up) after the renewal took the
    // count: the count comes back as frees, every block, and the slab stays open in the slot.
    heap.words[3] = make_class_slot(0, 128, true, 5);
    CHECK(heap.slots.renew(3, 0, used_up + 1, 1).id == no_slab);
    CHECK((heap.memory.avail[0] & avail_count_mask) == 128u);
    CHECK((heap.memory.avail[0] & avail_open) != 0);
    // The slot moved on to another slab, used up in turn: the renewal leaves that one there.
    heap.words[3] = make_class_slot(1, 128, true, 128);
    CHECK(heap.slots.renew(3, 0, used_up + 1, 1).id == no_slab);
    CHECK(heap.words[3] == make_class_slot(1, 128, true, 128));
    CHECK((heap.memory.avail[0] & avail_count_mask) == 128u);
    // Used up again, as it was: the renewal is published.
    heap.words[3] = used_up;
    block_claim const won = heap.slots.renew(3, 0, used_up + 1, 1);
    CHECK(won.id == 0u);
    CHECK(won.count == 1u);
    CHECK(won.fresh);
    CHECK(slot_claimed(heap.words[3]) == 1u);
    CHECK(slot_promised(heap.words[3]) == 128u);
  }
}

TEST_CASE("a claim that would wait takes blocks straight from a listed slab", "[reuse][slots]") {
  test_heap heap{2, 1};
  std::vector<std::uint32_t> got;
  REQUIRE(heap.allocate(3, 0, 256, 1, got) == 256);  // class 3: both slabs, 128 blocks each
  CHECK(heap.slots.lists().take_direct(3, 1, 0).count == 0);  // nothing listed
  // Free 40 blocks of slab 0, closed (its slot moved on): listed with 40 (threshold 16, 8 kept).
  std::vector<std::uint32_t> freed;
  for (std::uint32_t key : got) {
    if (key < 1024 && key % 3 == 0 && freed.size() < 40) {
      freed.push_back(key);
      heap.free(3, key, 1, 0);
    }
  }
  REQUIRE(heap.counted_free_blocks() == 40);
  block_claim const direct = heap.slots.lists().take_direct(3, 30, 0);
  REQUIRE(direct.count == 30);
  CHECK(direct.id == 0u);
  CHECK_FALSE(direct.fresh);
  CHECK(heap.counted_free_blocks() == 10);
  CHECK(heap.slots.lists().take_direct(3, 2, 0).count == 0);  // 10 - 2 would leave no more than 8
  std::vector<std::uint32_t> again;
  heap.slots.take(direct, 3, [&](std::uint32_t b) { again.push_back(heap.key_of(0, b)); });
  std::sort(again.begin(), again.end());
  std::sort(freed.begin(), freed.end());
  CHECK(again.size() == 30);
  CHECK(std::adjacent_find(again.begin(), again.end()) == again.end());
  CHECK(std::includes(freed.begin(), freed.end(), again.begin(), again.end()));
  // The slab is still listed: an install opens it for what is left.
  CHECK((heap.memory.avail[0] & avail_listed) != 0);
}

TEST_CASE("a claim that would wait takes blocks straight from a slab closed below the threshold",
          "[reuse][slots]") {
  test_heap heap{2, 1};
  std::vector<std::uint32_t> got;
  REQUIRE(heap.allocate(3, 0, 256, 1, got) == 256);  // class 3: both slabs, 128 blocks each
  // Free 12 blocks of slab 0, closed with none free when its slot moved on: below the threshold
  // (16), on the class's second list; nothing is listed.
  std::vector<std::uint32_t> freed;
  for (std::uint32_t key : got) {
    if (key < 1024 && key % 5 == 0 && freed.size() < 12) {
      freed.push_back(key);
      heap.free(3, key, 1, 0);
    }
  }
  REQUIRE(heap.counted_free_blocks() == 12);
  REQUIRE((heap.memory.avail[0] & (avail_listed | avail_open)) == 0);
  CHECK(heap.slots.lists().take_direct(3, 13, 0).count == 0);  // short
  block_claim const direct =
      heap.slots.lists().take_direct(3, 12, 0);  // all of them: it keeps none
  REQUIRE(direct.count == 12);
  CHECK(direct.id == 0u);
  CHECK_FALSE(direct.fresh);
  CHECK(heap.counted_free_blocks() == 0);
  std::vector<std::uint32_t> again;
  heap.slots.take(direct, 3, [&](std::uint32_t b) { again.push_back(heap.key_of(0, b)); });
  std::sort(again.begin(), again.end());
  std::sort(freed.begin(), freed.end());
  CHECK(again == freed);
  // Still closed in its class, for the frees to come.
  CHECK(heap.slots.avail(0, 3).closed_full());
}

TEST_CASE("a claim that would wait drops a slab that left its class from the list below",
          "[reuse][slots]") {
  test_heap heap{2, 1};
  std::vector<std::uint32_t> got;
  REQUIRE(heap.allocate(3, 0, 256, 1, got) == 256);  // class 3: both slabs, 128 blocks each
  slab_set const below = heap.slots.slabs().below(3, 0);
  CHECK(below.find(0) == 0u);  // slab 0, closed with every block in use, waits for frees there
  // Every block of slab 0 freed: it leaves the class, and its member on that list is stale.
  for (std::uint32_t key : got) {
    if (key < 1024) {
      heap.free(3, key, 1, 0);
    }
  }
  REQUIRE(heap.memory.cls[0] == 0xffu);
  CHECK(below.find(0) == 0u);
  CHECK(heap.slots.lists().take_direct(3, 1, 0).count == 0);
  CHECK(below.find(0) == no_member);  // the look that found it stale took it off
  CHECK(heap.double_handouts == 0);
}

TEST_CASE("a roomy heap installs an empty slab rather than a listed one with few free blocks",
          "[reuse][slots][roomy]") {
  for (bool const roomy : {true, false}) {
    CAPTURE(roomy);
    test_heap heap{4, 1};
    heap.memory.roomy = roomy;
    std::vector<std::uint32_t> got;
    REQUIRE(heap.allocate(3, 0, 256, 1, got) == 256);  // class 3: slabs 0 and 1, 128 blocks each
    CHECK(heap.memory.out == 2);
    // Free 20 blocks of slab 0, closed (its slot moved on): listed (threshold 16), with fewer
    // than a quarter of its blocks (32) free.
    int freed = 0;
    for (std::uint32_t key : got) {
      if (key < 1024 && key % 2 == 0 && freed < 20) {
        heap.free(3, key, 1, 0);
        ++freed;
      }
    }
    REQUIRE((heap.memory.avail[0] & avail_listed) != 0);
    // The next claim installs: a roomy heap takes an empty slab and leaves slab 0 listed with its
    // 20 free blocks; a heap short of room opens slab 0 (a promise of 15).
    std::vector<std::uint32_t> next;
    REQUIRE(heap.allocate(3, 0, 1, 2, next) == 1);
    if (!roomy) {
      CHECK(next[0] / 1024 == 0u);
      continue;
    }
    CHECK(next[0] / 1024 >= 2u);
    CHECK(heap.memory.out == 3);
    CHECK((heap.memory.avail[0] & avail_listed) != 0);
    CHECK((heap.memory.avail[0] & avail_count_mask) == 20u);
    // 12 more frees give slab 0 a quarter of its blocks: once the empty slab is used up, the
    // install reuses slab 0.
    for (std::uint32_t key : got) {
      if (key < 1024 && key % 2 == 1 && freed < 32) {
        heap.free(3, key, 1, 0);
        ++freed;
      }
    }
    REQUIRE(heap.allocate(3, 0, 127, 2, next) == 127);  // the rest of the empty slab
    std::vector<std::uint32_t> last;
    REQUIRE(heap.allocate(3, 0, 1, 3, last) == 1);
    CHECK(last[0] / 1024 == 0u);
    // Opened from the list with three quarters of its 32 free blocks promised, the rest kept.
    CHECK((heap.memory.avail[0] & (avail_open | avail_listed)) == avail_open);
    CHECK((heap.memory.avail[0] & avail_count_mask) == 32u - reuse_promise(32));
    CHECK(heap.slots.slabs().listed(3, 0).find(1) == no_member);
    CHECK(heap.memory.out == 3);
    CHECK(heap.double_handouts == 0);
    CHECK(heap.bad_blocks == 0);
  }
}

/// Slots of 4 classes, 8 slots each, over 16 slabs, whose widths start at one slot a class with a
/// budget of 8 slabs; class 1 (512 blocks a slab, listed once 64 are free) claims through them.
struct width_heap {
  static constexpr unsigned slot_count = 8;
  test_slab_memory memory{16};
  std::vector<std::uint64_t> words =
      std::vector<std::uint64_t>(std::size_t{slot_count} * test_classes, vacant_class_slot);
  slot_shape shape{slot_width::initial(0, test_classes), 0, 8, 0};
  class_slots<test_slabs> const slots{test_slabs{&memory}, words.data(), test_classes, slot_count,
                                      &shape};
  /// The blocks of each slab in use.
  std::vector<std::vector<std::uint32_t>> out =
      std::vector<std::vector<std::uint32_t>>(memory.slabs);

  std::uint32_t claim(unsigned slot, std::uint32_t want) {
    block_claim got = slots.claim(1, slot, want, 0);
    if (is_moved(got)) {
      got = slots.claim(1, got.id, want, 0);
    }
    slots.take(got, 1, [&](std::uint32_t b) { out[got.id].push_back(b); });
    return got.count;
  }
  /// Claims what is left of the slot's slab: its id.
  std::uint32_t use_up(unsigned slot) {
    std::uint64_t const at = atomic(slots.word(1, slot)).load(relaxed);
    std::uint32_t const left = slot_promised(at) - slot_claimed(at);
    REQUIRE(claim(slot, left) == left);
    return slot_id(at);
  }
  /// Frees `n` blocks of slab `id`, closed: it is listed.
  void free_some(std::uint32_t id, int n = 100) {
    for (int i = 0; i < n; ++i) {
      slots.lists().free_block(id, 1, out[id].back(), 0);
      out[id].pop_back();
    }
    REQUIRE((memory.avail[id] & avail_listed) != 0);
  }
  std::uint32_t slab_in(unsigned slot) const { return slot_id(slots.word(1, slot)); }
  std::uint32_t mask() const { return slots.width().mask(1); }
  std::ptrdiff_t class_1_slabs() const {
    return std::count(memory.cls.begin(), memory.cls.end(), 1u);
  }
  /// Every class whose slot holds a slab is in use in the widths word (which a renewal, reusing
  /// the slab in place, relies on).
  bool holders_in_use() const {
    for (unsigned c = 0; c < test_classes; ++c) {
      for (unsigned s = 0; s < slot_count; ++s) {
        if (is_slab(slot_id(slots.word(c, s))) &&
            (slot_width::classes_of(shape.widths) & (1u << c)) == 0) {
          return false;
        }
      }
    }
    return true;
  }
};

TEST_CASE("a renewal reopens a slab in place and leaves the widths as they are",
          "[reuse][slots][width]") {
  width_heap heap;
  REQUIRE(heap.claim(0, 1) == 1);
  std::uint64_t const widths = heap.shape.widths;
  CHECK(heap.holders_in_use());
  std::uint32_t const id = heap.use_up(0);
  for (std::uint32_t b : heap.out[id]) {  // every block of the used-up slab, still in its slot
    heap.slots.lists().free_block(id, 1, b, 0);
  }
  heap.out[id].clear();
  REQUIRE(heap.claim(0, 1) == 1);
  CHECK(heap.slab_in(0) == id);  // renewed in place
  CHECK(heap.shape.widths == widths);
  CHECK(heap.holders_in_use());
}

TEST_CASE("installs that reuse a slab after a used-up one widen the class; a new class narrows it",
          "[reuse][slots][width]") {
  width_heap heap;
  auto const& shape = heap.shape;
  auto const& slots = heap.slots;
  auto const claim = [&](unsigned slot, std::uint32_t want) { return heap.claim(slot, want); };
  auto const use_up = [&](unsigned slot) { return heap.use_up(slot); };
  auto const free_some = [&](std::uint32_t id) { heap.free_some(id); };
  auto const class_1_slabs = [&] { return heap.class_1_slabs(); };
  // The class's first install takes an empty slab: it comes into use, at the base width.
  REQUIRE(claim(0, 1) == 1);
  CHECK(slot_width::classes_of(shape.widths) == 1u << 1);
  CHECK(slots.width().mask(1) == 0);
  // The install after a used-up slab, with nothing listed, takes another empty one: no change.
  std::uint32_t closed = use_up(0);
  REQUIRE(claim(0, 1) == 1);
  CHECK(slots.width().mask(1) == 0);
  // Each install that takes a listed slab after a used-up one doubles the width, up to the
  // budget of 8 slabs with one class in use.
  auto const widen_to = [&](std::initializer_list<std::uint32_t> masks) {
    for (std::uint32_t mask : masks) {
      free_some(closed);
      closed = use_up(0);
      REQUIRE(claim(0, 1) == 1);
      CHECK(slots.width().mask(1) == mask);
    }
  };
  widen_to({1u, 3u, 7u, 7u});
  CHECK(slots.slot_of(1, 5) == 5);
  CHECK(slots.slot_of(1, 13) == 5);
  CHECK(slots.slot_of(2, 5) == 0);
  // A slot past the base width takes no empty slab: with nothing listed, its claim is served at
  // slot 0, the slot stays vacant, and the class goes back to the base width.
  std::uint32_t const claimed = slot_claimed(slots.word(1, 0));
  auto const slabs_before = class_1_slabs();
  REQUIRE(claim(6, 1) == 1);
  CHECK(slot_is_vacant(slots.word(1, 6)));
  CHECK(slot_claimed(slots.word(1, 0)) == claimed + 1);
  CHECK(class_1_slabs() == slabs_before);
  CHECK(slots.width().mask(1) == 0);
  // It widens again; slot 5 takes a listed slab, not an empty one.
  widen_to({1u, 3u, 7u});
  free_some(closed);
  REQUIRE(claim(5, 1) == 1);
  CHECK(slot_id(slots.word(1, 5)) == closed);
  CHECK(class_1_slabs() == slabs_before);
  // Class 2 installs for the first time: two classes share the budget, 4 slots each, and slot 5
  // of class 1 is past its width.
  REQUIRE(slots.claim(2, 0, 1, 0).count == 1);
  CHECK(slot_width::classes_of(shape.widths) == ((1u << 1) | (1u << 2)));
  CHECK(slots.width().mask(1) == 3);
  CHECK(slots.slot_of(1, 5) == 1);
  // Out of empty slabs, class 1 gives up the slab of slot 5, and keeps those of slots 0 to 3.
  CHECK(slots.release_slots(1, 0));
  CHECK(slot_is_vacant(slots.word(1, 5)));
  CHECK(is_slab(slot_id(slots.word(1, 0))));
  CHECK_FALSE(is_slab(slot_id(slots.word(2, 0))));  // another class's: given up
  CHECK(heap.holders_in_use());
}

TEST_CASE("a class that narrows gives up the slots past its width; they take no empty slab",
          "[reuse][slots][width][roomy]") {
  // Class 1 widens to 8 slots alone; slot 5 holds a listed slab with room. Class 2 comes into use
  // and narrows it to 4: the install that narrowed gives slot 5's slab up at once. A claim that
  // read the old width, at slot 5 of a roomy heap, takes no empty slab there: it is sent to the
  // slot of the base width, and the class holds no more slabs than before.
  width_heap heap;
  heap.memory.roomy = false;
  REQUIRE(heap.claim(0, 1) == 1);
  std::uint32_t closed = heap.use_up(0);
  REQUIRE(heap.claim(0, 1) == 1);
  for (int i = 0; i < 4; ++i) {
    heap.free_some(closed);
    closed = heap.use_up(0);
    REQUIRE(heap.claim(0, 1) == 1);
  }
  REQUIRE(heap.mask() == 7);
  heap.free_some(closed);
  REQUIRE(heap.claim(5, 1) == 1);
  REQUIRE(heap.slab_in(5) == closed);
  REQUIRE(slot_has_room(heap.slots.word(1, 5)));
  REQUIRE(heap.slots.claim(2, 0, 1, 0).count == 1);
  CHECK(heap.mask() == 3);
  CHECK(slot_is_vacant(heap.slots.word(1, 5)));
  CHECK((heap.memory.avail[closed] & avail_listed) != 0);  // closed, and listed again
  CHECK(is_slab(heap.slab_in(0)));                         // within the width: kept
  // Nothing listed for the stale claim to reuse: it takes the slab back off the list, or is sent
  // to slot 0; either way no empty slab.
  heap.memory.roomy = true;
  auto const slabs_before = heap.class_1_slabs();
  REQUIRE(heap.claim(5, 1) == 1);
  CHECK(heap.class_1_slabs() == slabs_before);
  CHECK((slot_is_vacant(heap.slots.word(1, 5)) || heap.slab_in(5) == closed));
  CHECK(heap.holders_in_use());
}

TEST_CASE("a roomy install widens its class, from an empty slab or a listed one, rich or not",
          "[reuse][slots][width][roomy]") {
  width_heap heap;
  heap.memory.roomy = true;
  REQUIRE(heap.claim(0, 1) == 1);  // the first install: an empty slab, the class in use
  CHECK(slot_width::classes_of(heap.shape.widths) == 1u << 1);
  CHECK(heap.mask() == 0);
  // Nothing listed: the next install takes an empty slab, and the class widens (it needs more
  // blocks than its slots hold).
  std::uint32_t const first = heap.use_up(0);
  REQUIRE(heap.claim(0, 1) == 1);
  CHECK(heap.mask() == 1);
  // Slab `first` listed with 100 free blocks, fewer than a quarter: an empty slab, and the class
  // widens again.
  heap.free_some(first);
  heap.use_up(0);
  REQUIRE(heap.claim(0, 1) == 1);
  CHECK(heap.slab_in(0) != first);
  CHECK((heap.memory.avail[first] & avail_listed) != 0);
  CHECK(heap.mask() == 3);
  // 40 more: a quarter of its blocks free. The install reopens it and widens to the share.
  heap.free_some(first, 40);
  heap.use_up(0);
  REQUIRE(heap.claim(0, 1) == 1);
  CHECK(heap.slab_in(0) == first);
  CHECK(heap.mask() == 7);
  // Nothing listed again: an empty slab, and the width stays at the share.
  auto const slabs = heap.class_1_slabs();
  heap.use_up(0);
  REQUIRE(heap.claim(0, 1) == 1);
  CHECK(heap.class_1_slabs() == slabs + 1);
  CHECK(heap.mask() == 7);
  CHECK(heap.holders_in_use());
}

TEST_CASE("an SM's odd warps claim through a second slot only where the class has every slot",
          "[reuse][slots][width]") {
  test_slab_memory memory{4};
  std::vector<std::uint64_t> words(std::size_t{max_slots} * test_classes, vacant_class_slot);
  // Every class at every slot, as on a large heap: the even and the odd warps of an SM claim
  // through two slot words.
  class_slots<test_slabs> const every{test_slabs{&memory}, words.data(), test_classes, max_slots};
  for (unsigned sm = 0; sm < max_slots / 2; ++sm) {
    CHECK(every.slot_of(1, claim_hint(sm, 0)) == sm);
    CHECK(every.slot_of(1, claim_hint(sm, 2)) == sm);
    CHECK(every.slot_of(1, claim_hint(sm, 1)) == sm + max_slots / 2);
    CHECK(every.slot_of(1, claim_hint(sm, 7)) == sm + max_slots / 2);
  }
  REQUIRE(every.claim(1, every.slot_of(1, claim_hint(5, 1)), 3, 5).count == 3);
  CHECK(slot_claimed(words[(5 + max_slots / 2) * test_classes + 1]) == 3);
  CHECK(slot_is_vacant(words[5 * test_classes + 1]));
  // Classes of 8 slots: both hints of an SM name its one slot, never one past the width.
  slot_shape shape{slot_width::initial(7, test_classes), 7, 8 * test_classes, 0};
  class_slots<test_slabs> const narrow{test_slabs{&memory}, words.data(), test_classes, max_slots,
                                       &shape};
  for (unsigned sm = 0; sm < max_slots / 2; ++sm) {
    CHECK(narrow.slot_of(1, claim_hint(sm, 1)) == narrow.slot_of(1, claim_hint(sm, 0)));
    CHECK(narrow.slot_of(1, claim_hint(sm, 1)) <= 7u);
  }
}

TEST_CASE("a listed slab whose blocks are all freed leaves its class's list", "[reuse][slots]") {
  test_heap heap{2, 1};
  std::vector<std::uint32_t> blocks;
  REQUIRE(heap.allocate(0, 0, 1024, 1, blocks) == 1024);  // slab 0, 16 B blocks
  heap.slots.vacate(0, 0, 0);                             // closed with every block out
  for (std::uint32_t key : blocks) {
    heap.free(0, key, 1, 0);  // listed at an eighth free, emptied at the last
  }
  CHECK(heap.memory.empties == 1);
  CHECK(heap.slots.slabs().listed(0, 0).find(0) == no_member);
  CHECK(heap.double_handouts == 0);
}

TEST_CASE("a slab whose blocks are all freed leaves its class for another", "[reuse][slots]") {
  test_heap heap{2, 1};
  std::vector<std::uint32_t> small;
  REQUIRE(heap.allocate(0, 0, 2048, 1, small) == 2048);  // both slabs, 16 B blocks
  std::vector<std::uint32_t> none;
  CHECK(heap.allocate(2, 0, 1, 1, none) == 0);
  heap.slots.vacate(0, 0, 0);  // the slot gives its used-up slab up
  for (std::uint32_t key : small) {
    heap.free(0, key, 1, 0);
  }
  // Slab 0 was listed (closed when the slot moved on) and stays with its class; slab 1 was
  // open until the vacate and empties when its last block is freed... unless it was listed
  // first. Either way, class 2 gets a slab once class 0's list hands the listed one over to a
  // claim of its own class, or the empty one directly.
  std::vector<std::uint32_t> other;
  CHECK(heap.allocate(2, 0, 256, 2, other) == 256);
  CHECK(heap.double_handouts == 0);
  CHECK(heap.bad_blocks == 0);
}

TEST_CASE("an install out of slabs closes the slab its own slot used up, freed in since",
          "[reuse][slots]") {
  // A class whose every slab is in its slots has nothing on its lists: the blocks freed into the
  // slab that its slot used up count only once the slab is closed, which the install does.
  test_heap heap{2, 1};
  std::vector<std::uint32_t> got;
  REQUIRE(heap.allocate(3, 0, 256, 1, got) == 256);  // slab 0 closed full, slab 1 in the slot
  for (std::uint32_t key : got) {
    if (key >= 1024 && key % 2 == 0) {
      heap.free(3, key, 1, 0);  // 64 blocks of the open slab 1: its count, not its list
    }
  }
  std::vector<std::uint32_t> again;
  CHECK(heap.allocate(3, 0, 10, 2, again) == 10);
  CHECK(heap.double_handouts == 0);
  CHECK(heap.bad_blocks == 0);
  // Blocks of slab 1, freed there: slab 0 has none free.
  CHECK(std::all_of(again.begin(), again.end(), [](std::uint32_t key) { return key >= 1024; }));
}

TEST_CASE("an install out of slabs claims from a slab another installer put in its own slot",
          "[reuse][slots]") {
  // A thread that took an install over may publish a slab in the slot while the first installer
  // still searches: with no slab left anywhere else, that slab serves the first one's claim.
  test_heap heap{1, 1};
  std::vector<std::uint32_t> got;
  REQUIRE(heap.allocate(3, 0, 10, 1, got) == 10);  // the one slab, in slot 0, 118 blocks left
  block_claim const more = heap.slots.install(3, 0, 5, 0);
  REQUIRE(more.count == 5);
  CHECK(more.id == 0u);
  std::vector<std::uint32_t> blocks;
  heap.slots.take(more, 3, [&](std::uint32_t b) { blocks.push_back(b); });
  CHECK(std::all_of(blocks.begin(), blocks.end(), [](std::uint32_t b) { return b >= 10; }));
  CHECK(slot_claimed(heap.words[3]) == 15);  // slot 0's word of class 3, still the slab's
}

/// What a failed search sees happen elsewhere while it looks (in_flight_slabs).
enum class elsewhere { nothing, in_flight, moved };

/// test_slabs whose one slab another thread holds while the search asks the supply for a slab
/// for the first two times, and puts among the empty slabs before its third: an install holding
/// it all along (`in_flight`: counted), or one that a slot gave up and that a close puts back
/// meanwhile (`moved`: counted as a move at the second).
struct in_flight_slabs : test_slabs {
  std::uint32_t* held;
  unsigned* asked;
  elsewhere what;

  std::uint32_t take_empty(unsigned hint) const {
    ++*asked;
    if (*asked == 2 && what == elsewhere::moved) {
      atomic(m->moves).fetch_add(1, relaxed);
    }
    if (*asked == 3 && *held != no_slab) {
      m->empty().push(*held);
      *held = no_slab;
      if (what == elsewhere::in_flight) {
        atomic(m->in_flight).fetch_sub(1, relaxed);
      }
    }
    return test_slabs::take_empty(hint);
  }
};

TEST_CASE("a search that finds nothing looks again while slabs are in flight or moved, else once",
          "[reuse][slots]") {
  for (elsewhere what : {elsewhere::in_flight, elsewhere::moved, elsewhere::nothing}) {
    INFO("elsewhere: " << static_cast<int>(what));
    std::uint32_t held = no_slab;
    unsigned asked = 0;
    engine_heap<in_flight_slabs> heap{1, 1, &held, &asked, what};
    held = heap.memory.empty().pop();
    REQUIRE(held == 0u);
    if (what == elsewhere::in_flight) {
      atomic(heap.memory.in_flight).fetch_add(1, relaxed);
    }
    // The install asks the supply once, and the last search once more after the class's
    // reclaim found nothing: then it looks again only if something was in flight or moved.
    bool const again = what != elsewhere::nothing;
    std::vector<std::uint32_t> got;
    CHECK(heap.allocate(3, 0, 5, 1, got) == (again ? 5u : 0u));
    CHECK(asked == (again ? 3u : 2u));
    CHECK(heap.memory.in_flight == 0);
  }
}

TEST_CASE("a slab closed with every block out stays on the list below for the frees to come",
          "[reuse][slots]") {
  test_heap heap{1, 1};
  std::vector<std::uint32_t> got;
  REQUIRE(heap.allocate(3, 0, 128, 1, got) == 128);  // the one slab, used up
  // Out of slabs: the install closes the used-up slab (below the threshold, none free), finds
  // nothing to open, and the claim fails. The slab stays on the list below.
  std::vector<std::uint32_t> more;
  CHECK(heap.allocate(3, 0, 1, 2, more) == 0);
  for (std::size_t i = 0; i < 3; ++i) {
    heap.free(3, got[i], 1, 0);  // 3 free: fewer than the 16 that list it
  }
  CHECK(heap.allocate(3, 0, 3, 2, more) == 3);  // the class reaches them
  CHECK(heap.double_handouts == 0);
}

/// test_slabs that records the count of slabs in flight when an install formats its slab.
struct watching_slabs : test_slabs {
  std::uint64_t* in_flight_at_format;

  void format(std::uint32_t id, unsigned c) const {
    *in_flight_at_format = atomic(m->in_flight).load(relaxed);
    test_slabs::format(id, c);
  }
};

TEST_CASE("an install holds its slab in flight until its slot has it; a close counts a move",
          "[reuse][slots]") {
  // A failed search looks again while either count says a slab may come back (final_search).
  std::uint64_t seen = 0;
  engine_heap<watching_slabs> heap{2, 1, &seen};
  heap.memory.roomy = true;  // an empty slab, through take_roomy
  std::vector<std::uint32_t> got;
  REQUIRE(heap.allocate(3, 0, 10, 1, got) == 10);
  CHECK(seen == 1);
  CHECK(heap.memory.in_flight == 0);
  heap.memory.roomy = false;  // through the supply's take
  REQUIRE(heap.allocate(2, 0, 10, 1, got) == 10);
  CHECK(seen == 1);
  CHECK(heap.memory.in_flight == 0);
  CHECK(heap.memory.moves == 0);
  heap.slots.vacate(3, 0, 0);  // 118 blocks free: listed
  CHECK(heap.memory.moves == 1);
}

/// test_slabs whose supply has no slab, where another installer puts slab `held`, fresh, in the
/// slot word at `*slot` with 10 of its blocks claimed, while the last search asks the supply.
struct publishing_slabs : test_slabs {
  std::uint64_t** slot;
  std::uint32_t held;
  unsigned* asked;

  std::uint32_t take_empty(unsigned hint) const {
    if (++*asked == 2) {
      format(held, 3);
      slab_avail{avail(held), blocks(3), 3}.open_fresh();
      atomic(**slot).store(make_class_slot(held, blocks(3), true, 10), release);
    }
    return test_slabs::take_empty(hint);
  }
};

TEST_CASE("an install out of slabs that uses up another slot's slab gives that slot up",
          "[reuse][slots]") {
  std::uint64_t* slot = nullptr;
  unsigned asked = 0;
  engine_heap<publishing_slabs> heap{1, 2, &slot, 0u, &asked};
  slot = &heap.slots.word(3, 1);
  REQUIRE(heap.memory.empty().pop() == 0u);  // the one slab, out of the supply
  // Slot 0's install finds nothing, its class's reclaim and last search neither; meanwhile slot
  // 1 got the slab. The install claims from it, more than it has: the 118 left, and slot 1,
  // used up, is given up (its slab closed), so that the frees of its blocks bring the slab back.
  block_claim const got = heap.slots.install(3, 0, 200, 0);
  CHECK(asked == 2);
  REQUIRE(got.count == 118);
  CHECK(got.id == 0u);
  CHECK_FALSE(is_slab(slot_id(heap.slots.word(3, 1))));
  for (std::uint32_t b = 0; b < 128; ++b) {
    heap.slots.lists().free_block(0, 3, b, 0);
  }
  CHECK(heap.memory.empties == 1);
}

/// Threads allocating and freeing blocks of every class with mixed lifetimes: each thread keeps
/// some blocks for the whole run and frees most soon after allocating them, staying within its
/// share of 80% of the heap for each class. Returns the allocations that failed.
template <class Heap>
std::uint64_t churn(Heap& heap, unsigned threads, std::uint64_t ops_per_thread, double live_share) {
  std::uint64_t const slabs_per_class = heap.memory.slabs / test_classes;
  std::atomic<std::uint64_t> failures{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng{1234567u + t};
      std::uint32_t const who = t + 1;
      unsigned const slot = t % heap.slots.slot_count();
      struct held {
        std::vector<std::uint32_t> keep;  // for the whole run
        std::vector<std::uint32_t> soon;  // freed in random order
        std::uint64_t budget;
      };
      std::vector<held> classes(test_classes);
      for (unsigned c = 0; c < test_classes; ++c) {
        std::uint64_t const blocks = slabs_per_class * (test_slab_memory::max_blocks >> c);
        classes[c].budget = static_cast<std::uint64_t>(live_share * blocks) / threads;
      }
      std::vector<std::uint32_t> got;
      for (std::uint64_t op = 0; op < ops_per_thread; ++op) {
        unsigned const c = static_cast<unsigned>(rng() % test_classes);
        held& h = classes[c];
        std::uint64_t const live = h.keep.size() + h.soon.size();
        bool const grow = live == 0 || (live < h.budget && rng() % 2 == 0);
        if (grow) {
          auto const want =
              static_cast<std::uint32_t>(std::min<std::uint64_t>(1 + rng() % 32, h.budget - live));
          got.clear();
          std::uint32_t const n = heap.allocate(c, slot, want, who, got);
          if (n < want) {
            failures.fetch_add(want - n, std::memory_order_relaxed);
          }
          for (std::uint32_t key : got) {
            // One block in sixteen stays for the whole run while the thread has room for it.
            (rng() % 16 == 0 && h.keep.size() < h.budget / 4 ? h.keep : h.soon).push_back(key);
          }
        } else if (!h.soon.empty()) {
          std::size_t const i = rng() % h.soon.size();
          heap.free(c, h.soon[i], who, t);
          h.soon[i] = h.soon.back();
          h.soon.pop_back();
        }
      }
      for (unsigned c = 0; c < test_classes; ++c) {
        for (std::uint32_t key : classes[c].soon) {
          heap.free(c, key, who, t);
        }
        for (std::uint32_t key : classes[c].keep) {
          heap.free(c, key, who, t);
        }
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  return failures;
}

/// After a churn: the slots give their slabs up, and every slab that still has a class counts
/// all its blocks free (listed ones stay listed). Returns how many have a class.
template <class Heap>
std::uint32_t settle_and_count_classed(Heap& heap) {
  for (unsigned c = 0; c < test_classes; ++c) {
    for (unsigned s = 0; s < heap.slots.slot_count(); ++s) {
      heap.slots.vacate(c, s, 0);
    }
  }
  std::uint32_t classed = 0;
  for (std::uint32_t d = 0; d < heap.memory.slabs; ++d) {
    std::uint32_t const c = heap.memory.cls[d];
    if (c < test_classes) {
      CHECK((heap.memory.avail[d] & avail_count_mask) == (test_slab_memory::max_blocks >> c));
      ++classed;
    }
  }
  return classed;
}

TEST_CASE("threads churning blocks of mixed lifetimes at 80% of the heap never fail",
          "[reuse][slots][threads]") {
  unsigned const threads = 8;
  std::uint64_t const ops = under_tsan ? 40'000 : 400'000;  // 3.2 M operations in all
  test_heap heap{256, 4};
  std::uint64_t const failures = churn(heap, threads, ops, 0.8);
  CHECK(failures == 0);
  CHECK(heap.double_handouts == 0);
  CHECK(heap.bad_blocks == 0);
  // Every block is free, and every slab without a class is back among the empty ones.
  std::uint32_t const listed = settle_and_count_classed(heap);
  std::uint32_t empty = 0;
  while (heap.memory.empty().pop() != no_slab) {
    ++empty;
  }
  CHECK(listed + empty == heap.memory.slabs);
  // Slabs were emptied and changed class on the way (the mix of classes moved).
  CHECK(heap.memory.empties > 0);
}

TEST_CASE("the reuse path over the heap's slab supply: two arenas, 80% live, never failing",
          "[reuse][slots][supply][threads]") {
  // Two arenas of 128 slabs; slot ids name them, test_slab_memory holds them in a row.
  devmr_test::supply_fixture arenas{{128, 128}};
  engine_heap<supply_slabs> heap{256, 4, &arenas.header(), std::uint32_t{128}};
  std::uint64_t const failures = churn(heap, 8, under_tsan ? 20'000 : 200'000, 0.8);
  CHECK(failures == 0);
  CHECK(heap.double_handouts == 0);
  CHECK(heap.bad_blocks == 0);
  // Every block is free, and every slab without a class is back in the supply, from which a
  // search takes each once.
  std::uint32_t const classed = settle_and_count_classed(heap);
  slab_supply const supply{&arenas.header()};
  std::vector<bool> seen(256);
  std::uint32_t taken = 0;
  for (std::uint32_t id = supply.search_run(1, 0); id != no_slab; id = supply.search_run(1, 0)) {
    std::uint32_t const d = arena_of(id) * 128 + index_of(id);
    CHECK_FALSE(seen[d]);
    seen[d] = true;
    ++taken;
  }
  CHECK(classed + taken == 256);
  CHECK(heap.memory.empties > 0);
}

}  // namespace
