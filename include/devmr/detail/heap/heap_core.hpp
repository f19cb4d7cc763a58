#pragma once

// The lock-free core of the slab heap, written once for host and device. Every shared word is
// touched through cuda::atomic_ref, so host tests drive exactly this code from many std::threads on
// host memory, and kernels run it on device memory.
//
// How memory moves:
//  - Small blocks (up to half a slab) come from the slots of their size class (class_slots.hpp):
//    a slab a slot takes fresh hands its blocks out in order; a slab whose blocks were freed
//    while others of it stay live goes on its class's list once enough of them are free, and a
//    slot takes it from there again, handing out its free blocks from its bitmap. A slab whose
//    blocks are all free leaves its class, back to the slab supply (slab_supply.hpp), for any
//    class or a large block.
//  - Large blocks take runs of whole slabs from the supply, and give them back when freed. A run
//    that no stack of free runs can serve is gathered from empty slabs in a row, after the slots
//    give up their slabs if need be (gather_run).
//  - A checked heap hands every block out from its bitmap, so that a clear bit means a block in
//    use: a free whose bit is set already is a double free, and changes nothing.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/atomics.hpp>
#include <devmr/detail/heap/bits.hpp>
#include <devmr/detail/heap/class_slots.hpp>
#include <devmr/detail/heap/heap_slabs.hpp>
#include <devmr/detail/heap/layout.hpp>
#include <devmr/detail/heap/out_of_line.hpp>
#include <devmr/detail/heap/slab_supply.hpp>

#include <cuda/atomic>

#include <cstddef>
#include <cstdint>

namespace devmr::detail::heap {

/// The class of blocks of `size` bytes (at most max_small_bytes; the larger of size and
/// alignment).
DEVMR_HOST_DEVICE inline unsigned class_of_size(std::size_t size) {
  return size <= (std::size_t{1} << min_block_shift) ? 0u : ceil_log2(size) - min_block_shift;
}

/// A small block that a free gives back: block `block` of slab `id`, of class `cls`.
struct block_ref {
  std::uint32_t id;
  unsigned cls;
  std::uint32_t block;
};

/// A view of one heap's header: the operations of the lock-free core, over its slab supply.
class heap_core : public slab_supply {
 public:
  using slots_type = class_slots<heap_slabs>;

  /// A core that reads arena 0's entry, the checked flag and whether the slot widths are fixed
  /// from the header.
  DEVMR_HOST_DEVICE explicit heap_core(heap_header* header)
      : heap_core{header, heap_view{header}.arena(0), read_only(header->checked) != 0,
                  slot_width::fixed_for(header->slot_widths, max_slots)} {}
  /// A core for a caller that carries arena 0's entry and the flags (slab_ref's fast paths).
  /// `fixed_widths`: the caller knows the slot widths fixed (false: claims read them).
  DEVMR_HOST_DEVICE heap_core(heap_header* header,
                              arena_view const& first,
                              bool checked,
                              bool fixed_widths = false)
      : slab_supply{header}, first_{first}, checked_{checked}, fixed_widths_{fixed_widths} {}

  DEVMR_HOST_DEVICE arena_view const& first() const { return first_; }
  DEVMR_HOST_DEVICE bool checked() const { return checked_; }
  DEVMR_HOST_DEVICE bool fixed_widths() const { return fixed_widths_; }
  /// The slab supply alone (a view of the header).
  DEVMR_HOST_DEVICE slab_supply supply() const { return slab_supply{h_}; }

  /// The slots of the size classes. The slow paths that look at every slot of a class look at
  /// all max_slots of them (those past the ones in use are vacant, or hold slabs that they give
  /// up when the heap runs out), so that no register holds the count in the allocating kernels.
  DEVMR_HOST_DEVICE slots_type slots() const {
    return heap_slots(heap_slabs{h_, first_, checked_}, fixed_widths_);
  }

  // ---- small blocks -------------------------------------------------------------------------

  /// One block of class `cls` through slot `slot` (host paths and tests; kernels claim for a
  /// warp at once, warp_allocate): nullptr when the heap has none left.
  DEVMR_HOST_DEVICE void* allocate_small(unsigned cls, unsigned slot, unsigned hint) const {
    slots_type const s = slots();
    block_claim got = s.claim(cls, slot, 1, hint);
    if (is_moved(got)) {
      got = s.claim(cls, got.id, 1, hint);  // a slot of the base width: sends none on
    }
    if (got.count == 0) {
      return nullptr;
    }
    std::byte* p = nullptr;
    s.take(got, cls, [&](std::uint32_t b) {
      p = s.slabs().data(got.id) + (std::size_t{b} << (cls + min_block_shift));
    });
    return p;
  }

  // ---- large blocks -------------------------------------------------------------------------

  /// A run of whole slabs for one block of `bytes` (> max_small_bytes); nullptr when none is left.
  DEVMR_HOST_DEVICE void* allocate_large(std::size_t bytes, unsigned hint) const {
    std::uint64_t const slabs = (bytes + slab_bytes - 1) >> slab_shift;
    if (slabs > max_slabs_per_arena) {
      return nullptr;
    }
    auto const count = static_cast<std::uint32_t>(slabs);
    std::uint32_t id = out_of_line<&slab_supply::take_run>(supply(), count, hint);
    if (id == no_slab) {
      id = out_of_line<&heap_core::gather_run>(*this, count, hint);
    }
    if (id == no_slab) {
      return nullptr;
    }
    count_taken(arena_of(id), slabs);
    slab_meta& m = meta(id);
    atomic(m.length).store(static_cast<std::uint32_t>(slabs), relaxed);
    atomic(m.remaining).store(large_run_count, relaxed);
    // release: a free, which acquires the state, sees the run's count.
    atomic(m.state).store(make_state(tag_large, 0), release);
    return data(id);
  }

  /// The last resort of a search for `slabs` contiguous slabs: they are looked for among the
  /// marks of the bitmaps of empty slabs; if there are not so many in a row, every free run and
  /// slab resting on a stack is marked there too, and, if that is not enough, the slots give up
  /// their slabs (those whose blocks are all free leave their classes, marked), and the bitmaps
  /// are searched again. So the slabs that small blocks emptied come back as long runs, and runs
  /// cut into pieces merge. A slow path: called out of line (out_of_line.hpp).
  DEVMR_HOST_DEVICE std::uint32_t gather_run(std::uint32_t slabs, unsigned hint) const {
    slots_type const s = slots();
    if (slabs == 1) {
      return out_of_line<&slots_type::release_slots>(s, num_classes, hint)
                 ? out_of_line<&slab_supply::take_run>(supply(), slabs, hint)
                 : no_slab;
    }
    std::uint32_t id = find_marked_run(slabs);
    if (id == no_slab && mark_all_free()) {
      id = find_marked_run(slabs);
    }
    if (id == no_slab && out_of_line<&slots_type::release_slots>(s, num_classes, hint)) {
      mark_all_free();
      id = find_marked_run(slabs);
    }
    return id;
  }

  // ---- frees --------------------------------------------------------------------------------

  /// What a free of `p` gives back, for the caller to free with the blocks of its warp: true,
  /// and `b` set, for a small block; false when nothing is left to do (nullptr, a pointer of no
  /// block, a large block, freed here, or any block of a checked heap, checked and freed here).
  /// `size`: the larger of the size and alignment it was allocated with, or 0 when unknown:
  /// then its slab's tag says its class (a slab keeps its class while a block of it is out).
  /// `order`: that of the frees made here, as for class_lists::free_bits.
  DEVMR_HOST_DEVICE bool find_block(void const* p,
                                    std::size_t size,
                                    unsigned hint,
                                    block_ref& b,
                                    cuda::std::memory_order order = release) const {
    std::size_t offset = 0;
    if (!locate(p, first_, b.id, offset)) {
      if (p != nullptr) {
        count_misuse(h_->counters.invalid_frees);
      }
      return false;
    }
    if (checked_) {
      check_free(b.id, offset, hint, order);
      return false;
    }
    if (size == 0 || size > max_small_bytes) {
      std::uint32_t const tag = state_tag(atomic(meta(b.id, first_).state).load(relaxed));
      if (tag >= num_classes) {
        free_large(b.id, offset, tag, hint);
        return false;
      }
      b.cls = tag;
    } else {
      b.cls = class_of_size(size);
    }
    b.block = static_cast<std::uint32_t>(offset >> (b.cls + min_block_shift));
    return true;
  }

  /// Frees the large block at `offset` of slab `id`, whose tag is `tag` (not a class's): misuse
  /// unless it is the first byte of a run whose block is out.
  DEVMR_HOST_DEVICE void free_large(std::uint32_t id,
                                    std::size_t offset,
                                    std::uint32_t tag,
                                    unsigned hint) const {
    if (tag != tag_large || offset != 0) {
      count_misuse(tag == tag_free && offset == 0 ? h_->counters.double_frees
                                                  : h_->counters.invalid_frees);
      return;
    }
    std::uint32_t expected = large_run_count;
    // acq_rel: acquires the run's count as allocate_large stored it; releases the block's last
    // writes to the run's next owner (the push releases them again).
    if (!atomic(meta(id).remaining)
             .compare_exchange_strong(expected, large_run_left, acq_rel, relaxed)) {
      count_misuse(h_->counters.double_frees);
      return;
    }
    retire(id, hint);
  }

  /// Checks and frees the block at `offset` of slab `id` on a checked heap, recording misuse.
  DEVMR_HOST_DEVICE void check_free(std::uint32_t id,
                                    std::size_t offset,
                                    unsigned hint,
                                    cuda::std::memory_order order) const {
    // A slab past its arena's frontier was not handed out since the heap began or was reset: its
    // metadata may be from before the reset, and must not be trusted.
    if (index_of(id) >= atomic(h_->frontier[arena_of(id)]).load(relaxed)) {
      count_misuse(h_->counters.invalid_frees);
      return;
    }
    // acquire: the tag as the slab's format or allocate_large stored it.
    std::uint32_t const tag = state_tag(atomic(meta(id).state).load(acquire));
    if (tag >= num_classes) {
      free_large(id, offset, tag, hint);
      return;
    }
    unsigned const shift = tag + min_block_shift;
    if ((offset & ((std::size_t{1} << shift) - 1)) != 0) {
      count_misuse(h_->counters.invalid_frees);
      return;
    }
    // The block's bit is clear while it is out (a checked heap hands out every block from its
    // bitmap); set, it was freed already (or never handed out since the slab took its class).
    auto const block = static_cast<std::uint32_t>(offset >> shift);
    std::uint32_t const bit = 1u << (block % bitmap_word_bits);
    slots_type const s = slots();
    std::uint32_t const was =
        atomic(s.slabs().bits(id)[block / bitmap_word_bits]).fetch_or(bit, order);
    if ((was & bit) != 0) {
      count_misuse(h_->counters.double_frees);
      return;
    }
    s.lists().count_freed(id, tag, 1, hint);
  }

  /// Frees one block from one thread (host paths and tests; kernels free for a warp at once).
  /// `size` as for find_block.
  DEVMR_HOST_DEVICE void free_one(void const* p, unsigned hint, std::size_t size = 0) const {
    block_ref b{};
    if (find_block(p, size, hint, b)) {
      slots().lists().free_block(b.id, b.cls, b.block, hint);
    }
  }

  DEVMR_HOST_DEVICE void count_misuse(std::uint64_t& counter) const {
    atomic(counter).fetch_add(1, relaxed);
  }

 private:
  arena_view first_;
  bool checked_;
  bool fixed_widths_;
};

/// What a slab holds, as statistics see it (slab_usage).
enum class slab_use { none, small, large };

/// The blocks of slab `id` (of `per_slab` blocks) that slot value `w` promised and no claim took:
/// free blocks of the slab that its count does not hold. A slot that hands out a row of fresh
/// slabs (class_slots::open_row) promised all of their blocks, in order.
DEVMR_HOST_DEVICE inline std::uint32_t slot_unclaimed(std::uint64_t w,
                                                      std::uint32_t id,
                                                      std::uint32_t per_slab) {
  std::uint32_t const first = slot_id(w);
  std::uint32_t const promised = slot_promised(w);
  std::uint32_t const claimed = slot_claimed(w);
  if (!is_slab(first) || claimed >= promised) {
    return 0;
  }
  if (!slot_is_fresh(w) || promised <= per_slab) {
    return first == id ? promised - claimed : 0;
  }
  if (id < first || id - first >= promised / per_slab) {
    return 0;
  }
  return per_slab - row_slab_claimed(claimed, id - first, per_slab);
}

/// What slab `id` (metadata `m`) of the heap at `h` holds for users (statistics scans, with no
/// kernel running): a slab of small blocks of class `cls`, `in_use` of them out (those neither
/// free in its count nor, while a slot holds it, promised to the slot's claims); a large run of
/// `m.length` slabs with its block out; or nothing (free, a run's body, or a slab that left its
/// class).
DEVMR_HOST_DEVICE inline slab_use slab_usage(heap_header const& h,
                                             std::uint32_t id,
                                             slab_meta const& m,
                                             unsigned& cls,
                                             std::uint32_t& in_use) {
  std::uint32_t const tag = state_tag(m.state);
  if (tag == tag_large) {
    return m.remaining == large_run_count ? slab_use::large : slab_use::none;
  }
  if (tag >= num_classes) {
    return slab_use::none;  // its count was never written if it never held small blocks
  }
  std::uint32_t const avail = m.avail;
  if ((avail & avail_class_mask) == avail_no_class) {
    return slab_use::none;
  }
  cls = tag;
  in_use = class_capacity(tag) - (avail & avail_count_mask);
  if ((avail & avail_open) != 0) {
    for (auto const& line : h.slots) {
      if (std::uint32_t const unclaimed =
              slot_unclaimed(line.classes[tag], id, class_capacity(tag));
          unclaimed != 0) {
        in_use -= unclaimed;
        break;
      }
    }
  }
  return slab_use::small;
}

}  // namespace devmr::detail::heap
