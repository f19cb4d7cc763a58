#pragma once

// A set of slabs kept as a bitmap, one bit per slab, with two levels of summary: one bit per
// bitmap word (set while the word may have members), and one bit per summary word: a size
// class's list of slabs with blocks to reuse. Any thread adds a slab or takes one off (one
// atomic each; the first member of a bare word also sets its summary bit, and the first of a
// bare summary word its top bit), and a search takes whichever it finds first from where it
// starts looking, so that an empty list costs one load for every million slabs, and a full one
// no atomic on a word that every insert touches. Membership is only a hint: the slab's count
// (slab_avail) says whether the slab is really listed, and whoever takes it off checks that with
// its own atomic.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/atomics.hpp>
#include <devmr/detail/heap/block_bitmap.hpp>

#include <cstdint>

namespace devmr::detail::heap {

/// What slab_set::take returns when the set is empty.
inline constexpr std::uint32_t no_member = 0xffffffffu;
/// What slab_set::find returns when summary bits marked words but the words it looked at were
/// bare: the set may still have members elsewhere, and a take clears those marks.
inline constexpr std::uint32_t stale_member = 0xfffffffeu;

/// Words of a slab set of `members` slabs: the bitmap, its summary, and the summary's top words.
DEVMR_HOST_DEVICE constexpr std::uint32_t slab_set_words(std::uint32_t members) {
  return bitmap_words_for(members) + bitmap_words_for(bitmap_words_for(members)) +
         bitmap_words_for(bitmap_words_for(bitmap_words_for(members)));
}

/// A view of a slab set of `count` bitmap words at `words` (its summaries follow them).
struct slab_set {
  std::uint32_t* words;
  std::uint32_t count;

  /// Summary words: bit b of word s stands for bitmap word 32 s + b.
  DEVMR_HOST_DEVICE std::uint32_t summaries() const { return bitmap_words_for(count); }
  DEVMR_HOST_DEVICE std::uint32_t& summary(std::uint32_t s) const { return words[count + s]; }
  /// Top words: bit b of word t stands for summary word 32 t + b.
  DEVMR_HOST_DEVICE std::uint32_t& top(std::uint32_t t) const {
    return words[count + summaries() + t];
  }

  /// Adds slab `index`. A word that was bare gets its summary bit, and a summary word that was
  /// bare its top bit (release: a search that sees the bit sees the member).
  DEVMR_HOST_DEVICE void insert(std::uint32_t index) const {
    std::uint32_t const w = index / bitmap_word_bits;
    if (atomic(words[w]).fetch_or(1u << (index % bitmap_word_bits), relaxed) == 0) {
      mark_word(w);
    }
  }

  /// Takes slab `index` off; true when it was in the set. The last member of a word takes the
  /// word's summary bit too (see bare), so that searches do not wade through words emptied so.
  DEVMR_HOST_DEVICE bool erase(std::uint32_t index) const {
    return erased(index, clear_bit(index));
  }

  /// erase in two steps, so that the caller's next atomic travels with the first: clear_bit
  /// clears slab `index`'s bit and returns the word as it was, whose value erased then waits for
  /// (class_lists::act, whose take goes out beside the erase).
  DEVMR_HOST_DEVICE std::uint32_t clear_bit(std::uint32_t index) const {
    return atomic(words[index / bitmap_word_bits])
        .fetch_and(~(1u << (index % bitmap_word_bits)), relaxed);
  }
  DEVMR_HOST_DEVICE bool erased(std::uint32_t index, std::uint32_t was) const {
    if (was == 1u << (index % bitmap_word_bits)) {
      bare(index / bitmap_word_bits);
    }
    return held(index, was);
  }
  /// Whether word `was`, as clear_bit returned it, held slab `index`.
  DEVMR_HOST_DEVICE static bool held(std::uint32_t index, std::uint32_t was) {
    return (was & 1u << (index % bitmap_word_bits)) != 0;
  }

  /// The summary words that top word `t` marks. A set of one summary word reads none: that word's
  /// own bits say what its top bit would, a round trip sooner (the lists of an arena of up to
  /// 1024 slabs). acquire: pairs with the releases of mark_word.
  DEVMR_HOST_DEVICE std::uint32_t marked_summaries(std::uint32_t t) const {
    return summaries() == 1 ? 1u : atomic(top(t)).load(acquire);
  }

  /// Sets the summary bit of bitmap word `w`, and the top bit of its summary word if that was
  /// bare.
  DEVMR_HOST_DEVICE void mark_word(std::uint32_t w) const {
    std::uint32_t const s = w / bitmap_word_bits;
    if (atomic(summary(s)).fetch_or(1u << (w % bitmap_word_bits), release) == 0) {
      atomic(top(s / bitmap_word_bits)).fetch_or(1u << (s % bitmap_word_bits), release);
    }
  }

  /// Clears the summary bit of word `w`, found bare, and sets it again if a member came
  /// meanwhile (it may have found the bit still set, and set none); a summary word left bare
  /// so loses its top bit the same way.
  DEVMR_HOST_DEVICE void bare(std::uint32_t w) const {
    std::uint32_t const s = w / bitmap_word_bits;
    std::uint32_t const bit = 1u << (w % bitmap_word_bits);
    // acquire: the look at the word that follows comes after the clear; and where the clear
    // replaced the summary bit of a member's insert (mark_word, a release), it sees that member.
    std::uint32_t const was = atomic(summary(s)).fetch_and(~bit, acquire);
    if (atomic(words[w]).load(relaxed) != 0) {
      mark_word(w);
      return;
    }
    if (was == bit) {
      std::uint32_t const t = s / bitmap_word_bits;
      std::uint32_t const top_bit = 1u << (s % bitmap_word_bits);
      atomic(top(t)).fetch_and(~top_bit, acquire);  // acquire: as for the summary word
      if (atomic(summary(s)).load(relaxed) != 0) {
        atomic(top(t)).fetch_or(top_bit, release);
      }
    }
  }

  /// Takes a member off bitmap word `w`: its index, or no_member when the word is bare.
  DEVMR_HOST_DEVICE std::uint32_t take_from(std::uint32_t w) const {
    auto word = atomic(words[w]);
    for (std::uint32_t seen = word.load(relaxed); seen != 0;) {
      std::uint32_t const bit = seen & (0u - seen);
      seen = word.fetch_and(~bit, relaxed);
      if ((seen & bit) != 0) {
        if (seen == bit) {
          bare(w);
        }
        return w * bitmap_word_bits + lowest_bit_index(bit);
      }
    }
    return no_member;
  }

  /// A member of the set, left in it: one picked by `seed` (any value) among those that a look
  /// down one path of summary bits finds, so that threads that look at the same moment spread
  /// over the members. Else no_member when no summary bit marked a word (the set is empty, and a
  /// take would find nothing either, so the caller need not try one), or stale_member. Loads
  /// only: the member may be gone by the time the caller acts on it, as any member may (see the
  /// top of this file).
  DEVMR_HOST_DEVICE std::uint32_t find(std::uint32_t seed) const {
    std::uint32_t const tops = bitmap_words_for(summaries());
    std::uint32_t none = no_member;
    DEVMR_ROLLED for (std::uint32_t i = 0; i < tops; ++i) {
      std::uint32_t const t = (seed + i) % tops;
      for (std::uint32_t marked = marked_summaries(t); marked != 0;) {
        std::uint32_t const sb = nth_set_bit(marked, seed >> 8);
        std::uint32_t const s = t * bitmap_word_bits + sb;
        for (std::uint32_t words_marked = atomic(summary(s)).load(acquire); words_marked != 0;) {
          none = stale_member;
          std::uint32_t const wb = nth_set_bit(words_marked, seed >> 14);
          std::uint32_t const w = s * bitmap_word_bits + wb;
          if (std::uint32_t const members = atomic(words[w]).load(relaxed); members != 0) {
            return w * bitmap_word_bits + nth_set_bit(members, seed >> 20);
          }
          words_marked &= ~(1u << wb);  // bare: a hint out of date
        }
        marked &= ~(1u << sb);
      }
    }
    return none;
  }

  /// find, where the set has one summary word (an arena of up to 1024 slabs), with a guess: a
  /// bitmap word that the seed picks is loaded beside the summary word, and where it has
  /// members, as most words of a long list do, the look returns one of them as soon as both
  /// loads are back, a round trip sooner. The summary word is loaded relaxed here, so that
  /// nothing waits on it: a word that it marks and whose member this look does not see yet reads
  /// as bare, a hint out of date like any other. Sets with top words are looked at by find.
  DEVMR_HOST_DEVICE std::uint32_t find_guessing(std::uint32_t seed) const {
    if (summaries() != 1) {
      return find(seed);
    }
    std::uint32_t const turned = (seed << 16) | (seed >> 16);
    std::uint32_t guess =
        static_cast<std::uint32_t>((std::uint64_t{turned} * count) >> bitmap_word_bits);
    std::uint32_t members = atomic(words[guess]).load(relaxed);
    std::uint32_t words_marked = atomic(summary(0)).load(relaxed);
    std::uint32_t none = words_marked != 0 ? stale_member : no_member;
    while (members == 0 && words_marked != 0) {
      guess = nth_set_bit(words_marked, seed >> 14);
      members = atomic(words[guess]).load(relaxed);
      words_marked &= ~(1u << guess);  // bare, if so: a hint out of date
    }
    return members != 0 ? guess * bitmap_word_bits + nth_set_bit(members, seed >> 20) : none;
  }

  /// Takes a slab off the set, looking at the summary words from the one of bitmap word
  /// `start` (any value; modulo the words) on and around once: its index, or no_member when
  /// the set looked empty. Clears the summary bits of bare words it looks at.
  DEVMR_HOST_DEVICE std::uint32_t take(std::uint32_t start) const {
    std::uint32_t const n = summaries();
    std::uint32_t const tops = bitmap_words_for(n);
    std::uint32_t const first = start % n;
    DEVMR_ROLLED for (std::uint32_t i = 0; i <= tops; ++i) {
      // The first top word twice: from the first summary word on, then the ones before it.
      std::uint32_t const t = (first / bitmap_word_bits + i) % tops;
      std::uint32_t marked = marked_summaries(t);
      if (i == 0) {
        marked &= ~0u << (first % bitmap_word_bits);
      } else if (i == tops) {
        marked &= ~(~0u << (first % bitmap_word_bits));
      }
      for (; marked != 0; marked &= marked - 1) {
        std::uint32_t const s = t * bitmap_word_bits + lowest_bit_index(marked);
        for (std::uint32_t words_marked = atomic(summary(s)).load(acquire); words_marked != 0;
             words_marked &= words_marked - 1) {
          std::uint32_t const w = s * bitmap_word_bits + lowest_bit_index(words_marked);
          if (std::uint32_t const m = take_from(w); m != no_member) {
            return m;
          }
          bare(w);
          if (std::uint32_t const m = take_from(w); m != no_member) {
            return m;
          }
        }
      }
    }
    return no_member;
  }
};

}  // namespace devmr::detail::heap
