#pragma once

// pool_resource<Kind>'s members: NVTX ranges, argument checks, then the pool core. Included by
// <devmr/pool_resource.hpp>.

#include <devmr/detail/nvtx.hpp>

#include <utility>

namespace devmr {
namespace detail {
/// Resolves options.device (-1: the current device; otherwise checks that it exists) and builds
/// a pool core over the driver's allocation calls for kind. Defined in host/pool_resource.cpp.
std::unique_ptr<pool_core> make_driver_pool(memory_kind kind, pool_options& options);
}  // namespace detail

template <memory_kind Kind>
pool_resource<Kind>::pool_resource(pool_options options) : options_(options) {
  DEVMR_FUNC_RANGE();
  core_ = detail::make_driver_pool(Kind, options_);
}

template <memory_kind Kind>
pool_resource<Kind>::~pool_resource() = default;
template <memory_kind Kind>
pool_resource<Kind>::pool_resource(pool_resource&&) noexcept = default;
template <memory_kind Kind>
pool_resource<Kind>& pool_resource<Kind>::operator=(pool_resource&&) noexcept = default;

template <memory_kind Kind>
void* pool_resource<Kind>::allocate(std::size_t bytes, std::size_t alignment) {
  DEVMR_FUNC_RANGE();
  return core_->allocate(bytes, alignment);
}

template <memory_kind Kind>
void pool_resource<Kind>::deallocate(void const* p, std::size_t bytes, std::size_t) noexcept {
  DEVMR_FUNC_RANGE();
  core_->deallocate(p, bytes);
}

template <memory_kind Kind>
void* pool_resource<Kind>::allocate_async(std::size_t bytes,
                                          std::size_t alignment,
                                          cuda::stream_ref stream) {
  DEVMR_FUNC_RANGE();
  return core_->allocate_async(bytes, alignment, stream.get());
}

template <memory_kind Kind>
void pool_resource<Kind>::deallocate_async(void const* p,
                                           std::size_t bytes,
                                           std::size_t,
                                           cuda::stream_ref stream) {
  DEVMR_FUNC_RANGE();
  core_->deallocate_async(p, bytes, stream.get());
}

template <memory_kind Kind>
pool_stats pool_resource<Kind>::stats() const {
  DEVMR_FUNC_RANGE();
  return core_->stats();
}

template <memory_kind Kind>
void pool_resource<Kind>::release() {
  DEVMR_FUNC_RANGE();
  core_->release();
}

}  // namespace devmr
