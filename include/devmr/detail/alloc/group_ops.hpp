#pragma once

// One block for a whole cooperative group over any resource with __device__ allocate/deallocate:
// the resource's own group overloads where it has them (slab_ref), else the group's first thread
// allocates and hands the pointer to the others.

#include <devmr/detail/config.hpp>
#include <devmr/slab_ref.hpp>

#include <cstddef>

#if defined(__CUDACC__)
namespace devmr::detail::alloc {

/// Gives every member of `g` the pointer its first thread holds; the first thread's writes
/// before the call are visible to every member after it.
template <thread_group Group>
__device__ void* share_pointer(Group const& g, void* value) {
  if constexpr (requires { g.shfl(value, 0u); }) {
    value = g.shfl(value, 0u);
    g.sync();  // a shuffle orders no memory: the leader's allocation happens before any use
    return value;
  } else {
    // A whole thread block (thread_group admits no other group without a shuffle).
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

/// One block for group `g` from the single-thread allocate of `ref`: the first thread allocates,
/// every member gets its pointer. All members call it.
template <thread_group Group, class Ref>
__device__ void* leader_allocate(Group const& g,
                                 Ref const& ref,
                                 std::size_t bytes,
                                 std::size_t alignment) {
  void* p = nullptr;
  if (g.thread_rank() == 0) {
    p = ref.allocate(bytes, alignment);
  }
  return share_pointer(g, p);
}

/// Frees a block of group `g` through the single-thread deallocate of `ref`, once every member
/// is past its last use. All members call it.
template <thread_group Group, class Ref>
__device__ void leader_deallocate(
    Group const& g, Ref const& ref, void const* p, std::size_t bytes, std::size_t alignment) {
  g.sync();
  if (g.thread_rank() == 0) {
    ref.deallocate(p, bytes, alignment);
  }
}

/// One block of `bytes` for group `g`, the same pointer to every member; all members call it.
template <thread_group Group, class Ref>
__device__ void* group_allocate(Group const& g,
                                Ref const& ref,
                                std::size_t bytes,
                                std::size_t alignment) {
  if constexpr (requires { ref.allocate(g, bytes, alignment); }) {
    return ref.allocate(g, bytes, alignment);
  } else {
    return leader_allocate(g, ref, bytes, alignment);
  }
}

/// Frees a block of group `g` once every member is past its last use; all members call it.
template <thread_group Group, class Ref>
__device__ void group_deallocate(
    Group const& g, Ref const& ref, void const* p, std::size_t bytes, std::size_t alignment) {
  if constexpr (requires { ref.deallocate(g, p, bytes, alignment); }) {
    ref.deallocate(g, p, bytes, alignment);
  } else {
    leader_deallocate(g, ref, p, bytes, alignment);
  }
}

}  // namespace devmr::detail::alloc
#endif
