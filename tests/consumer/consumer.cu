// A consumer of devmr: a pool, a heap, a kernel that allocates through the heap's ref, and the
// concepts the ref satisfies. Built by scripts/test-package; run, it needs a GPU (it says so and
// exits 0 where there is none, since the package test is about building and linking).

#include <devmr/devmr.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>

static_assert(cuda::mr::resource_with<devmr::slab_ref<>, cuda::mr::device_accessible>);

__global__ void fill(devmr::slab_ref<> heap, int* ok) {
  auto* block = static_cast<int*>(heap.allocate(sizeof(int) * 4));
  if (block != nullptr) {
    block[3] = static_cast<int>(threadIdx.x);
    atomicAdd(ok, block[3] == static_cast<int>(threadIdx.x) ? 1 : 0);
    heap.deallocate(block, sizeof(int) * 4);
  }
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("consumer: built and linked against devmr; no GPU to run on\n");
    return 0;
  }
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = std::size_t{128} << 20}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = std::size_t{64} << 20}};
  int* ok = nullptr;
  if (cudaMallocManaged(&ok, sizeof(int)) != cudaSuccess) {
    return 1;
  }
  *ok = 0;
  fill<<<1, 256>>>(heap.ref(), ok);
  if (cudaDeviceSynchronize() != cudaSuccess || *ok != 256 || heap.stats().blocks_in_use != 0) {
    std::printf("consumer: FAILED (%d of 256)\n", *ok);
    return 1;
  }
  cudaFree(ok);
  std::printf("consumer: OK\n");
  return 0;
}
