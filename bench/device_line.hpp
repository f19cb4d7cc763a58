// The opening of the benchmarks in this folder that run on device 0: whether there is a GPU, and
// the line that names it.
#pragma once

#include <devmr/errors.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>

namespace devmr_bench {

/// Prints `title` and device 0's name, compute capability and SM count; false (with a message on
/// stderr naming `program`) when there is no GPU.
inline bool open_device(char const* program, char const* title) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "%s: no GPU\n", program);
    return false;
  }
  cudaDeviceProp prop{};
  DEVMR_CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s\n", title);
  std::printf("device 0: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount);
  return true;
}

}  // namespace devmr_bench
