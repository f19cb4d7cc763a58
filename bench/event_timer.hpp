// A pair of CUDA events that times what a callable enqueues on the default stream; the
// benchmarks in this folder time their kernels with it.
#pragma once

#include <devmr/errors.hpp>

#include <cuda_runtime_api.h>

namespace devmr_bench {

namespace {

/// Keeps the stream busy for `ns` nanoseconds (one thread, sleeping), so that the host has
/// enqueued the start event, the timed work and the stop event before the GPU reaches them.
__global__ void hold_kernel(unsigned long long ns) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= ns) {
      break;
    }
    __nanosleep(1000);
  }
}

}  // namespace

class event_timer {
 public:
  /// `hold`: whether time_ms enqueues its work behind the hold kernel (false only to measure
  /// what the hold removes: timer_bench).
  explicit event_timer(bool hold = true) : hold_{hold} {
    DEVMR_CUDA_TRY(cudaEventCreate(&start_));
    DEVMR_CUDA_TRY(cudaEventCreate(&stop_));
  }
  ~event_timer() {
    cudaEventDestroy(stop_);
    cudaEventDestroy(start_);
  }
  event_timer(event_timer const&) = delete;
  event_timer& operator=(event_timer const&) = delete;

  /// Milliseconds between an event recorded before `launch()` and one recorded after it.
  /// Both events and the launch wait in the stream behind a hold kernel: on an idle GPU the
  /// start event would be stamped as soon as it was recorded, and the time the host then takes
  /// to launch the kernel (3 to 5 us, and its jitter) would count as the kernel's, a large part
  /// of the kernels of 2^16 threads (bench/RESULTS.md, timer_bench). The hold changes no
  /// GPU work: it ends before the start event.
  template <class Launch>
  float time_ms(Launch&& launch) {
    if (hold_) {
      hold_kernel<<<1, 1>>>(hold_ns);
      DEVMR_CUDA_TRY(cudaGetLastError());
    }
    DEVMR_CUDA_TRY(cudaEventRecord(start_, 0));
    launch();
    DEVMR_CUDA_TRY(cudaGetLastError());
    DEVMR_CUDA_TRY(cudaEventRecord(stop_, 0));
    DEVMR_CUDA_TRY(cudaEventSynchronize(stop_));
    float ms = 0.0f;
    DEVMR_CUDA_TRY(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  /// Long enough for the host to enqueue the events and the launch (20 us sufficed on the H200;
  /// 50 us leaves room for a slow host).
  static constexpr unsigned long long hold_ns = 50'000;

  bool hold_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace devmr_bench
