#pragma once

// The atomics of the heap's lock-free core: every shared word is touched through
// cuda::atomic_ref at device scope, so that host tests drive the same code from std::threads on
// host memory that kernels run on device memory.

#include <devmr/detail/config.hpp>

#include <cuda/atomic>

#include <cstdint>
#if !DEVMR_IS_DEVICE_CODE
#include <functional>
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

/// A number that differs from call to call and from thread to thread (`hint`: the caller's SM or
/// thread), so that threads that search a shared structure at the same moment start in different
/// places of it. Not a random number: only spread.
DEVMR_HOST_DEVICE inline std::uint32_t spread_seed(unsigned hint) {
#if DEVMR_IS_DEVICE_CODE
  auto x = static_cast<std::uint32_t>(clock64()) ^ (hint * 0x9e3779b9u);
#else
  thread_local std::uint32_t calls = 0;
  auto x = static_cast<std::uint32_t>(std::hash<std::thread::id>{}(std::this_thread::get_id())) ^
           (++calls * 0x9e3779b9u) ^ hint;
#endif
  x ^= x >> 16;  // the finalizer of MurmurHash3
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  return x ^ (x >> 16);
}

}  // namespace devmr::detail::heap
