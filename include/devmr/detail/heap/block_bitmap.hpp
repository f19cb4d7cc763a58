#pragma once

// The free blocks of one slab, one bit each: how a slab hands out again the blocks that were
// freed while others of it are still live. A set bit is a block that was freed and that nobody
// has taken since. Frees set bits (one atomic OR for a warp's blocks of one word); a claim takes
// bits (one atomic a word); whoever takes a bit owns the block.
//
// The bitmap alone does not say how many bits a claim may count on: the slab's count of free
// blocks does (slab_avail), and a slot promises a claim its blocks before the claim looks for
// them. Every promised bit is set, or about to be set by a free in flight, and no two promises
// cover one bit, so a claim that keeps looking finds its bits; another claim that took a bit it
// looked at was served, which is progress.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/atomics.hpp>
#include <devmr/detail/heap/bits.hpp>

#include <cstdint>

namespace devmr::detail::heap {

/// Bits in one word of a block bitmap.
inline constexpr unsigned bitmap_word_bits = 32;

/// Words of the bitmap of a slab of `blocks` blocks.
DEVMR_HOST_DEVICE constexpr std::uint32_t bitmap_words_for(std::uint32_t blocks) {
  return (blocks + bitmap_word_bits - 1) / bitmap_word_bits;
}

/// A view of the block bitmap of one slab: `count` words from `words`.
struct block_bitmap {
  std::uint32_t* words;
  std::uint32_t count;

  /// No block free: how a slab formatted for a class starts (its blocks go out in order first,
  /// counted by its slot, and come back here one by one as they are freed). The slab is the
  /// formatting thread's alone; its publication releases the stores.
  DEVMR_HOST_DEVICE void clear() const {
    for (std::uint32_t w = 0; w < count; ++w) {
      atomic(words[w]).store(0, relaxed);
    }
  }

  /// clear, with 16 bytes a store on the device where the words allow it (a quarter of the
  /// instructions: 128 stores rather than 512 for a slab of 64 B blocks): plain stores, which
  /// the publication orders as it orders the atomic ones. For the slow paths out of line that
  /// format rows of slabs or open them again (class_slots::open_row, renew): the four registers
  /// of zeros a store holds would raise the count of the install inline in the allocation's
  /// path, and with it every allocating kernel's. The loop stays rolled for the same reason.
  DEVMR_HOST_DEVICE void clear_wide() const {
#if DEVMR_IS_DEVICE_CODE
    if (count % 4 == 0 && reinterpret_cast<std::uintptr_t>(words) % 16 == 0) {
      auto* const quads = reinterpret_cast<uint4*>(words);
      DEVMR_ROLLED for (std::uint32_t q = 0; q < count / 4; ++q) {
        quads[q] = make_uint4(0, 0, 0, 0);
      }
      return;
    }
#endif
    clear();
  }

  /// Frees the blocks that `mask` marks in word `w`. release: the last writes of the freeing
  /// threads to their blocks happen before the use of whoever takes the bits (take_from
  /// acquires); relaxed where the caller issued a release fence since those writes.
  DEVMR_HOST_DEVICE void give(std::uint32_t w,
                              std::uint32_t mask,
                              cuda::std::memory_order order = release) const {
    atomic(words[w]).fetch_or(mask, order);
  }

  /// Frees block `block`.
  DEVMR_HOST_DEVICE void give_block(std::uint32_t block) const {
    give(block / bitmap_word_bits, 1u << (block % bitmap_word_bits));
  }

  /// Frees blocks [first, last): those of a slab that its slot never handed out, when the slot
  /// gives the slab up, or every block of a slab (a checked heap's format, a renewal that lost
  /// its slot). One release fence, then an OR a word with nothing to wait for: a release on each
  /// OR would make each wait for the one before (2048 of them for a slab of 16-byte blocks).
  /// Whoever counts the blocks then does so with a release (slab_avail::close and free), or
  /// publishes the slab with one (a slot's exchange).
  DEVMR_HOST_DEVICE void give_range(std::uint32_t first, std::uint32_t last) const {
    cuda::atomic_thread_fence(release, cuda::thread_scope_device);
    while (first < last) {
      std::uint32_t const w = first / bitmap_word_bits;
      std::uint32_t const low = first % bitmap_word_bits;
      std::uint32_t const end = last - w * bitmap_word_bits;
      std::uint32_t const high = end >= bitmap_word_bits ? bitmap_word_bits : end;
      std::uint32_t const below_high = high == bitmap_word_bits ? ~0u : (1u << high) - 1;
      give(w, below_high & ~((1u << low) - 1), relaxed);
      first = w * bitmap_word_bits + high;
    }
  }

  /// Takes up to `need` (> 0) free blocks of word `w`: the bits taken, none when the word has
  /// none. A word that others take from at the same time may give fewer than it showed.
  DEVMR_HOST_DEVICE std::uint32_t take_from(std::uint32_t w, unsigned need) const {
    auto word = atomic(words[w]);
    std::uint32_t seen = word.load(relaxed);
    while (seen != 0) {
      std::uint32_t const pick = lowest_bits(seen, need);
      // acquire: pairs with the release of the frees that set the bits (give), so that their
      // writes to the blocks happen before the new owner's.
      std::uint32_t const was = word.fetch_and(~pick, acquire);
      if ((was & pick) != 0) {
        return was & pick;
      }
      seen = was;  // every bit picked was taken meanwhile: look at what is there now
    }
    return 0;
  }

  /// The same with one round trip where take_from has two (a look, then an AND): takes every
  /// free block of word `w` with one exchange and gives back, with an OR that nobody waits for,
  /// those past the `need` lowest. Meanwhile the word shows none of them: a claim that looks at
  /// it then looks on, and a free of one of them would look like the free of a block in use, so
  /// it is for heaps that never judge a free by its bit (unchecked). The OR passes the frees'
  /// release on to the next taker: every change of a bitmap word is a read-modify-write, so
  /// the release sequence of each free's OR runs through the exchange and the OR.
  DEVMR_HOST_DEVICE std::uint32_t take_whole(std::uint32_t w, unsigned need) const {
    auto word = atomic(words[w]);
    // acquire: as take_from's AND.
    std::uint32_t const was = word.exchange(0, acquire);
    std::uint32_t const pick = lowest_bits(was, need);
    if (was != pick) {
      word.fetch_or(was & ~pick, relaxed);
    }
    return pick;
  }

  /// Up to `need` free blocks of word `w`: take_whole where `whole`, else take_from.
  DEVMR_HOST_DEVICE std::uint32_t take_some(std::uint32_t w, unsigned need, bool whole) const {
    return whole ? take_whole(w, need) : take_from(w, need);
  }

  /// Takes `need` free blocks, promised to the caller (see the top of this file), looking from
  /// word `start` on and around; calls `sink(w, bits)` for each word it took bits of. `whole`:
  /// a word at a time with take_whole (heaps that do not judge frees by their bits).
  template <class Sink>
  DEVMR_HOST_DEVICE void take(std::uint32_t start, unsigned need, bool whole, Sink&& sink) const {
    std::uint32_t w = start < count ? start : start % count;
    std::uint32_t bare = 0;  // words in a row found without a free block
    while (need != 0) {
      if (std::uint32_t const got = take_some(w, need, whole); got != 0) {
        sink(w, got);
        need -= popcount32(got);
        bare = 0;
        continue;  // the same word may have more
      }
      w = w + 1 == count ? 0 : w + 1;
      if (++bare > count) {
        // A whole round found nothing: the promised bits are still in flight (a free counted
        // its block before its bit arrived) or other claims take them as they come.
        pause_briefly();
        bare = 0;
      }
    }
  }
};

}  // namespace devmr::detail::heap
