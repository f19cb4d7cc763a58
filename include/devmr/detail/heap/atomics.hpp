#pragma once

// The atomics of the heap's lock-free core: every shared word is touched through
// cuda::atomic_ref at device scope, so that host tests drive the same code from std::threads on
// host memory that kernels run on device memory.

#include <devmr/detail/config.hpp>

#include <cuda/atomic>
#if !DEVMR_IS_DEVICE_CODE
#include <thread>
#endif

namespace devmr::detail::heap {

template <class T>
DEVMR_HOST_DEVICE auto atomic(T& word) {
  return cuda::atomic_ref<T, cuda::thread_scope_device>{word};
}

inline constexpr auto relaxed = cuda::std::memory_order_relaxed;
inline constexpr auto acquire = cuda::std::memory_order_acquire;
inline constexpr auto release = cuda::std::memory_order_release;
inline constexpr auto acq_rel = cuda::std::memory_order_acq_rel;

/// Lets another thread run while this one waits for it: a short sleep on the device, a yield on
/// the host.
DEVMR_HOST_DEVICE inline void pause_briefly() {
#if DEVMR_IS_DEVICE_CODE
  __nanosleep(256);
#else
  std::this_thread::yield();
#endif
}

}  // namespace devmr::detail::heap
