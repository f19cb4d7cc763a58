#pragma once

// A set of slabs kept as a bitmap, one bit per slab, with a summary of one bit per bitmap word:
// a size class's list of slabs with blocks to reuse. Any thread adds a slab or takes one off (one
// atomic each; the first member of a bare word also sets its summary bit), and a search takes
// whichever it finds first from where it starts looking, skipping 32 bare words a summary load,
// so that an empty list costs a few loads. Membership is only a hint: the slab's count
// (slab_avail) says whether the slab is really listed, and whoever takes it off checks that with
// its own atomic.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/atomics.hpp>
#include <devmr/detail/heap/block_bitmap.hpp>

#include <cstdint>

namespace devmr::detail::heap {

/// What slab_set::take returns when the set is empty.
inline constexpr std::uint32_t no_member = 0xffffffffu;

/// Words of a slab set of `members` slabs: the bitmap, then its summary, then a count of its
/// members.
DEVMR_HOST_DEVICE constexpr std::uint32_t slab_set_words(std::uint32_t members) {
  return bitmap_words_for(members) + bitmap_words_for(bitmap_words_for(members)) + 1;
}

/// A view of a slab set of `count` bitmap words at `words` (its summary follows them).
struct slab_set {
  std::uint32_t* words;
  std::uint32_t count;

  DEVMR_HOST_DEVICE std::uint32_t& summary(std::uint32_t w) const {
    return words[count + w / bitmap_word_bits];
  }
  /// At least the number of members: raised before a member's bit is set, lowered after it is
  /// cleared, so that a search of a set that has none costs one load (a search of a large
  /// heap's set looks at a summary word for every 1024 slabs).
  DEVMR_HOST_DEVICE std::uint32_t& members() const {
    return words[count + bitmap_words_for(count)];
  }

  /// Adds slab `index`. A word that was bare gets its summary bit (release: a search that sees
  /// the summary bit sees the member).
  DEVMR_HOST_DEVICE void insert(std::uint32_t index) const {
    std::uint32_t const w = index / bitmap_word_bits;
    std::uint32_t const bit = 1u << (index % bitmap_word_bits);
    atomic(members()).fetch_add(1, relaxed);
    std::uint32_t const was = atomic(words[w]).fetch_or(bit, relaxed);
    if ((was & bit) != 0) {
      atomic(members()).fetch_sub(1, relaxed);  // a member already
    } else if (was == 0) {
      atomic(summary(w)).fetch_or(1u << (w % bitmap_word_bits), release);
    }
  }

  /// Takes slab `index` off; true when it was in the set. The last member of a word takes the
  /// word's summary bit too (see bare), so that searches do not wade through words emptied so.
  DEVMR_HOST_DEVICE bool erase(std::uint32_t index) const {
    std::uint32_t const w = index / bitmap_word_bits;
    std::uint32_t const bit = 1u << (index % bitmap_word_bits);
    std::uint32_t const was = atomic(words[w]).fetch_and(~bit, relaxed);
    if ((was & bit) != 0) {
      atomic(members()).fetch_sub(1, relaxed);
    }
    if (was == bit) {
      bare(w);
    }
    return (was & bit) != 0;
  }

  /// Clears the summary bit of word `w`, found bare, and sets it again if a member came
  /// meanwhile (it may have found the bit still set, and set none).
  DEVMR_HOST_DEVICE void bare(std::uint32_t w) const {
    std::uint32_t const bit = 1u << (w % bitmap_word_bits);
    // acq_rel: orders the clear before the look at the word that follows.
    atomic(summary(w)).fetch_and(~bit, acq_rel);
    if (atomic(words[w]).load(relaxed) != 0) {
      atomic(summary(w)).fetch_or(bit, relaxed);
    }
  }

  /// Takes a member off bitmap word `w`: its index, or no_member when the word is bare.
  DEVMR_HOST_DEVICE std::uint32_t take_from(std::uint32_t w) const {
    auto word = atomic(words[w]);
    for (std::uint32_t seen = word.load(relaxed); seen != 0;) {
      std::uint32_t const bit = seen & (0u - seen);
      seen = word.fetch_and(~bit, relaxed);
      if ((seen & bit) != 0) {
        atomic(members()).fetch_sub(1, relaxed);
        return w * bitmap_word_bits + lowest_bit_index(bit);
      }
    }
    return no_member;
  }

  /// Takes a slab off the set, looking from summary word `start` on and around once: its
  /// index, or no_member when the set looked empty. Clears the summary bits of bare words it
  /// looks at (and looks at the word again after, since a member added meanwhile may have found
  /// the summary bit still set).
  DEVMR_HOST_DEVICE std::uint32_t take(std::uint32_t start) const {
    if (atomic(members()).load(relaxed) == 0) {
      return no_member;
    }
    std::uint32_t const summaries = bitmap_words_for(count);
    DEVMR_ROLLED for (std::uint32_t n = 0; n < summaries; ++n) {
      std::uint32_t const s = (start + n) % summaries;
      // acquire: pairs with the release in insert.
      for (std::uint32_t marked = atomic(words[count + s]).load(acquire); marked != 0;
           marked &= marked - 1) {
        std::uint32_t const w = s * bitmap_word_bits + lowest_bit_index(marked);
        if (std::uint32_t const m = take_from(w); m != no_member) {
          return m;
        }
        bare(w);
        if (std::uint32_t const m = take_from(w); m != no_member) {
          return m;
        }
      }
    }
    return no_member;
  }
};

}  // namespace devmr::detail::heap
