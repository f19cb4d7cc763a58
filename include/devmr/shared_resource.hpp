#pragma once

#include <devmr/detail/config.hpp>

#include <cuda/memory_resource>
#include <cuda/stream_ref>

#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>

namespace devmr {

namespace detail::alloc {
/// An owning object whose allocations go through a ref it hands out (a slab_heap).
template <class Owner>
concept ref_owner = requires(Owner const& o) {
  o.ref();
};

/// What a shared_resource calls: the resource itself, or the ref of a heap.
template <class Owner>
decltype(auto) callable_resource(Owner& owner) {
  if constexpr (ref_owner<Owner>) {
    return owner.ref();
  } else {
    return (owner);
  }
}

/// A resource with CCCL 3.0's stream-ordered calls (devmr's pools).
template <class Resource>
concept stream_ordered = requires(Resource& r, void const* p, std::size_t n, cuda::stream_ref s) {
  r.allocate_async(n, n, s);
  r.deallocate_async(p, n, n, s);
};

template <class Owner>
using callable_resource_t =
    std::remove_cvref_t<decltype(callable_resource(std::declval<Owner&>()))>;

/// A resource's default alignment where it names one (pools: 256, slab_ref: 16), else 16.
template <class Resource>
constexpr std::size_t default_alignment_of() noexcept {
  if constexpr (requires { Resource::default_alignment; }) {
    return Resource::default_alignment;
  } else {
    return alignof(std::max_align_t);
  }
}
}  // namespace detail::alloc

/**
 * @brief Shared ownership of a resource: copies share one `Resource` (a pool or a slab_heap),
 * which is destroyed with the last copy. For containers and objects that must keep their
 * resource alive, e.g. `std::vector<T, devmr::allocator<T, devmr::shared_resource<
 * devmr::managed_pool>>>`, or a cache that outlives the scope that made its pool.
 *
 * It models what it holds: the same `cuda::mr` concepts and properties (a pool: a stream-ordered
 * resource, both CCCL spellings; a slab_heap: the synchronous resource of its slab_ref, whose
 * properties it forwards). Two shared_resources are equal when their resources are. Host code
 * only (a `std::shared_ptr` inside); kernels take the heap's `ref()`, through `get()`.
 *
 * Lifetime: a shared_resource keeps its resource alive, and nothing else: a heap keeps a
 * reference to its pool, so share the pool too (or make the pool outlive the heap). Blocks still
 * allocated when the last copy goes are reported by the resource's destructor (heap and pool:
 * the count on stderr).
 *
 * @tparam Resource the owned resource: a pool_resource, a slab_heap, or any cuda::mr resource
 */
template <class Resource>
class shared_resource
    : public cuda::forward_property<shared_resource<Resource>,
                                    detail::alloc::callable_resource_t<Resource>> {
  using callable = detail::alloc::callable_resource_t<Resource>;

 public:
  /// Alignment when none is given: that of what allocations go through.
  static constexpr std::size_t default_alignment = detail::alloc::default_alignment_of<callable>();

  /// @brief Makes the resource from `args` and holds it.
  template <class... Args>
  explicit shared_resource(std::in_place_t, Args&&... args)
      : resource_{std::make_shared<Resource>(std::forward<Args>(args)...)} {}

  /// @brief Takes over `resource` (moved into shared storage).
  explicit shared_resource(Resource&& resource)
      : resource_{std::make_shared<Resource>(std::move(resource))} {}

  /// @brief The resource held.
  [[nodiscard]] Resource& get() const noexcept { return *resource_; }
  /// @brief What allocations go through: the resource, or the heap's ref (cuda::forward_property
  /// reads properties from it).
  [[nodiscard]] decltype(auto) upstream_resource() const {
    return detail::alloc::callable_resource(*resource_);
  }
  /// @brief How many shared_resources hold the resource.
  [[nodiscard]] long use_count() const noexcept { return resource_.use_count(); }

  /// @brief Allocates from the resource (CCCL 3.0 spelling).
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment) {
    return upstream_resource().allocate(bytes, alignment);
  }
  /// @brief Frees a block of the resource (CCCL 3.0 spelling).
  void deallocate(void const* p, std::size_t bytes, std::size_t alignment = default_alignment) {
    upstream_resource().deallocate(p, bytes, alignment);
  }
  /// @brief CCCL >= 3.1 spelling of allocate.
  void* allocate_sync(std::size_t bytes, std::size_t alignment = default_alignment) {
    return allocate(bytes, alignment);
  }
  /// @brief CCCL >= 3.1 spelling of deallocate.
  void deallocate_sync(void const* p,
                       std::size_t bytes,
                       std::size_t alignment = default_alignment) {
    deallocate(p, bytes, alignment);
  }

  /// @brief Stream-ordered allocation (CCCL 3.0 spelling), where the resource has it.
  template <class R = callable>
  requires detail::alloc::stream_ordered<R>
  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref stream) {
    return upstream_resource().allocate_async(bytes, alignment, stream);
  }
  /// @brief Stream-ordered free (CCCL 3.0 spelling), where the resource has it.
  template <class R = callable>
  requires detail::alloc::stream_ordered<R>
  void deallocate_async(void const* p,
                        std::size_t bytes,
                        std::size_t alignment,
                        cuda::stream_ref stream) {
    upstream_resource().deallocate_async(p, bytes, alignment, stream);
  }
  /// @brief CCCL >= 3.1 spelling of allocate_async.
  template <class R = callable>
  requires detail::alloc::stream_ordered<R>
  void* allocate(cuda::stream_ref stream,
                 std::size_t bytes,
                 std::size_t alignment = default_alignment) {
    return allocate_async(bytes, alignment, stream);
  }
  /// @brief CCCL >= 3.1 spelling of deallocate_async.
  template <class R = callable>
  requires detail::alloc::stream_ordered<R>
  void deallocate(cuda::stream_ref stream,
                  void const* p,
                  std::size_t bytes,
                  std::size_t alignment = default_alignment) {
    deallocate_async(p, bytes, alignment, stream);
  }

  /// @brief Equal when the resources are equal.
  friend bool operator==(shared_resource const& a, shared_resource const& b) {
    return a.resource_ == b.resource_ || a.upstream_resource() == b.upstream_resource();
  }
  /// @brief Unequal when the resources are unequal.
  friend bool operator!=(shared_resource const& a, shared_resource const& b) { return !(a == b); }

 private:
  std::shared_ptr<Resource> resource_;
};

}  // namespace devmr
