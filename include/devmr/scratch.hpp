#pragma once

#include <devmr/detail/config.hpp>

#include <cstddef>
#include <type_traits>

namespace devmr {

/**
 * @brief Per-thread scratch memory in device code: owns `size()` elements of `T` from a
 * resource ref for as long as it lives, and frees them when it goes out of scope.
 *
 * ```cpp
 * __global__ void k(devmr::slab_ref<> heap, int const* lengths) {
 *   devmr::scratch<float, devmr::slab_ref<>> work{heap, lengths[threadIdx.x]};
 *   if (!work) { return; }              // the heap could not serve: no crash, nullptr counted
 *   for (float& x : work) { x = 0; }
 * }                                      // freed here
 * ```
 *
 * The elements start uninitialized (as after `new T[n]` for such a `T`), so `T` must be
 * trivially default constructible and trivially destructible. Movable, not copyable: a moved-from
 * scratch owns nothing. Works with any ref whose `allocate(bytes, alignment)` and
 * `deallocate(p, bytes, alignment)` are callable in device code: `slab_ref`,
 * `device_resource_ref`, a user's ref. The ref is held by value, so it must be a reference type
 * (trivially copyable, non-owning); the resource it refers to must outlive the scratch. For one
 * buffer shared by a tile or a block, see group_scratch.
 *
 * @tparam T the element type
 * @tparam Ref the resource ref the memory comes from
 */
template <class T, class Ref>
class scratch {
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_destructible_v<T>,
                "scratch holds uninitialized elements: T must be trivial to create and destroy");
  static_assert(std::is_trivially_copyable_v<Ref>, "scratch holds its ref by value");

 public:
  /// The element type.
  using value_type = T;
  /// The type of an element count or index.
  using size_type = std::size_t;
  /// A pointer to an element.
  using iterator = T*;
  /// A pointer to a const element.
  using const_iterator = T const*;

  /// Alignment of the block: T's, and at least 16 bytes (what every devmr block has).
  static constexpr std::size_t alignment = alignof(T) > 16 ? alignof(T) : 16;

  /// @brief Owns nothing.
  scratch() noexcept = default;

  /**
   * @brief Allocates `count` elements from `ref`. When the resource cannot serve (or `count`
   * is 0, or `count * sizeof(T)` overflows), the scratch is empty: `data()` is nullptr,
   * `size()` 0 and `operator bool` false.
   */
  DEVMR_DEVICE scratch(Ref ref, size_type count) noexcept : ref_{ref} {
    if (count != 0 && count <= max_size()) {
      data_ = static_cast<T*>(ref_.allocate(count * sizeof(T), alignment));
      size_ = data_ != nullptr ? count : 0;
    }
  }

  /// @brief Takes `other`'s elements; `other` is left empty.
  DEVMR_DEVICE scratch(scratch&& other) noexcept
      : ref_{other.ref_}, data_{other.data_}, size_{other.size_} {
    other.data_ = nullptr;
    other.size_ = 0;
  }

  /// @brief Frees this scratch's elements and takes `other`'s; `other` is left empty.
  DEVMR_DEVICE scratch& operator=(scratch&& other) noexcept {
    if (this != &other) {
      release();
      ref_ = other.ref_;
      data_ = other.data_;
      size_ = other.size_;
      other.data_ = nullptr;
      other.size_ = 0;
    }
    return *this;
  }

  scratch(scratch const&) = delete;
  scratch& operator=(scratch const&) = delete;

  /// @brief Frees the elements.
  DEVMR_DEVICE ~scratch() { release(); }

  /// @brief True when the scratch holds its elements (the allocation succeeded).
  DEVMR_DEVICE explicit operator bool() const noexcept { return data_ != nullptr; }

  /// @brief The first element (nullptr when empty).
  DEVMR_DEVICE T* data() noexcept { return data_; }
  /// @brief The first element (nullptr when empty).
  DEVMR_DEVICE T const* data() const noexcept { return data_; }
  /// @brief Number of elements held (0 when empty).
  DEVMR_DEVICE size_type size() const noexcept { return size_; }
  /// @brief True when the scratch holds no elements.
  DEVMR_DEVICE bool empty() const noexcept { return size_ == 0; }
  /// @brief The most elements a scratch can ask for.
  DEVMR_DEVICE static constexpr size_type max_size() noexcept { return ~size_type{0} / sizeof(T); }

  /// @brief Element `i` (unchecked; `i < size()`).
  DEVMR_DEVICE T& operator[](size_type i) noexcept { return data_[i]; }
  /// @brief Element `i` (unchecked; `i < size()`).
  DEVMR_DEVICE T const& operator[](size_type i) const noexcept { return data_[i]; }

  /// @brief The first element.
  DEVMR_DEVICE iterator begin() noexcept { return data_; }
  /// @brief Past the last element.
  DEVMR_DEVICE iterator end() noexcept { return data_ + size_; }
  /// @brief The first element.
  DEVMR_DEVICE const_iterator begin() const noexcept { return data_; }
  /// @brief Past the last element.
  DEVMR_DEVICE const_iterator end() const noexcept { return data_ + size_; }

  /// @brief The ref the elements came from.
  DEVMR_DEVICE Ref const& ref() const noexcept { return ref_; }

 private:
  DEVMR_DEVICE void release() noexcept {
    if (data_ != nullptr) {
      ref_.deallocate(data_, size_ * sizeof(T), alignment);
      data_ = nullptr;
      size_ = 0;
    }
  }

  Ref ref_{};
  T* data_ = nullptr;
  size_type size_ = 0;
};

}  // namespace devmr
