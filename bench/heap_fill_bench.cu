// What a heap costs near its end, where heap_bench's rows (at most two thirds of its heap) do not
// go: after every reset, construction and growth the heap gives each SM's slot of every size
// class a slab (priming), and a kernel that needs more slabs than are left fresh takes those of
// the other classes, or gathers them for a large block.
//
//   fill:   a 24 GiB heap, reset; one kernel in which every thread allocates one 4 KiB block
//           (and writes its first word) until 50, 90, 93, 96 or 99% of the heap is handed out.
//   gather: a heap of 1 or 24 GiB, reset; one thread asks for a block as large as the heap, which
//           takes every slab, the primed ones included.
//
// Each case: median (with minimum and maximum) of 5 runs, kernel time by CUDA events; the heap is
// reset before each run and every block freed after it. A nullptr in a fill counts as a failure.
//
// Exit status: 0 every allocation succeeded; 1 one failed, or a CUDA/devmr error; 2 no GPU.

#include "device_line.hpp"
#include "event_timer.hpp"

#include <devmr/pool_resource.hpp>
#include <devmr/slab_heap.hpp>
#include <devmr/slab_ref.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <vector>

namespace {

constexpr std::size_t gib = std::size_t{1} << 30;
constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t fill_block = 4096;
constexpr int runs = 5;

__global__ void fill_kernel(devmr::slab_ref<> ref, void** blocks, unsigned n) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    void* p = ref.allocate(fill_block);
    if (p != nullptr) {
      *static_cast<unsigned*>(p) = i;
    }
    blocks[i] = p;
  }
}

__global__ void free_kernel(devmr::slab_ref<> ref, void* const* blocks, unsigned n) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    ref.deallocate(blocks[i], fill_block);
  }
}

__global__ void count_nulls(void* const* blocks, unsigned n, unsigned* nulls) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && blocks[i] == nullptr) {
    atomicAdd(nulls, 1u);
  }
}

__global__ void whole_kernel(devmr::slab_ref<> ref, std::size_t bytes, void** out) {
  *out = ref.allocate(bytes);
}

__global__ void release_kernel(devmr::slab_ref<> ref, void* p, std::size_t bytes) {
  ref.deallocate(p, bytes);
}

void print_times(char const* label, std::vector<float> ms, char const* note) {
  std::sort(ms.begin(), ms.end());
  std::printf("%-34s %8.3f %8.3f %8.3f  %s\n", label, static_cast<double>(ms[ms.size() / 2]),
              static_cast<double>(ms.front()), static_cast<double>(ms.back()), note);
}

/// The fill rows; returns the nullptrs seen.
unsigned fill_rows(devmr_bench::event_timer& timer) {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 24 * gib + 64 * mib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 24 * gib}};
  unsigned failures = 0;
  for (int const percent : {50, 90, 93, 96, 99}) {
    auto const n = static_cast<unsigned>(heap.capacity() / 100 * percent / fill_block);
    unsigned const grid = (n + 255) / 256;
    void** blocks = nullptr;
    unsigned* nulls = nullptr;
    DEVMR_CUDA_TRY(cudaMalloc(&blocks, n * sizeof(void*)));
    DEVMR_CUDA_TRY(cudaMalloc(&nulls, sizeof(unsigned)));
    DEVMR_CUDA_TRY(cudaMemset(nulls, 0, sizeof(unsigned)));
    std::vector<float> ms;
    for (int r = 0; r < runs; ++r) {
      heap.reset();
      DEVMR_CUDA_TRY(cudaDeviceSynchronize());
      ms.push_back(timer.time_ms([&] { fill_kernel<<<grid, 256>>>(heap.ref(), blocks, n); }));
      count_nulls<<<grid, 256>>>(blocks, n, nulls);
      free_kernel<<<grid, 256>>>(heap.ref(), blocks, n);
      DEVMR_CUDA_TRY(cudaDeviceSynchronize());
    }
    unsigned seen = 0;
    DEVMR_CUDA_TRY(cudaMemcpy(&seen, nulls, sizeof(seen), cudaMemcpyDeviceToHost));
    failures += seen;
    char label[64];
    std::snprintf(label, sizeof(label), "fill %d%% of 24 GiB, 4 KiB blocks", percent);
    char note[64];
    std::snprintf(note, sizeof(note), "%u threads, %u nullptrs", n, seen);
    print_times(label, ms, note);
    DEVMR_CUDA_TRY(cudaFree(blocks));
    DEVMR_CUDA_TRY(cudaFree(nulls));
  }
  return failures;
}

/// The gather rows; returns the failed allocations.
unsigned gather_rows(devmr_bench::event_timer& timer) {
  unsigned failures = 0;
  for (std::size_t const size : {gib, 24 * gib}) {
    devmr::device_pool pool{devmr::pool_options{.initial_bytes = size + 64 * mib}};
    devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = size}};
    void** out = nullptr;
    DEVMR_CUDA_TRY(cudaMalloc(&out, sizeof(void*)));
    std::vector<float> ms;
    for (int r = 0; r < runs; ++r) {
      heap.reset();
      DEVMR_CUDA_TRY(cudaDeviceSynchronize());
      ms.push_back(
          timer.time_ms([&] { whole_kernel<<<1, 1>>>(heap.ref(), heap.capacity(), out); }));
      void* p = nullptr;
      DEVMR_CUDA_TRY(cudaMemcpy(&p, out, sizeof(p), cudaMemcpyDeviceToHost));
      if (p == nullptr) {
        ++failures;
      } else {
        release_kernel<<<1, 1>>>(heap.ref(), p, heap.capacity());
        DEVMR_CUDA_TRY(cudaDeviceSynchronize());
      }
    }
    char label[64];
    std::snprintf(label, sizeof(label), "gather the whole %zu GiB heap", size / gib);
    print_times(label, ms, "one thread, right after a reset");
    DEVMR_CUDA_TRY(cudaFree(out));
  }
  return failures;
}

int run() {
  if (!devmr_bench::open_device("heap_fill_bench",
                                "heap_fill_bench (devmr slab_heap near its end)")) {
    return 2;
  }
  std::printf("%-34s %8s %8s %8s\n", "case", "ms", "min", "max");
  devmr_bench::event_timer timer;
  unsigned const failures = fill_rows(timer) + gather_rows(timer);
  std::printf("failed allocations: %u\n", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (std::exception const& e) {
    std::fprintf(stderr, "heap_fill_bench: %s\n", e.what());
    return 1;
  }
}
