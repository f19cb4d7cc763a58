// A pair of CUDA events that times what a callable enqueues on the default stream; the
// benchmarks in this folder time their kernels with it.
#pragma once

#include <devmr/errors.hpp>

#include <cuda_runtime_api.h>

namespace devmr_bench {

class event_timer {
 public:
  event_timer() {
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
  template <class Launch>
  float time_ms(Launch&& launch) {
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
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace devmr_bench
