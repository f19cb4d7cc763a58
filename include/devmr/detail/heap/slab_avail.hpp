#pragma once

// The count of a slab's free blocks that no slot has promised to a claim, and the two flags that
// say where the slab is: open (a slot hands out its blocks) or listed (on its class's list of
// slabs with blocks to reuse). One 32-bit word, so that a free of a warp's blocks of one slab
// costs one atomic addition.
//
// A slab's life in its class:
//  - open: a slot took it (fresh from formatting, or from the class's list, taking the whole
//    count as its promise); frees add to the count, which waits for the slot to close it;
//  - closed: the slot gave it up (its promise used up, or given back); from here the frees that
//    bring the count to the class's threshold list the slab (one of them, by setting the flag),
//    and the free that brings it to every block of the slab empties it: the slab leaves its
//    class, for any class or a large run;
//  - listed: on its class's list; frees still add; a slot that takes it off the list opens it
//    again, and the free that frees its last block takes it off the list, takes it, and empties
//    it.
// Every change of place is one atomic on this word, so that exactly one thread acts on each:
// the one whose operation set the flag, or whose exchange took the count.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/atomics.hpp>

#include <cstdint>

namespace devmr::detail::heap {

inline constexpr std::uint32_t avail_count_mask = (std::uint32_t{1} << 20) - 1;
/// The class whose blocks the slab holds (bits 20-24), so that a thread that found the slab on
/// a class's list from before it changed class does not open it for the wrong one.
inline constexpr unsigned avail_class_shift = 20;
inline constexpr std::uint32_t avail_class_mask = std::uint32_t{0x1f} << avail_class_shift;
/// The class field of a slab that left its class (emptied).
inline constexpr std::uint32_t avail_no_class = avail_class_mask;
/// A slot holds the slab: its count gathers frees for the slot's close.
inline constexpr std::uint32_t avail_open = std::uint32_t{1} << 31;
/// The slab is on its class's list of slabs with blocks to reuse.
inline constexpr std::uint32_t avail_listed = std::uint32_t{1} << 30;

/// Free blocks a closed slab of `blocks` blocks must have to be listed for reuse: an eighth of
/// them. A lower threshold puts slabs with fewer blocks on the list, so that slots reopen slabs
/// more often for fewer blocks each; a higher one leaves more free blocks where no slot looks
/// (below the threshold, on slabs that wait for more frees: at most an eighth of a class's
/// memory, and in a steady state about half of that).
DEVMR_HOST_DEVICE constexpr std::uint32_t reuse_threshold(std::uint32_t blocks) {
  return blocks >= 8 ? blocks / 8 : 1;
}

/// The blocks a slot promises when it opens a listed slab with `count` free blocks: three
/// quarters of them. Its claims look for their bits from places spread over the bitmap, and
/// take over what they do not find there from the places of others: with every free bit
/// promised, the last claims of a promise scanned long stretches that others had emptied
/// (about 14 words a claim at 16 B on the H200); with a quarter left over, a claim finds its
/// bits close to where it starts. The quarter stays counted, for the slab's next opening.
DEVMR_HOST_DEVICE constexpr std::uint32_t reuse_promise(std::uint32_t count) {
  return count - count / 4;
}

/// Free blocks at which a listed slab is worth its install even on a roomy heap (one with many
/// empty slabs, class_slots::take_roomy): a quarter of its blocks, so that its promise is at
/// least three sixteenths of them. A listed slab with fewer waits for more frees, and the install
/// takes an empty slab, whose promise is every block.
DEVMR_HOST_DEVICE constexpr std::uint32_t rich_threshold(std::uint32_t blocks) {
  return blocks / 4;
}

/// The blocks a listed slab keeps for its next opening when claims take blocks from it
/// directly (slab_avail::claim_direct): half the listing threshold, so that a slot that opens it
/// still gets a promise worth its install.
DEVMR_HOST_DEVICE constexpr std::uint32_t direct_keep(std::uint32_t blocks) {
  return reuse_threshold(blocks) / 2;
}

/// The classes whose claims take blocks straight from slabs that no slot holds
/// (class_lists::take_direct): those with at most this many blocks a slab. A count can run ahead
/// of the bits it counts (a free's bit and its count are two atomics), so a claim may look
/// through its slab's whole bitmap once before its bits arrive: 32 words here, against 2048 for
/// the smallest blocks, whose slabs' promises are large enough that their claims wait for
/// installs rarely anyway.
inline constexpr std::uint32_t direct_max_blocks = 1024;

/// What an addition to a slab's count asks of the thread that made it.
enum class avail_event {
  none,         ///< nothing to do
  listed,       ///< this thread listed the slab: it adds the slab to its class's list
  emptied,      ///< this thread took the slab, every block free: it hands it on (a format follows)
  full_listed,  ///< every block of a listed slab is free: this thread takes it off its class's
                ///< list and tries to take it (take_full), to hand it on (see class_lists::act)
  below,        ///< this thread closed the slab with free blocks too few to list it (none,
                ///< perhaps): it adds the slab to its class's list of such slabs (close only)
};

/// What slab_avail::claim_direct did: took the blocks, refused them (the slab is where the
/// caller found it, but short), or found the slab elsewhere (opened, listed or unlisted since,
/// or of another class).
enum class direct_claim { taken, refused, gone };

/// A view of a slab's free count (`word`) for class `cls`, of `blocks` blocks per slab.
struct slab_avail {
  std::uint32_t& word;
  std::uint32_t blocks;
  unsigned cls;

  DEVMR_HOST_DEVICE std::uint32_t class_bits() const { return cls << avail_class_shift; }

  /// A slab formatted for the class, all its blocks promised to the slot that opens it (they
  /// go out in order, counted by the slot). The slab is the caller's alone.
  DEVMR_HOST_DEVICE void open_fresh() const {
    atomic(word).store(avail_open | class_bits(), relaxed);
  }

  /// Opens a slab that the caller took off its class's list: three quarters of its count become
  /// the promise of the caller's slot (reuse_promise), the rest stays counted. 0 when the slab is
  /// no longer listed in this class (another thread took it: it was emptied, or opened).
  /// acquire: pairs with the release of the frees counted (free), so that their bits are set
  /// before the slot's claims look for them (the slot's publication releases them on).
  DEVMR_HOST_DEVICE std::uint32_t open_listed() const { return open_listed(peek()); }

  /// open_listed, from `seen`: a value of the word that the caller read (peek), so that the CAS
  /// needs no load of its own where the caller looked at the count already.
  DEVMR_HOST_DEVICE std::uint32_t open_listed(std::uint32_t seen) const {
    auto w = atomic(word);
    while ((seen & (avail_open | avail_listed | avail_class_mask)) ==
           (avail_listed | class_bits())) {
      std::uint32_t const promise = reuse_promise(seen & avail_count_mask);
      std::uint32_t const kept = (seen & avail_count_mask) - promise;
      if (w.compare_exchange_weak(seen, avail_open | class_bits() | kept, acquire, relaxed)) {
        return promise;
      }
    }
    return 0;
  }

  /// The word as a free's addition leaves a listed slab whose blocks are then all free.
  DEVMR_HOST_DEVICE std::uint32_t filled() const { return avail_listed | class_bits() | blocks; }

  /// The word as it is now: a hint, as another thread may change it at once.
  DEVMR_HOST_DEVICE std::uint32_t peek() const { return atomic(word).load(relaxed); }

  /// The free blocks that the count holds: a hint, as peek.
  DEVMR_HOST_DEVICE std::uint32_t free_blocks() const { return peek() & avail_count_mask; }

  /// Whether the slab is closed in the class (no slot holds it) and not listed.
  DEVMR_HOST_DEVICE bool closed_below() const {
    return (atomic(word).load(relaxed) & (avail_open | avail_listed | avail_class_mask)) ==
           class_bits();
  }

  /// Whether the slab is closed in the class (no slot holds it, not listed) with no free block:
  /// frees may still come.
  DEVMR_HOST_DEVICE bool closed_full() const { return atomic(word).load(relaxed) == class_bits(); }

  /// Opens a slab of the class that no slot holds and that is not listed (its free blocks are
  /// below the listing threshold): every free block becomes the promise of the caller's slot.
  /// 0 when the slab is not such a slab, or has no free block. acquire: as open_listed's.
  DEVMR_HOST_DEVICE std::uint32_t open_below() const {
    auto w = atomic(word);
    std::uint32_t seen = w.load(relaxed);
    while ((seen & (avail_open | avail_listed | avail_class_mask)) == class_bits() &&
           (seen & avail_count_mask) != 0) {
      if (w.compare_exchange_weak(seen, avail_open | class_bits(), acquire, relaxed)) {
        return seen & avail_count_mask;
      }
    }
    return 0;
  }

  /// Opens again, fresh, a slab that the caller's slot holds with its promise used up, if every
  /// one of its blocks was freed since it was opened (a kernel that freed what the one before it
  /// allocated): true when it did, and every block is the new promise. One exchange, relaxed, so
  /// that it does not hold up the loads that follow it while it travels (renew_settled orders
  /// it where it succeeds).
  DEVMR_HOST_DEVICE bool renew() const {
    std::uint32_t full = avail_open | class_bits() | blocks;
    return atomic(word).compare_exchange_strong(full, avail_open | class_bits(), relaxed, relaxed);
  }

  /// What a successful renew needs before the slab's blocks go out again: the frees that it
  /// counted (their bits, and their blocks' last writes) happen before, as open_listed's acquire
  /// gives.
  DEVMR_HOST_DEVICE static void renew_settled() {
    cuda::atomic_thread_fence(acquire, cuda::thread_scope_device);
  }

  /// Takes `want` blocks of a slab that no slot holds, for a claim that would otherwise wait for
  /// its slot's next slab (class_lists::take_direct): the count falls by `want` and the slab stays
  /// where it is. `listed`: from a listed slab, which keeps more than direct_keep blocks for the
  /// slot that opens it next; else from a slab closed below the listing threshold, which keeps
  /// none (no slot opens it while frees can still list it). All or nothing: `gone` when the slab
  /// is no longer in that place in this class (a slot holds it, or it moved, or left the class),
  /// `refused` when its count is short or every one of its blocks is free (the free that made it
  /// so empties it). acquire: as open_listed's.
  DEVMR_HOST_DEVICE direct_claim claim_direct(std::uint32_t want, bool listed) const {
    auto w = atomic(word);
    std::uint32_t const place = (listed ? avail_listed : 0u) | class_bits();
    std::uint32_t const least = listed ? want + direct_keep(blocks) + 1 : want;
    std::uint32_t seen = w.load(relaxed);
    for (;;) {
      std::uint32_t const count = seen & avail_count_mask;
      if ((seen & (avail_open | avail_listed | avail_class_mask)) != place) {
        return direct_claim::gone;
      }
      if (count >= blocks || count < least) {
        return direct_claim::refused;
      }
      if (w.compare_exchange_weak(seen, seen - want, acquire, relaxed)) {
        return direct_claim::taken;
      }
    }
  }

  /// Adds `n` freed blocks to the count; the bits of the blocks are set already. release: the
  /// bits, and the blocks' last writes, happen before the use of whoever takes the count (a
  /// slot's open_listed, a renewal, or the thread that empties the slab). A fence issued before
  /// the bits were set would not do: the count could then say a block is free before its bit
  /// arrives, and a renewal or a format clears the bitmap on the count's word.
  DEVMR_HOST_DEVICE avail_event free(std::uint32_t n) const {
    return settle(atomic(word).fetch_add(n, release) + n);
  }

  /// Closes the slab, which the caller swapped out of its slot: `unused`, the blocks the slot
  /// promised and no claim took, come back to the count (their bits are set: see give_range for
  /// a fresh slab's). release: as for free.
  DEVMR_HOST_DEVICE avail_event close(std::uint32_t unused) const {
    std::uint32_t const change = unused - avail_open;  // the flag is set: this clears it
    std::uint32_t const now = atomic(word).fetch_add(change, release) + change;
    avail_event const event = settle(now);
    // Closed (a slot cleared the listed flag when it opened the slab) with fewer free blocks
    // than the threshold, none perhaps: frees that come later add to them.
    return event == avail_event::none ? avail_event::below : event;
  }

  /// The event of an addition that left `now` (the value after it). Where a CAS here fails,
  /// the word it returns may be of a later life of the slab in another class (the caller was
  /// held up while the slab was opened, emptied, formatted and closed again): its count then
  /// says nothing against this class's blocks and threshold, and the slab is left to the
  /// threads of its class. A later life in this class is acted on as any other value of the
  /// word: what the word says decides the event, not which thread reads it.
  DEVMR_HOST_DEVICE avail_event settle(std::uint32_t now) const {
    auto w = atomic(word);
    for (;;) {
      if ((now & avail_open) != 0) {
        return avail_event::none;  // its slot closes it
      }
      std::uint32_t const count = now & avail_count_mask;
      if (count == blocks) {
        if ((now & avail_listed) != 0) {
          return avail_event::full_listed;
        }
        // Every block free and none promised: nobody else can touch the slab. acquire: the
        // frees of every block (and their bits) happen before the slab's next format, whose
        // taker acquires them through the release that hands the slab on (Slabs::give_empty).
        if (w.compare_exchange_weak(now, avail_open | avail_no_class, acquire, relaxed)) {
          return avail_event::emptied;
        }
      } else {
        if (count < reuse_threshold(blocks) || (now & avail_listed) != 0) {
          return avail_event::none;
        }
        if (w.compare_exchange_weak(now, now | avail_listed, relaxed, relaxed)) {
          return avail_event::listed;
        }
      }
      // The CAS failed on the word as it is now. The first value, left by the caller's own
      // addition, is of the class; this one may not be. (Compared as a class number: against
      // class_bits() the allocation's slowest path, reclaim, held two more registers.)
      if (((now & avail_class_mask) >> avail_class_shift) != cls) {
        return avail_event::none;
      }
    }
  }

  /// Takes a listed slab whose blocks are all free (full_listed); false when it is no longer so
  /// in this class (a slot opened it first, or it moved on to a later life). The CAS starts from
  /// `seen`, the word as the addition that filled the count left it (filled): no load of its
  /// own, and no fence before it.
  DEVMR_HOST_DEVICE bool take_full(std::uint32_t seen) const {
    auto w = atomic(word);
    while ((seen & (avail_open | avail_class_mask)) == class_bits() &&
           (seen & avail_count_mask) == blocks) {
      // acquire: as settle's, for an emptied slab.
      if (w.compare_exchange_weak(seen, avail_open | avail_no_class, acquire, relaxed)) {
        return true;
      }
    }
    return false;
  }
};

}  // namespace devmr::detail::heap
