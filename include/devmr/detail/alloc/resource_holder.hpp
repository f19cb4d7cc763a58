#pragma once

// How an allocator keeps its resource: a copyable resource (a ref, a shared_resource) by value,
// an owning one (a pool: move-only) by address. Either way the allocator stays copyable, as the
// C++ Allocator requirements ask, and the concrete type stays visible, so calls inline.

#include <devmr/detail/config.hpp>

#include <memory>
#include <type_traits>

namespace devmr::detail::alloc {

template <class Resource, bool ByValue = std::is_copy_constructible_v<Resource>>
class resource_holder;

/// A copyable resource, kept by value.
template <class Resource>
class resource_holder<Resource, true> {
 public:
  DEVMR_HOST_DEVICE explicit resource_holder(Resource const& resource) : resource_{resource} {}
  DEVMR_HOST_DEVICE Resource& get() const noexcept { return resource_; }

 private:
  mutable Resource resource_;  // allocate may be non-const on a resource; the holder is a handle
};

/// An owning resource, kept by address: it must outlive the allocators that point at it.
template <class Resource>
class resource_holder<Resource, false> {
 public:
  DEVMR_HOST_DEVICE explicit resource_holder(Resource& resource) : resource_{&resource} {}
  DEVMR_HOST_DEVICE Resource& get() const noexcept { return *resource_; }

 private:
  Resource* resource_;
};

}  // namespace devmr::detail::alloc
