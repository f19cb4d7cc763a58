// Allocation inside kernels: each thread builds an output of a length only it knows (here, the
// divisors of its number), keeps it in a block from the slab heap, and a later kernel reads and
// frees the blocks. The host checks the result and the heap's statistics.

#include "sample_support.hpp"

#include <devmr/devmr.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

struct divisor_list {
  unsigned* values;
  unsigned count;
};

__global__ void find_divisors(devmr::slab_ref<> heap, divisor_list* lists, unsigned n) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x + 1;
  if (i > n) {
    return;
  }
  unsigned count = 0;
  for (unsigned d = 1; d <= i; ++d) {
    count += i % d == 0 ? 1 : 0;
  }
  auto* values = static_cast<unsigned*>(heap.allocate(count * sizeof(unsigned)));
  if (values != nullptr) {  // out of memory: the heap counted it; this thread reports nothing
    unsigned k = 0;
    for (unsigned d = 1; d <= i; ++d) {
      if (i % d == 0) {
        values[k++] = d;
      }
    }
  }
  lists[i - 1] = {values, values != nullptr ? count : 0};
}

__global__ void sum_and_free(devmr::slab_ref<> heap,
                             divisor_list* lists,
                             unsigned n,
                             unsigned long long* sums) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  unsigned long long sum = 0;
  for (unsigned k = 0; k < lists[i].count; ++k) {
    sum += lists[i].values[k];
  }
  sums[i] = sum;
  heap.deallocate(lists[i].values, lists[i].count * sizeof(unsigned));
}

}  // namespace

int main() {
  devmr_samples::require_gpu("heap_sample");
  unsigned const n = 1u << 16;
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = std::size_t{512} << 20}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = std::size_t{256} << 20}};

  divisor_list* lists = nullptr;
  unsigned long long* sums = nullptr;
  DEVMR_SAMPLE_CHECK(cudaMalloc(&lists, n * sizeof(divisor_list)));
  DEVMR_SAMPLE_CHECK(cudaMallocManaged(&sums, n * sizeof(unsigned long long)));

  find_divisors<<<n / 256, 256>>>(heap.ref(), lists, n);
  DEVMR_SAMPLE_CHECK(cudaDeviceSynchronize());
  devmr::heap_stats const live = heap.stats();
  std::printf("after find_divisors: %zu blocks (%zu bytes) in use, %llu failed allocations\n",
              live.blocks_in_use, live.bytes_in_use,
              static_cast<unsigned long long>(live.failed_allocations));

  sum_and_free<<<n / 256, 256>>>(heap.ref(), lists, n, sums);
  DEVMR_SAMPLE_CHECK(cudaDeviceSynchronize());
  devmr::heap_stats const done = heap.stats();
  std::printf("after sum_and_free:  %zu blocks in use\n", done.blocks_in_use);

  // sigma(i), the sum of divisors, computed on the host the slow way for a few values.
  int wrong = 0;
  for (unsigned i = 1; i <= n; i += 997) {
    unsigned long long expect = 0;
    for (unsigned d = 1; d <= i; ++d) {
      expect += i % d == 0 ? d : 0;
    }
    wrong += sums[i - 1] != expect ? 1 : 0;
  }
  std::printf("sigma(%u) = %llu; %d wrong sums\n", n, sums[n - 1], wrong);
  cudaFree(lists);
  cudaFree(sums);
  bool const ok = wrong == 0 && live.blocks_in_use == n && done.blocks_in_use == 0;
  std::printf("%s\n", ok ? "heap_sample: OK" : "heap_sample: FAILED");
  return ok ? 0 : 1;
}
