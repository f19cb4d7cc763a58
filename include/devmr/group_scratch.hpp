#pragma once

#include <devmr/detail/alloc/group_ops.hpp>
#include <devmr/detail/config.hpp>
#include <devmr/slab_ref.hpp>

#include <cstddef>
#include <type_traits>

#if defined(__CUDACC__)
namespace devmr {

/**
 * @brief One scratch buffer for a whole cooperative group (a tile, a coalesced group or a thread
 * block): its first thread allocates, every member sees the same elements, and the group frees
 * them once, when every member's group_scratch goes out of scope.
 *
 * ```cpp
 * auto tile = cg::tiled_partition<32>(cg::this_thread_block());
 * devmr::group_scratch<int, devmr::slab_ref<>, decltype(tile)> shared{tile, heap, 32 * n};
 * if (!shared) { return; }   // every member sees the same answer
 * ```
 *
 * Every member of the group must construct it with the same arguments and reach its end of
 * scope (the destructor synchronizes the group before the first thread frees). Elements start
 * uninitialized, as for scratch. Not copyable and not movable: the group's members hold one
 * block together. Works with any ref with `__device__` allocate/deallocate; slab_ref's own group
 * overloads serve it where the ref has them.
 *
 * @tparam T the element type
 * @tparam Ref the resource ref the memory comes from
 * @tparam Group the cooperative group, a devmr::thread_group
 */
template <class T, class Ref, thread_group Group>
class group_scratch {
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_destructible_v<T>,
                "group_scratch holds uninitialized elements: T must be trivial to create and "
                "destroy");
  static_assert(std::is_trivially_copyable_v<Ref>, "group_scratch holds its ref by value");

 public:
  /// The element type.
  using value_type = T;
  /// The type of an element count or index.
  using size_type = std::size_t;
  /// A pointer to an element.
  using iterator = T*;
  /// A pointer to a const element.
  using const_iterator = T const*;

  /// Alignment of the block: T's, and at least 16 bytes.
  static constexpr std::size_t alignment = alignof(T) > 16 ? alignof(T) : 16;

  /**
   * @brief Allocates `count` elements for the group; every member must call it. When the
   * resource cannot serve (or `count` is 0), every member's group_scratch is empty.
   */
  __device__ group_scratch(Group const& group, Ref ref, size_type count) noexcept
      : group_{group}, ref_{ref} {
    std::size_t const bytes = count <= ~size_type{0} / sizeof(T) ? count * sizeof(T) : 0;
    data_ = static_cast<T*>(detail::alloc::group_allocate(group_, ref_, bytes, alignment));
    size_ = data_ != nullptr ? count : 0;
  }

  group_scratch(group_scratch const&) = delete;
  group_scratch& operator=(group_scratch const&) = delete;

  /// @brief Frees the elements once every member is past its last use of them.
  __device__ ~group_scratch() {
    if (data_ != nullptr) {
      detail::alloc::group_deallocate(group_, ref_, data_, size_ * sizeof(T), alignment);
    }
  }

  /// @brief True when the group holds its elements (the same answer in every member).
  __device__ explicit operator bool() const noexcept { return data_ != nullptr; }

  /// @brief The first element, the same in every member (nullptr when empty).
  __device__ T* data() noexcept { return data_; }
  /// @brief The first element, the same in every member (nullptr when empty).
  __device__ T const* data() const noexcept { return data_; }
  /// @brief Number of elements held (0 when empty).
  __device__ size_type size() const noexcept { return size_; }
  /// @brief True when the group holds no elements.
  __device__ bool empty() const noexcept { return size_ == 0; }
  /// @brief Element `i` (unchecked; `i < size()`).
  __device__ T& operator[](size_type i) noexcept { return data_[i]; }
  /// @brief Element `i` (unchecked; `i < size()`).
  __device__ T const& operator[](size_type i) const noexcept { return data_[i]; }
  /// @brief The first element.
  __device__ iterator begin() noexcept { return data_; }
  /// @brief Past the last element.
  __device__ iterator end() noexcept { return data_ + size_; }
  /// @brief The first element.
  __device__ const_iterator begin() const noexcept { return data_; }
  /// @brief Past the last element.
  __device__ const_iterator end() const noexcept { return data_ + size_; }

  /// @brief The group that holds the elements.
  __device__ Group const& group() const noexcept { return group_; }

 private:
  Group group_;
  Ref ref_;
  T* data_ = nullptr;
  size_type size_ = 0;
};

}  // namespace devmr
#endif
