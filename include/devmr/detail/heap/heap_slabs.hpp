#pragma once

// What the size classes' slots (class_slots.hpp) need of a heap's slabs, over its header: each
// slab's free count and block bitmap, each class's lists of slabs with blocks to reuse (one per
// arena), and the slab supply (slab_supply.hpp) that slabs leave their classes for and come back
// from.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/atomics.hpp>
#include <devmr/detail/heap/block_bitmap.hpp>
#include <devmr/detail/heap/class_slots.hpp>
#include <devmr/detail/heap/heap_view.hpp>
#include <devmr/detail/heap/layout.hpp>
#include <devmr/detail/heap/out_of_line.hpp>
#include <devmr/detail/heap/slab_set.hpp>
#include <devmr/detail/heap/slab_supply.hpp>
#include <devmr/detail/heap/slot_width.hpp>

#include <cstddef>
#include <cstdint>

namespace devmr::detail::heap {

static_assert(block_words_per_slab == bitmap_words_for(max_blocks_per_slab));

/// Words of an arena's lists of slabs (arena_desc::listed) for `slabs` slabs: for each class,
/// the slabs with blocks to reuse (listed), then for each class the slabs closed with free blocks
/// too few to list (below), which a class short of slabs takes from (class_slots::reclaim).
DEVMR_HOST_DEVICE constexpr std::uint64_t class_list_words(std::uint32_t slabs) {
  return std::uint64_t{2} * num_classes * slab_set_words(slabs);
}

/// An arena's metadata, one allocation of `bytes` bytes: the slabs' block bitmaps
/// (arena_desc::block_bits) from its start, which need not start out clear (a slab's is cleared
/// when it takes a class); at `meta` the slabs' metadata (slab_meta); at `empty` the bitmap of
/// empty slabs (arena_desc::empty_bits) and at `listed` the lists of slabs to reuse
/// (arena_desc::listed), which do (from `empty` to the end). The bitmaps lie right before the
/// metadata, so that a fast path finds arena 0's from the copy of its entry that a slab_ref
/// carries, with no load of the arena table (heap_slabs::bits).
struct meta_layout {
  std::uint64_t meta;
  std::uint64_t empty;
  std::uint64_t listed;
  std::uint64_t bytes;
};

/// The layout of the metadata of an arena of `slabs` slabs.
DEVMR_HOST_DEVICE constexpr meta_layout meta_layout_for(std::uint64_t slabs) {
  std::uint64_t const meta = slabs * block_words_per_slab * sizeof(std::uint32_t);
  std::uint64_t const empty = meta + slabs * sizeof(slab_meta);
  std::uint64_t const listed = empty + empty_words(slabs) * sizeof(std::uint64_t);
  return {meta, empty, listed,
          listed + class_list_words(static_cast<std::uint32_t>(slabs)) * sizeof(std::uint32_t)};
}

/// The table entry of an arena of `slabs` slabs at `base`, whose metadata (meta_layout_for) is at
/// `meta`.
inline arena_desc arena_at(std::byte* base, std::byte* meta, std::uint64_t slabs) {
  meta_layout const at = meta_layout_for(slabs);
  return {base,
          reinterpret_cast<slab_meta*>(meta + at.meta),
          reinterpret_cast<std::uint32_t*>(meta),
          reinterpret_cast<std::uint32_t*>(meta + at.listed),
          reinterpret_cast<std::uint64_t*>(meta + at.empty),
          slabs};
}

/// The slabs of one heap, as class_slots sees them. `first` is arena 0's entry, which the fast
/// paths carry (a slab_ref holds it), so that most slabs' metadata and memory need no load of
/// the arena table.
class heap_slabs {
 public:
  DEVMR_HOST_DEVICE heap_slabs(heap_header* header,
                               heap_view::arena_view const& first,
                               bool checked)
      : h_{header}, first_{first}, checked_{checked}, lazy_{false} {}
  /// The same where the caller holds no copy of arena 0's entry (the slow paths, out of line):
  /// the arena table is read where a slab's metadata or memory is needed, so that no register
  /// holds the entry across the calls the slow paths make.
  DEVMR_HOST_DEVICE heap_slabs(heap_header* header, bool checked)
      : h_{header}, first_{}, checked_{checked}, lazy_{true} {}

  DEVMR_HOST_DEVICE heap_header* header() const { return h_; }
  DEVMR_HOST_DEVICE slab_supply supply() const { return slab_supply{h_}; }

  DEVMR_HOST_DEVICE std::uint32_t blocks(unsigned cls) const { return class_capacity(cls); }
  DEVMR_HOST_DEVICE std::uint32_t& avail(std::uint32_t id) const { return meta(id).avail; }
  /// The first word of slab `id`'s block bitmap. Arena 0's follow from the copy of its entry
  /// (meta_layout): a claim reaches a reused slab's bitmap right after the acquire of its claim,
  /// which empties the SM's L1, and a free right after its fence, so that a load of the arena
  /// table there would be a round trip to L2 in the chain of each.
  DEVMR_HOST_DEVICE std::uint32_t* bits(std::uint32_t id) const {
    if (lazy_ || arena_of(id) != 0) {
      return supply().block_bits(id);
    }
    return reinterpret_cast<std::uint32_t*>(first_.meta) -
           (first_.slabs - index_of(id)) * block_words_per_slab;
  }
  DEVMR_HOST_DEVICE std::byte* data(std::uint32_t id) const {
    return lazy_ ? supply().data(id) : supply().data(id, first_);
  }

  DEVMR_HOST_DEVICE std::uint32_t list_parts() const { return read_only(h_->arena_count); }
  DEVMR_HOST_DEVICE slab_set listed(unsigned cls, std::uint32_t part) const {
    return list(cls, part);
  }
  DEVMR_HOST_DEVICE slab_set below(unsigned cls, std::uint32_t part) const {
    return list(num_classes + cls, part);
  }
  DEVMR_HOST_DEVICE static std::uint32_t member(std::uint32_t id) { return index_of(id); }
  DEVMR_HOST_DEVICE static std::uint32_t part_of(std::uint32_t id) { return arena_of(id); }
  DEVMR_HOST_DEVICE static std::uint32_t slab_of(std::uint32_t part, std::uint32_t member) {
    return make_slab_id(part, member);
  }

  /// Slab `id`, taken from the supply, now holds blocks of class `cls`: its tag says so, for
  /// frees that do not know their block's size, checked frees and statistics.
  DEVMR_HOST_DEVICE void format(std::uint32_t id, unsigned cls) const {
    atomic(meta(id).state).store(make_state(cls, 0), relaxed);
  }

  /// One slab from the supply, or no_slab when the heap has none. The look at the hint's own
  /// stack of single slabs and at the fresh slabs is made here, inline; only when neither has a
  /// slab does the search of the supply run, out of line: an install that takes a slab from its
  /// own stack makes no second call, whose saved registers it would restore at its end.
  DEVMR_HOST_DEVICE std::uint32_t take_empty(unsigned hint) const {
    std::uint32_t const id = supply().take_near(hint);
    return id != no_slab ? id
                         : out_of_line<&slab_supply::take_run>(supply(), std::uint32_t{1}, hint);
  }

  /// For an install of class `cls` on a roomy heap: a row of run_slabs empty slabs where the heap
  /// takes rows (heap_header::rows) and the class is one of those that do, as take_row gives it
  /// (the count of slabs from bit 56), else one slab (take_empty). A checked heap takes no rows:
  /// its fresh slabs hand their blocks out from their bitmaps, one slab's each.
  DEVMR_HOST_DEVICE std::uint64_t take_empty_for(unsigned cls, unsigned hint) const {
    if (cls >= first_run_class && !checked_ && read_only(h_->rows) != 0) {
      std::uint64_t const row = out_of_line<&slab_supply::take_row>(supply(), run_slabs, hint);
      if (static_cast<std::uint32_t>(row) != no_slab) {
        return row;
      }
    }
    return take_empty(hint);
  }

  /// Slab `id`, whose blocks are all free, goes back to the supply: marked in its arena's
  /// bitmap of empty slabs. The thread that emptied it acquired every free of its blocks
  /// (slab_avail::settle); the mark's release passes them on to the search that takes it.
  DEVMR_HOST_DEVICE void give_empty(std::uint32_t id, unsigned) const {
    std::uint32_t const part = arena_of(id);
    std::uint64_t* const empty = empty_bits(part);
    atomic(meta(id).remaining).store(0, relaxed);  // what the taker's settle reads
    slab_supply::mark_in(empty, empty_bitmap_words(slabs_in(part)), index_of(id) / 64,
                         std::uint64_t{1} << (index_of(id) % 64), release);
    supply().count_given(part, 1);
  }

  /// Slab `id`, taken from the supply, is formatted for a class: one more slab out of the supply.
  DEVMR_HOST_DEVICE void count_out(std::uint32_t id) const {
    supply().count_taken(arena_of(id), 1);
  }
  /// Whether fewer slabs than the heap's roomy limit are out of the supply (slot_shape::roomy):
  /// then installs take empty slabs first. A hint, read relaxed.
  /// The limit and arena 0's count are read without waiting for the arena count (every heap has
  /// arena 0, and an arena not published yet has none out): the three loads travel together, one
  /// round trip at the head of every install.
  DEVMR_HOST_DEVICE bool roomy() const {
    std::uint32_t const limit = read_only(h_->slot_widths.roomy);
    std::uint64_t out = supply().slabs_out(0);
    std::uint32_t const arenas = read_only(h_->arena_count);
    DEVMR_ROLLED for (std::uint32_t a = 1; a < arenas; ++a) {
      out += supply().slabs_out(a);
    }
    return out < limit;
  }

  /// Slabs that installs took and have not yet put in their slots (class_slots::final_search).
  DEVMR_HOST_DEVICE std::uint64_t& in_flight() const { return h_->slabs_in_flight.value; }
  /// Slabs that closes put on a list or back in the supply so far (class_slots::final_search).
  DEVMR_HOST_DEVICE std::uint64_t& moves() const { return h_->slab_moves.value; }

  /// Fresh slabs hand their blocks out in order, but on checked heaps (see class_slots::install).
  DEVMR_HOST_DEVICE bool bump_fresh() const { return !checked_; }

 private:
  DEVMR_HOST_DEVICE slab_meta& meta(std::uint32_t id) const {
    return lazy_ ? supply().meta(id) : supply().meta(id, first_);
  }

  /// List `index` of part `part`: see class_list_words.
  DEVMR_HOST_DEVICE slab_set list(unsigned index, std::uint32_t part) const {
    auto const slabs = static_cast<std::uint32_t>(slabs_in(part));
    return {lists(part) + index * slab_set_words(slabs), bitmap_words_for(slabs)};
  }

  // What a free that lists or empties a slab needs of its arena's entry: for arena 0, from the
  // copy of the entry (meta_layout_for), as bits() does, since that free reaches them right after
  // the acquire that took the slab or the atomics of its count.

  /// Arena `part`'s slabs.
  DEVMR_HOST_DEVICE std::uint64_t slabs_in(std::uint32_t part) const {
    return lazy_ || part != 0 ? read_only(h_->arenas[part].slabs) : first_.slabs;
  }
  /// Arena `part`'s bitmap of empty slabs (arena_desc::empty_bits).
  DEVMR_HOST_DEVICE std::uint64_t* empty_bits(std::uint32_t part) const {
    return in_meta(part, &arena_desc::empty_bits, &meta_layout::empty);
  }
  /// Arena `part`'s lists of slabs (arena_desc::listed).
  DEVMR_HOST_DEVICE std::uint32_t* lists(std::uint32_t part) const {
    return in_meta(part, &arena_desc::listed, &meta_layout::listed);
  }
  /// What `field` of arena `part`'s entry points at: for arena 0, `at` of its metadata's layout.
  template <class T>
  DEVMR_HOST_DEVICE T* in_meta(std::uint32_t part,
                               T* arena_desc::*field,
                               std::uint64_t meta_layout::*at) const {
    if (lazy_ || part != 0) {
      return read_only(h_->arenas[part].*field);
    }
    meta_layout const layout = meta_layout_for(first_.slabs);
    return reinterpret_cast<T*>(reinterpret_cast<std::byte*>(first_.meta) +
                                (layout.*at - layout.meta));
  }

  heap_header* h_;
  heap_view::arena_view first_;
  bool checked_;
  bool lazy_;
};

/// The slots of the size classes of the heap whose slabs `slabs` are (a view of its header, with
/// or without arena 0's entry). `fixed_widths`: whether the caller knows its slot widths fixed.
DEVMR_HOST_DEVICE inline class_slots<heap_slabs> heap_slots(heap_slabs const& slabs,
                                                            bool fixed_widths) {
  heap_header* const h = slabs.header();
  return {slabs, &h->slots[0].classes[0], num_classes, max_slots, &h->slot_widths, fixed_widths};
}

// A heap's installs take rows of slabs where the heap says so (heap_header::rows): a Slabs
// whose take_empty_for the slots did not see would leave every heap without them, silently.
static_assert(class_slots<heap_slabs>::takes_rows);

/// A heap's slots, out of line (out_of_line.hpp), are rebuilt from the heap's header: the flags
/// are read from it again, so that the allocating kernel keeps no copy of its view in memory for
/// the call, and the arena table is read where a slab's metadata or memory is needed (a view
/// that held arena 0's entry would hold it across every call the slow path makes, in registers
/// that count in the allocating kernel). The view does not know its widths fixed: it reads the
/// widths word where it needs the widths (a fixed heap's gives every class every slot), so that
/// its first loads wait for no test of the base (slot_width::look).
template <>
struct view_handle<class_slots<heap_slabs>> {
  DEVMR_HOST_DEVICE static heap_header* of(class_slots<heap_slabs> const& s) {
    return s.slabs().header();
  }
  DEVMR_HOST_DEVICE static class_slots<heap_slabs> view(heap_header* h) {
    return heap_slots(heap_slabs{h, read_only(h->checked) != 0}, false);
  }
};

/// The lists of a heap's slots, rebuilt out of line from the heap's header as its slots are.
template <>
struct view_handle<class_lists<heap_slabs>> {
  DEVMR_HOST_DEVICE static heap_header* of(class_lists<heap_slabs> const& l) {
    return l.slabs().header();
  }
  DEVMR_HOST_DEVICE static class_lists<heap_slabs> view(heap_header* h) {
    return class_lists<heap_slabs>{heap_slabs{h, read_only(h->checked) != 0}};
  }
};

}  // namespace devmr::detail::heap
