#pragma once

// The device path of the size classes' slots, a warp at a time: the lanes of a warp that ask for
// blocks of one class share one claim (one atomic on their slot of the class, see claim_hint)
// and, from a reused slab, one AND per bitmap word their blocks come from; the lanes that free
// blocks of one bitmap word share one OR and one addition to their slab's count.

#include <devmr/detail/heap/class_slots.hpp>
#include <devmr/detail/heap/warp.cuh>

#include <cstddef>
#include <cstdint>

namespace devmr::detail::heap {

/// The peers' share of `count` blocks promised to them from the bitmap of a reused slab at
/// `slab` (blocks of 2^`shift` bytes), one word at a time from word `w`: the leader takes the
/// bits (a word whole where `whole`: block_bitmap::take_some), every peer sees which. Returns the
/// calling lane's block if it is among them (its `place` below their count; `place` moves past
/// them), else `mine`.
__device__ inline std::byte* take_reused(block_bitmap const bitmap,
                                         bool whole,
                                         std::uint32_t w,
                                         unsigned count,
                                         unsigned peers,
                                         unsigned leader,
                                         unsigned& place,
                                         std::byte* slab,
                                         unsigned shift,
                                         std::byte* mine) {
  bool const leads = lane_id() == leader;
  unsigned need = count;
  unsigned bare = 0;
  while (need != 0) {
    std::uint32_t bits = 0;
    if (leads) {
      bits = bitmap.take_some(w, need, whole);
    }
    bits = __shfl_sync(peers, bits, leader);
    if (bits == 0) {
      w = w + 1 == bitmap.count ? 0 : w + 1;
      if (++bare > bitmap.count) {
        pause_briefly();  // see block_bitmap::take
        bare = 0;
      }
      continue;
    }
    unsigned const n = __popc(bits);
    if (place < n) {
      unsigned const bit = set_bit_index(bits, place);
      mine = slab + (std::size_t{w * bitmap_word_bits + bit} << shift);
    }
    place -= n;
    need -= n;
    bare = 0;
  }
  return mine;
}

/// Serves the calling lane's request for one block of class `cls` through slot `slot` of
/// `slots`, together with the lanes of its warp that ask for the same class at the same time:
/// the block, or nullptr. `failed`: blocks the heap could not serve, as the first lane of the
/// group sees them (0 elsewhere), for the caller to count. `Slabs` gives `data(id)`, the first
/// byte of slab `id`, beside what class_slots needs.
template <class Slabs>
__device__ std::byte* warp_allocate(
    class_slots<Slabs> const& slots, unsigned cls, unsigned slot, unsigned hint, unsigned& failed) {
  unsigned const active = __activemask();
  unsigned const peers = __match_any_sync(active, cls);
  unsigned const leader = __ffs(peers) - 1;
  bool const leads = lane_id() == leader;
  unsigned const shift = cls + min_block_shift;
  // This lane's place among the blocks the peers still want (wraps once it has its block).
  unsigned place = __popc(peers & lanes_below());
  unsigned rest = __popc(peers);  // uniform across the peers: every value below is broadcast
  std::byte* mine = nullptr;
  while (rest != 0) {
    // The claim's addition, its slot value sent to the peers at once: where it serves them all
    // from a fresh slab, each works out its own block from it, with nothing more from the
    // leader; else the leader goes on from that value (claim_from) and sends what it got.
    std::uint64_t const seen =
        __shfl_sync(peers, leads ? slots.claim_add(cls, slot, rest) : 0, leader);
    // (The fresh flag is tested alone first: ptxas then branches past the rest of the test for
    // a reused slab's value, as measured, where the test alone compiles to predicates.)
    block_claim got{slot_id(seen), slot_claimed(seen), rest, true};
    if (!slot_is_fresh(seen) || !slot_serves_fresh(seen, rest)) {
      got = no_claim;
      if (leads) {
        got = slots.claim_from(cls, slot, rest, hint, seen);
      }
      // Two shuffles send the claim: its slab, then its first block (or bitmap word: below
      // 2^20), its count (at most 32) and whether the slab is fresh, in one word.
      constexpr unsigned fresh_bit = 1u << 31;
      constexpr unsigned moved = 1u << 30;  // no blocks: claim again at the base width
      unsigned const sent = __shfl_sync(
          peers, is_moved(got) ? moved : got.first << 8 | got.count | (got.fresh ? fresh_bit : 0u),
          leader);
      got.id = __shfl_sync(peers, got.id, leader);
      if (sent == moved) {
        slot = got.id;  // of the base width: sends no claim on
        continue;
      }
      got.count = sent & 0xffu;
      if (got.count == 0) {
        break;
      }
      got.fresh = (sent & fresh_bit) != 0;
      got.first = (sent >> 8) & slot_field_mask;
    }
    std::byte* const slab = slots.slabs().data(got.id);
    if (got.fresh) {
      // The next blocks of a fresh slab, in order.
      if (place < got.count) {
        mine = slab + (std::size_t{got.first + place} << shift);
      }
      place -= got.count;
    } else {
      mine = take_reused(slots.bitmap(got.id, cls), slots.whole_takes(), got.first, got.count,
                         peers, leader, place, slab, shift, mine);
    }
    rest -= got.count;
  }
  // Memory ordering among the peers (shuffles give none): the leader's acquires happen before
  // every peer's use of its block.
  __syncwarp(peers);
  failed = leads ? rest : 0;
  return mine;
}

/// Frees the calling lane's block `block` of slab `id` (class `cls`), if `valid`, together with
/// the lanes of its warp that free blocks of the same bitmap word: one OR and one addition for
/// them all, by the first of them. Every active lane calls it. `callers`: the lanes that passed a
/// warp barrier together since the last use of their blocks, and then each issued a release
/// fence (device_deallocate), so that the OR needs no release of its own: a claim that takes the
/// bits acquires the blocks' last writes through the word. The addition is a release all the
/// same, which orders the OR before it: whoever sees the count sees the bits. A renewal, or the
/// format of an emptied slab, clears the bitmap once the count says every block is free, and an
/// OR that landed after that clear would mark a block that the slab hands out again as free.
/// Where the lanes here did not all pass that barrier together, the peers meet at a barrier of
/// their own and fence again. One vote of every lane here decides it for all of them: lanes of a
/// warp need not run in step, and a lane may meet here a peer that passed that barrier with it
/// in another free (an earlier one of its own), so that one counts the other among its callers
/// and the other does not; decided by each lane alone, one would wait at the barrier for ever.
template <class Slabs>
__device__ void warp_free(class_slots<Slabs> const& slots,
                          std::uint32_t id,
                          unsigned cls,
                          std::uint32_t block,
                          bool valid,
                          unsigned hint,
                          unsigned callers) {
  unsigned const active = __activemask();
  bool const apart = __any_sync(active, (active & ~callers) != 0);
  unsigned const below = lanes_below();
  std::uint32_t const w = block / bitmap_word_bits;
  // Lanes with nothing to free match on a value of their own, which no (slab, word) takes.
  unsigned long long const key =
      valid ? (static_cast<unsigned long long>(id) << 16) | w : ~0ull - __popc(below);
  unsigned const peers = __match_any_sync(active, key);
  std::uint32_t const mask = __reduce_or_sync(peers, valid ? 1u << (block % bitmap_word_bits) : 0u);
  if (apart) {
    __syncwarp(peers);
    release_fence();
  }
  if (valid && (peers & below) == 0) {
    slots.lists().bitmap(id, cls).give(w, mask, relaxed);
    slots.lists().count_freed(id, cls, __popc(mask), hint);
  }
}

}  // namespace devmr::detail::heap
