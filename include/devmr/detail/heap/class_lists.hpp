#pragma once

// The reuse path of the size classes: where a slab's blocks go when they are freed, and where
// the slab goes when its count says so. A slab that a slot holds gathers its frees in its count
// (slab_avail); once no slot holds it, the count puts it on one of its class's two lists:
//  - listed (slab_set): an eighth of its blocks or more are free. An install of the class takes
//    it off and opens it for its slot (open_taken, from class_slots' searches);
//  - below: a slot closed it with fewer free blocks than that (none, perhaps); frees that come
//    later add to them, and lift it onto the list above once they reach the threshold.
// A slab whose every block is free leaves its class for the heap's supply of empty slabs
// (Slabs::give_empty), taken off its list as its count is taken. Claims that would wait for their
// slot's install take blocks straight from a slab of either list (take_direct), and an install out
// of slabs takes any slab of either list that has a free block (take_any). Each change of a slab's
// place is one atomic on its count, so that exactly one thread acts on it (slab_avail); list
// membership is a hint that the count confirms.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/atomics.hpp>
#include <devmr/detail/heap/block_bitmap.hpp>
#include <devmr/detail/heap/layout.hpp>
#include <devmr/detail/heap/out_of_line.hpp>
#include <devmr/detail/heap/slab_avail.hpp>
#include <devmr/detail/heap/slab_set.hpp>

#include <cstdint>

namespace devmr::detail::heap {

/// Blocks a claim obtained: `count` blocks of slab `id` (none when `id` is no_slab). Those of a
/// fresh slab are blocks `first`, `first + 1`, ...; those of a reused one are bits to take from
/// its bitmap, looking from word `first` (see class_slots::take).
struct block_claim {
  std::uint32_t id;
  std::uint32_t first;
  std::uint32_t count;
  bool fresh;
};
inline constexpr block_claim no_claim{no_slab, 0, 0, false};

/**
 * The lists of the size classes over the slabs that `Slabs` describes, and the frees and closes
 * that fill them. `Slabs` gives:
 *  - `blocks(cls)`: blocks in a slab of class `cls`;
 *  - `avail(id)`: the slab's free count word (std::uint32_t&, see slab_avail);
 *  - `bits(id)`: its bitmap's first word (std::uint32_t*, room for the smallest class);
 *  - `list_parts()` and `listed(cls, part)`: the class's list of slabs with blocks to reuse, one
 *    slab_set for each part of the heap (an arena); slab `id` is member `member(id)` of part
 *    `part_of(id)`, and member `m` of part `p` is slab `slab_of(p, m)`; `below(cls, part)`: the
 *    same for the class's slabs closed with free blocks too few to list;
 *  - `give_empty(id, hint)`: a slab whose blocks are all free leaves its class;
 *  - `moves()`: the count of slabs that closes put on a list or back in the supply
 *    (std::uint64_t&, see class_slots::final_search).
 */
template <class Slabs>
class class_lists {
 public:
  DEVMR_HOST_DEVICE explicit class_lists(Slabs const& slabs) : slabs_{slabs} {}

  DEVMR_HOST_DEVICE Slabs const& slabs() const { return slabs_; }

  DEVMR_HOST_DEVICE slab_avail avail(std::uint32_t id, unsigned cls) const {
    return {slabs_.avail(id), slabs_.blocks(cls), cls};
  }
  DEVMR_HOST_DEVICE block_bitmap bitmap(std::uint32_t id, unsigned cls) const {
    return {slabs_.bits(id), bitmap_words_for(slabs_.blocks(cls))};
  }

  /// Frees the blocks that `mask` marks in word `w` of the bitmap of slab `id` (class `cls`),
  /// then counts them: one OR and one addition for all of them.
  DEVMR_HOST_DEVICE void free_bits(
      std::uint32_t id, unsigned cls, std::uint32_t w, std::uint32_t mask, unsigned hint) const {
    bitmap(id, cls).give(w, mask);
    count_freed(id, cls, popcount32(mask), hint);
  }

  /// Counts `n` blocks of slab `id` (class `cls`) freed, whose bits the caller set: lists or
  /// empties the slab when the count says so (a release: slab_avail::free).
  DEVMR_HOST_DEVICE void count_freed(std::uint32_t id,
                                     unsigned cls,
                                     std::uint32_t n,
                                     unsigned hint) const {
    act(avail(id, cls).free(n), id, cls, hint);
  }

  /// Frees block `block` of slab `id` (class `cls`).
  DEVMR_HOST_DEVICE void free_block(std::uint32_t id,
                                    unsigned cls,
                                    std::uint32_t block,
                                    unsigned hint) const {
    free_bits(id, cls, block / bitmap_word_bits, 1u << (block % bitmap_word_bits), hint);
  }

  /// Closes slab `id` of class `cls`, swapped out of its slot (alone or in a row) with `unused`
  /// of its blocks promised and not claimed, whose bits are set: the slab goes where its count
  /// then says.
  DEVMR_HOST_DEVICE void close(std::uint32_t id,
                               unsigned cls,
                               std::uint32_t unused,
                               unsigned hint) const {
    avail_event const event = avail(id, cls).close(unused);
    if (event == avail_event::below) {
      slabs_.below(cls, slabs_.part_of(id)).insert(slabs_.member(id));
    } else if (event != avail_event::full_listed) {
      // A close's addition never fills a listed slab (the slab was open, so not listed): where
      // its CAS failed on a listed slab whose blocks are all free, the free whose addition filled
      // it acts on it. Left to that free, the close's slow paths keep fewer registers.
      act(event, id, cls, hint);
    }
    if (event != avail_event::none) {
      // A slab swapped out of its slot was on no list and in no slot until here.
      atomic(slabs_.moves()).fetch_add(1, relaxed);
    }
  }

  /// What an event of a slab's count asks of the thread that caused it (see slab_avail).
  DEVMR_HOST_DEVICE void act(avail_event event,
                             std::uint32_t id,
                             unsigned cls,
                             unsigned hint) const {
    if (event == avail_event::full_listed) {
      // Off the list and taken, from the count that the addition left (slab_avail::filled: no
      // load): the erase goes out first and the take beside it, so that installs stop finding the
      // slab as soon as it is taken (one that finds a member it cannot open searches the list again
      // in order). A slot that took it off the list first opens it, or finds it taken here. Where
      // the take fails, the slab is someone else's: opened, or listed again since, perhaps in a
      // later life, and then the erase may have taken off that listing's member, which would leave
      // the slab's free blocks where no install looks. So a member that the erase found goes back,
      // as a listing puts it. Put back for a slab that is not listed by then, it is stale, and the
      // search that finds it drops it.
      slab_set const set = slabs_.listed(cls, slabs_.part_of(id));
      std::uint32_t const was = set.clear_bit(slabs_.member(id));
      slab_avail const a = avail(id, cls);
      if (!a.take_full(a.filled())) {
        if (!slab_set::held(slabs_.member(id), was)) {
          return;
        }
        event = avail_event::listed;
      } else {
        set.erased(slabs_.member(id), was);
      }
    }
    if (event == avail_event::listed) {
      slabs_.listed(cls, slabs_.part_of(id)).insert(slabs_.member(id));
    } else if (event == avail_event::emptied || event == avail_event::full_listed) {
      slabs_.give_empty(id, hint);
    }
  }

  /// All `want` blocks of class `cls` from a slab that no slot holds, taken straight from its
  /// count (slab_avail::claim_direct), without a slot: a slab on the class's list, else one on
  /// its list of slabs closed below the listing threshold; none when the slabs that a look at
  /// each list finds cannot serve them, or the class has more than direct_max_blocks blocks a
  /// slab. Claims that find their slot's slab used up take this way while one of them installs
  /// the next, so that they neither wait for that install nor queue behind it: many such claims
  /// at once spread over the lists' slabs and over each slab's bitmap. The slabs below the
  /// threshold serve such claims where the installs leave few listed slabs (a heap mostly in
  /// use, whose slabs are listed and opened again as soon as they reach the threshold). A slow
  /// path: called out of line.
  DEVMR_HOST_DEVICE block_claim take_direct(unsigned cls, std::uint32_t want, unsigned hint) const {
    if (slabs_.blocks(cls) > direct_max_blocks) {
      return no_claim;
    }
    std::uint32_t const seed = spread_seed(hint);
    std::uint32_t const parts = slabs_.list_parts();
    DEVMR_ROLLED for (unsigned below = 0; below < 2; ++below) {
      DEVMR_ROLLED for (std::uint32_t part = 0; part == 0 || part < parts; ++part) {
        slab_set const set = below != 0 ? slabs_.below(cls, part) : slabs_.listed(cls, part);
        std::uint32_t const member = set.find_guessing(seed);
        if (member >= stale_member) {
          continue;
        }
        std::uint32_t const id = slabs_.slab_of(part, member);
        direct_claim const got = avail(id, cls).claim_direct(want, below == 0);
        if (got == direct_claim::taken) {
          return {id, seed % bitmap_words_for(slabs_.blocks(cls)), want, false};
        }
        // Off the list, unless a close put it back below the threshold before the erase.
        if (got == direct_claim::gone && below != 0 && set.erase(member) &&
            avail(id, cls).closed_below()) {
          set.insert(member);
        }
      }
    }
    return no_claim;
  }

  /// Opens listed slab `member` of part `part` of class `cls`'s list, which the caller took off
  /// the list, from its count word `seen` (0: loaded here): its id, and the blocks it promised
  /// in the high word; no_slab when it was emptied meanwhile.
  DEVMR_HOST_DEVICE std::uint64_t open_taken(unsigned cls,
                                             std::uint32_t part,
                                             std::uint32_t member,
                                             std::uint32_t seen) const {
    std::uint32_t const id = slabs_.slab_of(part, member);
    slab_avail const a = avail(id, cls);
    std::uint32_t const promised = a.open_listed(seen != 0 ? seen : a.peek());
    return promised != 0 ? id | (std::uint64_t{promised} << 32) : no_slab;
  }

  /// Takes off class `cls`'s lists any slab with a free block and opens it for the caller's
  /// slot: one off the list, else one off the list below the threshold, looking from places of
  /// `hint`. Returns its id, and the blocks promised in the high half; no_slab when both lists
  /// are empty. For an install out of slabs (class_slots::reclaim): one walk for both lists,
  /// word by word, where taking the listed slabs as an install takes them (its random look and
  /// its take, inline here) made the largest slow path, 70 registers against 44, and the
  /// allocating kernels' count follows it.
  DEVMR_HOST_DEVICE std::uint64_t take_any(unsigned cls, unsigned hint) const {
    std::uint32_t const parts = slabs_.list_parts();
    DEVMR_ROLLED for (unsigned below = 0; below < 2; ++below) {
      DEVMR_ROLLED for (std::uint32_t n = 0; n < parts; ++n) {
        std::uint32_t const part = (hint + n) % parts;
        slab_set const set = below != 0 ? slabs_.below(cls, part) : slabs_.listed(cls, part);
        DEVMR_ROLLED for (std::uint32_t k = 0; k < set.count; ++k) {
          std::uint32_t const w = (hint + k) % set.count;
          std::uint32_t bits = atomic(set.words[w]).load(relaxed);
          while (bits != 0) {
            std::uint32_t const member = w * bitmap_word_bits + lowest_bit_index(bits);
            bits &= bits - 1;
            std::uint32_t const id = slabs_.slab_of(part, member);
            slab_avail const a = avail(id, cls);
            // A slab closed with every block in use stays on the list, for the frees to come.
            if ((below != 0 && a.closed_full()) || !set.erase(member)) {
              continue;
            }
            // A member no longer so (listed or opened since, emptied, of another class now) is
            // dropped: a slot that closes it again adds it again.
            std::uint32_t const promised = below != 0 ? a.open_below() : a.open_listed();
            if (promised != 0) {
              return id | (std::uint64_t{promised} << 32);
            }
            // But a slab below the threshold that a slot opened and closed again between the look
            // at its count and the erase (with every block in use: nothing to open) was added
            // again before the erase took its member off: it goes back, for the frees to come.
            if (below != 0 && a.closed_below()) {
              set.insert(member);
            }
          }
        }
      }
    }
    return no_slab;
  }

 private:
  Slabs slabs_;
};

/// The slow paths of class_lists take the object's address out of line (the caller keeps it in
/// memory), unless `Slabs` can rebuild the lists from less: a heap's lists (heap_slabs.hpp) are
/// rebuilt from the heap's header.
template <class Slabs>
struct view_handle<class_lists<Slabs>> : address_handle<class_lists<Slabs>> {};

}  // namespace devmr::detail::heap
