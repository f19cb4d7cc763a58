#pragma once

// A set of slabs kept as a bitmap, one bit per slab: a size class's list of slabs with blocks to
// reuse. Any thread adds a slab or takes one off (one atomic each), and a search takes whichever
// it finds first from where it starts looking, so that searches from different SMs start apart.
// Membership is only a hint: the slab's count (slab_avail) says whether the slab is really
// listed, and whoever takes it off checks that with its own atomic.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/atomics.hpp>
#include <devmr/detail/heap/block_bitmap.hpp>

#include <cstdint>

namespace devmr::detail::heap {

/// What slab_set::take returns when the set is empty.
inline constexpr std::uint32_t no_member = 0xffffffffu;

/// A view of `count` words of a slab set.
struct slab_set {
  std::uint32_t* words;
  std::uint32_t count;

  /// Adds slab `index`.
  DEVMR_HOST_DEVICE void insert(std::uint32_t index) const {
    atomic(words[index / bitmap_word_bits]).fetch_or(1u << (index % bitmap_word_bits), relaxed);
  }

  /// Takes slab `index` off; true when it was in the set.
  DEVMR_HOST_DEVICE bool erase(std::uint32_t index) const {
    std::uint32_t const bit = 1u << (index % bitmap_word_bits);
    return (atomic(words[index / bitmap_word_bits]).fetch_and(~bit, relaxed) & bit) != 0;
  }

  /// Takes a slab off the set, looking from word `start` on and around once: its index, or
  /// no_member when the set looked empty.
  DEVMR_HOST_DEVICE std::uint32_t take(std::uint32_t start) const {
    if (count == 0) {
      return no_member;
    }
    std::uint32_t w = start % count;
    DEVMR_ROLLED for (std::uint32_t n = 0; n < count; ++n) {
      auto word = atomic(words[w]);
      for (std::uint32_t seen = word.load(relaxed); seen != 0;) {
        std::uint32_t const bit = seen & (0u - seen);
        seen = word.fetch_and(~bit, relaxed);
        if ((seen & bit) != 0) {
          return w * bitmap_word_bits + lowest_bit_index(bit);
        }
      }
      w = w + 1 == count ? 0 : w + 1;
    }
    return no_member;
  }
};

}  // namespace devmr::detail::heap
