#pragma once

// The cuda::mr concepts under the names of the CCCL in use. CCCL 3.1 renamed them: the plain
// (synchronous) resource became `synchronous_resource`, and `resource` now means the
// stream-ordered one that 3.0 called `async_resource`. devmr provides both spellings of the
// member functions, so each resource satisfies the concepts of either version; these aliases let
// one static_assert say so.

#include <devmr/detail/config.hpp>

#include <cuda/memory_resource>

namespace devmr::detail {

#if CCCL_MAJOR_VERSION > 3 || (CCCL_MAJOR_VERSION == 3 && CCCL_MINOR_VERSION >= 1)
/// A resource with synchronous allocate/deallocate and the given properties.
template <class Resource, class... Properties>
concept synchronous_resource_with = cuda::mr::synchronous_resource_with<Resource, Properties...>;
/// A resource with stream-ordered allocation too, and the given properties.
template <class Resource, class... Properties>
concept stream_ordered_resource_with = cuda::mr::resource_with<Resource, Properties...>;
#else
template <class Resource, class... Properties>
concept synchronous_resource_with = cuda::mr::resource_with<Resource, Properties...>;
template <class Resource, class... Properties>
concept stream_ordered_resource_with = cuda::mr::async_resource_with<Resource, Properties...>;
#endif

}  // namespace devmr::detail
