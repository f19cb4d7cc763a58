#pragma once

// How many slots each size class spreads its claims over: its width. A slot holds one slab of its
// class, partly handed out, so the heap lets its slots together hold a budget of slabs (a quarter
// of them). With every class in use, each class gets an equal share of the budget; while fewer
// classes are in use, each of them may use a larger share, so that fewer SMs meet on one slot word
// and each slot's installs serve fewer claims.
//
// One word holds the classes that have taken an empty slab (bits 0-15) and the width of each of the
// first twelve classes (four bits each from bit 16: log2 of its slots), the classes of blocks up to
// 32 KiB. The classes of larger blocks (sixteen blocks a slab at most) keep the base width, which
// the word need not hold. Every class starts at the share of all classes. An install that reuses
// one of its class's listed slabs doubles the class's width, up to the share of the classes in use,
// as does an install of a class in use that takes an empty slab on a roomy heap (it needs more
// blocks than its slots hold); a class that takes its first empty slab narrows every class to the
// share that leaves room for it. Both are one CAS on the word, so that no width passes the share of
// the classes that the word records. While the heap is roomy, any slot within its class's width
// takes empty slabs; past that, a slot past the share of all classes reuses its class's slabs and
// never takes an empty one: one with nothing to reuse narrows its class back and sends its claim to
// the slot of the base width (class_slots::install), so that on a heap mostly in use widening
// spreads a class over the slabs it holds, not the heap's last empty slabs over more slots. Claims
// read the width with a relaxed load: one that read it just before it narrowed uses a slot that is
// no longer in use, which serves it from the slab there, if any, and takes no empty slab. A class
// that comes into use and narrows the others returns the word it replaced, so that its install has
// the slots past each class's new width give their slabs up (class_slots::release_narrowed); the
// slots past a width that narrowed back (narrow) keep theirs until the heap runs out of empty slabs
// and the slots give them up (class_slots::release_slots). A heap large enough that every class has
// all its slots with every class in use (fixed) keeps every class at all of them in the word, and a
// caller that knows it (a slab_ref says so) reads no word at all.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/atomics.hpp>
#include <devmr/detail/heap/bits.hpp>
#include <devmr/detail/heap/heap_view.hpp>
#include <devmr/detail/heap/layout.hpp>

#include <cstdint>

namespace devmr::detail::heap {

/// A view of the widths of a heap's class slots: the shape at `shape` (nullptr: a fixed width of
/// `limit` slots for every class) and the most slots a class has (`limit`, a power of two, at
/// most 2^15). The shape's `base` (the slot mask of each class with every class in use, where the
/// widths start) and `budget` (the slabs of all slots together) change only between kernels, so
/// claims read them through the read-only cache when they need them, and hold no register for
/// them in between.
struct slot_width {
  slot_shape* shape;
  std::uint32_t limit;
  /// The caller knows the widths fixed (a heap's widths, once fixed, stay so): claims read no
  /// word. Where false, they read the word, which holds every class at `limit` slots when fixed.
  bool known_fixed = false;

  /// Classes whose widths a word holds, four bits each above bit 16; the others keep the base
  /// width. Every class has its bit below bit 16.
  static constexpr unsigned max_classes = 12;
  static constexpr unsigned width_shift = 16;
  /// The bits of a word that hold the widths (above the classes in use).
  static constexpr std::uint64_t width_bits = ~std::uint64_t{(1u << width_shift) - 1};
  static_assert(num_classes <= width_shift);

  /// log2 of the slots of each of `classes` classes in use (at least one) that share `budget`
  /// slabs: the largest power of two of slots that fits their share, at least one, at most
  /// `limit`.
  DEVMR_HOST_DEVICE static unsigned share_log2(std::uint32_t budget,
                                               unsigned classes,
                                               std::uint32_t limit) {
    std::uint32_t const each = budget / (classes == 0 ? 1 : classes);
    return floor_log2(each < 1 ? 1 : (each > limit ? limit : each));
  }
  /// The same as a slot mask (slots minus one).
  DEVMR_HOST_DEVICE static std::uint32_t share(std::uint32_t budget,
                                               unsigned classes,
                                               std::uint32_t limit) {
    return (std::uint32_t{1} << share_log2(budget, classes, limit)) - 1;
  }

  /// The state word of `classes` classes at slot mask `mask` each, none in use.
  DEVMR_HOST_DEVICE static std::uint64_t initial(std::uint32_t mask, unsigned classes) {
    std::uint64_t word = 0;
    for (unsigned c = 0; c < classes && c < max_classes; ++c) {
      word |= std::uint64_t{floor_log2(std::uint64_t{mask} + 1)} << (width_shift + 4 * c);
    }
    return word;
  }

  DEVMR_HOST_DEVICE static constexpr std::uint32_t classes_of(std::uint64_t word) {
    return static_cast<std::uint32_t>(word) & ((1u << width_shift) - 1);
  }
  /// log2 of the slots of class `cls` (< max_classes) in `word`.
  DEVMR_HOST_DEVICE static constexpr unsigned log2_of(std::uint64_t word, unsigned cls) {
    return static_cast<unsigned>(word >> (width_shift + 4 * cls)) & 15u;
  }
  DEVMR_HOST_DEVICE static constexpr std::uint32_t mask_of(std::uint64_t word, unsigned cls) {
    return (std::uint32_t{1} << log2_of(word, cls)) - 1;
  }
  /// `word` with class `cls` (< max_classes) at 2^`log2` slots.
  DEVMR_HOST_DEVICE static constexpr std::uint64_t with_log2(std::uint64_t word,
                                                             unsigned cls,
                                                             unsigned log2) {
    unsigned const at = width_shift + 4 * cls;
    return (word & ~(std::uint64_t{15} << at)) | (std::uint64_t{log2} << at);
  }

  /// True where the widths cannot change: no word, or every class has the most slots already
  /// with every class in use (a large heap), so that claims need no look at the word.
  DEVMR_HOST_DEVICE bool fixed() const { return shape == nullptr || fixed_for(*shape, limit); }

  /// The slot mask of every class with all classes in use (all slots where the width is fixed).
  DEVMR_HOST_DEVICE std::uint32_t base() const {
    return shape == nullptr ? limit - 1 : read_only(shape->base);
  }
  DEVMR_HOST_DEVICE std::uint32_t budget() const { return read_only(shape->budget); }

  /// True when the slots of `shape` (of `limit` slots a class) are fixed.
  DEVMR_HOST_DEVICE static bool fixed_for(slot_shape const& shape, std::uint32_t limit) {
    return read_only(shape.base) + 1 == limit;
  }

  /// The slot mask that claims of class `cls` use now: one load of the word (none where the
  /// widths are known fixed), with no look at the base, so that a claim waits for one load before
  /// its atomic; the base for the classes the word does not hold.
  DEVMR_HOST_DEVICE std::uint32_t mask(unsigned cls) const {
    if (known_fixed || shape == nullptr) {
      return limit - 1;
    }
    return cls < max_classes ? mask_of(atomic(shape->widths).load(relaxed), cls) : base();
  }

  /// What an update of the widths reads first (use, widen): the word and the budget, loaded
  /// together; nothing where the caller knows the widths fixed. An install that reads it beside
  /// its look at its class's list, or beside its take off the list (class_slots::take_roomy,
  /// take_listed_in), and updates from it after them issues the update with no load to wait for.
  /// It reads no base: a test of the base that decided whether to load the word would hold the
  /// word's load, and the look beside it, until the base came back (the L1 holds no copy once
  /// a claim's acquire emptied it). A heap whose widths are fixed but not known so (a ref taken
  /// before a grow fixed them) updates from its word as any other: there every class has every
  /// slot, and every class's share of the budget is all of them, so that no width changes; a
  /// class that comes into use gains its bit, once.
  struct snapshot {
    std::uint64_t word;
    std::uint32_t budget;
    bool fixed;
  };
  /// A snapshot that updates nothing, as of fixed widths.
  DEVMR_HOST_DEVICE static constexpr snapshot no_update() { return {0, 0, true}; }
  DEVMR_HOST_DEVICE snapshot look() const {
    if (known_fixed || shape == nullptr) {
      return no_update();
    }
    return {atomic(shape->widths).load(relaxed), budget(), false};
  }

  /// Class `cls` takes an empty slab: the first time, it joins the classes in use, and every
  /// class wider than their share narrows to it. Returns the word it replaced where a class
  /// narrowed (its slots past the new width are the caller's to give up), else 0.
  DEVMR_HOST_DEVICE std::uint64_t use(unsigned cls) const { return use(cls, look()); }
  /// use, from what `seen` read of the widths (look). Where `grow`, a class already in use
  /// widens as one that reuses a slab would (widen): an install on a roomy heap whose class
  /// needs more blocks than its slots hold.
  DEVMR_HOST_DEVICE std::uint64_t use(unsigned cls, snapshot seen, bool grow = false) const {
    if (seen.fixed) {
      return 0;
    }
    auto w = atomic(shape->widths);
    std::uint32_t const bit = std::uint32_t{1} << cls;
    if (grow && (classes_of(seen.word) & bit) != 0) {
      widen(cls, seen);
      return 0;
    }
    while ((classes_of(seen.word) & bit) == 0) {
      std::uint32_t const classes = classes_of(seen.word) | bit;
      unsigned const fair = share_log2(seen.budget, popcount32(classes), limit);
      std::uint64_t next = seen.word | bit;
      for (unsigned c = 0; c < max_classes; ++c) {
        if (log2_of(next, c) > fair) {
          next = with_log2(next, c, fair);
        }
      }
      std::uint64_t const was = seen.word;
      if (w.compare_exchange_weak(seen.word, next, relaxed, relaxed)) {
        return (next & width_bits) != (was & width_bits) ? was : 0;
      }
    }
    return 0;
  }

  /// A slot of class `cls` past the base width found nothing to reuse: the class goes back to
  /// the base width, so that its claims stop meeting slots that have nothing to hand out. One
  /// attempt, as for widen.
  DEVMR_HOST_DEVICE void narrow(unsigned cls) const {
    if (cls >= max_classes || fixed()) {
      return;
    }
    auto w = atomic(shape->widths);
    std::uint64_t seen = w.load(relaxed);
    unsigned const to = floor_log2(std::uint64_t{base()} + 1);
    if (log2_of(seen, cls) > to) {
      w.compare_exchange_strong(seen, with_log2(seen, cls, to), relaxed, relaxed);
    }
  }

  /// Class `cls` installs a slab it reuses: its width doubles if the share of the classes in use
  /// allows it. One attempt; a failed CAS means that the widths changed meanwhile.
  DEVMR_HOST_DEVICE void widen(unsigned cls) const {
    if (cls < max_classes) {
      widen(cls, look());
    }
  }
  /// widen, from what `seen` read of the widths (look).
  DEVMR_HOST_DEVICE void widen(unsigned cls, snapshot seen) const {
    if (cls >= max_classes || seen.fixed) {
      return;
    }
    unsigned const now = log2_of(seen.word, cls);
    if (now < share_log2(seen.budget, popcount32(classes_of(seen.word)), limit)) {
      atomic(shape->widths)
          .compare_exchange_strong(seen.word, with_log2(seen.word, cls, now + 1), relaxed, relaxed);
    }
  }
};

}  // namespace devmr::detail::heap
