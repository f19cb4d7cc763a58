// The README's quickstart, complete: each thread of a kernel allocates a list of a length only it
// knows from a slab heap, fills and sums it, and frees it. The host checks every sum and that the
// heap holds no block afterwards. The part between the two `[quickstart]` lines is the README's
// code block, word for word (a test compares them).

#include "sample_support.hpp"

#include <cstdio>
#include <cstdlib>
#include <vector>

// [quickstart]
#include <devmr/devmr.hpp>

__global__ void build(devmr::slab_ref<> heap, int* sums) {
  int const n = 1 + threadIdx.x % 7;  // a length only this thread knows
  auto* list = static_cast<int*>(heap.allocate(n * sizeof(int)));  // nullptr if the heap is full
  int sum = -1;
  if (list != nullptr) {
    for (int i = 0; i < n; ++i) {
      list[i] = i + 1;
    }
    sum = 0;
    for (int i = 0; i < n; ++i) {
      sum += list[i];
    }
    heap.deallocate(list, n * sizeof(int));  // the size it was allocated with
  }
  sums[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

devmr::heap_stats run(int* sums, unsigned blocks, unsigned threads) {
  devmr::device_pool pool{{.initial_bytes = 1ull << 30}};          // arenas from cudaMalloc
  devmr::slab_heap<> heap{pool, {.initial_bytes = 512ull << 20}};  // carved from the pool
  build<<<blocks, threads>>>(heap.ref(), sums);                    // a slab_ref per kernel
  return heap.stats();  // waits for the kernel: blocks in use, failed allocations, ...
}
// [quickstart]

int main() {
  devmr_samples::require_gpu("quickstart");
  unsigned const blocks = 1024;
  unsigned const threads = 256;
  int* sums = nullptr;
  DEVMR_SAMPLE_CHECK(cudaMalloc(&sums, std::size_t{blocks} * threads * sizeof(int)));
  devmr::heap_stats const stats = run(sums, blocks, threads);
  std::vector<int> host(std::size_t{blocks} * threads);
  DEVMR_SAMPLE_CHECK(
      cudaMemcpy(host.data(), sums, host.size() * sizeof(int), cudaMemcpyDeviceToHost));
  DEVMR_SAMPLE_CHECK(cudaFree(sums));
  std::size_t wrong = 0;
  for (std::size_t t = 0; t < host.size(); ++t) {
    int const n = 1 + static_cast<int>(t % threads) % 7;
    wrong += host[t] == n * (n + 1) / 2 ? 0 : 1;
  }
  std::printf("%zu threads: %zu wrong sums; heap: %zu blocks in use, %llu failed allocations\n",
              host.size(), wrong, stats.blocks_in_use,
              static_cast<unsigned long long>(stats.failed_allocations));
  bool const ok = wrong == 0 && stats.blocks_in_use == 0 && stats.failed_allocations == 0;
  std::printf("%s\n", ok ? "quickstart: OK" : "quickstart: FAILED");
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
