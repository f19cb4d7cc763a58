#pragma once

#include <devmr/detail/alloc/exec_check.hpp>
#include <devmr/detail/alloc/resource_holder.hpp>
#include <devmr/detail/config.hpp>

#include <cstddef>
#include <limits>
#include <new>
#include <type_traits>

namespace devmr {

/**
 * @brief A C++ allocator over a devmr resource (or any `cuda::mr` resource), keeping the
 * resource's concrete type: no type erasure, so in a kernel
 * `allocator<T, slab_ref<>>::allocate(n)` is `slab_ref::allocate(n * sizeof(T), alignof(T))`,
 * inlined.
 *
 * ```cpp
 * devmr::managed_pool pool{};
 * devmr::slab_heap<devmr::memory_kind::managed> heap{pool};
 * std::vector<int, devmr::allocator<int, devmr::slab_ref<devmr::memory_kind::managed>>> v{
 *     devmr::allocator<int, devmr::slab_ref<devmr::memory_kind::managed>>{heap.ref()}};
 * v.push_back(1);                  // host: slab_ref's host path
 * kernel<<<1, 1>>>(v.data());      // the kernel reads the vector's managed memory
 * ```
 *
 * It meets the C++ Allocator requirements. `allocate`, `deallocate` and the comparisons are
 * `__host__ __device__`; each may be called on the side where the resource's function exists
 * (slab_ref: both; pools: the host; a user's device resource: the device). On the host a
 * failure throws what the resource throws (`devmr::out_of_memory`, a `std::bad_alloc`) and a
 * size overflow `std::bad_array_new_length`; in device code both return nullptr.
 *
 * Holding: a copyable resource (a ref: slab_ref, device_resource_ref; shared_resource) is held
 * by value; an owning, move-only one (a pool) by address.
 *
 * Lifetime: the allocator owns nothing, unless `Resource` is a shared_resource. The resource
 * (the pool, or the heap behind a ref) must outlive the allocator, every copy of it and every
 * container using it, and every block they allocated must be freed before it goes; a heap
 * destroyed with blocks still allocated reports the count on stderr, a pool reports them too.
 * A container that must keep its resource alive takes `allocator<T, shared_resource<R>>`.
 *
 * Propagation: a container's blocks belong to the resource that allocated them, so the
 * allocator moves with the blocks: it propagates on copy assignment, move assignment and swap
 * (a move or swap of containers never copies elements, and a copy-assigned container allocates
 * from the source's resource). Two allocators are equal when their resources are equal (the
 * same heap, the same pool): memory from one can be freed by the other.
 *
 * @tparam T the element type
 * @tparam Resource the resource (slab_ref<Kind>, device_resource_ref<...>, a pool,
 * shared_resource<...>, or a user's resource)
 */
template <class T, class Resource>
class allocator {
 public:
  /// The element type.
  using value_type = T;
  /// The type of an element count.
  using size_type = std::size_t;
  /// The type of a distance between two elements.
  using difference_type = std::ptrdiff_t;
  /// The resource the allocator allocates from.
  using resource_type = Resource;
  /// Propagated on copy assignment: the container takes the other's resource.
  using propagate_on_container_copy_assignment = std::true_type;
  /// Propagated on move assignment: the container takes the other's resource with its blocks.
  using propagate_on_container_move_assignment = std::true_type;
  /// Propagated on swap: the containers swap resources with their blocks.
  using propagate_on_container_swap = std::true_type;
  /// Not always equal: two allocators are equal only when their resources are equal.
  using is_always_equal = std::false_type;

  /// @brief The allocator over the same resource for element type `U`.
  template <class U>
  struct rebind {
    /// `allocator<U, Resource>`.
    using other = allocator<U, Resource>;
  };

  /// @brief An allocator over `resource` (copied when copyable, else referred to).
  DEVMR_HOST_DEVICE explicit allocator(Resource& resource) noexcept : holder_{resource} {}
  /// @brief An allocator over a copy of `resource` (refs, shared_resource).
  template <class R = Resource>
  requires std::is_copy_constructible_v<R> DEVMR_HOST_DEVICE explicit allocator(
      Resource const& resource) noexcept
      : holder_{resource} {}

  /// @brief The same resource, for another element type (rebinding).
  template <class U>
  DEVMR_HOST_DEVICE allocator(allocator<U, Resource> const& other) noexcept
      : holder_{other.holder_} {}

  /**
   * @brief Allocates room for `n` objects of `T`, aligned to `alignof(T)`.
   * @return the block; nullptr in device code when the resource cannot serve
   * @throw std::bad_array_new_length (host) when `n * sizeof(T)` overflows
   * @throw (host) what the resource throws when it cannot serve
   */
  DEVMR_EXEC_CHECK_DISABLE
  [[nodiscard]] DEVMR_HOST_DEVICE T* allocate(size_type n) const {
    if (n > max_size()) {
#if DEVMR_IS_DEVICE_CODE
      return nullptr;
#else
      throw std::bad_array_new_length{};
#endif
    }
    return static_cast<T*>(holder_.get().allocate(n * sizeof(T), alignof(T)));
  }

  /// @brief Frees `p`, allocated by an equal allocator for `n` objects.
  DEVMR_EXEC_CHECK_DISABLE
  DEVMR_HOST_DEVICE void deallocate(T* p, size_type n) const noexcept {
    holder_.get().deallocate(p, n * sizeof(T), alignof(T));
  }

  /// @brief The most objects one allocation may ask for.
  DEVMR_HOST_DEVICE static constexpr size_type max_size() noexcept {
    return std::numeric_limits<size_type>::max() / sizeof(T);
  }

  /// @brief The resource (a reference to the copy this allocator holds, or to the pool).
  DEVMR_HOST_DEVICE Resource& resource() const noexcept {
    return holder_.get();
  }

  /// @brief Equal when the resources are equal (memory of one can be freed by the other).
  DEVMR_EXEC_CHECK_DISABLE
  template <class U>
  DEVMR_HOST_DEVICE friend bool operator==(allocator const& a,
                                           allocator<U, Resource> const& b) noexcept {
    return a.resource() == b.resource();
  }
  /// @brief Unequal when the resources are unequal.
  DEVMR_EXEC_CHECK_DISABLE
  template <class U>
  DEVMR_HOST_DEVICE friend bool operator!=(allocator const& a,
                                           allocator<U, Resource> const& b) noexcept {
    return !(a == b);
  }

 private:
  template <class U, class R>
  friend class allocator;

  detail::alloc::resource_holder<Resource> holder_;
};

}  // namespace devmr
