#pragma once

#include <devmr/detail/cccl_concepts.hpp>
#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/slot_width.hpp>
#include <devmr/memory_kind.hpp>
#include <devmr/pool_resource.hpp>
#include <devmr/slab_ref.hpp>

#include <cuda/std/span>
#include <cuda/stream_ref>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace devmr {

/// @brief How a slab heap takes memory from its pool.
struct heap_options {
  std::size_t initial_bytes = 0;  ///< taken from the pool at construction (0: 64 MiB)
  std::size_t maximum_bytes = 0;  ///< cap on what grow() may take (0: as far as the pool goes)
  bool checked = false;           ///< validate every free; record invalid and double frees
};

/// @brief What a slab heap holds, from a scan of its slabs (exact when no kernel is running).
struct heap_stats {
  /// Number of small-block size classes: 16 B, 32 B, ... 512 KiB.
  static constexpr std::size_t num_size_classes = detail::heap::num_classes;

  /// @brief One size class.
  struct size_class {
    std::size_t block_bytes = 0;    ///< the class's block size
    std::size_t blocks_in_use = 0;  ///< blocks allocated and not freed
    std::size_t slabs = 0;  ///< slabs holding blocks of the class, not yet emptied (a slab holds
                            ///< blocks of two neighbouring classes and counts for each)
  };
  std::size_t bytes_in_use = 0;   ///< bytes of the blocks in use (block sizes, large runs whole)
  std::size_t blocks_in_use = 0;  ///< blocks in use, small and large
  std::size_t large_blocks_in_use = 0;  ///< blocks above 512 KiB (runs of slabs) in use
  std::size_t large_bytes_in_use = 0;   ///< bytes of those runs
  /// Per size class, smallest block size first.
  std::array<size_class, num_size_classes> classes{};
  /// Bytes of the slabs that hold blocks in use (1 MiB each; large blocks' runs whole): what the
  /// heap holds for its live blocks. `held_bytes - bytes_in_use` is what the blocks in use keep
  /// from other uses: the free blocks of partly used slabs.
  std::size_t held_bytes = 0;
  /// Slabs that hold no block in use (never handed out, free, emptied, or current in a slot with
  /// nothing live): ready for any size class or large block.
  std::size_t free_slabs = 0;
  std::size_t capacity_bytes = 0;  ///< bytes of all arenas
  std::size_t arenas = 0;          ///< arenas taken from the pool
  std::uint64_t failed_allocations =
      0;  ///< device allocations that returned nullptr for lack of memory
  std::uint64_t bad_alignments = 0;  ///< alignments refused (not a power of two, or > 1 MiB)
  std::uint64_t invalid_frees = 0;  ///< frees of pointers no block starts at (since the last check)
  std::uint64_t double_frees = 0;   ///< frees of free blocks, checked heaps (since the last check)
};

/**
 * @brief The owning host object of a lock-free slab heap that kernels allocate from.
 *
 * The heap takes arenas from `upstream` (which must outlive it) and hands kernels a `slab_ref`.
 * Small blocks (up to 512 KiB, powers of two) come from 1 MiB slabs of one size class each; larger
 * blocks are runs of whole slabs. A freed block is handed out again while other blocks of its slab
 * are live: a slab with an eighth of its blocks free goes on its class's list, which the class's
 * slots take slabs from before new ones, and a slab whose blocks are all free leaves its class for
 * any use; a class out of listed and empty slabs opens its slabs with fewer free blocks, and takes
 * back those its slots hold, before an allocation fails. Slabs are formatted when first taken, so
 * construction does not depend on the heap's size. Each size class has a slot per SM, and on heaps
 * of 16 GiB and more a second one for each SM's odd warps (fewer on heaps under 16 GiB, where SMs
 * share them: a quarter of a slab per class and slot at most), which holds one slab partly handed
 * out. Free runs of slabs are split for shorter requests; free slabs merge into a longer run when
 * a large block needs one (a slower search, taken only when no free run is long enough), the slots
 * giving up their slabs if need be. Runs never span two arenas.
 *
 * Growth: `grow` adds an arena that kernels launched afterwards use; live blocks never move.
 * Destruction returns every arena to the pool and reports on stderr how many blocks were still
 * allocated.
 *
 * @tparam Kind the memory kind of the pool
 */
template <memory_kind Kind = memory_kind::device>
class slab_heap {
 public:
  /**
   * @brief Creates a heap over `upstream`, taking `options.initial_bytes` from it.
   * @throw devmr::out_of_memory when the pool cannot serve the initial arena
   * @throw std::invalid_argument when maximum_bytes is below initial_bytes
   * @throw devmr::cuda_error when a CUDA call fails
   */
  explicit slab_heap(pool_resource<Kind>& upstream, heap_options options = {});
  ~slab_heap();
  /// @brief Takes `other`'s heap; `other` is left holding nothing (its ref() refers to nothing).
  slab_heap(slab_heap&& other) noexcept;
  /// @brief Gives this heap's memory back (as the destructor does) and takes `other`'s heap.
  slab_heap& operator=(slab_heap&& other) noexcept;
  slab_heap(slab_heap const&) = delete;
  slab_heap& operator=(slab_heap const&) = delete;

  /// @brief The reference that kernels take by value.
  [[nodiscard]] slab_ref<Kind> ref() const noexcept {
    return header_ == nullptr ? slab_ref<Kind>{}
                              : slab_ref<Kind>{header_, image_->arenas[0], image_->checked != 0,
                                               detail::heap::slot_width::fixed_for(
                                                   image_->slot_widths, detail::heap::max_slots)};
  }

  /**
   * @brief Takes at least `bytes` more from the pool, for kernels launched after this call.
   * @throw devmr::out_of_memory past maximum_bytes, past 64 arenas, or when the pool refuses;
   * the heap is unchanged then
   */
  void grow(std::size_t bytes);

  /// @brief Frees every block at once, in stream order: kernels after it on `stream` see an
  /// empty heap, each SM's slots holding a fresh slab as after construction. Blocks allocated
  /// before become invalid.
  void reset(cuda::stream_ref stream = cuda::stream_ref{cudaStream_t{}});

  /// @brief Frees a block (allocated by a kernel or the host) in stream order. `bytes` and
  /// `alignment` as for slab_ref::deallocate.
  void deallocate_async(void const* p,
                        std::size_t bytes,
                        std::size_t alignment,
                        cuda::stream_ref stream);

  /// @brief Frees every non-null pointer of `blocks`, an array in device-accessible memory, in
  /// stream order. With no sizes, each block's class is found from its slab.
  void deallocate_bulk(cuda::std::span<void* const> blocks, cuda::stream_ref stream);

  /// @brief Scans the heap on `stream` and waits for the result.
  [[nodiscard]] heap_stats stats(cuda::stream_ref stream = cuda::stream_ref{cudaStream_t{}}) const;

  /**
   * @brief Throws if kernels recorded invalid or double frees since the last check (and clears
   * the record).
   * @throw devmr::heap_error naming the counts
   */
  void check(cuda::stream_ref stream = cuda::stream_ref{cudaStream_t{}}) const;

  /// @brief Bytes of all arenas.
  [[nodiscard]] std::size_t capacity() const noexcept;
  /// @brief The options, with `initial_bytes` resolved to what construction took.
  [[nodiscard]] heap_options const& options() const noexcept { return options_; }

 private:
  struct arena_memory {
    void* data;
    std::size_t data_bytes;
    void* meta;  ///< metadata and block bitmaps (meta_layout_for)
    std::size_t meta_bytes;
  };
  void add_arena(std::size_t bytes);
  void destroy() noexcept;

  pool_resource<Kind>* upstream_ = nullptr;
  heap_options options_{};
  int device_ = 0;
  detail::heap::heap_header* header_ = nullptr;       ///< device-accessible, from the pool
  std::unique_ptr<detail::heap::heap_header> image_;  ///< host copy of the arena table
  std::vector<arena_memory> arenas_;
};

using device_heap = slab_heap<memory_kind::device>;
using managed_heap = slab_heap<memory_kind::managed>;
using pinned_heap = slab_heap<memory_kind::pinned>;

static_assert(
    detail::synchronous_resource_with<slab_ref<memory_kind::device>, cuda::mr::device_accessible>);
static_assert(
    !detail::synchronous_resource_with<slab_ref<memory_kind::device>, cuda::mr::host_accessible>);
static_assert(detail::synchronous_resource_with<slab_ref<memory_kind::managed>,
                                                cuda::mr::device_accessible,
                                                cuda::mr::host_accessible>);
static_assert(detail::synchronous_resource_with<slab_ref<memory_kind::pinned>,
                                                cuda::mr::device_accessible,
                                                cuda::mr::host_accessible>);

}  // namespace devmr
