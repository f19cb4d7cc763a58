// Catch2's main for the GPU tests: where no GPU is present the suite reports itself skipped
// (exit code devmr_gpu_skip_code, registered with CTest as SKIP_RETURN_CODE) instead of passing.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>

#ifndef DEVMR_GPU_SKIP_CODE
#error "DEVMR_GPU_SKIP_CODE must be defined by the build"
#endif

int main(int argc, char* argv[]) {
  int count = 0;
  cudaError_t const status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", cudaGetErrorString(status));
    cudaGetLastError();
    return DEVMR_GPU_SKIP_CODE;
  }
  return Catch::Session().run(argc, argv);
}
