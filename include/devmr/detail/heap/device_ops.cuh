#pragma once

// The device fast path of slab_ref: allocate and free from kernels, a warp at a time. Threads of a
// warp that ask for blocks of one group (two neighbouring size classes) share one claim (one
// atomic on the current slab of their SM's slot); threads that free blocks of one slab share one
// subtraction.

#include <devmr/detail/heap/heap_core.hpp>
#include <devmr/detail/heap/warp.cuh>

#include <cstddef>
#include <cstdint>

namespace devmr::detail::heap {

/// Allocates `bytes` aligned to `alignment` from the heap at `h`; nullptr (counted) on failure.
/// `arena0` and `checked`: arena 0's entry and the heap's flag, as the slab_ref carries them (a
/// kernel's parameters: no load).
__device__ inline void* device_allocate(heap_header* h,
                                        heap_core::arena_view const& arena0,
                                        bool checked,
                                        std::size_t bytes,
                                        std::size_t alignment) {
  if (bytes == 0) {
    return nullptr;
  }
  heap_core const core{h};
  if (!is_power_of_two(alignment) || alignment > slab_bytes) {
    atomic(h->counters.bad_alignments).fetch_add(1, relaxed);
    return nullptr;
  }
  std::size_t const size = bytes > alignment ? bytes : alignment;
  if (size > max_small_bytes) {
    void* p = core.allocate_large(size, sm_id());
    if (p == nullptr) {
      atomic(h->counters.failed_allocations).fetch_add(1, relaxed);
    }
    return p;
  }
  unsigned const cls = class_of_size(size);
  unsigned const shift = cls + min_block_shift;
  bool const large = is_large_class(cls);

  // The threads of this warp that want blocks of this group: one leader claims for all of them,
  // for each of the group's two classes, with one atomic.
  unsigned const active = __activemask();
  unsigned const peers = __match_any_sync(active, group_of(cls));
  unsigned const larges = __ballot_sync(active, large) & peers;
  unsigned const lane = lane_id();
  unsigned const leader = __ffs(peers) - 1;
  // This lane's place among the blocks of its class that the peers still want.
  unsigned place = __popc((large ? larges : peers & ~larges) & lanes_below());
  unsigned const sm = sm_id();
  unsigned const slot = sm & h->slot_mask;

  std::byte* mine = nullptr;
  // Blocks the peers still want, small | large << 16 (uniform across peers: every value below
  // is broadcast).
  unsigned rest = __popc(peers & ~larges) | __popc(larges) << 16;
  while (rest != 0) {
    pair_claim got{nullptr, 0, 0};
    if (lane == leader) {
      got = core.claim_pair(group_of(cls), slot, rest, sm, arena0);
    }
    got.counts = __shfl_sync(peers, got.counts, leader);
    if (got.counts == 0) {
      break;
    }
    got.fronts = __shfl_sync(peers, got.fronts, leader);
    got.slab = reinterpret_cast<std::byte*>(
        __shfl_sync(peers, reinterpret_cast<unsigned long long>(got.slab), leader));
    unsigned const count = large ? got.large_count() : got.small_count();
    if (place < count) {
      mine = large ? got.large_block(place, shift) : got.small_block(place, shift);
    }
    place -= count;  // past the blocks served (wraps once this lane has its block: none again)
    rest -= got.counts;
  }
  // Memory ordering among the peers (shuffles give none): the leader's claims, acquires, happen
  // before every peer's use of its block.
  __syncwarp(peers);
  if (rest != 0 && lane == leader) {
    atomic(h->counters.failed_allocations).fetch_add((rest & 0xffffu) + (rest >> 16), relaxed);
  }
  if (mine != nullptr && checked) {
    std::uint32_t id = 0;
    std::size_t offset = 0;
    core.locate(mine, arena0, id, offset);
    core.mark_allocated(id, offset, cls);
  }
  return mine;
}

/// The subtraction of device_deallocate: `peers`, the lanes of this warp freeing blocks of slab
/// `id` (metadata `m`), give them back at once, by the first of them (no peer below it: one
/// instruction after the match, where __ffs took three). `larges`: the lanes freeing blocks of
/// their group's large class; `below`: lanes_below().
__device__ __forceinline__ void give_back(heap_core const& core,
                                          slab_meta& m,
                                          std::uint32_t id,
                                          unsigned peers,
                                          unsigned larges,
                                          unsigned below) {
  if ((peers & below) == 0) {
    auto const large = static_cast<std::uint32_t>(__popc(peers & larges));
    core.free_blocks(m, id, freed_blocks(__popc(peers) - large, large), sm_id(), relaxed);
  }
}

/// The subtraction of device_deallocate's slow path, once the slab of the caller's block is
/// found: the lanes here group by slab. `callers`: the lanes that passed device_deallocate's
/// barrier together; `large`: the caller's block is of its group's large class; `below`:
/// lanes_below().
__device__ __forceinline__ void free_with_peers(heap_core const& core,
                                                slab_meta& m,
                                                std::uint32_t id,
                                                unsigned callers,
                                                bool large,
                                                unsigned below) {
  unsigned const peers = __match_any_sync(__activemask(), id);
  unsigned const larges = __ballot_sync(peers, large);
  // Peers that did not pass the barrier together (the warp came together again in between,
  // which the hardware may do; every peer then sees it, as lanes that passed it together have
  // the same `callers`) meet at a barrier of their own, and fence again after it, so that the
  // subtraction still follows a release of all their blocks.
  if ((peers & ~callers) != 0) {
    __syncwarp(peers);
    release_fence();
  }
  give_back(core, m, id, peers, larges, below);
}

/// Frees `p` (nullptr: nothing) into the heap at `h`; pointers it does not own are counted.
/// `bytes` and `alignment`: those it was allocated with, which say its class (an unchecked heap
/// trusts them, as it trusts that a block is freed once; a checked heap reads the class from its
/// bitmap); `bytes` 0 when unknown (bulk frees: the class follows from the slab's fronts).
/// `first` and `checked` as for device_allocate.
__device__ inline void device_deallocate(heap_header* h,
                                         heap_core::arena_view const& first,
                                         bool checked,
                                         void const* p,
                                         std::size_t bytes,
                                         std::size_t alignment) {
  // The release of the frees. The warp barrier orders the last use of every calling lane's block
  // before the fence of each of them, so of the lane that will subtract for it; that fence and
  // the relaxed subtraction after it publish them to the search that acquires the slab's count.
  // Issued first, the fence waits for the caller's load of `p` instead of following the lookup.
  unsigned const callers = __activemask();
  unsigned const below = lanes_below();
  __syncwarp(callers);
  release_fence();
  heap_core const core{h};
  // Most blocks lie in arena 0, whose entry is at hand: on an unchecked heap their slab follows
  // from the offset alone (its id is its index there), with no loop over the arenas.
  std::uintptr_t off = 0;
  bool const fast = !checked && bytes != 0 && first.holds(p, off);
  auto const index = static_cast<std::uint32_t>(off >> slab_shift);
  // (An alignment of 0, which no allocation took, is taken as 1, as max(bytes, 0) would be.)
  bool large = is_large_last((bytes - 1) | (alignment != 0 ? alignment - 1 : 0));
  // One match over all the callers, right after the fence, so that its peers all passed the
  // barrier together. Lanes of the fast path match on their slab's index; the others on a value
  // of their own that no index takes, and group with nobody here. (A match that only the fast
  // path reached was preceded by a test of the warp's convergence: 2^22 frees of 16 B to 1 KiB
  // +0.01 to +0.02 of the floor without it.)
  static_assert(max_slabs_per_arena <= no_slab - 31);
  unsigned const peers =
      __match_any_sync(callers, fast ? index : no_slab - static_cast<unsigned>(__popc(below)));
  unsigned const larges = __ballot_sync(callers, large);
  if (fast) {
    give_back(core, first.meta[index], make_slab_id(0, index), peers, larges, below);
    return;
  }
  std::uint32_t id = 0;
  std::size_t offset = 0;
  if (!core.locate(p, first, id, offset)) {  // no arena holds nullptr
    if (p != nullptr) {
      core.count_misuse(h->counters.invalid_frees);
    }
    return;
  }
  if (checked) {
    if (core.check_free(id, offset, sm_id(), large) != free_check::proceed) {
      return;
    }
  } else if (bytes == 0) {
    sizeless const kind = core.sizeless_class(p, id, offset);
    if (kind == sizeless::pending) {
      return;  // freed by the thread that ends its slab's claims
    }
    large = kind == sizeless::large;
  }
  free_with_peers(core, core.meta(id, first), id, callers, large, below);
}

/// Allocates from the heap at `h`, reading arena 0's entry and the checked flag from its header
/// (the library's own kernels, which take the header).
__device__ inline void* device_allocate(heap_header* h, std::size_t bytes, std::size_t alignment) {
  heap_core const core{h};
  return device_allocate(h, core.arena(0), core.checked(), bytes, alignment);
}

/// Frees `p` into the heap at `h`, reading arena 0's entry and the checked flag from its header.
/// `size` as for the other overload.
__device__ inline void device_deallocate(heap_header* h, void const* p, std::size_t size) {
  heap_core const core{h};
  device_deallocate(h, core.arena(0), core.checked(), p, size, 1);
}

/// True when `p` lies in one of the heap's arenas.
__device__ inline bool device_owns(heap_header* h, void const* p) {
  std::uint32_t id = 0;
  std::size_t offset = 0;
  return heap_core{h}.locate(p, id, offset);
}

}  // namespace devmr::detail::heap
