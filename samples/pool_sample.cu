// A device_pool used from host code: allocate a block on a stream, fill it from a kernel, copy it
// back, verify, free it on the stream. Exits non-zero where there is no GPU.

#include "sample_support.hpp"

#include <devmr/pool_resource.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

__global__ void fill_squares(int* values, int count) {
  int const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) {
    values[i] = i * i;
  }
}

}  // namespace

int main() {
  devmr_samples::require_gpu("pool_sample");
  try {
    // A pool of device memory on the current device: 64 MiB reserved now, at most 1 GiB ever.
    devmr::device_pool pool{
        devmr::pool_options{.initial_bytes = 64 << 20, .maximum_bytes = std::size_t{1} << 30}};
    std::printf("device_pool on device %d: %zu bytes reserved in %zu arena(s)\n", pool.device(),
                pool.stats().reserved_bytes, pool.stats().arenas);

    cudaStream_t stream = nullptr;
    DEVMR_SAMPLE_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    constexpr int count = 1 << 20;
    constexpr std::size_t bytes = count * sizeof(int);

    // Stream-ordered: the block is usable by work enqueued on `stream` from now on.
    auto* values = static_cast<int*>(pool.allocate_async(bytes, alignof(int), stream));
    std::printf("allocate_async: %zu bytes at %p\n", bytes, static_cast<void*>(values));
    fill_squares<<<(count + 255) / 256, 256, 0, stream>>>(values, count);
    DEVMR_SAMPLE_CHECK(cudaGetLastError());

    std::vector<int> host(count);
    DEVMR_SAMPLE_CHECK(cudaMemcpyAsync(host.data(), values, bytes, cudaMemcpyDeviceToHost, stream));
    // Freed on the stream: the pool hands the block to other streams only after the copy is done.
    pool.deallocate_async(values, bytes, alignof(int), stream);
    DEVMR_SAMPLE_CHECK(cudaStreamSynchronize(stream));

    int wrong = 0;
    for (int i = 0; i < count; ++i) {
      wrong += host[i] != i * i ? 1 : 0;
    }
    std::printf("kernel filled %d ints, copied back: %d wrong\n", count, wrong);

    auto const stats = pool.stats();
    std::printf("stats: %lld blocks served, peak %lld bytes held, %lld held now\n",
                static_cast<long long>(stats.blocks.total),
                static_cast<long long>(stats.bytes.peak),
                static_cast<long long>(stats.bytes.current));
    DEVMR_SAMPLE_CHECK(cudaStreamDestroy(stream));
    if (wrong != 0) {
      std::fprintf(stderr, "pool_sample: FAILED\n");
      return EXIT_FAILURE;
    }
  } catch (std::exception const& e) {
    std::fprintf(stderr, "pool_sample: %s\n", e.what());
    return EXIT_FAILURE;
  }
  std::printf("pool_sample: OK\n");
  return EXIT_SUCCESS;
}
