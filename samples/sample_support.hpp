// What every sample does around its work: make sure there is a GPU to run on, and stop with a
// message that names the failing CUDA call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace devmr_samples {

/// The running sample's name, for its messages (set by require_gpu).
inline char const* sample_name = "devmr sample";

/// Exits with status 2 and a message when no CUDA device is present: the samples need a GPU.
inline void require_gpu(char const* name) {
  sample_name = name;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "%s: no CUDA device found; this sample needs an NVIDIA GPU\n", name);
    std::exit(2);
  }
}

/// Exits with a message naming `call` when `status` is an error.
inline void check(cudaError_t status, char const* call) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s failed: %s\n", sample_name, call, cudaGetErrorString(status));
    std::exit(EXIT_FAILURE);
  }
}

}  // namespace devmr_samples

/// Runs a CUDA call; on an error, names it and exits (devmr_samples::check).
#define DEVMR_SAMPLE_CHECK(call) ::devmr_samples::check((call), #call)
