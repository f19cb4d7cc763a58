#pragma once

// The cuda::mr reference types under the names of the CCCL in use (CCCL 3.1 renamed them, as it
// renamed the concepts: see cccl_concepts.hpp), and the synchronous calls of each spelling.

#include <devmr/detail/config.hpp>

#include <cuda/memory_resource>

#include <cstddef>
#include <type_traits>

namespace devmr::detail::alloc {

#if CCCL_MAJOR_VERSION > 3 || (CCCL_MAJOR_VERSION == 3 && CCCL_MINOR_VERSION >= 1)
/// A reference to a resource with synchronous allocation.
template <class... Properties>
using synchronous_ref = cuda::mr::synchronous_resource_ref<Properties...>;
/// A reference to a resource with stream-ordered allocation too.
template <class... Properties>
using stream_ordered_ref = cuda::mr::resource_ref<Properties...>;

/// A resource that a reference can be made from. CCCL >= 3.1 builds its references on
/// cuda::__basic_any, whose interface asks for a copyable resource, and asking whether a
/// move-only one (a pool) converts fails to compile instead of answering false: this is checked
/// first.
template <class Resource>
concept referable = std::is_copy_constructible_v<Resource>;

template <class Ref>
void* allocate_sync(Ref& ref, std::size_t bytes, std::size_t alignment) {
  return ref.allocate_sync(bytes, alignment);
}
template <class Ref>
void deallocate_sync(Ref& ref, void* p, std::size_t bytes, std::size_t alignment) {
  ref.deallocate_sync(p, bytes, alignment);
}
#else
template <class... Properties>
using synchronous_ref = cuda::mr::resource_ref<Properties...>;
template <class... Properties>
using stream_ordered_ref = cuda::mr::async_resource_ref<Properties...>;

/// CCCL 3.0's references point at any resource, copyable or not.
template <class Resource>
concept referable = true;

template <class Ref>
void* allocate_sync(Ref& ref, std::size_t bytes, std::size_t alignment) {
  return ref.allocate(bytes, alignment);
}
template <class Ref>
void deallocate_sync(Ref& ref, void* p, std::size_t bytes, std::size_t alignment) {
  ref.deallocate(p, bytes, alignment);
}
#endif

}  // namespace devmr::detail::alloc
