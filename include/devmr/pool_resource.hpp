#pragma once

#include <devmr/detail/cccl_concepts.hpp>
#include <devmr/detail/config.hpp>
#include <devmr/errors.hpp>
#include <devmr/memory_kind.hpp>

#include <cuda/memory_resource>
#include <cuda/stream_ref>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace devmr {

/// @brief How a pool reserves memory from the driver.
struct pool_options {
  std::size_t initial_bytes = 0;  ///< reserved at construction (0: nothing until the first use)
  std::size_t maximum_bytes = 0;  ///< cap on the bytes reserved from the driver (0: no cap)
  int device = -1;                ///< the device whose memory the pool holds (-1: the current one)
};

/// @brief A pool's statistics, RMM style: counters of the blocks users hold.
struct pool_stats {
  /// @brief One counter: its value now, its highest value, and the sum of all increments.
  struct counter {
    std::int64_t current = 0;  ///< the value now
    std::int64_t peak = 0;     ///< the highest value so far
    std::int64_t total = 0;    ///< the sum of all increments
  };
  counter bytes;                   ///< requested bytes of the blocks users hold (not rounded)
  counter blocks;                  ///< blocks users hold; total counts every allocation served
  std::size_t reserved_bytes = 0;  ///< bytes held from the driver, in arenas
  std::size_t arenas = 0;          ///< arenas held from the driver
};

namespace detail {
class pool_core;
}

/**
 * @brief An owning, move-only, thread-safe pool of memory of one kind, a `cuda::mr` resource.
 *
 * The pool reserves large arenas from the driver (`cudaMalloc` for device, `cudaMallocManaged` for
 * managed, `cudaMallocHost` for pinned memory) and serves allocations from them with a coalescing
 * free list (best fit, split, neighbours merged on free), so that small allocations never reach
 * the driver. Arenas grow as needed, each at least 64 MiB (or half of what is reserved), never
 * beyond `pool_options::maximum_bytes`; `release()` gives fully free arenas back; the destructor
 * gives all back (and reports blocks still allocated on stderr).
 *
 * Every block starts on a 256-byte boundary and spans a multiple of 256 bytes; any power-of-two
 * alignment is honoured. `allocate(0)` returns `nullptr` without touching the pool;
 * `deallocate(nullptr, ...)` does nothing.
 *
 * Stream ordering: a block freed with `deallocate_async(p, ..., s)` may still be in use by work
 * enqueued on `s`. It is reused by `allocate_async` on `s` at once (stream order protects it). It
 * is handed to another stream, or to a synchronous `allocate`, only once an event recorded on `s`
 * after the free has completed, or after that stream was made to wait for the event
 * (`cudaStreamWaitEvent`, no host blocking); a synchronous `allocate` that needs it waits on the
 * host (`cudaEventSynchronize`). The event is recorded at once when the block is 2 MiB or larger,
 * and otherwise once per 64 small frees on that stream (so small stream-ordered frees cost no
 * CUDA call); small blocks freed since the last event reach other streams only through a
 * device-wide `cudaDeviceSynchronize`, and only when the pool would otherwise run out. `release()`
 * and the destructor wait for all of them. A synchronous `deallocate` returns the block at once,
 * like host `free`: the caller guarantees that no pending work uses it. A stream handle is taken as
 * the identity of the stream: synchronize a stream before destroying it if blocks were freed on it
 * and another stream could be created with the same handle.
 *
 * Errors: `std::invalid_argument` for an alignment that is not a power of two,
 * `devmr::out_of_memory` when the cap or the driver refuses, `devmr::cuda_error` when a CUDA call
 * fails. After any of them, every block allocated before stays valid.
 *
 * @tparam Kind where the memory lives
 */
template <memory_kind Kind>
class pool_resource {
 public:
  /// Alignment used when none is given: what `cudaMalloc` guarantees.
  static constexpr std::size_t default_alignment = 256;

  /**
   * @brief Creates a pool; reserves `options.initial_bytes` at once.
   * @throw devmr::cuda_error when there is no such device or the driver fails
   * @throw devmr::out_of_memory when the initial reservation cannot be made
   */
  explicit pool_resource(pool_options options = {});
  /// @brief Gives every arena back; reports blocks still allocated on stderr (no silent leak).
  ~pool_resource();
  /// @brief Moves the pool; the moved-from object may only be destroyed or assigned to.
  pool_resource(pool_resource&&) noexcept;
  /// @brief Gives this pool's arenas back (as the destructor does) and takes the other's pool.
  pool_resource& operator=(pool_resource&&) noexcept;
  pool_resource(pool_resource const&) = delete;
  pool_resource& operator=(pool_resource const&) = delete;

  /**
   * @brief Allocates a block that no pending stream work uses (CCCL 3.0 spelling).
   * @param bytes size of the block; 0 returns `nullptr`
   * @param alignment a power of two
   * @return the block
   * @throw std::invalid_argument, devmr::out_of_memory, devmr::cuda_error
   */
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment = default_alignment);

  /**
   * @brief Frees a block at once (CCCL 3.0 spelling): no pending work may still use it.
   * @param p a block from this pool, or `nullptr` (does nothing)
   * @param bytes and @param alignment as given to the allocation
   */
  void deallocate(void const* p,
                  std::size_t bytes,
                  std::size_t alignment = default_alignment) noexcept;

  /**
   * @brief Allocates a block usable by work enqueued on `stream` from now on.
   * @throw std::invalid_argument, devmr::out_of_memory, devmr::cuda_error
   */
  [[nodiscard]] void* allocate_async(std::size_t bytes,
                                     std::size_t alignment,
                                     cuda::stream_ref stream);
  /// @brief allocate_async with the default alignment.
  [[nodiscard]] void* allocate_async(std::size_t bytes, cuda::stream_ref stream) {
    return allocate_async(bytes, default_alignment, stream);
  }

  /**
   * @brief Frees a block once the work enqueued on `stream` so far is done (see the class
   * comment on stream ordering).
   * @param p a block from this pool, or `nullptr` (does nothing)
   * @param bytes and @param alignment as given to the allocation
   * @param stream the stream whose work may still use the block
   */
  void deallocate_async(void const* p,
                        std::size_t bytes,
                        std::size_t alignment,
                        cuda::stream_ref stream);
  /// @brief deallocate_async with the default alignment.
  void deallocate_async(void const* p, std::size_t bytes, cuda::stream_ref stream) {
    deallocate_async(p, bytes, default_alignment, stream);
  }

  /// @brief CCCL >= 3.1 spelling of allocate(bytes, alignment).
  [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment = default_alignment) {
    return allocate(bytes, alignment);
  }
  /// @brief CCCL >= 3.1 spelling of deallocate(p, bytes, alignment).
  void deallocate_sync(void const* p,
                       std::size_t bytes,
                       std::size_t alignment = default_alignment) noexcept {
    deallocate(p, bytes, alignment);
  }
  /// @brief CCCL >= 3.1 spelling of allocate_async(bytes, alignment, stream).
  [[nodiscard]] void* allocate(cuda::stream_ref stream,
                               std::size_t bytes,
                               std::size_t alignment = default_alignment) {
    return allocate_async(bytes, alignment, stream);
  }
  /// @brief CCCL >= 3.1 spelling of deallocate_async(p, bytes, alignment, stream).
  void deallocate(cuda::stream_ref stream,
                  void const* p,
                  std::size_t bytes,
                  std::size_t alignment = default_alignment) {
    deallocate_async(p, bytes, alignment, stream);
  }

  /// @return the pool's counters, exact at the time of the call
  [[nodiscard]] pool_stats stats() const;

  /// @brief Waits for blocks freed on streams, then gives every fully free arena to the driver.
  void release();

  /// @return the device whose memory the pool holds
  [[nodiscard]] int device() const noexcept { return options_.device; }
  /// @return the options, with `device` resolved to a device id
  [[nodiscard]] pool_options const& options() const noexcept { return options_; }

  /// @return true when both are the same pool (identity)
  friend bool operator==(pool_resource const& a, pool_resource const& b) noexcept {
    return a.core_.get() == b.core_.get();
  }
  /// @return true when they are different pools
  friend bool operator!=(pool_resource const& a, pool_resource const& b) noexcept {
    return !(a == b);
  }

  /// Every pool's memory is device accessible.
  friend void get_property(pool_resource const&, cuda::mr::device_accessible) noexcept {}
  /// Managed and pinned memory is host accessible too.
  friend void get_property(pool_resource const&, cuda::mr::host_accessible) noexcept
      requires(is_host_accessible(Kind)) {}

 private:
  std::unique_ptr<detail::pool_core> core_;
  pool_options options_;
};

/// A pool of device memory (`cudaMalloc`).
using device_pool = pool_resource<memory_kind::device>;
/// A pool of managed memory (`cudaMallocManaged`).
using managed_pool = pool_resource<memory_kind::managed>;
/// A pool of page-locked host memory (`cudaMallocHost`).
using pinned_pool = pool_resource<memory_kind::pinned>;

}  // namespace devmr

#include <devmr/detail/pool/pool_core.hpp>
#include <devmr/detail/pool/pool_resource_impl.hpp>

static_assert(
    devmr::detail::stream_ordered_resource_with<devmr::device_pool, cuda::mr::device_accessible>);
static_assert(
    !devmr::detail::synchronous_resource_with<devmr::device_pool, cuda::mr::host_accessible>);
static_assert(devmr::detail::stream_ordered_resource_with<devmr::managed_pool,
                                                          cuda::mr::device_accessible,
                                                          cuda::mr::host_accessible>);
static_assert(devmr::detail::stream_ordered_resource_with<devmr::pinned_pool,
                                                          cuda::mr::device_accessible,
                                                          cuda::mr::host_accessible>);
