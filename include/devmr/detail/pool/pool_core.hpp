#pragma once

// The pool's logic, independent of where its memory comes from: arenas, a coalescing free list,
// stream-ordered frees, statistics, a lock. pool_resource<Kind> plugs in the driver; host tests
// plug in host memory and fake streams. Included by <devmr/pool_resource.hpp>; include that.

#include <devmr/detail/pool/free_list.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace devmr::detail {

/// @brief Where a pool's arenas come from (the driver, or host memory in tests).
class arena_source {
 public:
  virtual ~arena_source() = default;
  /// @return bytes of fresh memory aligned to at least pool_granule
  /// @throw devmr::out_of_memory when there is no memory, devmr::cuda_error on other failures
  virtual void* reserve(std::size_t bytes) = 0;
  /// @brief Returns an arena that reserve gave.
  virtual void give_back(void* arena, std::size_t bytes) noexcept = 0;
};

/// @brief Events on streams: how the pool keeps frees stream-ordered. Handles are opaque
/// (cudaStream_t and cudaEvent_t for the driver).
class stream_order {
 public:
  virtual ~stream_order() = default;
  virtual void* create_event() = 0;
  virtual void destroy_event(void* event) noexcept = 0;
  /// @brief event completes once the work enqueued on stream so far is done
  virtual void record(void* event, void* stream) = 0;
  /// @return true when the event has completed
  virtual bool done(void* event) = 0;
  /// @brief blocks the calling host thread until the event has completed
  virtual void host_wait(void* event) = 0;
  /// @brief work enqueued on stream from now on waits for the event (no host blocking)
  virtual void stream_wait(void* stream, void* event) = 0;
  /// @brief blocks the calling host thread until all work on the device is done, on every
  /// stream (destroyed streams included)
  virtual void device_wait() = 0;
};

/**
 * @brief The pool: arenas from an arena_source, sub-allocated through free lists.
 *
 * Free memory sits in one of several free lists: the ready list (no pending work uses it) and,
 * per stream that blocks were freed on with deallocate_async, two lists of blocks that work on that
 * stream may still use:
 *  - sealed: covered by the stream's event (re-recorded at each seal), which completes once no
 *    work uses them; other streams may take them after waiting for the event;
 *  - unsealed: freed since the last seal, covered by no event yet; only the same stream may take
 *    them (stream order protects them), or anyone after a device-wide wait.
 * A free seals at once when the block is large (seal_block_bytes) or when enough frees or bytes
 * have gathered (seal_count, seal_bytes): small blocks cost an event record only once per many
 * frees, and an event is only ever recorded from a call that names the stream (which must then be
 * alive). Thread-safe: one mutex guards everything.
 */
class pool_core {
 public:
  struct config {
    std::size_t initial_bytes = 0;
    std::size_t maximum_bytes = 0;                        ///< 0: no cap
    std::size_t min_arena_bytes = std::size_t{64} << 20;  ///< growth chunk
    std::size_t arena_rounding = std::size_t{2} << 20;    ///< arena sizes are multiples of this
    std::size_t seal_block_bytes = std::size_t{2} << 20;  ///< a freed block this big seals at once
    std::size_t seal_count = 64;                          ///< seal after this many unsealed frees
    std::size_t seal_bytes = std::size_t{16} << 20;       ///< or this many unsealed bytes
  };

  pool_core(std::unique_ptr<arena_source> source,
            std::unique_ptr<stream_order> order,
            config const& cfg);
  ~pool_core();
  pool_core(pool_core const&) = delete;
  pool_core& operator=(pool_core const&) = delete;

  void* allocate(std::size_t bytes, std::size_t alignment);
  void deallocate(void const* p, std::size_t bytes) noexcept;
  void* allocate_async(std::size_t bytes, std::size_t alignment, void* stream);
  void deallocate_async(void const* p, std::size_t bytes, void* stream);
  pool_stats stats() const;
  void release();

  /// @return bytes free and ready for any user (for tests)
  std::size_t ready_bytes() const;

 private:
  struct live_block {
    std::size_t size;       // rounded to the granule
    std::size_t requested;  // as asked for
    std::uintptr_t arena;
  };
  struct stream_list {
    void* event = nullptr;  // recorded on the stream at every seal
    free_list list;         // sealed: done once event completes
    free_list unsealed;     // freed since the last seal: this stream only
    std::size_t unsealed_frees = 0;
  };
  using lock = std::unique_lock<std::mutex>;

  void* allocate_impl(std::size_t bytes, std::size_t alignment, void* stream, bool async);
  std::optional<free_block> take_from_streams(std::size_t size,
                                              std::size_t alignment,
                                              void* stream,
                                              bool async);
  bool grow(std::size_t size, std::size_t alignment);
  void settle_all();
  void seal(stream_list& entry, void* stream);
  void* record_allocation(free_block const& block, std::size_t requested);
  bool try_reserve(std::size_t bytes);

  mutable std::mutex mutex_;
  std::unique_ptr<arena_source> source_;
  std::unique_ptr<stream_order> order_;
  config config_;
  std::map<std::uintptr_t, std::size_t> arenas_;  // base -> bytes
  std::size_t reserved_ = 0;
  free_list ready_;
  std::map<void*, stream_list> streams_;
  std::unordered_map<std::uintptr_t, live_block> live_;
  pool_stats stats_{};
};

}  // namespace devmr::detail
