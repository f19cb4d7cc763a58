#pragma once

// The slots of the size classes: where claims for blocks of one class meet, and how slabs come
// into a slot, are handed out, and leave it again.
//
// Each class has `slot_count` slots (an SM uses the slot of its id); a slot word names the slab
// that the slot hands out, the blocks it promised when it took the slab, and the blocks claimed
// since. A claim adds the blocks it wants to the whole word, one atomic; the value it gets back
// says which slab and which of its promised blocks are the claim's own:
//  - a fresh slab (formatted for the class as the slot took it) promises every block, in
//    order: the claim's blocks are the next ones, with no other atomic (a bump pointer);
//  - a reused slab (popped from the class's list of slabs with blocks to reuse) promises the
//    free blocks it had then; the claim takes as many bits from the slab's bitmap, looking from a
//    word that its place among the slot's claims picks, so that claims spread over the bitmap.
// When a slot's promise runs out, one claim installs the next slab: the claim that used it up
// if it still wants blocks, else the first claim that finds it used up. The others take their
// blocks straight from a slab on one of their class's lists if one has them (class_lists), else
// wait for the install, but only for a bounded time: then one of them takes the install over, so
// that a descheduled installer holds nobody up for long. Whoever swaps a slab out of its slot
// closes it: the blocks promised and never claimed go back to its count (slab_avail), after which
// frees list it for reuse, or empty it for any class. A slab used up whose blocks were all freed
// while it sat in its slot (a kernel freed what the one before it allocated) is not swapped
// out: the install opens it again, fresh, where it is (renew).
//
// A slot installs from its class's list first and from the heap's empty slabs after, so that
// freed blocks are handed out again before new slabs are taken: a heap whose live blocks stay
// put and whose other blocks churn serves the churn from the slabs it holds. While the heap is
// roomy (more than an eighth of its slabs empty), a listed slab with few free blocks is left to
// gather more, and the slot takes an empty slab, whose promise is every block: installs are
// then rarer by as many times, at the price of memory that nobody else is using.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/atomics.hpp>
#include <devmr/detail/heap/block_bitmap.hpp>
#include <devmr/detail/heap/class_lists.hpp>
#include <devmr/detail/heap/layout.hpp>
#include <devmr/detail/heap/out_of_line.hpp>
#include <devmr/detail/heap/slab_avail.hpp>
#include <devmr/detail/heap/slab_set.hpp>
#include <devmr/detail/heap/slot_width.hpp>
#include <devmr/detail/heap/slot_word.hpp>

#include <cuda/std/bit>

#include <cstdint>

namespace devmr::detail::heap {

/// What a claim at a slot past the base width gets when that slot has nothing to reuse (see
/// class_slots::install): no blocks, and `id` names the slot of the base width where the caller
/// claims again.
DEVMR_HOST_DEVICE constexpr block_claim moved_claim(unsigned slot) {
  return {slot, 1, 0, false};
}
DEVMR_HOST_DEVICE constexpr bool is_moved(block_claim const& c) {
  return c.count == 0 && c.first == 1;
}

/**
 * The slots of the size classes over the slabs that `Slabs` describes. `Slabs` gives what
 * class_lists needs (the slabs' counts, bitmaps and lists; give_empty; moves), and:
 *  - `format(id, cls)`: records that the slab now holds blocks of class `cls`;
 *  - `take_empty(hint)`: a slab of no class (no_slab when there is none); optionally
 *    `take_empty_for(cls, hint)`: for an install of class `cls` on a roomy heap, an empty slab or
 *    a row of them, consecutive ids whose memory lies in a row (their count from bit 56 of the
 *    result), whose blocks the slot hands out in order as one slab's (open_row);
 *  - `roomy()`: whether more than the heap's roomy share of its slabs is empty (a hint), and
 *    `count_out(id)`: slab `id`, taken from the supply, is formatted for a class (take_roomy);
 *  - `in_flight()`: the count of slabs that installs hold (std::uint64_t&, see final_search);
 *  - `bump_fresh()`: whether the heap leaves its frees unjudged by their bits (an unchecked
 *    heap): then a fresh slab hands its blocks out in order (else from its bitmap, all set, as a
 *    reused slab does), and claims take a reused slab's bitmap words whole (whole_takes).
 * `words`: the slot words, `slot_count` for each class, slot-major (an SM's words share lines).
 * `shape`: how many of them the claims use (slot_width.hpp); nullptr: all, always.
 * `fixed_widths`: the caller knows the widths fixed (slot_width::known_fixed).
 */
template <class Slabs>
class class_slots {
 public:
  /// Whether `Slabs` gives rows of empty slabs to installs (take_empty_for).
  static constexpr bool takes_rows = requires(Slabs const& s, unsigned cls, unsigned hint) {
    s.take_empty_for(cls, hint);
  };

  DEVMR_HOST_DEVICE class_slots(Slabs slabs,
                                std::uint64_t* words,
                                unsigned classes,
                                unsigned slot_count,
                                slot_shape* shape = nullptr,
                                bool fixed_widths = false)
      : lists_{slabs},
        words_{words},
        classes_{classes},
        slot_count_{slot_count},
        width_{shape, slot_count, fixed_widths} {}

  DEVMR_HOST_DEVICE Slabs const& slabs() const { return lists_.slabs(); }
  DEVMR_HOST_DEVICE unsigned slot_count() const { return slot_count_; }
  DEVMR_HOST_DEVICE slot_width const& width() const { return width_; }
  /// The slot that claims of class `cls` from SM (or thread) `hint` use now.
  DEVMR_HOST_DEVICE unsigned slot_of(unsigned cls, unsigned hint) const {
    return hint & width_.mask(cls);
  }
  DEVMR_HOST_DEVICE std::uint64_t& word(unsigned cls, unsigned slot) const {
    return words_[slot * classes_ + cls];
  }

  /// The lists of the classes' slabs that no slot holds, and the frees that fill them.
  DEVMR_HOST_DEVICE class_lists<Slabs> const& lists() const { return lists_; }
  DEVMR_HOST_DEVICE slab_avail avail(std::uint32_t id, unsigned cls) const {
    return lists_.avail(id, cls);
  }
  DEVMR_HOST_DEVICE block_bitmap bitmap(std::uint32_t id, unsigned cls) const {
    return lists_.bitmap(id, cls);
  }
  /// Claims take a reused slab's bitmap words whole (block_bitmap::take_whole): on heaps that do
  /// not judge frees by their bits, one round trip a word instead of two.
  DEVMR_HOST_DEVICE bool whole_takes() const { return slabs().bump_fresh(); }

  /// Claims up to `want` (> 0) blocks of class `cls` through slot `slot`. Returns fewer when
  /// the slot's slab runs out (the caller claims the rest with another call), none when the heap
  /// has no slab left for the class. `hint` spreads the traffic of the heap's stacks (the SM).
  /// Inline in the allocation's fast path: what a claim that its addition did not serve does
  /// beyond the wait for an install (claim_install, take_direct, install) runs out of line, and
  /// what the claim got is worked out again from the slot value it saw (served) rather than held
  /// across those calls.
  DEVMR_HOST_DEVICE block_claim claim(unsigned cls,
                                      unsigned slot,
                                      std::uint32_t want,
                                      unsigned hint) const {
    return claim_from(cls, slot, want, hint, claim_add(cls, slot, want));
  }

  /// The addition that starts a claim of `want` blocks of class `cls` through slot `slot`: the
  /// slot value it replaced. acquire: pairs with the release that published the slot's slab
  /// (install), whose release sequence the other claims' additions continue: the slab's format,
  /// or the frees that its promise counts, happen before its blocks are used.
  DEVMR_HOST_DEVICE std::uint64_t claim_add(unsigned cls, unsigned slot, std::uint32_t want) const {
    return atomic(word(cls, slot)).fetch_add(want, acquire);
  }

  /// The rest of a claim of `want` blocks whose addition (claim_add) replaced slot value `seen`:
  /// what that addition served, or, where it did not serve all of it, what the claim gets once
  /// it installs the next slab or waits for another claim's install (see claim).
  DEVMR_HOST_DEVICE block_claim claim_from(
      unsigned cls, unsigned slot, std::uint32_t want, unsigned hint, std::uint64_t seen) const {
    auto w = atomic(word(cls, slot));
    for (;;) {
      if (served(seen, want, cls).count == want) {
        return served(seen, want, cls);
      }
      if (installs(seen, want, cls)) {
        return out_of_line<&class_slots::claim_install>(*this, cls, slot, want, hint, seen);
      }
      // Another claim installs the next slab. A slab on the class's list serves the claim
      // without waiting, if one has the blocks; else wait for the install, but not without
      // bound: then take it over, and the others wait for this thread in turn.
      if (block_claim const direct =
              out_of_line<&class_lists<Slabs>::take_direct>(lists_, cls, want, hint);
          direct.count != 0) {
        return direct;
      }
      std::uint32_t const id = slot_id(seen);
      seen = wait_for_install(w, seen);
      if (slot_still_waiting(seen, id) &&
          out_of_line<&class_slots::take_over>(*this, cls, slot, seen, id, hint)) {
        return out_of_line<&class_slots::install>(*this, cls, slot, want, hint);
      }
      seen = w.fetch_add(want, acquire);  // installed, or taken over by another waiter
    }
  }

  /// A claim that its addition did not serve in full (`seen`: the value it replaced, from which
  /// what it served follows) and that installs the next slab itself (installs()). A slow path:
  /// called out of line, with the install inline, so that an install is one call away from the
  /// allocation's fast path.
  DEVMR_HOST_DEVICE DEVMR_FORCEINLINE block_claim claim_install(
      unsigned cls, unsigned slot, std::uint32_t want, unsigned hint, std::uint64_t seen) const {
    if (served(seen, want, cls).count != 0) {
      // This claim used the slab up and wants more: it installs the next one for the claims
      // behind it, and claims the rest with another call. (One that got all it wanted installs
      // nothing: the next claim, if one comes, does, slot_just_used_up.) What it got is worked
      // out again from `seen` rather than held across the call.
      out_of_line<&class_slots::install>(*this, cls, slot, 0u, hint);
      return served(seen, want, cls);
    }
    if (!slot_just_used_up(seen)) {
      return install(cls, slot, want, hint);  // vacant
    }
    // The slab sat used up in its slot: if every one of its blocks was freed since, it opens
    // again, fresh, where it is; else the install goes on with what renew read.
    block_claim const again = out_of_line<&class_slots::renew>(*this, cls, slot, seen + want, want);
    if (again.id != no_slab) {
      return again;
    }
    return install_seeing(cls, slot, want, hint, again.first != 0);
  }

  /// Opens again, fresh, the slab of slot `slot` of class `cls` that its claims used up (`now`:
  /// a value of the slot since then, which names it), if every one of its blocks was freed since
  /// it was opened (slab_avail::renew), with the first `want` blocks claimed for the caller: its
  /// bitmap cleared where the heap hands fresh blocks out in order, the slot word exchanged. The
  /// slab never leaves its slot: no close, no list, no search of the supply. A row of slabs
  /// (open_row) opens again as far as its slabs, from the first, were all freed (renew_row):
  /// those make the new opening, a row or one slab, and the others close. Else no_claim (id
  /// no_slab) with `first` what Slabs::roomy said, for the install that follows: the exchange
  /// of the count travels beside that load, where it would otherwise hold the install up by a
  /// round trip. Also no_claim when the slot changed before the slab was published again
  /// (another thread gave it up): its blocks come back as frees. A slow path: called out of
  /// line.
  DEVMR_HOST_DEVICE block_claim renew(unsigned cls,
                                      unsigned slot,
                                      std::uint64_t now,
                                      std::uint32_t want) const {
    std::uint32_t const id = slot_id(now);
    std::uint32_t const per_slab = slabs().blocks(cls);
    std::uint32_t const row = is_row(now, cls) ? slot_promised(now) / per_slab : 1;
    std::uint32_t const renewed = row > 1 ? renew_row(id, cls, row, slot) : avail(id, cls).renew();
    bool const roomy = slabs().roomy();
    if (renewed == 0) {
      return {no_slab, roomy ? 1u : 0u, 0, false};
    }
    slab_avail::renew_settled();
    std::uint32_t const promised = renewed * per_slab;
    bool const fresh = slabs().bump_fresh();  // always, for a row: a checked heap takes none
    if (fresh) {
      DEVMR_ROLLED for (std::uint32_t i = 0; i < renewed; ++i) {
        bitmap(id + i, cls).clear_wide();  // else its blocks go out from its bits, all set
      }
    }
    // No width to update: a class whose slot holds a slab is in use (slot_width) since the
    // install of its first slab after the heap was made or reset, which took an empty one.
    std::uint32_t const mine = want < promised ? want : promised;
    auto w = atomic(word(cls, slot));
    // The opening that the claims used up, not a later one: the same id, promise and kind.
    std::uint64_t const opening = now & ~std::uint64_t{slot_field_mask};
    while ((now & ~std::uint64_t{slot_field_mask}) == opening && slot_used_up(now)) {
      // acq_rel: as install's exchange.
      if (w.compare_exchange_weak(now, make_class_slot(id, promised, fresh, mine), acq_rel,
                                  relaxed)) {
        // The slabs of the row past the new opening leave the slot, used up.
        DEVMR_ROLLED for (std::uint32_t i = renewed; i < row; ++i) {
          lists_.close(id + i, cls, 0, slot);
        }
        return {id, 0, mine, fresh};
      }
    }
    // Whoever gave the slab (or row) up closed it with none of the renewed blocks counted free,
    // so that nobody takes from it: they come back as frees, their bits first.
    DEVMR_ROLLED for (std::uint32_t i = 0; i < renewed; ++i) {
      if (fresh) {
        bitmap(id + i, cls).give_range(0, per_slab);
      }
      lists_.count_freed(id + i, cls, per_slab, slot);
    }
    return {no_slab, roomy ? 1u : 0u, 0, false};
  }

  /// How many of the `row` slabs from `id` (a row that slot `slot` of class `cls` holds, used
  /// up) open again, fresh (slab_avail::renew), counted from the first: those, up to the first
  /// that cannot, all of whose blocks were freed since the row was opened. The renewals go out
  /// together, a round trip for the row; a slab past the first that could not, which opened
  /// again, gets its blocks back as frees (the slot still holds it, used up, or its closer
  /// counted none of them). A slow path: called out of line, with renew.
  DEVMR_HOST_DEVICE std::uint32_t renew_row(std::uint32_t id,
                                            unsigned cls,
                                            std::uint32_t row,
                                            unsigned slot) const {
    bool opened[run_slabs];
    DEVMR_UNROLLED for (std::uint32_t i = 0; i < run_slabs; ++i) {
      opened[i] = i < row && avail(id + i, cls).renew();
    }
    std::uint32_t mask = 0;
    DEVMR_UNROLLED for (std::uint32_t i = 0; i < run_slabs; ++i) {
      mask |= opened[i] ? 1u << i : 0u;
    }
    auto const first = static_cast<std::uint32_t>(cuda::std::countr_one(mask));
    DEVMR_ROLLED for (std::uint32_t i = first + 1; i < row; ++i) {
      if ((mask >> i & 1u) != 0) {
        lists_.count_freed(id + i, cls, slabs().blocks(cls), slot);
      }
    }
    return first;
  }

  /// True when a claim of `want` blocks of class `cls` that its addition did not serve in full
  /// (`seen`: the slot value it replaced) installs the next slab itself: it used the slab up
  /// and wants more, or it found the slot vacant or its slab used up just before it.
  DEVMR_HOST_DEVICE bool installs(std::uint64_t seen, std::uint32_t want, unsigned cls) const {
    return served(seen, want, cls).count != 0 || slot_is_vacant(seen) || slot_just_used_up(seen);
  }

  /// Takes the blocks of `got` (a claim of class `cls`), calling `sink(block)` with the index
  /// of each in its slab.
  template <class Sink>
  DEVMR_HOST_DEVICE void take(block_claim const& got, unsigned cls, Sink&& sink) const {
    if (got.fresh) {
      for (std::uint32_t i = 0; i < got.count; ++i) {
        sink(got.first + i);
      }
      return;
    }
    bitmap(got.id, cls)
        .take(got.first, got.count, whole_takes(), [&](std::uint32_t w, std::uint32_t bits) {
          for (; bits != 0; bits &= bits - 1) {
            sink(w * bitmap_word_bits + lowest_bit_index(bits));
          }
        });
  }

  /// Installs a slab in slot `slot` of class `cls`, which this thread holds (its claim found the
  /// slot vacant or its slab used up, or it took the install over), with the first `want`
  /// blocks (or as many as the slab promises) claimed for this thread. Out of slabs, a claim
  /// takes blocks from the current slab of another slot of its class (steal); the slot is left
  /// vacant for the claims that wait for it, which claim again, the first of them searching in
  /// turn. A slow path: inline in claim_install, through which the allocation's fast path calls
  /// it, and out of line (out_of_line.hpp) elsewhere; the searches it makes of the supply and of
  /// the class's list run out of line.
  DEVMR_HOST_DEVICE DEVMR_FORCEINLINE block_claim install(unsigned cls,
                                                          unsigned slot,
                                                          std::uint32_t want,
                                                          unsigned hint) const {
    return install_seeing(cls, slot, want, hint, slabs().roomy());
  }

  /// install, with `roomy` what Slabs::roomy said (the caller read it).
  DEVMR_HOST_DEVICE DEVMR_FORCEINLINE block_claim
  install_seeing(unsigned cls, unsigned slot, std::uint32_t want, unsigned hint, bool roomy) const {
    std::uint32_t promised = 0;
    bool fresh = false;
    // A roomy heap gives the slot an empty slab rather than a listed one with few free blocks
    // (or the listed one with many that its look found, opened: `promised` blocks), or a row of
    // empty slabs, opened (open_row: `promised` fresh blocks).
    std::uint32_t id = no_slab;
    if (roomy) {
      std::uint64_t const got = out_of_line<&class_slots::take_roomy>(*this, cls, hint, slot);
      id = static_cast<std::uint32_t>(got);
      promised = static_cast<std::uint32_t>(got >> 32);
    }
    if (id != no_slab) {
      hold_in_flight();
    } else if (id = take_listed(cls, hint, promised); id != no_slab) {
      hold_in_flight();
    } else if (slot > width_.base()) {
      // A slot past the width that every class has (a class widened: slot_width) reuses the
      // class's slabs and takes no empty one: widening spreads the claims over the slabs that
      // the class holds, never the heap's empty slabs over more slots. Found none: the class
      // goes back to the base width (its claims would otherwise each try an install here), the
      // slot is left vacant, and the claim is sent to the slot of the base width (moved_claim).
      return out_of_line<&class_slots::leave_wide_slot>(*this, cls, slot, want, hint);
    }
    if (id == no_slab) {
      // A class that reuses a listed slab installed one before (lists are emptied only with
      // every slot): one that needs an empty slab may be in use for the first time since the
      // heap was made or reset.
      out_of_line<&class_slots::use_width>(*this, cls, hint);
      id = slabs().take_empty(hint);
      if (id == no_slab && out_of_line<&class_slots::release_slots>(*this, cls, hint)) {
        id = slabs().take_empty(hint);
      }
      if (id == no_slab) {
        std::uint64_t const found = out_of_line<&class_slots::final_search>(*this, cls, slot, hint);
        id = static_cast<std::uint32_t>(found);
        promised = static_cast<std::uint32_t>(found >> 32);
      }
      if (id != no_slab) {
        hold_in_flight();
      }
    }
    if (id != no_slab && promised == 0) {
      slabs().count_out(id);
      slabs().format(id, cls);
      block_bitmap const bits = bitmap(id, cls);
      bits.clear();
      avail(id, cls).open_fresh();
      promised = slabs().blocks(cls);
      // A fresh slab's blocks go out in order, with no bitmap word touched, unless the heap
      // checks its frees: then every block is handed out from its bit, so that a clear bit
      // always means a block in use.
      fresh = slabs().bump_fresh();
      if (!fresh) {
        bits.give_range(0, promised);
      }
    }
    if (id == no_slab) {
      return out_of_line<&class_slots::out_of_slabs>(*this, cls, slot, want, hint);
    }
    std::uint32_t const mine = want < promised ? want : promised;
    // A row of slabs (open_row) promised more than a slab's blocks, fresh ones; a reused slab
    // promises fewer.
    fresh = fresh || promised > slabs().blocks(cls);
    // acq_rel: release publishes the format (or the frees that open_listed acquired) to the
    // claims, which acquire; acquire orders the format of the slab that this replaces, if
    // another installer published one meanwhile, before its close.
    std::uint64_t const now = make_class_slot(id, promised, fresh, mine);
    std::uint64_t const old = atomic(word(cls, slot)).exchange(now, acq_rel);
    let_go_in_flight();
    if (is_row(old, cls)) {
      // Out of line, with what the claim got passed through (nothing held across the call).
      std::uint64_t const got = out_of_line<&class_slots::close_row>(*this, old, cls, hint, now);
      return {slot_id(got), 0, slot_claimed(got), slot_is_fresh(got)};
    }
    close_slab(old, cls, hint);
    return {id, 0, mine, fresh};
  }

  /// An install of class `cls` in slot `slot` that found no slab: a claim of `want` blocks takes
  /// what it can from the current slab of another slot of its class (steal), and the slot is
  /// left vacant (give_up). A slow path: called out of line.
  DEVMR_HOST_DEVICE block_claim out_of_slabs(unsigned cls,
                                             unsigned slot,
                                             std::uint32_t want,
                                             unsigned hint) const {
    block_claim got = no_claim;
    if (want != 0) {
      got = steal(cls, want, hint);
    }
    give_up(cls, slot, hint);
    return got;
  }

  /// Counts a slab that an install took, off a list or from the supply, as in flight until it
  /// is in its slot (final_search).
  DEVMR_HOST_DEVICE void hold_in_flight() const {
    atomic(slabs().in_flight()).fetch_add(1, relaxed);
  }
  /// Ends what hold_in_flight began. relaxed: a release would wait for the slot's exchange (a
  /// fence, a round trip on every install); the count only tells a search that found nothing
  /// whether to look again.
  DEVMR_HOST_DEVICE void let_go_in_flight() const {
    atomic(slabs().in_flight()).fetch_sub(1, relaxed);
  }

  /// A slot of class `cls` past the base width found nothing to reuse (see install): the class
  /// goes back to the base width and the slot is left vacant; a claim of `want` blocks is sent
  /// to the slot of the base width (moved_claim). A slow path: called out of line.
  DEVMR_HOST_DEVICE block_claim leave_wide_slot(unsigned cls,
                                                unsigned slot,
                                                std::uint32_t want,
                                                unsigned hint) const {
    width_.narrow(cls);
    give_up(cls, slot, hint);
    if (want == 0) {
      return no_claim;
    }
    return moved_claim(slot & width_.base());
  }

  /// Closes the slab of slot value `old`, which this thread swapped out of its slot (nothing
  /// when it names none): the blocks the slot promised and no claim took go back.
  DEVMR_HOST_DEVICE void close(std::uint64_t old, unsigned cls, unsigned hint) const {
    if (is_row(old, cls)) {
      out_of_line<&class_slots::close_row>(*this, old, cls, hint, old);
    } else {
      close_slab(old, cls, hint);
    }
  }

  /// Whether slot value `old` of class `cls` names a row of slabs (open_row): fresh blocks, more
  /// than a slab's.
  DEVMR_HOST_DEVICE bool is_row(std::uint64_t old, unsigned cls) const {
    return is_slab(slot_id(old)) && slot_is_fresh(old) && slot_promised(old) > slabs().blocks(cls);
  }

  /// close, for a slot value that names one slab (or none).
  DEVMR_HOST_DEVICE void close_slab(std::uint64_t old, unsigned cls, unsigned hint) const {
    std::uint32_t const id = slot_id(old);
    if (!is_slab(id)) {
      return;
    }
    std::uint32_t const promised = slot_promised(old);
    std::uint32_t const claimed = slot_claimed(old);
    std::uint32_t const unused = claimed < promised ? promised - claimed : 0;
    if (unused != 0 && slot_is_fresh(old)) {
      bitmap(id, cls).give_range(claimed, promised);  // a reused slab's are still set
    }
    lists_.close(id, cls, unused, hint);
  }

  /// Formats and opens the `row` empty slabs from `id` for class `cls`, for a slot that hands out
  /// the blocks of all of them in order, as one slab's (Slabs::take_empty_for): each slab counts
  /// as out of the supply, takes the class, and keeps a count and a bitmap of its own, clear, to
  /// which the frees of its blocks go. Returns the blocks the slot promises: all of them. A slow
  /// path: called out of line.
  DEVMR_HOST_DEVICE std::uint32_t open_row(std::uint32_t id,
                                           std::uint32_t row,
                                           unsigned cls) const {
    DEVMR_ROLLED for (std::uint32_t i = 0; i < row; ++i) {
      slabs().count_out(id + i);
      slabs().format(id + i, cls);
      bitmap(id + i, cls).clear_wide();
      avail(id + i, cls).open_fresh();
    }
    return row * slabs().blocks(cls);
  }

  /// Closes the row of slabs of slot value `old` (open_row), which this thread swapped out of its
  /// slot: each slab gets back its blocks that the slot promised and no claim took (the claims
  /// took the row's blocks in order). Returns `pass`, so that a caller out of line holds nothing
  /// across the call. A slow path: called out of line.
  DEVMR_HOST_DEVICE std::uint64_t close_row(std::uint64_t old,
                                            unsigned cls,
                                            unsigned hint,
                                            std::uint64_t pass) const {
    std::uint32_t const per_slab = slabs().blocks(cls);
    std::uint32_t const id = slot_id(old);
    std::uint32_t const claimed = slot_claimed(old);
    DEVMR_ROLLED for (std::uint32_t i = 0; i < slot_promised(old) / per_slab; ++i) {
      std::uint32_t const taken = row_slab_claimed(claimed, i, per_slab);
      if (taken != per_slab) {
        bitmap(id + i, cls).give_range(taken, per_slab);
      }
      lists_.close(id + i, cls, per_slab - taken, hint);
    }
    return pass;
  }

  /// Empties slot `slot` of class `cls` (for reset-like uses and tests): closes its slab.
  DEVMR_HOST_DEVICE void vacate(unsigned cls, unsigned slot, unsigned hint) const {
    close(atomic(word(cls, slot)).exchange(vacant_class_slot, acq_rel), cls, hint);
  }

  /// Out of empty slabs: the slots of the other classes give up their slabs, so that those
  /// whose blocks are all free leave their classes (a class that nobody allocates from any more
  /// keeps none) and the others go on their lists; so do the slots of class `cls` past its width
  /// (slot_width), which its claims no longer use. True when one was given up. `cls`
  /// num_classes (or any class past the last): every slot gives its slab up, for a run of whole
  /// slabs.
  DEVMR_HOST_DEVICE bool release_slots(unsigned cls, unsigned hint) const {
    bool released = false;
    DEVMR_ROLLED for (unsigned c = 0; c < classes_; ++c) {
      unsigned const first = c == cls ? width_.mask(c) + 1 : 0;
      DEVMR_ROLLED for (unsigned s = first; s < slot_count_; ++s) {
        released = release_slot(c, s, hint) || released;
      }
    }
    return released;
  }

  /// Class `cls` takes an empty slab (slot_width::use); where the widths narrowed, the slots past
  /// them give their slabs up (release_narrowed). Returns 0, so that a caller out of line holds
  /// nothing across the call. A slow path: called out of line.
  DEVMR_HOST_DEVICE std::uint64_t use_width(unsigned cls, unsigned hint) const {
    if (std::uint64_t const was = width_.use(cls); was != 0) {
      release_narrowed(was, hint);
    }
    return 0;
  }

  /// The widths narrowed from `was` (slot_width::use): the slots of each class past its width
  /// now, up to its width in `was`, give up their slabs, which no claim uses any more: a slab
  /// whose blocks are all free (a class that was alone in use, and whose blocks were freed)
  /// leaves its class at once, for the classes now in use, and the claims that read the old
  /// width find those slots vacant, and are sent to the base width (install). Returns `was`,
  /// so that a caller out of line holds nothing across the call. A slow path: called out of line.
  DEVMR_HOST_DEVICE std::uint64_t release_narrowed(std::uint64_t was, unsigned hint) const {
    slot_width::snapshot const now = width_.look();
    DEVMR_ROLLED for (unsigned c = 0; c < classes_ && c < slot_width::max_classes; ++c) {
      std::uint32_t const old_mask = slot_width::mask_of(was, c);
      DEVMR_ROLLED for (unsigned s = slot_width::mask_of(now.word, c) + 1;
                        s <= old_mask && s < slot_count_; ++s) {
        release_slot(c, s, hint);
      }
    }
    return was;
  }

  /// The last search of an install out of slabs, after the slots of the other classes gave
  /// theirs up (release_slots): reclaim, then the supply. A slab that another install holds
  /// (taken, and not yet in its slot), or that another thread swapped out of its slot and has
  /// not yet closed, is on no list and in no slot for a moment, and may be the only one with
  /// free blocks: while installs hold slabs, or when a close put one back during the search, it
  /// is made again (the slots giving their slabs up first), a bounded number of times; else it
  /// gives up at once. Returns what reclaim returns, or a slab from the supply with none
  /// promised (which the caller formats), or no_slab. A slow path: called out of line, and
  /// calling out of line, so that it holds few registers.
  DEVMR_HOST_DEVICE std::uint64_t final_search(unsigned cls, unsigned slot, unsigned hint) const {
    std::uint64_t moves = atomic(slabs().moves()).load(relaxed);
    for (unsigned attempt = 0;; ++attempt) {
      std::uint64_t const found = out_of_line<&class_slots::reclaim>(*this, cls, slot, hint);
      if (static_cast<std::uint32_t>(found) != no_slab) {
        return found;
      }
      if (std::uint32_t const id = slabs().take_empty(hint); id != no_slab) {
        return id;
      }
      std::uint64_t const moved = atomic(slabs().moves()).load(relaxed);
      if (attempt == final_search_retries ||
          (moved == moves && atomic(slabs().in_flight()).load(relaxed) == 0)) {
        return no_slab;
      }
      moves = moved;
      pause_briefly();
      out_of_line<&class_slots::release_slots>(*this, cls, hint);
    }
  }

  /// Searches that final_search makes again at most.
  static constexpr unsigned final_search_retries = 16;

  /// Out of slabs even after the slots of the other classes gave theirs up (release_slots): the
  /// other slots of class `cls` give up theirs too, so that the blocks that they hold back (the
  /// quarter of a reused slab's free blocks that its slot does not promise, and the blocks
  /// promised and not claimed) go back to their slabs' counts, which list the slabs for reuse
  /// or empty them, and so does the caller's slot `slot` if it still holds the slab that the
  /// claims used up (the blocks freed since it was opened count as soon as it closes: a class
  /// whose slabs are all in its slots has no other); then a slab off the class's list, or else
  /// one off its list of slabs closed below the listing threshold, is opened for the caller's
  /// slot (class_lists::take_any). Returns its id, and the blocks promised in the high half;
  /// no_slab when both lists are empty. A slow path: called out of line.
  DEVMR_HOST_DEVICE std::uint64_t reclaim(unsigned cls, unsigned slot, unsigned hint) const {
    DEVMR_ROLLED for (unsigned s = 0; s < slot_count_; ++s) {
      if (s != slot) {
        release_slot(cls, s, hint);
      }
    }
    close_used_up(cls, slot, hint);
    return lists_.take_any(cls, hint);
  }

 private:
  /// An empty slab for an install of class `cls` on a roomy heap (Slabs::roomy), taken rather
  /// than a listed slab with few free blocks: a listed slab is listed as soon as an eighth of
  /// its blocks are free, and an install that opens it then promises a few dozen blocks, where
  /// an empty slab promises every block. Such slabs stay listed and gather frees meanwhile.
  /// Where the slab that a look at the class's list finds has a quarter of its blocks free
  /// (rich_threshold), the install reuses it: this takes it off the list and opens it
  /// (take_listed_in, with no second look) and returns its id, with the blocks it promised in
  /// the high word. Else the empty slab, with 0 there; no_slab when the supply has none. A class
  /// with listed slabs reuses its slabs: it widens as an install of a listed slab would. A slow
  /// path: called out of line.
  DEVMR_HOST_DEVICE std::uint64_t take_roomy(unsigned cls, unsigned hint, unsigned slot) const {
    // Read beside the look, so that the update of the widths waits for no load and travels
    // beside the take that follows it.
    slot_width::snapshot const widths = width_.look();
    // A claim that read the width before its class narrowed, at a slot past the width now: no
    // empty slab, which would spread the class's blocks over slots that no claim uses any more
    // (the install goes on as on a heap that is not roomy: a listed slab, or the slot of the
    // base width).
    if (!widths.fixed && cls < slot_width::max_classes &&
        slot > slot_width::mask_of(widths.word, cls)) {
      return no_slab;
    }
    std::uint32_t const parts = slabs().list_parts();
    DEVMR_ROLLED for (std::uint32_t part = 0; part == 0 || part < parts; ++part) {
      std::uint32_t const member = slabs().listed(cls, part).find_guessing(spread_seed(hint));
      if (member == no_member) {
        continue;
      }
      width_.widen(cls, widths);
      if (member != stale_member) {
        slab_avail const a = avail(slabs().slab_of(part, member), cls);
        std::uint32_t const seen = a.peek();
        if ((seen & avail_count_mask) >= rich_threshold(slabs().blocks(cls))) {
          if (std::uint64_t const taken = take_listed_in(cls, part, member, hint, seen, false);
              static_cast<std::uint32_t>(taken) != no_slab) {
            return taken;
          }
        }
      }
      // A look at a word emptied meanwhile, a slab with few free blocks, or a list that ran dry
      // before the take: an empty slab.
      return take_fresh_for(cls, hint);
    }
    // A class in use before that takes an empty slab on a roomy heap needs more blocks than its
    // slots hold: it widens as a reuse would (slot_width::use), so that a class alone on a fresh
    // heap does not send every SM's claims to the slots of the base width, one install after
    // another.
    if (std::uint64_t const was = width_.use(cls, widths, true); was != 0) {
      release_narrowed(was, hint);
    }
    return take_fresh_for(cls, hint);
  }

  /// An empty slab for an install of class `cls` on a roomy heap (its id), or a row of them,
  /// opened (open_row), where Slabs gives rows (take_empty_for): as take_roomy returns them,
  /// with the blocks the row promises in the high word (more than a slab's: fresh blocks).
  DEVMR_HOST_DEVICE std::uint64_t take_fresh_for(unsigned cls, unsigned hint) const {
    if constexpr (takes_rows) {
      std::uint64_t const got = slabs().take_empty_for(cls, hint);
      auto const row = static_cast<std::uint32_t>(got >> 56);
      auto const id = static_cast<std::uint32_t>(got);
      if (row <= 1) {
        return id;
      }
      // Out of line: the format of a row's bitmaps (clear_wide) holds registers that the
      // roomy take, two calls from the allocation's fast path, would otherwise hold too.
      std::uint32_t const promised = out_of_line<&class_slots::open_row>(*this, id, row, cls);
      return id | (std::uint64_t{promised} << 32);
    } else {
      return slabs().take_empty(hint);
    }
  }

  /// A slab off class `cls`'s list, opened for the caller's slot with `promised` blocks;
  /// no_slab when the list has none. Each search first tries a member that a look down the
  /// list's summaries picks at random (slab_set::find), so that installs that search at once
  /// take different slabs instead of meeting on the first member of the list; then it searches
  /// in order, from a place of its SM, unless the look found no word marked: an empty list costs
  /// an install one load (the top word's, or the summary word's where a part has but one), not
  /// two. The look is inline; the take, out of line.
  /// The parts (arenas) are looked at in order from part 0, which every heap has, so that the
  /// first look need not wait for the count of parts: its loads of the arena table travel beside
  /// that count's, one round trip less on every install (take_roomy and take_direct look in the
  /// same order).
  DEVMR_HOST_DEVICE std::uint32_t take_listed(unsigned cls,
                                              unsigned hint,
                                              std::uint32_t& promised) const {
    std::uint32_t const parts = slabs().list_parts();
    DEVMR_ROLLED for (std::uint32_t part = 0; part == 0 || part < parts; ++part) {
      std::uint32_t const member = slabs().listed(cls, part).find(spread_seed(hint));
      if (member == no_member) {
        continue;
      }
      std::uint64_t const found =
          out_of_line<&class_slots::take_listed_in>(*this, cls, part, member, hint, 0u, true);
      if (static_cast<std::uint32_t>(found) != no_slab) {
        promised = static_cast<std::uint32_t>(found >> 32);
        return static_cast<std::uint32_t>(found);
      }
    }
    return no_slab;
  }

  /// take_listed's take from part `part` of the list, whose look found `member` (or
  /// stale_member): the slab's id, and the blocks it promised in the high word; no_slab when
  /// the part has none. `seen`: the member's count word as the look read it (take_roomy), or 0
  /// for none read. `widens`: the take widens the class (false where the caller did: take_roomy).
  /// The class reuses slabs, and its slots use them up: it widens where the classes in use leave
  /// room (slot_width), so that fewer SMs meet on each slot and fewer claims wait for each install.
  /// It widens once it took a slab off the list, before it opens it; from the widths read beside
  /// the erase of the member its look found, so that the update waits for no load and travels
  /// beside the opening. A slow path: called out of line.
  DEVMR_HOST_DEVICE std::uint64_t take_listed_in(unsigned cls,
                                                 std::uint32_t part,
                                                 std::uint32_t member,
                                                 unsigned hint,
                                                 std::uint32_t seen,
                                                 bool widens) const {
    if (member != stale_member) {
      // The count, where the look did not read it, is loaded beside the erase rather than after
      // it: a CAS that a free made stale meanwhile fails and goes again, one round trip, as a
      // load after the erase would have cost every time.
      slot_width::snapshot const widths = widens ? width_.look() : slot_width::no_update();
      std::uint32_t const count =
          seen != 0 ? seen : avail(slabs().slab_of(part, member), cls).peek();
      if (slabs().listed(cls, part).erase(member)) {
        width_.widen(cls, widths);
        if (std::uint64_t const found = lists_.open_taken(cls, part, member, count);
            found != no_slab) {
          return found;
        }
        widens = false;
      }
    }
    return out_of_line<&class_slots::take_listed_next>(*this, cls, part, hint, widens);
  }

  /// take_listed_in's search of part `part` of the list in order, from a place of `hint`, once
  /// the member its look found was gone: the first slab it takes off the list and opens, as
  /// take_listed_in returns it. A slow path: called out of line.
  DEVMR_HOST_DEVICE std::uint64_t take_listed_next(unsigned cls,
                                                   std::uint32_t part,
                                                   unsigned hint,
                                                   bool widens) const {
    slab_set const set = slabs().listed(cls, part);
    std::uint32_t start = hint;
    for (;;) {
      std::uint32_t const taken = set.take(start);
      if (taken == no_member) {
        return no_slab;
      }
      if (widens) {
        width_.widen(cls);
        widens = false;
      }
      if (std::uint64_t const found = lists_.open_taken(cls, part, taken, 0); found != no_slab) {
        return found;
      }
      start = taken / (bitmap_word_bits * bitmap_word_bits);  // emptied meanwhile: look on
    }
  }

  /// What a claim of `want` blocks got from slot value `seen`, the value its addition replaced.
  DEVMR_HOST_DEVICE block_claim served(std::uint64_t seen, std::uint32_t want, unsigned cls) const {
    std::uint32_t const id = slot_id(seen);
    std::uint32_t const claimed = slot_claimed(seen);
    std::uint32_t const promised = slot_promised(seen);
    if (!is_slab(id) || claimed >= promised) {
      return no_claim;
    }
    std::uint32_t const left = promised - claimed;
    std::uint32_t const count = want < left ? want : left;
    bool const fresh = slot_is_fresh(seen);
    // A reused slab's claims look from words spread over its bitmap by their place. 32 bits
    // hold the product (claimed < 2^20 blocks, bitmap words <= 2^11): no 64-bit division.
    std::uint32_t const first =
        fresh ? claimed
              : claimed * static_cast<std::uint32_t>(bitmap_words_for(slabs().blocks(cls))) /
                    promised;
    return {id, first, count, fresh};
  }

  /// Polls slot word `w` from `seen` while it still stands for what the waiter saw, a bounded
  /// number of times; returns the last value read.
  DEVMR_HOST_DEVICE static std::uint64_t wait_for_install(
      cuda::atomic_ref<std::uint64_t, cuda::thread_scope_device> w, std::uint64_t seen) {
    std::uint32_t const id = slot_id(seen);
    // About 260 us on the device, where each poll sleeps 256 ns; four polls on the host, whose
    // tests then take installs over often.
    unsigned const polls = DEVMR_IS_DEVICE_CODE ? 1024 : 4;
    for (unsigned i = 0; i < polls && slot_still_waiting(seen, id); ++i) {
      pause_briefly();
      seen = w.load(relaxed);
    }
    return seen;
  }

  /// Swaps the next installing id into slot `slot` of class `cls` while it still stands for
  /// slot id `id` (`seen`: the waiter's last look); closes the used-up slab it displaced. False
  /// when the slot changed meanwhile. The taker's claim is counted in the slot (a claimed count
  /// of one): the slot is not vacant.
  DEVMR_HOST_DEVICE bool take_over(
      unsigned cls, unsigned slot, std::uint64_t seen, std::uint32_t id, unsigned hint) const {
    return displace(
        cls, slot, seen, [id](std::uint64_t v) { return slot_still_waiting(v, id); }, 1, hint);
  }

  /// The installer of slot `slot` of class `cls` closes the slab there if the claims used it
  /// up, under the next installing id with one claim counted (as take_over leaves it), so that
  /// the claims that wait there go on waiting for this install. A slab with room that another
  /// installer published meanwhile stays.
  DEVMR_HOST_DEVICE void close_used_up(unsigned cls, unsigned slot, unsigned hint) const {
    displace(
        cls, slot, atomic(word(cls, slot)).load(relaxed),
        [](std::uint64_t v) { return slot_used_up(v); }, 1, hint);
  }

  /// Swaps the next installing id into slot `slot` of class `cls`, with `claimed` claims counted,
  /// while the slot's value satisfies `stands` (`seen`: the caller's last look at it), and closes
  /// the slab it displaced: true when it did, false when the slot changed to a value that does
  /// not. take_over, close_used_up and give_up differ only in `stands` and `claimed`.
  template <class Stands>
  DEVMR_HOST_DEVICE bool displace(unsigned cls,
                                  unsigned slot,
                                  std::uint64_t seen,
                                  Stands stands,
                                  std::uint32_t claimed,
                                  unsigned hint) const {
    auto w = atomic(word(cls, slot));
    while (stands(seen)) {
      // acquire: the format of the slab it displaces happens before its close.
      if (w.compare_exchange_weak(seen,
                                  make_class_slot(next_installer(slot_id(seen)), 0, false, claimed),
                                  acquire, relaxed)) {
        close(seen, cls, hint);
        return true;
      }
    }
    return false;
  }

  /// Slot `s` of class `c` gives up the slab it holds, if any, and closes it: true when it did.
  DEVMR_HOST_DEVICE bool release_slot(unsigned c, unsigned s, unsigned hint) const {
    auto w = atomic(word(c, s));
    std::uint64_t seen = w.load(relaxed);
    // acquire: the format of the slab it takes out happens before its close.
    if (is_slab(slot_id(seen)) &&
        w.compare_exchange_strong(seen, vacant_class_slot, acquire, relaxed)) {
      close(seen, c, hint);
      return true;
    }
    return false;
  }

  /// Out of slabs: claim from the current slab of any slot of the class, if one has blocks
  /// promised and not claimed (the caller's own too: an installer that took its install over
  /// may have published a slab there meanwhile). A claim that uses such a slab up leaves its
  /// slot vacant.
  DEVMR_HOST_DEVICE block_claim steal(unsigned cls, std::uint32_t want, unsigned hint) const {
    for (unsigned s = 0; s < slot_count_; ++s) {
      auto w = atomic(word(cls, s));
      std::uint64_t const look = w.load(relaxed);
      if (!slot_has_room(look)) {
        continue;
      }
      std::uint64_t const seen = w.fetch_add(want, acquire);  // as a claim's
      block_claim const got = served(seen, want, cls);
      if (got.count < want || slot_just_used_up(seen)) {
        give_up(cls, s, hint);
      }
      if (got.count != 0) {
        return got;
      }
    }
    return no_claim;
  }

  /// Out of slabs: leaves slot `slot` of class `cls` vacant under the next installing id while it
  /// holds no slab with blocks to claim, closing the slab it held, so that the claims waiting
  /// for an install claim again. A slab with room that another installer published meanwhile
  /// stays, and so does a vacancy nobody claimed.
  DEVMR_HOST_DEVICE void give_up(unsigned cls, unsigned slot, unsigned hint) const {
    displace(
        cls, slot, atomic(word(cls, slot)).load(relaxed),
        [](std::uint64_t v) { return !slot_is_vacant(v) && !slot_has_room(v); }, 0, hint);
  }

  class_lists<Slabs> lists_;
  std::uint64_t* words_;
  unsigned classes_;
  unsigned slot_count_;
  slot_width width_;
};

/// The slow paths of class_slots take the object's address out of line (the caller keeps it in
/// memory), unless `Slabs` can rebuild the slots from less: a heap's slots (heap_slabs.hpp) are
/// rebuilt from the heap's header.
template <class Slabs>
struct view_handle<class_slots<Slabs>> : address_handle<class_slots<Slabs>> {};

}  // namespace devmr::detail::heap
