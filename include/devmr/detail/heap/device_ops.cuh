#pragma once

// The device fast path of slab_ref: allocate and free from kernels, a warp at a time. Threads of a
// warp that ask for blocks of one size class share one claim (one atomic on their slot of the
// class, see class_ops.cuh); threads that free blocks of one bitmap word of one slab share one
// OR and one addition.

#include <devmr/detail/heap/class_ops.cuh>
#include <devmr/detail/heap/heap_core.hpp>
#include <devmr/detail/heap/warp.cuh>

#include <cstddef>
#include <cstdint>

namespace devmr::detail::heap {

/// Allocates `bytes` aligned to `alignment` from the heap at `h`; nullptr (counted) on failure.
/// `first`, `checked` and `fixed_widths`: arena 0's entry, the heap's flag and whether its slot
/// widths were fixed, as the slab_ref carries them (a kernel's parameters: no load).
__device__ inline void* device_allocate(heap_header* h,
                                        heap_view::arena_view const& first,
                                        bool checked,
                                        bool fixed_widths,
                                        std::size_t bytes,
                                        std::size_t alignment) {
  if (bytes == 0) {
    return nullptr;
  }
  if (!is_power_of_two(alignment) || alignment > slab_bytes) {
    atomic(h->counters.bad_alignments).fetch_add(1, relaxed);
    return nullptr;
  }
  heap_core const core{h, first, checked, fixed_widths};
  std::size_t const size = bytes > alignment ? bytes : alignment;
  void* p = nullptr;
  unsigned failed = 0;
  if (size > max_small_bytes) {
    p = core.allocate_large(size, sm_id());
    failed = p == nullptr ? 1 : 0;
  } else {
    unsigned const sm = sm_id();
    auto const slots = core.slots();
    unsigned const cls = class_of_size(size);
    p = warp_allocate(slots, cls, slots.slot_of(cls, claim_hint(sm, warp_slot())), sm, failed);
  }
  if (failed != 0) {
    atomic(h->counters.failed_allocations).fetch_add(failed, relaxed);
  }
  return p;
}

/// Frees `p` (nullptr: nothing) into the heap at `h`; pointers it does not own are counted.
/// `bytes` and `alignment`: those it was allocated with, which say its class (an unchecked heap
/// trusts them, as it trusts that a block is freed once; a checked heap reads the class from the
/// slab and the block's state from its bitmap); `bytes` 0 when unknown (bulk frees: the slab's
/// tag says the class). `first` and `checked` as for device_allocate.
__device__ inline void device_deallocate(heap_header* h,
                                         heap_view::arena_view const& first,
                                         bool checked,
                                         void const* p,
                                         std::size_t bytes,
                                         std::size_t alignment) {
  // The release of the frees. The warp barrier orders the last use of every calling lane's block
  // before the fence of each of them, so of the lane that frees for it; that fence and the
  // relaxed atomics after it publish them to whoever takes the blocks again. Issued first, the
  // fence waits for the caller's load of `p` instead of following the lookup.
  unsigned const callers = __activemask();
  __syncwarp(callers);
  release_fence();
  heap_core const core{h, first, checked};
  // (An alignment of 0, which no allocation took, is taken as 1, as max(bytes, 0) would be.)
  std::size_t const size = bytes == 0 ? 0 : (bytes > alignment ? bytes : alignment);
  // Most blocks lie in arena 0, whose entry is at hand: on an unchecked heap their slab follows
  // from the offset alone (its id is its index there), with no loop over the arenas.
  std::uintptr_t off = 0;
  bool const fast = !checked && size - 1 < max_small_bytes && first.holds(p, off);
  block_ref b{make_slab_id(0, static_cast<std::uint32_t>(off >> slab_shift)), class_of_size(size),
              0};
  b.block = static_cast<std::uint32_t>((off & (slab_bytes - 1)) >> (b.cls + min_block_shift));
  unsigned const sm = sm_id();
  bool valid = fast;
  if (!fast) {
    valid = core.find_block(p, size, sm, b, relaxed);
  }
  warp_free(core.slots(), b.id, b.cls, b.block, valid, sm, callers);
}

/// Allocates from the heap at `h`, reading arena 0's entry and the checked flag from its header
/// (the library's own kernels, which take the header).
__device__ inline void* device_allocate(heap_header* h, std::size_t bytes, std::size_t alignment) {
  heap_core const core{h};
  return device_allocate(h, core.first(), core.checked(), core.fixed_widths(), bytes, alignment);
}

/// Frees `p` into the heap at `h`, reading arena 0's entry and the checked flag from its header.
/// `size` as for the other overload.
__device__ inline void device_deallocate(heap_header* h, void const* p, std::size_t size) {
  heap_core const core{h};
  device_deallocate(h, core.first(), core.checked(), p, size, 1);
}

/// True when `p` lies in one of the heap's arenas.
__device__ inline bool device_owns(heap_header* h, void const* p) {
  std::uint32_t id = 0;
  std::size_t offset = 0;
  return heap_view{h}.locate(p, id, offset);
}

}  // namespace devmr::detail::heap
