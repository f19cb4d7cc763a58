#pragma once

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/layout.hpp>
#include <devmr/memory_kind.hpp>

#include <cuda/memory_resource>

#include <cstddef>
#include <type_traits>

namespace devmr {

template <memory_kind Kind>
class slab_heap;

namespace detail::heap {
// The host side of a slab_ref: stream-ordered launches and a wait (device/slab_heap.cu).
void* host_allocate(heap_header* h, std::size_t bytes, std::size_t alignment);
void host_deallocate(heap_header* h, void const* p, std::size_t size);
bool host_owns(heap_header const* h, void const* p) noexcept;
}  // namespace detail::heap

namespace detail {
/// A group that can elect a leader and synchronize.
template <class Group>
concept synchronizing_group = requires(Group const& g) {
  g.thread_rank();
  g.size();
  g.sync();
};
/// A group whose members can take a value from one of them by shuffle: a tile, a coalesced group.
template <class Group>
concept shuffling_group = requires(Group const& g, void* p) {
  g.shfl(p, 0u);
};
/// A whole thread block.
template <class Group>
concept block_group = requires(Group const& g) {
  g.group_index();
  g.thread_index();
};
/// A group of several blocks: a grid, a cluster.
template <class Group>
concept multi_block_group = requires(Group const& g) {
  g.num_blocks();
};
/// A group that can hand its members one pointer: by shuffle, or through a block's shared memory.
template <class Group>
concept pointer_sharing_group = shuffling_group<Group> || block_group<Group>;
}  // namespace detail

/// @brief A cooperative group that can elect a leader, synchronize and hand its members one
/// pointer: a thread block (through its shared memory), or a tile or coalesced group of one (by
/// a shuffle), as cooperative_groups makes them. Not a group that spans blocks (a grid, a
/// cluster), nor the type-erased `thread_group`, which may be one of a block's tiles and has no
/// shuffle.
template <class Group>
concept thread_group = !detail::multi_block_group<Group> && detail::synchronizing_group<Group> &&
                       detail::pointer_sharing_group<Group>;

/**
 * @brief A non-owning, trivially copyable reference to a slab_heap: what kernels take by value.
 *
 * It holds the address of the heap's header and copies of the few words of it that never change
 * while the heap lives (40 bytes in all); every copy stays valid across `grow` and `reset`.
 *
 * In device code `allocate` and `deallocate` run lock-free from any number of threads at once:
 * a warp's requests of two neighbouring size classes share one atomic, and so do its frees of
 * one slab (a slab holds blocks of two neighbouring classes). A
 * request that cannot be served returns `nullptr` and is counted (slab_heap::stats); so is an
 * alignment that is not a power of two or is above 1 MiB. `allocate(0)` returns `nullptr` and is
 * no failure; `deallocate(nullptr, ...)` does nothing. Every block is aligned to at least 16
 * bytes and to the requested alignment.
 *
 * In host code the same calls take a slow path (a launch on the calling thread's default stream
 * and a wait) and throw like any host resource: `std::invalid_argument` for a bad alignment,
 * `devmr::out_of_memory` when the heap cannot serve. So a slab_ref is a
 * `cuda::mr::resource_with<device_accessible>` and converts to `cuda::mr::resource_ref`. Blocks
 * can be freed from either side, whichever side allocated them.
 *
 * @tparam Kind the memory kind of the pool the heap draws from
 */
template <memory_kind Kind = memory_kind::device>
class slab_ref {
 public:
  /// Alignment of every block when none is asked for.
  static constexpr std::size_t default_alignment = 16;

  /// @brief A reference to no heap; only assignment, comparison and destruction are valid.
  slab_ref() = default;

  /**
   * @brief Allocates a block of at least `bytes` bytes.
   * @return the block, or nullptr (device code: no memory left, or a bad alignment, counted)
   * @throw std::invalid_argument (host) alignment not a power of two, or above 1 MiB
   * @throw devmr::out_of_memory (host) the heap cannot serve the request
   */
  DEVMR_HOST_DEVICE void* allocate(std::size_t bytes,
                                   std::size_t alignment = default_alignment) const;

  /// @brief Frees a block of this heap. `bytes` and `alignment` are those of the allocation
  /// (as every cuda::mr resource requires): they say the block's size class. A heap made with
  /// heap_options::checked finds the class itself and counts frees of blocks not out; an
  /// unchecked heap trusts them, as it trusts that no block is freed twice. `bytes` 0: the class
  /// is found from the block's slab (slower).
  DEVMR_HOST_DEVICE void deallocate(void const* p,
                                    std::size_t bytes,
                                    std::size_t alignment = default_alignment) const;

  /// @brief CCCL >= 3.1 spelling of allocate.
  DEVMR_HOST_DEVICE void* allocate_sync(std::size_t bytes,
                                        std::size_t alignment = default_alignment) const {
    return allocate(bytes, alignment);
  }
  /// @brief CCCL >= 3.1 spelling of deallocate.
  DEVMR_HOST_DEVICE void deallocate_sync(void const* p,
                                         std::size_t bytes,
                                         std::size_t alignment = default_alignment) const {
    deallocate(p, bytes, alignment);
  }

#if defined(__CUDACC__)
  /**
   * @brief One block for a whole group: the group's first thread allocates, every member gets
   * the same pointer. Every member of `g` must call it.
   */
  template <thread_group Group>
  __device__ void* allocate(Group const& g,
                            std::size_t bytes,
                            std::size_t alignment = default_alignment) const;

  /// @brief Frees a block allocated for group `g`, once all members are past their last use.
  template <thread_group Group>
  __device__ void deallocate(Group const& g,
                             void const* p,
                             std::size_t bytes,
                             std::size_t alignment = default_alignment) const;
#endif

  /// @brief True when `p` lies in memory of this heap.
  DEVMR_HOST_DEVICE bool owns(void const* p) const noexcept;

  /// @brief Two refs are equal when they refer to the same heap.
  DEVMR_HOST_DEVICE friend bool operator==(slab_ref const& a, slab_ref const& b) noexcept {
    return a.header_ == b.header_;
  }
  /// @brief Two refs are unequal when they refer to different heaps.
  DEVMR_HOST_DEVICE friend bool operator!=(slab_ref const& a, slab_ref const& b) noexcept {
    return !(a == b);
  }

  /// @brief Blocks are device accessible.
  DEVMR_HOST_DEVICE friend void get_property(slab_ref const&,
                                             cuda::mr::device_accessible) noexcept {}
  /// @brief Blocks of managed and pinned heaps are host accessible too.
  template <memory_kind K = Kind>
  requires(is_host_accessible(K)) DEVMR_HOST_DEVICE
      friend void get_property(slab_ref const&, cuda::mr::host_accessible) noexcept {}

 private:
  friend class slab_heap<Kind>;
  DEVMR_HOST_DEVICE slab_ref(detail::heap::heap_header* header,
                             detail::heap::arena_desc const& first,
                             bool checked,
                             bool fixed_widths) noexcept
      : header_{header},
        base_{first.base},
        meta_{first.meta},
        slabs_{first.slabs},
        checked_{checked ? 1u : 0u},
        fixed_widths_{fixed_widths ? 1u : 0u} {}

  detail::heap::heap_header* header_ = nullptr;
  // Copies of what every device allocate and free reads of the header: arena 0's entry (where
  // most blocks lie) and the checked flag, neither of which changes while the heap lives, and
  // whether the slot widths are fixed, which a grow can only make true. A kernel
  // reads them from its parameters; from the header they were loads after the free's fence, and
  // registers held across the claim.
  std::byte* base_ = nullptr;                ///< arena 0's first slab
  detail::heap::slab_meta* meta_ = nullptr;  ///< arena 0's slab metadata
  std::uint64_t slabs_ = 0;                  ///< arena 0's slabs
  std::uint32_t checked_ = 0;                ///< nonzero: the heap validates every free
  /// Nonzero: the heap's slot widths were fixed when the ref was made (they stay so as it grows),
  /// and its claims read no width (slot_width).
  std::uint32_t fixed_widths_ = 0;
};

static_assert(std::is_trivially_copyable_v<slab_ref<>>);
static_assert(sizeof(slab_ref<>) == 5 * sizeof(void*));

}  // namespace devmr

#include <devmr/detail/heap/slab_ref.inl>
