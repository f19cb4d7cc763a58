#pragma once

// Definitions of slab_ref's members: the device fast path inline, the host path in the library.

#include <devmr/slab_ref.hpp>

#if defined(__CUDACC__)
#include <devmr/detail/heap/device_ops.cuh>

#include <cooperative_groups.h>
#endif

namespace devmr {

template <memory_kind Kind>
DEVMR_HOST_DEVICE void* slab_ref<Kind>::allocate(std::size_t bytes, std::size_t alignment) const {
#if DEVMR_IS_DEVICE_CODE
  return detail::heap::device_allocate(header_, {base_, meta_, slabs_}, checked_ != 0,
                                       fixed_widths_ != 0, bytes, alignment);
#else
  return detail::heap::host_allocate(header_, bytes, alignment);
#endif
}

template <memory_kind Kind>
DEVMR_HOST_DEVICE void slab_ref<Kind>::deallocate(void const* p,
                                                  std::size_t bytes,
                                                  std::size_t alignment) const {
#if DEVMR_IS_DEVICE_CODE
  detail::heap::device_deallocate(header_, {base_, meta_, slabs_}, checked_ != 0, p, bytes,
                                  alignment);
#else
  // The class of the block follows from the larger of the two, as for allocate (0: unknown).
  std::size_t const size = bytes == 0 ? 0 : (bytes > alignment ? bytes : alignment);
  detail::heap::host_deallocate(header_, p, size);
#endif
}

template <memory_kind Kind>
DEVMR_HOST_DEVICE bool slab_ref<Kind>::owns(void const* p) const noexcept {
#if DEVMR_IS_DEVICE_CODE
  return detail::heap::device_owns(header_, p);
#else
  return detail::heap::host_owns(header_, p);
#endif
}

#if defined(__CUDACC__)
namespace detail::heap {
/// Gives every member of `g` the value its first thread holds.
template <class Group>
__device__ void* broadcast(Group const& g, void* value) {
  if constexpr (requires { g.shfl(value, 0u); }) {
    value = g.shfl(value, 0u);
    g.sync();  // a shuffle orders no memory: the first thread's allocation happens before any use
    return value;
  } else {
    // A whole block (thread_group admits no other group without a shuffle): one slot per block.
    __shared__ void* slot;
    if (g.thread_rank() == 0) {
      slot = value;
    }
    g.sync();
    value = slot;
    g.sync();  // nobody overwrites the slot before every member has read it
    return value;
  }
}
}  // namespace detail::heap

template <memory_kind Kind>
template <thread_group Group>
__device__ void* slab_ref<Kind>::allocate(Group const& g,
                                          std::size_t bytes,
                                          std::size_t alignment) const {
  void* p = nullptr;
  if (g.thread_rank() == 0) {
    p = allocate(bytes, alignment);
  }
  return detail::heap::broadcast(g, p);
}

template <memory_kind Kind>
template <thread_group Group>
__device__ void slab_ref<Kind>::deallocate(Group const& g,
                                           void const* p,
                                           std::size_t bytes,
                                           std::size_t alignment) const {
  g.sync();
  if (g.thread_rank() == 0) {
    deallocate(p, bytes, alignment);
  }
}
#endif

}  // namespace devmr
