#pragma once

// The lock-free core of the slab heap, written once for host and device. Every shared word is
// touched through cuda::atomic_ref, so host tests drive exactly this code from many std::threads on
// host memory, and kernels run it on device memory.
//
// How memory moves:
//  - Two neighbouring size classes form a group, whose blocks share slabs: small blocks from a
//    slab's start up, large ones (twice the size) from its end down. Each group has up to
//    max_slots "current slab" slots. A slot word holds its slab's id and the counts of the blocks
//    of each class handed out: a claim adds the numbers of blocks it wants to the word, one
//    atomic, and the value it gets back says which slab and which of its blocks are its own.
//    Blocks of a slab are handed out once per slab lifetime (two bump pointers inside the slab).
//  - When a slot's slab runs out (its fronts meet), one thread (the one whose claim made them
//    meet and wants more; or the first claim whose addition found the counts at zero, on a vacant
//    slot, or the fronts just met by a claim that wanted no more) installs the next; the others
//    wait for it, but only for a bounded time (~300 us on the device), then one of them takes the
//    installation over (and the others wait for that one). No thread ever waits without bound on
//    another: every other wait is a CAS retry that fails only because another thread made
//    progress. (A free that does not know its block's size, deallocate_bulk's, and finds its
//    slab's claims ending, leaves the block to the thread that ends them: see sizeless_class.)
//    The claim that makes the fronts meet records them in the slab's state, and whoever swaps a
//    slab out of its slot ends its claims (close); either gives back the units left between the
//    fronts.
//  - Freeing subtracts from the slab's `remaining` (units: a large block counts two);
//    whoever brings it to zero (every block claimed and freed) recycles it: a small slab is only
//    marked in its arena's bitmap of empty slabs (an atomic OR with no release; no other thread
//    waits for it), a large run goes back on a free stack. Whoever takes a slab settles its count
//    (an exchange that acquires every free of its last life), so that the frees need one release
//    fence each and no more.
//  - Slabs come from the heap's slab supply (slab_supply.hpp), and go back to it: fresh slabs,
//    stacks of free slabs and runs, bitmaps of empty slabs. What the supply cannot do without the
//    slots lives here: a search that also takes unused slabs from other groups' slots
//    (acquire_run, reclaim_slab), and the last resorts that make slots give up their current
//    slabs (reopen_slab, gather_run, close_slots).

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/atomics.hpp>
#include <devmr/detail/heap/bits.hpp>
#include <devmr/detail/heap/layout.hpp>
#include <devmr/detail/heap/slab_supply.hpp>

#include <cuda/atomic>
#include <cuda/std/bit>

#include <cstddef>
#include <cstdint>
#if !DEVMR_IS_DEVICE_CODE
#include <thread>
#endif

namespace devmr::detail::heap {

/// What a claim of `want` blocks (small | large << 16) adds to a slot word.
DEVMR_HOST_DEVICE constexpr std::uint64_t wanted_fronts(std::uint32_t want) {
  return make_fronts(want & 0xffffu, want >> 16);
}

/// The class of blocks of `size` bytes (at most max_small_bytes; the larger of size and
/// alignment).
DEVMR_HOST_DEVICE inline unsigned class_of_size(std::size_t size) {
  return size <= (std::size_t{1} << min_block_shift) ? 0u : ceil_log2(size) - min_block_shift;
}

/// Whether a block whose size, less one, has its highest bit where `last` has it is of its
/// group's large class (false for large runs, and for `last` ~0, a size of 0). A free takes
/// `last` as (bytes - 1) | (alignment - 1), whose highest bit is that of max(bytes, alignment) - 1
/// (the alignment is a power of two). Class c > 0 (sizes in (2^(c+3), 2^(c+4)]) is large when c
/// is odd, that is when the highest bit of size - 1 is at an even place: then the bits at even
/// places make the larger number. No branch and no bit scan: every free computes it (2^22 frees
/// of one size are partly bound by the instructions warps issue: bench/RESULTS.md),
/// and in the free a branch here made ptxas issue the release fence after the lookup of the
/// slab instead of beside the load of the pointer (0.1 of the floor). (One 64-bit comparison
/// of the bits at the large classes' places with the others, with no range test, took fewer
/// instructions but cost the mixed-size free 0.005 of the floor.)
DEVMR_HOST_DEVICE constexpr bool is_large_last(std::uint64_t last) {
  bool const grouped = last - 16 < max_small_bytes - 16;  // 16 B < size <= max_small_bytes
  auto const low = static_cast<std::uint32_t>(last);      // all of it where grouped
  return grouped & ((low & 0x55555555u) > (low & 0xaaaaaaaau));
}

/// Whether a block allocated for `size` bytes (the larger of size and alignment) is of its
/// group's large class; false for large runs and for 0.
DEVMR_HOST_DEVICE inline bool is_large_size(std::size_t size) {
  return is_large_last(size - 1);
}

/// Blocks a claim of one class obtained: `count` consecutive blocks starting at `first`.
struct claim_result {
  std::byte* first;
  std::uint32_t count;
};

/// Blocks a claim for both classes of a group obtained, packed so that kernels broadcast them in
/// few registers: consecutive small blocks from the `fronts & 0xffff`th of slab `slab` up, and
/// consecutive large blocks up to the `fronts >> 16`th from its end (large blocks are counted
/// from the end, the claim's last is its lowest).
struct pair_claim {
  std::byte* slab;       ///< nullptr: no block
  std::uint32_t fronts;  ///< small blocks of the slab before this claim's | large ones out after
                         ///< it << 16
  std::uint32_t counts;  ///< small blocks | large blocks << 16

  DEVMR_HOST_DEVICE std::uint32_t small_count() const { return counts & 0xffffu; }
  DEVMR_HOST_DEVICE std::uint32_t large_count() const { return counts >> 16; }
  /// The claim's `i`th small block; `shift`: log2 of its size.
  DEVMR_HOST_DEVICE std::byte* small_block(std::uint32_t i, unsigned shift) const {
    return slab + (std::size_t{(fronts & 0xffffu) + i} << shift);
  }
  /// The claim's `i`th large block from the lowest; `shift`: log2 of its size.
  DEVMR_HOST_DEVICE std::byte* large_block(std::uint32_t i, unsigned shift) const {
    return slab + slab_bytes - (std::size_t{(fronts >> 16) - i} << shift);
  }
};

/// Whether a claim made its slab's fronts meet (and so ended its claims), and if so whether it
/// got all it wanted.
enum class claim_end { none, got_all, wants_more };

/// What a checked free decided.
enum class free_check { proceed, done, rejected };

/// What a free that does not know its block's size found it to be (heap_core::sizeless_class):
/// small (or a large run), large, or pending, freed later by another thread.
enum class sizeless { small, large, pending };

/// A view of one heap's header: the operations of the lock-free core, over its slab supply.
class heap_core : public slab_supply {
 public:
  DEVMR_HOST_DEVICE explicit heap_core(heap_header* header) : slab_supply{header} {}

  // ---- small blocks -------------------------------------------------------------------------

  /// Claims up to `want` (> 0, < 65536) blocks of class `cls` through slot `slot` (host paths
  /// and tests; kernels claim for both classes of a group at once, claim_pair). Returns fewer
  /// when the current slab runs out (the caller claims the rest with another call), none when
  /// the heap has no slab left for the class's group. `hint` spreads stack traffic (the SM on
  /// the device).
  DEVMR_HOST_DEVICE claim_result claim(unsigned cls,
                                       unsigned slot,
                                       std::uint32_t want,
                                       unsigned hint) const {
    bool const large = is_large_class(cls);
    pair_claim const got =
        claim_pair(group_of(cls), slot, large ? want << 16 : want, hint, arena(0));
    unsigned const shift = cls + min_block_shift;
    return large ? claim_result{got.large_block(0, shift), got.large_count()}
                 : claim_result{got.small_block(0, shift), got.small_count()};
  }

  /// Claims up to the blocks that `want` counts (small ones of group `g`'s small class | large
  /// ones of its large class << 16; not none) through slot `slot`, with one atomic.
  /// Returns fewer when the current slab runs out, none when the heap has no slab left for the
  /// group. `first`: arena 0's entry, which the caller has at hand (read ahead: see arena()).
  DEVMR_HOST_DEVICE pair_claim claim_pair(
      unsigned g, unsigned slot, std::uint32_t want, unsigned hint, arena_view const& first) const {
    auto slot_word = atomic(slot_word_of(*h_, g, slot));
    std::uint32_t const units = group_units(g);
    // acquire: pairs with the release that published the slot's slab (install), whose release
    // sequence the other claims' additions continue: the slab's formatting, and the frees of its
    // previous life, happen before its blocks are used.
    std::uint64_t seen = slot_word.fetch_add(wanted_fronts(want), acquire);
    for (;;) {
      claim_end end = claim_end::none;
      pair_claim const got = take_blocks(seen, want, g, end, first);
      if (end == claim_end::wants_more) {
        give_back_rest(seen, got, units);
        // This claim made the fronts meet and still wants blocks: it installs the next slab
        // now, and the claims behind it wait for it as for an installing id. A claim that got
        // all it wanted installs nothing: the first claim that finds the fronts met does, if one
        // ever comes (at the end of a kernel, an install nobody needed held up the warp that
        // used the slab up).
        if (got.counts == 0) {
          return install(g, slot, want, hint, first);
        }
        install(g, slot, 0, hint, first);
        return got;
      }
      if (got.counts != 0) {
        return got;
      }
      // The first claim since the slot lost its slab, or since a claim took its last blocks and
      // all it wanted, installs: its addition found the counts at zero or the fronts just met.
      if (is_vacant(seen) || just_used_up(seen, units)) {
        return install(g, slot, want, hint, first);
      }
      // The slab is used up and another claim installs the next (see above), or the next is
      // being installed. Wait for the installer, but never without bound: after a while one
      // waiter takes the installation over, so a descheduled installer holds nobody up, and the
      // others wait for that one.
      std::uint32_t const id = slot_id(seen);
      seen = wait_for_install(slot_word, seen, units);
      if (still_waiting(seen, id, units) && take_over(slot_word, seen, id, units)) {
        return install(g, slot, want, hint, first);
      }
      seen = slot_word.fetch_add(wanted_fronts(want), acquire);  // installed, or taken over
    }
  }

  /// What a claim of the blocks of group `g` that `want` counts got from slot value `seen`, the
  /// value its addition replaced: nothing when it names no slab or one whose fronts met. A claim
  /// whose addition makes the fronts meet ends the slab's claims: it alone knows exactly what the
  /// slab handed out, and records it in the slab's state here (an exchange: the state may hold
  /// frees left pending meanwhile, which it frees, see sizeless_class); one that still wants
  /// blocks gives back the units left between the fronts (give_back_rest) before it installs.
  /// `end` says whether it made them meet, and whether it still wants blocks.
  DEVMR_HOST_DEVICE pair_claim take_blocks(std::uint64_t seen,
                                           std::uint32_t want,
                                           unsigned g,
                                           claim_end& end,
                                           arena_view const& first) const {
    std::uint32_t const small = want & 0xffffu;
    std::uint32_t const large = want >> 16;
    std::uint32_t const id = slot_id(seen);
    std::uint32_t const units = group_units(g);
    std::uint32_t const used = unit_count(seen);
    if (!is_slab(id) || used >= units) {
      return {nullptr, 0, 0};
    }
    // Small blocks first: a claim of both classes that finds too few units left takes every
    // small block it wants that fits, then the large ones that still fit.
    std::uint32_t const left = units - used;
    std::uint32_t const s = small < left ? small : left;
    std::uint32_t const l = large < (left - s) / 2 ? large : (left - s) / 2;
    std::uint32_t const large_end = large_count(seen) + l;  // large blocks out, from the end
    if (small + 2 * large >= left) {
      end = small + 2 * large > left ? claim_end::wants_more : claim_end::got_all;
      record_fronts(meta(id, first), id, g, make_fronts(small_count(seen) + s, large_end));
    }
    return {data(id, first), small_count(seen) | large_end << 16, s | l << 16};
  }

  /// Gives back the units that a claim which made its slab's fronts meet, from slot value `seen`,
  /// left between them (see take_blocks).
  DEVMR_HOST_DEVICE void give_back_rest(std::uint64_t seen,
                                        pair_claim const& got,
                                        std::uint32_t units) const {
    give_back_units(slot_id(seen),
                    units - unit_count(seen) - got.small_count() - 2 * got.large_count());
  }

  /// Ends the claims on slab `id` of group `g`, which handed out the blocks that `fronts` counts
  /// (make_fronts): its state records them (and the frees left pending meanwhile are freed, see
  /// sizeless_class), and the `unclaimed` units between the fronts go back, so that it is
  /// recycled once its blocks are freed. The state comes first: until the units go back the slab
  /// cannot be recycled, so the state is still this life's. (Called out of line from take_blocks,
  /// it took the allocating kernel from 64 registers to 70: take_blocks stores the state itself,
  /// and its caller gives the units back.)
  DEVMR_HOST_DEVICE void end_claims(std::uint32_t id,
                                    unsigned g,
                                    std::uint64_t fronts,
                                    std::uint32_t unclaimed) const {
    record_fronts(meta(id), id, g, fronts);
    give_back_units(id, unclaimed);
  }

  /// Records in the state of slab `id` (metadata `m`) of group `g` that its claims ended, having
  /// handed out the blocks that `fronts` counts. An exchange: it takes off the state the blocks
  /// that frees of unknown class left pending meanwhile (sizeless_class), and frees them.
  DEVMR_HOST_DEVICE void record_fronts(slab_meta& m,
                                       std::uint32_t id,
                                       unsigned g,
                                       std::uint64_t fronts) const {
    std::uint64_t const was = atomic(m.state).exchange(make_state(g, fronts), relaxed);
    if (pending_top(was) != 0) {
      free_pending(id, pending_top(was));
    }
  }

  /// Frees the blocks that frees of unknown class left pending on slab `id` (sizeless_class),
  /// `top` the last of them, once the exchange that ended the slab's claims took them off its
  /// state: the fronts it stored say which are large (record_fronts). It runs about never, but
  /// inline: called out of line from take_blocks and end_claims it took heap_bench's allocating
  /// kernel from 80 registers to 92 (and to 90 or 85 called from one of them, or from claim_pair),
  /// inline to none more.
  DEVMR_HOST_DEVICE void free_pending(std::uint32_t id, std::uint32_t top) const {
    slab_meta& m = meta(id);
    // acquire: the exchange continued the release sequences of the frees' pushes, so this load
    // of its value orders their links and the last writes to their blocks before the reads
    // below and the subtraction's release.
    std::uint64_t const state = atomic(m.state).load(acquire);
    unsigned const g = state_tag(state);
    std::uint64_t const fronts = state_fields(state);
    std::byte const* const base = data(id);
    std::uint32_t small = 0;
    std::uint32_t large = 0;
    while (top != 0) {
      std::size_t const offset = std::size_t{top - 1} << unit_shift(g);
      if (block_is_large(offset, g, fronts)) {
        ++large;
      } else {
        ++small;
      }
      top = *reinterpret_cast<std::uint32_t const*>(base + offset);
    }
    // A group's slab: no large run to retire (see free_blocks).
    std::uint32_t const count = freed_blocks(small, large);
    if (remaining_units(atomic(m.remaining).fetch_sub(count, release)) == remaining_units(count)) {
      mark_empty(id);
    }
  }

  /// Gives back `unclaimed` units of slab `id` of a group, as frees do (see free_blocks); a
  /// group's slab is never a large run.
  DEVMR_HOST_DEVICE void give_back_units(std::uint32_t id, std::uint32_t unclaimed) const {
    // release: the state recorded before it, and the frees that the count carries, happen before
    // the slab's next life (whoever takes the slab settles its count, which acquires).
    if (unclaimed != 0 &&
        remaining_units(atomic(meta(id).remaining).fetch_sub(unclaimed, release)) == unclaimed) {
      mark_empty(id);
    }
  }

  /// Ends the claims on the slab of slot value `old`, which this thread swapped out of its slot
  /// (nothing happens when `old` names no slab, or one whose fronts met: its last claim ended
  /// them).
  DEVMR_HOST_DEVICE void close(std::uint64_t old, unsigned g) const {
    std::uint32_t const units = group_units(g);
    if (is_slab(slot_id(old)) && unit_count(old) < units) {
      end_claims(slot_id(old), g, make_fronts(small_count(old), large_count(old)),
                 units - unit_count(old));
    }
  }

  /// Installs a slab in slot `slot` of group `g`, which this thread holds (its claim found the
  /// slot vacant or made its slab's fronts meet, or it took the installation over; see
  /// claim_pair): formats it with the first `small` and `large` blocks (at most all units but
  /// one) claimed for this thread, and publishes it. Out of slabs, a claim takes blocks from the
  /// current slab of another slot of its group (steal); if none has room, the slots give up their
  /// current slabs whose blocks are all free (reopen_slab), and the install takes one of those.
  /// Otherwise the slot is left vacant (give_up) for the claims that wait for it to claim again,
  /// the first of them searching in turn.
  /// `first`: arena 0's entry, read before take_slab, whose acquires empty the SM's L1 cache.
  DEVMR_HOST_DEVICE pair_claim install(
      unsigned g, unsigned slot, std::uint32_t want, unsigned hint, arena_view const& first) const {
    std::uint32_t id = take_slab(g, slot, want, hint);
    if (id == no_slab && want != 0) {
      pair_claim const got = steal(g, slot, want);
      if (got.counts != 0) {
        give_up(slot, g);
        return got;
      }
      id = reopen_slab(hint);
    }
    if (id == no_slab) {
      give_up(slot, g);
      return {nullptr, 0, 0};
    }
    // At most all units but one, so that the slab published has room left for the next claim.
    // (With its fronts met at once, it would make that claim install again: see claim_pair.)
    std::uint32_t const units = group_units(g);
    std::uint32_t const small = want & 0xffffu;
    std::uint32_t const large = want >> 16;
    std::uint32_t const s = small < units ? small : units - 1;
    std::uint32_t const l = large < (units - 1 - s) / 2 ? large : (units - 1 - s) / 2;
    bool const spare = (id & spare_taken) != 0;
    id &= ~spare_taken;
    publish(g, slot, id, s, l, first, !spare);
    return {data(id, first), l << 16, s | l << 16};
  }

  /// Marks an id that take_slab returns: the slot's spare, formatted for it already.
  static constexpr std::uint32_t spare_taken = std::uint32_t{1} << 31;
  static_assert((((max_arenas - 1) << arena_id_shift | (max_slabs_per_arena - 1)) & spare_taken) ==
                0);

  /// A slab for the install of slot `slot` of group `g` (`want`: what the installing claim
  /// wants, see install): the slot's spare, if it has one (marked spare_taken: formatted for the
  /// slot), else one from the caller's shard or the fresh slabs, else an unused slab of another
  /// group in its slot (for a claim that wants blocks), else any (acquire_run); no_slab when the
  /// heap has none. The spare's exchange goes out together with the shard's load, which every
  /// install waits for anyway (loading the spare word first, to exchange it only when it names
  /// a slab, gains nothing). Out of line, for the registers of the allocating kernels.
  DEVMR_HOST_DEVICE DEVMR_NOINLINE std::uint32_t take_slab(unsigned g,
                                                           unsigned slot,
                                                           std::uint32_t want,
                                                           unsigned hint) const {
    std::uint64_t& shard = shard_head(hint);
    std::uint64_t const top = atomic(shard).load(relaxed);
    std::uint32_t const spare = atomic(spare_word_of(*h_, g, slot)).exchange(no_slab, relaxed);
    if (spare != no_slab) {
      return spare | spare_taken;
    }
    if (std::uint32_t const id = take_near(hint, shard, top); id != no_slab) {
      return id;
    }
    if (want != 0) {
      if (std::uint32_t const id = reclaim_slab(g, hint, false); id != no_slab) {
        return id;
      }
    }
    return acquire_run(1, hint, want != 0 ? g : num_groups);
  }

  /// Gives slot `slot` of group `g` slab `id` (no_slab: one that it searches for) while the
  /// slot is vacant as a reset leaves it, so that the first claims on it find a slab instead of
  /// waiting for an install (slab_heap primes its slots when it is made, grown and reset). It
  /// takes the install as a waiter takes one over (see take_over), so claims that come meanwhile
  /// wait for it. A slot that holds anything else is left alone, and `id` goes on a stack.
  /// True when the slot was vacant.
  DEVMR_HOST_DEVICE bool prime(unsigned g, unsigned slot, std::uint32_t id, unsigned hint) const {
    atomic(h_->idle_slots.value).store(1, relaxed);  // see reclaim_slab
    std::uint64_t vacant = empty_slot;
    if (!atomic(slot_word_of(*h_, g, slot))
             .compare_exchange_strong(vacant, make_slot(installing_last, 1), relaxed, relaxed)) {
      if (id != no_slab) {
        make_free_head(id, 1);
        push(id, hint);
      }
      return false;
    }
    if (id == no_slab) {
      install(g, slot, 0, hint, arena(0));
    } else {
      publish(g, slot, id, 0, 0, arena(0));
    }
    return true;
  }

  /// Formats fresh slab `id` for slot `slot` of group `g` and leaves it as the slot's spare
  /// (see heap_header::spares), which the slot's next install takes with one exchange: so the
  /// second slab of a slot after a heap is made, grown or reset is installed without a search, a
  /// format and the release that waits for the format's stores (at 2^16 threads, 4 KiB blocks,
  /// every SM installs one while its other warps wait: bench/RESULTS.md). A
  /// slot that has a spare keeps it, and `id` goes on a stack. Spares come back when memory runs
  /// short (close_slots).
  /// Only prime_kernel adds spares, and the kernels that take them run after it: slab_heap
  /// waits for it when it is made or grown, and a reset is ordered on its stream. So the
  /// kernel boundary orders the format before every use of the spare, and the spare word, its
  /// take (take_slab, close_slots) and its publication need no release or acquire.
  DEVMR_HOST_DEVICE void add_spare(unsigned g,
                                   unsigned slot,
                                   std::uint32_t id,
                                   unsigned hint) const {
    format_small(id, g, slot, arena(0));
    std::uint32_t none = no_slab;
    if (!atomic(spare_word_of(*h_, g, slot)).compare_exchange_strong(none, id, relaxed, relaxed)) {
      make_free_head(id, 1);
      push(id, hint);
    }
  }

  /// How many spares prime adds for `primed` slots primed (prime_count): one each, while the
  /// primed slabs and the spares together stay within half of the heap's slabs; else none.
  DEVMR_HOST_DEVICE std::uint32_t spare_count(std::uint32_t primed) const {
    return std::uint64_t{primed} * 4 <= heap_slabs(*h_) ? primed : 0;
  }

  /// The slots that claims use: the mask's count, and on the device no more than the SMs (an SM
  /// claims in the slot of its id under the mask), so that scans of the slots skip those that
  /// nobody uses (a heap of 256 slots on the H200's 132 SMs).
  DEVMR_HOST_DEVICE std::uint32_t slots_in_use() const {
    std::uint32_t const slots = atomic(h_->slot_mask).load(relaxed) + 1;
#if DEVMR_IS_DEVICE_CODE
    unsigned sms = 0;
    asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
    return slots < sms ? slots : sms;
#else
    return slots;
#endif
  }

  /// How many slots prime fills, group by group from the smallest (slot after slot within a
  /// group): every slot in use of every group, or as many as half of the heap's slabs allow.
  /// The groups past those start vacant, and each SM's first claim in one installs its slab:
  /// priming the whole heap would leave nothing for installs but other slots' slabs (1 GiB at
  /// 2^16 threads, 4 KiB blocks: 0.04x of the floor).
  DEVMR_HOST_DEVICE std::uint32_t prime_count() const {
    std::uint64_t const slabs = heap_slabs(*h_);
    std::uint64_t const all = std::uint64_t{num_groups} * slots_in_use();
    return static_cast<std::uint32_t>(all < slabs / 2 ? all : slabs / 2);
  }

  /// `count` fresh slabs in a row (never handed out), for prime: the first's id, or no_slab.
  DEVMR_HOST_DEVICE std::uint32_t take_fresh_slabs(std::uint32_t count) const {
    return take_fresh(count, 0);
  }

  /// The fresh slabs for priming `count` slots (prime_count) and, if `spares` (spare_count;
  /// set to 0 when there are not so many fresh slabs in a row), their spares: the first's id
  /// (then prime_slot for each slot), or no_slab.
  DEVMR_HOST_DEVICE std::uint32_t take_prime_slabs(std::uint32_t count,
                                                   std::uint32_t& spares) const {
    if (spares != 0) {
      if (std::uint32_t const first = take_fresh(count + spares, 0); first != no_slab) {
        return first;
      }
      spares = 0;
    }
    return take_fresh(count, 0);
  }

  /// Primes the `i`th of `count` slots (group by group, `slots` in each) with slab `first + i`
  /// (a search when `first` is no_slab), and gives it spare `first + count + i` if `spares`
  /// (see take_prime_slabs). prime_kernel's threads call it, one `i` each.
  DEVMR_HOST_DEVICE void prime_slot(std::uint32_t i,
                                    std::uint32_t slots,
                                    std::uint32_t first,
                                    std::uint32_t count,
                                    std::uint32_t spares) const {
    prime(i / slots, i % slots, first == no_slab ? no_slab : first + i, i % slots);
    if (spares != 0) {
      add_spare(i / slots, i % slots, first + count + i, i % slots);
    }
  }

  /// Gives back blocks of slab `id` (frees): `count` as freed_blocks counts them (a large run's
  /// block counts 1); recycles the slab when none is left: a small slab is marked empty, a large
  /// run goes back on its stack. `first`: arena 0's entry. `order`: release, or relaxed where the
  /// caller issued a release fence since its frees' last writes (the device path, so that the
  /// fence overlaps its load of the pointer).
  DEVMR_HOST_DEVICE void free_blocks(std::uint32_t id,
                                     std::uint32_t count,
                                     unsigned hint,
                                     arena_view const& first,
                                     cuda::std::memory_order order = release) const {
    free_blocks(meta(id, first), id, count, hint, order);
  }
  /// `m`: slab `id`'s metadata, which the caller has at hand.
  DEVMR_HOST_DEVICE void free_blocks(slab_meta& m,
                                     std::uint32_t id,
                                     std::uint32_t count,
                                     unsigned hint,
                                     cuda::std::memory_order order = release) const {
    // release (or, relaxed, after the caller's release fence: see device_deallocate): the
    // freeing threads' last writes to their blocks happen-before the slab's next life. The thread
    // that frees the last block does not acquire them (an acquire would empty its SM's L1 cache): a
    // search for a slab does, when it takes the slab (settle, or take_marked_run for a run). A
    // large run has one block, whose free is this one: the release of its push orders it.
    std::uint32_t const left =
        remaining_units(atomic(m.remaining).fetch_sub(count, order)) - remaining_units(count);
    if (left == large_run_left) {
      retire(id, hint);
    } else if (left == 0) {
      mark_empty(id);
    }
  }

  /// Whether the block at `offset` of a slab of group `g` whose claims handed out the blocks
  /// that `fronts` counts is of the group's large class.
  DEVMR_HOST_DEVICE static bool block_is_large(std::size_t offset,
                                               unsigned g,
                                               std::uint64_t fronts) {
    return offset >= (std::size_t{small_count(fronts)} << unit_shift(g));
  }

  /// What a free that does not know its block's size (a bulk free) makes of the block `p`, at
  /// `offset` of slab `id`: its class follows from the fronts of the slab's claims, in the slot
  /// that holds the slab or, once its claims ended, in its state (a block of a large run counts
  /// as small: the run's one unit). While the claims are ending (between the addition that made
  /// the fronts meet, or the swap that took the slab out of its slot, and the exchange of its
  /// state that follows at once) the fronts are known nowhere: then the block goes on the
  /// slab's list of pending frees, in its state (pending_field), and the thread that ends the
  /// claims frees it (free_pending). So no free waits for another thread's store. A push fails
  /// only when another free pushed or the claims ended; the slab is not recycled meanwhile, as
  /// the block is not freed yet.
  DEVMR_HOST_DEVICE sizeless sizeless_class(void const* p,
                                            std::uint32_t id,
                                            std::size_t offset) const {
    slab_meta& m = meta(id);
    std::uint64_t state = atomic(m.state).load(relaxed);
    for (;;) {
      std::uint32_t const g = state_tag(state);
      if (g >= num_groups) {
        return sizeless::small;
      }
      // An open slab's slot counts the claim that handed the block out, which happened before
      // this free.
      std::uint64_t fronts = state_fields(state);
      if ((fronts & open_state) == 0 ||
          open_fronts(atomic(slot_word_of(*h_, g, open_slot(fronts))).load(relaxed), id, g,
                      fronts)) {
        return block_is_large(offset, g, fronts) ? sizeless::large : sizeless::small;
      }
      // The block is this thread's until it is freed: its first bytes link it to the list.
      *static_cast<std::uint32_t*>(const_cast<void*>(p)) = pending_top(state);
      std::uint64_t const top = ((offset >> unit_shift(g)) + 1) << pending_shift;
      // release: the link, and the block's last writes, before the free that follows the list.
      if (atomic(m.state).compare_exchange_weak(state, (state & ~pending_field) | top, release,
                                                relaxed)) {
        return sizeless::pending;
      }
    }
  }

  /// Marks a claimed block of class `cls` allocated in a checked heap's bitmap (see check_bit).
  DEVMR_HOST_DEVICE void mark_allocated(std::uint32_t id, std::size_t offset, unsigned cls) const {
    std::size_t const bit = check_bit(offset, group_of(cls), is_large_class(cls));
    atomic(check_bits(id)[bit / 64]).fetch_or(std::uint64_t{1} << (bit % 64), relaxed);
  }

  /// The bit of a checked heap's bitmap for the block at `offset` of a slab of group `g`: small
  /// blocks by index from the start, then large blocks by index from the end.
  DEVMR_HOST_DEVICE static std::size_t check_bit(std::size_t offset, unsigned g, bool large) {
    return large ? group_units(g) + ((slab_bytes - offset) >> (unit_shift(g) + 1)) - 1
                 : offset >> unit_shift(g);
  }
  // ---- large blocks -------------------------------------------------------------------------

  /// A run of whole slabs for one block of `bytes` (> max_small_bytes); nullptr when none is left.
  DEVMR_HOST_DEVICE void* allocate_large(std::size_t bytes, unsigned hint) const {
    std::uint64_t const slabs = (bytes + slab_bytes - 1) >> slab_shift;
    if (slabs > max_slabs_per_arena) {
      return nullptr;
    }
    std::uint32_t id = acquire_run(static_cast<std::uint32_t>(slabs), hint);
    if (id == no_slab) {
      // Called here, not in acquire_run: ptxas gives a called function registers above those
      // its callers hold at the call, and few are live here. (Inside acquire_run, this search
      // raised every allocating kernel from 64 registers to 99.)
      id = slabs > 1 ? gather_run(static_cast<std::uint32_t>(slabs)) : reopen_slab(hint);
    }
    if (id == no_slab) {
      return nullptr;
    }
    slab_meta& m = meta(id);
    atomic(m.length).store(static_cast<std::uint32_t>(slabs), relaxed);
    atomic(m.remaining).store(large_run_count, relaxed);
    // release: a checked free, which acquires the state, sees the run's count.
    atomic(m.state).store(make_state(tag_large, 0), release);
    return data(id);
  }

  // ---- frees --------------------------------------------------------------------------------

  /// Checks a free on a checked heap, recording misuse; `done` when it already freed the block.
  /// `large`: whether the block is of its group's large class, as the bitmap says.
  DEVMR_HOST_DEVICE free_check check_free(std::uint32_t id,
                                          std::size_t offset,
                                          unsigned hint,
                                          bool& large) const {
    // A slab past its arena's frontier was not handed out since the heap began or was reset: its
    // metadata may be from before the reset, and must not be trusted (a pointer from then would
    // pass for a block, and its free could mark the slab empty while the frontier hands it out).
    if (index_of(id) >= atomic(h_->frontier[arena_of(id)]).load(relaxed)) {
      return count_misuse(h_->counters.invalid_frees);
    }
    slab_meta& m = meta(id);
    std::uint64_t const state = atomic(m.state).load(acquire);
    std::uint32_t const tag = state_tag(state);
    if (tag < num_groups) {
      unsigned const shift = unit_shift(tag);
      if ((offset & ((std::size_t{1} << shift) - 1)) != 0) {
        return count_misuse(h_->counters.invalid_frees);
      }
      // The bitmap says which block starts here, if any is out: a small one, or a large one
      // (at an even unit). The two are never out at once.
      large = false;
      if (take_check_bit(id, check_bit(offset, tag, false))) {
        return free_check::proceed;
      }
      bool const even = (offset & ((std::size_t{2} << shift) - 1)) == 0;
      large = true;
      if (even && take_check_bit(id, check_bit(offset, tag, true))) {
        return free_check::proceed;
      }
      // Nothing out here: a double free if a block was handed out here, as far as the fronts
      // tell (exact once the slab's claims ended, or while its slot counts them and they have
      // not met; in between, any block may have been).
      std::uint64_t fronts = state_fields(state);
      if ((fronts & open_state) != 0 &&
          !open_fronts(atomic(slot_word_of(*h_, tag, open_slot(fronts))).load(relaxed), id, tag,
                       fronts)) {
        fronts = make_fronts(group_units(tag), group_units(tag) / 2);
      }
      bool const handed = (offset >> shift) < small_count(fronts) ||
                          (even && ((slab_bytes - offset) >> (shift + 1)) <= large_count(fronts));
      return count_misuse(handed ? h_->counters.double_frees : h_->counters.invalid_frees);
    }
    if (tag == tag_large) {
      if (offset != 0) {
        return count_misuse(h_->counters.invalid_frees);
      }
      std::uint32_t expected = large_run_count;
      if (!atomic(m.remaining)
               .compare_exchange_strong(expected, large_run_left, acq_rel, relaxed)) {
        return count_misuse(h_->counters.double_frees);
      }
      retire(id, hint);
      return free_check::done;
    }
    return count_misuse(tag == tag_free ? h_->counters.double_frees : h_->counters.invalid_frees);
  }

  /// Clears bit `bit` of slab `id`'s bitmap; true when it was set.
  DEVMR_HOST_DEVICE bool take_check_bit(std::uint32_t id, std::size_t bit) const {
    std::uint64_t const mask = std::uint64_t{1} << (bit % 64);
    return (atomic(check_bits(id)[bit / 64]).fetch_and(~mask, relaxed) & mask) != 0;
  }

  /// Frees one block from one thread (host paths and tests; kernels aggregate per warp). `bytes`:
  /// the size it was allocated with (as a resource's deallocate receives it), or 0 when unknown:
  /// then the block's class follows from its offset and its slab's fronts (sizeless_class).
  DEVMR_HOST_DEVICE void free_one(void const* p, unsigned hint, std::size_t bytes = 0) const {
    std::uint32_t id = 0;
    std::size_t offset = 0;
    if (p == nullptr) {
      return;
    }
    if (!locate(p, id, offset)) {
      count_misuse(h_->counters.invalid_frees);
      return;
    }
    bool large = false;
    if (checked()) {
      if (check_free(id, offset, hint, large) != free_check::proceed) {
        return;
      }
    } else {
      if (bytes != 0) {
        large = is_large_size(bytes);
      } else {
        sizeless const kind = sizeless_class(p, id, offset);
        if (kind == sizeless::pending) {
          return;
        }
        large = kind == sizeless::large;
      }
    }
    free_blocks(id, large ? freed_blocks(0, 1) : freed_blocks(1, 0), hint, arena(0));
  }

  DEVMR_HOST_DEVICE free_check count_misuse(std::uint64_t& counter) const {
    atomic(counter).fetch_add(1, relaxed);
    return free_check::rejected;
  }

  // ---- slab runs ----------------------------------------------------------------------------

  /// Takes a run of `slabs` contiguous slabs and returns the id of its first, or no_slab. The run
  /// is the caller's to format. A run being split is off its stack for a moment: a search that
  /// found nothing while one was (or whose remainder came back meanwhile) looks again, a bounded
  /// number of times, so that memory in flight is not reported as missing. The first search
  /// takes no snapshot of the returns (an acquire load that would hold back every load after it,
  /// a round trip on every install): only once it has found nothing do the careful searches begin.
  /// `reclaim_for`: the group of a claim that needs one slab (num_groups: none), which may take
  /// an unused slab from a slot of another group (see reclaim_slab) once the search found none.
  /// (A claim's install looks in its own shard, the fresh slabs and its own slot first:
  /// take_slab.)
  DEVMR_HOST_DEVICE DEVMR_NOINLINE std::uint32_t acquire_run(
      std::uint32_t slabs, unsigned hint, unsigned reclaim_for = num_groups) const {
    if (std::uint32_t const id = search_run(slabs, hint); id != no_slab) {
      return id;
    }
    if (reclaim_for < num_groups) {
      if (std::uint32_t const id = reclaim_slab(reclaim_for, hint, true); id != no_slab) {
        return id;
      }
    }
    for (unsigned attempt = 0;; ++attempt) {
      std::uint64_t const returned = atomic(h_->runs_returned.value).load(acquire);
      std::uint32_t const id = search_run(slabs, hint);
      if (id != no_slab || attempt == 128) {
        return id;
      }
      // acquire: pairs with the release in pop_run, so a retry sees the remainder pushed back.
      if (atomic(h_->runs_in_flight.value).load(acquire) == 0 &&
          atomic(h_->runs_returned.value).load(acquire) == returned) {
        return no_slab;
      }
#if DEVMR_IS_DEVICE_CODE
      __nanosleep(attempt < 16 ? 256u : 1024u);  // ~120 us at most
#else
      std::this_thread::yield();
#endif
    }
  }

 private:
  /// Formats slab `id` for group `g` (unless `format` is false: a spare, formatted for the slot
  /// by prime) with its first `small` and `large` blocks claimed, and publishes it in slot
  /// `slot` of the group, which this thread holds (see install).
  DEVMR_HOST_DEVICE void publish(unsigned g,
                                 unsigned slot,
                                 std::uint32_t id,
                                 std::uint32_t small,
                                 std::uint32_t large,
                                 arena_view const& first,
                                 bool format = true) const {
    // release: publishes the formatted slab to the claims, which acquire. A spare needs none:
    // prime formatted it in an earlier kernel (see add_spare), and the release's fence, which
    // waits for the SM's stores in flight, was most of what an install of one cost (2^16
    // threads, 4 KiB blocks: 0.736 of the floor with it and an acquire on the take, 0.781
    // without). Whatever the exchange replaces is
    // closed: the used-up slab, an installing id, or the slab that another installer (a waiter
    // that took over) published first.
    std::uint64_t old;
    if (format) {
      format_small(id, g, slot, first);
      old = atomic(slot_word_of(*h_, g, slot)).exchange(make_slot(id, small, large), release);
    } else {
      old = atomic(slot_word_of(*h_, g, slot)).exchange(make_slot(id, small, large), relaxed);
    }
    // A slab with room in the slot was published meanwhile by another installer (a waiter that
    // took over). acquire: its format, which that publication released, happens before close's
    // stores to its metadata (or the count's first subtraction could come before the format's
    // store). Installs that replace anything else, as nearly all do, pay no fence.
    if (is_slab(slot_id(old)) && unit_count(old) < group_units(g)) {
      cuda::atomic_thread_fence(acquire, cuda::thread_scope_device);
      close(old, g);
    }
  }

  /// A slab for a claim of group `g` from the slots of the other groups: one that a slot
  /// holds with no block claimed (a primed one that never served a claim, or a next one
  /// installed meanwhile) is taken from it for the caller's install. With nothing claimed
  /// nothing was freed, so the slot word alone tells, and once the swap has taken the slab from
  /// its slot it is the caller's: no mark, no second search. take_slab looks in the caller's
  /// own slot right after the fresh slabs (not `everywhere`: four loads of one line, so that a
  /// heap filled past what priming left fresh does not search every stack and bitmap per slab),
  /// and acquire_run in every slot, from the caller's on, as a last resort (a cursor that skipped
  /// slots found without any gains nothing measurable). A full
  /// scan that finds none clears the heap's idle_slots flag, which priming sets, so that
  /// a heap out of memory does not scan again on every failed claim. Slabs of the group itself
  /// stay: moving one between its slots gains nothing (a claim that finds no slab takes blocks
  /// from them, see steal). A slot's words share a line and are read four at a time (eight
  /// took the allocation kernel from 80 registers to 88). Out of line, for the registers.
  DEVMR_HOST_DEVICE DEVMR_NOINLINE std::uint32_t reclaim_slab(unsigned g,
                                                              unsigned hint,
                                                              bool everywhere) const {
    auto idle = atomic(h_->idle_slots.value);
    if (idle.load(relaxed) == 0) {
      return no_slab;
    }
    constexpr unsigned batch = 4;
    static_assert(num_groups % batch == 0);
    std::uint32_t const slots = slots_in_use();
    std::uint32_t const start = hint % slots;
    std::uint32_t const scanned = everywhere ? slots : 1;
    DEVMR_ROLLED for (std::uint32_t i = 0; i < num_groups * scanned; i += batch) {
      unsigned const slot = (start + i / num_groups) % slots;
      unsigned const base = i % num_groups;
      std::uint64_t seen[batch];
      for (unsigned k = 0; k < batch; ++k) {
        seen[k] = atomic(slot_word_of(*h_, base + k, slot)).load(relaxed);
      }
      for (unsigned k = 0; k < batch; ++k) {
        // The exact value: no claim came between the look and the swap. acquire: the slab's
        // formatting for its slot happens before this thread formats it again.
        std::uint64_t expected = seen[k];
        if (base + k != g && is_slab(slot_id(seen[k])) && unit_count(seen[k]) == 0 &&
            atomic(slot_word_of(*h_, base + k, slot))
                .compare_exchange_strong(expected, empty_slot, acquire, relaxed)) {
          return slot_id(seen[k]);
        }
      }
    }
    if (everywhere) {
      idle.store(0, relaxed);
    }
    return no_slab;
  }

  /// The last resort of a search for one slab, when acquire_run found none (and, for a claim,
  /// no other slot had blocks to spare): the slots give up the current slabs whose claimed blocks
  /// are all free (close_slots, which gather_run does for longer runs), and the search looks
  /// again. Without it, the slots of classes no longer in use keep those slabs (up to one per
  /// class for every slot), and a heap with no live block refuses one-slab blocks and the first
  /// blocks of a class. Out of line, for the registers of the allocating kernels.
  DEVMR_HOST_DEVICE DEVMR_NOINLINE std::uint32_t reopen_slab(unsigned hint) const {
    close_slots();
    return acquire_run(1, hint);  // also the slabs that another thread's closing marked
  }

  /// The last resort of a search for `slabs` (> 1) contiguous slabs: they are looked for among
  /// the marks of the bitmaps of empty slabs; if there are not so many in a row, every free run
  /// and slab resting on a stack is marked there too, and the bitmaps are searched again. So the
  /// slabs that small blocks emptied come back as long runs, and runs cut into pieces merge.
  DEVMR_HOST_DEVICE DEVMR_NOINLINE std::uint32_t gather_run(std::uint32_t slabs) const {
    std::uint32_t id = find_marked_run(slabs);
    if (id == no_slab && mark_all_free()) {
      id = find_marked_run(slabs);
    }
    if (id == no_slab && close_slots()) {
      id = find_marked_run(slabs);
    }
    return id;
  }

  /// Gives up the slabs that slots hold as current ones with every claimed block free: the slot
  /// is emptied (it takes another slab on its next claim) and the slab's claims end, so that it
  /// is marked empty at once. Slabs with live blocks stay: closing them would free nothing now.
  /// True when a slot gave one up. A slab that no claim took a block from (primed, most of
  /// them after a reset) needs no look at its count and no subtraction: it is the closer's, and
  /// its mark joins those of the slabs beside it, one addition to the bitmap word for them all
  /// (the primed slabs of a class lie in a row, slot after slot). The words of one class are
  /// read four at a time. So the first large block that gathers a run after a reset does not
  /// pay some five round trips for each of the ~2000 slabs primed on the H200. The slots'
  /// spares (see add_spare) go the same way, after the current slabs (they lie in a row too).
  /// The slabs are in flight meanwhile (out of their slots, not yet marked), so that a search
  /// that misses them looks again (acquire_run) instead of reporting the heap out of memory.
  DEVMR_HOST_DEVICE bool close_slots() const {
    begin_in_flight();
    constexpr unsigned batch = 4;
    std::uint32_t const slots = slots_in_use();
    bool closed = false;
    std::uint32_t row = no_slab;  // the first slab of the bitmap word whose marks are gathered
    std::uint64_t marks = 0;
    // Slab `id` of group `g`, which this thread took with no block claimed, marked empty.
    auto const gather = [&](std::uint32_t id, unsigned g) {
      closed = true;
      atomic(meta(id).remaining).store(0, relaxed);  // empty: what statistics read
      atomic(meta(id).state).store(make_state(g, 0), relaxed);
      std::uint32_t const start = id - index_of(id) % 64;
      if (start != row) {
        flush_marks(row, marks);
        row = start;
        marks = 0;
      }
      marks |= std::uint64_t{1} << (index_of(id) % 64);
    };
    DEVMR_ROLLED for (unsigned g = 0; g < num_groups; ++g) {
      std::uint32_t const units = group_units(g);
      DEVMR_ROLLED for (std::uint32_t first = 0; first < slots; first += batch) {
        std::uint64_t seen[batch];
        for (unsigned k = 0; k < batch; ++k) {
          seen[k] = first + k < slots ? atomic(slot_word_of(*h_, g, first + k)).load(relaxed)
                                      : empty_slot;
        }
        for (unsigned k = 0; k < batch; ++k) {
          std::uint32_t const id = slot_id(seen[k]);
          std::uint32_t const used = unit_count(seen[k]);
          if (!is_slab(id) || used >= units ||
              (used != 0 &&
               remaining_units(atomic(meta(id).remaining).load(relaxed)) != units - used)) {
            continue;  // no slab, a used-up one (it recycles itself), or blocks still live
          }
          // The exact value: no claim came between the look and the swap. acquire: the slab's
          // formatting for its slot happens before this thread's stores to its metadata.
          std::uint64_t expected = seen[k];
          if (!atomic(slot_word_of(*h_, g, first + k))
                   .compare_exchange_strong(expected, empty_slot, acquire, relaxed)) {
            continue;
          }
          if (used != 0) {
            closed = true;
            close(seen[k], g);
            continue;
          }
          gather(id, g);
        }
      }
    }
    DEVMR_ROLLED for (unsigned g = 0; g < num_groups; ++g) {
      DEVMR_ROLLED for (std::uint32_t first = 0; first < slots; first += batch) {
        std::uint32_t seen[batch];
        for (unsigned k = 0; k < batch; ++k) {
          seen[k] =
              first + k < slots ? atomic(spare_word_of(*h_, g, first + k)).load(relaxed) : no_slab;
        }
        for (unsigned k = 0; k < batch; ++k) {
          if (seen[k] != no_slab) {  // (formatted in an earlier kernel: see add_spare)
            std::uint32_t const id =
                atomic(spare_word_of(*h_, g, first + k)).exchange(no_slab, relaxed);
            if (id != no_slab) {
              gather(id, g);
            }
          }
        }
      }
    }
    flush_marks(row, marks);  // release (in mark): the stores above come first
    end_in_flight(closed);
    return closed;
  }

  /// Out of slabs: claim from the current slab of another slot of the group, if one has room.
  /// A claim that uses such a slab up leaves its slot vacant (there is no slab to install).
  DEVMR_HOST_DEVICE DEVMR_NOINLINE pair_claim steal(unsigned g,
                                                    unsigned own,
                                                    std::uint32_t want) const {
    std::uint32_t const slots = slots_in_use();
    std::uint32_t const units = group_units(g);
    arena_view const first = arena(0);
    for (std::uint32_t s = 0; s < slots; ++s) {
      auto slot_word = atomic(slot_word_of(*h_, g, s));
      std::uint64_t const w = s == own ? empty_slot : slot_word.load(relaxed);
      if (!is_slab(slot_id(w)) || unit_count(w) >= units) {
        continue;  // empty, being installed or used up: nothing to take
      }
      // acquire: as a claim's (see claim_pair).
      std::uint64_t const seen = slot_word.fetch_add(wanted_fronts(want), acquire);
      claim_end end = claim_end::none;
      pair_claim const got = take_blocks(seen, want, g, end, first);
      if (end == claim_end::wants_more) {
        give_back_rest(seen, got, units);
      }
      // A claim that made the fronts meet, or found them just met by one that wanted no more,
      // would install the next; out of slabs, it leaves the slot vacant instead.
      if (end != claim_end::none || just_used_up(seen, units)) {
        give_up(slot_word, seen + wanted_fronts(want), units);
      }
      if (got.counts != 0) {
        return got;
      }
    }
    return {nullptr, 0, 0};
  }

  /// Out of slabs: leaves the slot vacant under the next installing id (`seen`: what it held
  /// last) while it holds no slab with room (a claimed vacancy, an installing id, or a used-up
  /// slab), so that the claims waiting for this install claim again, and the first of them
  /// searches in turn. A slab with room that another installer published meanwhile stays, and
  /// so does a vacancy nobody has claimed.
  DEVMR_HOST_DEVICE static void give_up(
      cuda::atomic_ref<std::uint64_t, cuda::thread_scope_device> slot_word,
      std::uint64_t seen,
      std::uint32_t units) {
    while (!is_vacant(seen) && (!is_slab(slot_id(seen)) || unit_count(seen) >= units) &&
           !slot_word.compare_exchange_weak(seen, make_slot(next_installer(slot_id(seen)), 0),
                                            relaxed, relaxed)) {
    }
  }
  /// give_up for slot `slot` of group `g`, from what the slot holds now.
  DEVMR_HOST_DEVICE void give_up(unsigned slot, unsigned g) const {
    auto slot_word = atomic(slot_word_of(*h_, g, slot));
    give_up(slot_word, slot_word.load(relaxed), group_units(g));
  }

  /// True when slot value `w` names a slab whose fronts just met: a claim took its last units
  /// and all it wanted, so nobody installs the next yet; the claim whose addition found `w` does.
  DEVMR_HOST_DEVICE static bool just_used_up(std::uint64_t w, std::uint32_t units) {
    return is_slab(slot_id(w)) && unit_count(w) == units;
  }

  /// True while slot value `w` still stands for what a waiter saw, slot id `id`: the same
  /// installer (an installing id, or empty_id while its vacancy is claimed), or slab `id` used
  /// up (not formatted and installed here again) past its units, so that some claim installs
  /// the next. Fronts that met exactly are no longer waiting: the claim whose addition found
  /// them installs (see just_used_up).
  DEVMR_HOST_DEVICE static bool still_waiting(std::uint64_t w,
                                              std::uint32_t id,
                                              std::uint32_t units) {
    return slot_id(w) == id && (!is_slab(id) || unit_count(w) > units);
  }

  /// Swaps the next installing id into the slot while it still holds what a waiter saw (`seen`
  /// names `id`; claims may have added to its counts since); false when it changed meanwhile.
  DEVMR_HOST_DEVICE static bool take_over(
      cuda::atomic_ref<std::uint64_t, cuda::thread_scope_device> slot_word,
      std::uint64_t seen,
      std::uint32_t id,
      std::uint32_t units) {
    while (still_waiting(seen, id, units)) {
      // A count of one: the slot is not vacant, the taker's claim is in it.
      if (slot_word.compare_exchange_weak(seen, make_slot(next_installer(id), 1), relaxed,
                                          relaxed)) {
        return true;
      }
    }
    return false;
  }

  /// Waits a bounded time for the thread installing the slot's next slab (the slot holds `seen`:
  /// an installing id, a claimed vacancy or a used-up slab), looking by loads: a waiter adds to
  /// the slot's counts once, with the claim that found it waiting, so that the counts stay
  /// within their bits (see make_fronts). Loads cost nothing measurable against additions
  /// on the H200. Returns the value it saw last (what still_waiting
  /// accepts if it took too long).
  DEVMR_HOST_DEVICE static std::uint64_t wait_for_install(
      cuda::atomic_ref<std::uint64_t, cuda::thread_scope_device> slot_word,
      std::uint64_t seen,
      std::uint32_t units) {
    std::uint32_t const id = slot_id(seen);
    // Host threads (tests of this core) give up soon, so that the give-up path runs often.
    unsigned const rounds = DEVMR_IS_DEVICE_CODE ? 320 : 4;
    for (unsigned round = 0; round < rounds && still_waiting(seen, id, units); ++round) {
#if DEVMR_IS_DEVICE_CODE
      __nanosleep(round < 32 ? 32u : 1024u);  // about 1 us, then 1 us a round: ~300 us in all
#else
      std::this_thread::yield();
#endif
      seen = slot_word.load(relaxed);
    }
    return seen;
  }

  /// Formats slab `id` (from take_slab or prime) for group `g`, to be installed in slot `slot`. The
  /// counts are stored first: with arena 0's entry at hand they need no load, and the install's
  /// release waits for them while the flag of checked heaps is read.
  DEVMR_HOST_DEVICE void format_small(std::uint32_t id,
                                      unsigned g,
                                      unsigned slot,
                                      arena_view const& first) const {
    slab_meta& m = meta(id, first);
    atomic(m.remaining).store(group_units(g), relaxed);
    atomic(m.state).store(make_state(g, open_state | slot), relaxed);
    if (checked()) {
      std::uint64_t* bits = check_bits(id);
      std::uint32_t const words = (group_units(g) * 3 / 2 + 63) / 64;
      for (std::uint32_t w = 0; w < words; ++w) {
        atomic(bits[w]).store(0, relaxed);
      }
    }
  }
};

/// What slab `id` holds for users, from its metadata and the slots (statistics scans, with no
/// kernel running): for a group's slab, its group in `g` and its blocks in use of the group's
/// small and large classes; for a large run, num_groups and its block in `small`. False for
/// free, body and empty slabs.
DEVMR_HOST_DEVICE inline bool slab_usage(heap_header const& h,
                                         std::uint32_t id,
                                         slab_meta const& m,
                                         unsigned& g,
                                         std::uint64_t& small,
                                         std::uint64_t& large) {
  std::uint64_t const state = m.state;
  std::uint32_t const tag = state_tag(state);
  if (tag == tag_large) {
    g = num_groups;
    small = m.remaining == large_run_count ? 1 : 0;
    large = 0;
    return true;
  }
  if (tag >= num_groups || remaining_units(m.remaining) == 0) {
    return false;  // not a group's slab, or every block handed out and freed: free to take
  }
  // `remaining` counts the units not freed, and those not handed out while a slot holds the slab
  // (a slab whose claims ended gave those back: see heap_core::end_claims).
  std::uint32_t const units = group_units(tag);
  std::uint64_t fronts = state_fields(state);
  std::uint32_t unclaimed = 0;
  g = tag;
  if ((fronts & open_state) != 0) {
    if (!open_fronts(slot_word_of(h, tag, open_slot(fronts)), id, tag, fronts)) {
      // No slot counts its claims: a spare, a slab being installed (nothing handed out,
      // nothing freed: none in use), or one whose claims are ending this moment (see
      // heap_core::sizeless_class), whose fronts, and so the units between them, are known
      // nowhere. Once one of its blocks was freed, every unit not freed counts as a small block
      // in use (taking the units not handed out as all, as for the others, the count wrapped
      // around below zero).
      std::uint32_t const left = remaining_units(m.remaining);
      small = left < units ? left : 0;
      large = 0;
      return true;
    }
    unclaimed = units - unit_count(fronts);
  }
  // Large blocks freed are counted modulo 2^15: only a slab of 32 B blocks alone can hold 2^15
  // of them, and then it holds no small block.
  std::uint32_t const in_use = remaining_units(m.remaining) - unclaimed;
  large = (large_count(fronts) - large_freed(m.remaining)) & (remaining_unit_mask >> 2);
  if (2 * large < in_use && in_use - 2 * large > small_count(fronts)) {
    large += remaining_unit_mask / 4 + 1;
  }
  small = in_use - 2 * large;
  return true;
}

}  // namespace devmr::detail::heap
