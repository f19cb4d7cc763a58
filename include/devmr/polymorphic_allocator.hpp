#pragma once

#include <devmr/detail/alloc/cccl_refs.hpp>
#include <devmr/detail/cccl_concepts.hpp>
#include <devmr/detail/config.hpp>

#include <cuda/memory_resource>

#include <cstddef>
#include <limits>
#include <new>
#include <type_traits>

namespace devmr {

/**
 * @brief A C++ allocator over a type-erased `cuda::mr` resource reference, for host containers
 * whose type must not depend on the resource's: `std::vector<T, polymorphic_allocator<T,
 * device_accessible, host_accessible>>` takes its memory from a managed pool, a pinned pool, a
 * managed heap, or any resource with those properties.
 *
 * It holds a `cuda::mr::resource_ref<Properties...>` (CCCL 3.0; `synchronous_resource_ref` in
 * CCCL >= 3.1) and calls its synchronous allocation (`allocate`/`deallocate` in 3.0,
 * `allocate_sync`/`deallocate_sync` from 3.1). It is made from that reference, from the
 * stream-ordered one (`async_resource_ref` in 3.0, `resource_ref` from 3.1), or from a resource
 * that converts to it (a pool, a slab_ref). Host code only: cuda::mr references are not
 * callable in device code (device_resource_ref is the reference for that).
 *
 * Propagation, as std::pmr::polymorphic_allocator: none. A container keeps the resource it was
 * made with for its whole life (copy and move assignment between containers of different
 * resources copy or move the elements). Two allocators are equal when their references are.
 *
 * Lifetime: the reference owns nothing; the resource must outlive the allocator, every copy of
 * it and every container using it. Wrap the resource in a shared_resource (and refer to that)
 * when a container must keep it alive.
 *
 * @tparam T the element type
 * @tparam Properties the properties the resource must have
 */
template <class T, class... Properties>
class polymorphic_allocator {
 public:
  /// The element type.
  using value_type = T;
  /// The type of an element count.
  using size_type = std::size_t;
  /// The type of a distance between two elements.
  using difference_type = std::ptrdiff_t;
  /// The reference held (CCCL 3.0: resource_ref; >= 3.1: synchronous_resource_ref).
  using resource_ref_type = detail::alloc::synchronous_ref<Properties...>;
  /// Not propagated on copy assignment: the container keeps its own resource.
  using propagate_on_container_copy_assignment = std::false_type;
  /// Not propagated on move assignment: the container keeps its own resource.
  using propagate_on_container_move_assignment = std::false_type;
  /// Not propagated on swap: each container keeps its own resource.
  using propagate_on_container_swap = std::false_type;
  /// Not always equal: two allocators are equal only when their references are equal.
  using is_always_equal = std::false_type;

  /// @brief The allocator over the same resource for element type `U`.
  template <class U>
  struct rebind {
    /// `polymorphic_allocator<U, Properties...>`.
    using other = polymorphic_allocator<U, Properties...>;
  };

  /// @brief Allocates through `ref`.
  polymorphic_allocator(resource_ref_type ref) noexcept : ref_{ref} {}
  /// @brief Allocates through the synchronous calls of a stream-ordered reference.
  polymorphic_allocator(detail::alloc::stream_ordered_ref<Properties...> ref) noexcept
      : ref_{ref} {}
  /// @brief Allocates from `resource`, which must outlive the allocator. CCCL >= 3.1 makes its
  /// references only from copyable resources: there, wrap a pool in a devmr::shared_resource.
  template <class Resource>
  requires(!std::is_same_v<std::remove_cvref_t<Resource>, polymorphic_allocator> &&
           detail::synchronous_resource_with<Resource, Properties...> &&
           detail::alloc::referable<Resource> &&
           std::is_constructible_v<resource_ref_type, Resource&>)
      polymorphic_allocator(Resource& resource)
  noexcept : ref_{resource} {}
  /// @brief Refused: CCCL >= 3.1 makes references only from copyable resources, and this one
  /// (a pool) is move-only. Wrap it in a devmr::shared_resource and make the allocator from that.
  template <class Resource>
  requires(!std::is_same_v<std::remove_cvref_t<Resource>, polymorphic_allocator> &&
           detail::synchronous_resource_with<Resource, Properties...> &&
           !detail::alloc::referable<Resource>) polymorphic_allocator(Resource&)
  = delete;

  /// @brief The same resource, for another element type (rebinding).
  template <class U>
  polymorphic_allocator(polymorphic_allocator<U, Properties...> const& other) noexcept
      : ref_{other.resource()} {}

  /**
   * @brief Allocates room for `n` objects of `T`, aligned to `alignof(T)`.
   * @throw std::bad_array_new_length when `n * sizeof(T)` overflows
   * @throw what the resource throws when it cannot serve (devmr: devmr::out_of_memory)
   */
  [[nodiscard]] T* allocate(size_type n) {
    if (n > std::numeric_limits<size_type>::max() / sizeof(T)) {
      throw std::bad_array_new_length{};
    }
    return static_cast<T*>(detail::alloc::allocate_sync(ref_, n * sizeof(T), alignof(T)));
  }

  /// @brief Frees `p`, allocated by an equal allocator for `n` objects.
  void deallocate(T* p, size_type n) noexcept {
    detail::alloc::deallocate_sync(ref_, p, n * sizeof(T), alignof(T));
  }

  /// @brief The reference the allocator calls.
  [[nodiscard]] resource_ref_type resource() const noexcept { return ref_; }

  /// @brief Equal when the references are (they refer to equal resources).
  template <class U>
  friend bool operator==(polymorphic_allocator const& a,
                         polymorphic_allocator<U, Properties...> const& b) noexcept {
    return a.resource() == b.resource();
  }
  /// @brief Unequal when the references are unequal.
  template <class U>
  friend bool operator!=(polymorphic_allocator const& a,
                         polymorphic_allocator<U, Properties...> const& b) noexcept {
    return !(a == b);
  }

 private:
  resource_ref_type ref_;
};

}  // namespace devmr
