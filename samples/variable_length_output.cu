// Output of a length nobody knows in advance: each thread follows the Collatz sequence of its
// number and emits every value into chunks that it allocates from a managed slab heap as it goes,
// chained into a list. The host then reads the lists straight from managed memory, checks each
// against its own computation, gathers every chunk's address and frees them all with one
// deallocate_bulk (which needs no sizes).

#include "sample_support.hpp"

#include <devmr/devmr.hpp>

#include <cuda_runtime_api.h>
#include <cuda/std/span>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr unsigned threads = 1u << 16;
constexpr unsigned block_threads = 256;

/// One chunk of a thread's output: up to `capacity` values, and the next chunk.
struct chunk {
  static constexpr unsigned capacity = 30;
  chunk* next;
  unsigned count;
  std::uint64_t values[capacity];
};

/// The list of thread i: its first chunk, and whether every chunk could be allocated.
struct output_list {
  chunk* first;
  unsigned values;
  unsigned complete;
};

/// The next value of a Collatz sequence.
__host__ __device__ std::uint64_t collatz_step(std::uint64_t x) {
  return x % 2 == 0 ? x / 2 : 3 * x + 1;
}

using managed_ref = devmr::slab_ref<devmr::memory_kind::managed>;

/// Emits the Collatz sequence of i + 1 down to 1, chunk by chunk.
__global__ void emit(managed_ref heap, output_list* lists) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= threads) {
    return;
  }
  output_list out{nullptr, 0, 1};
  chunk* last = nullptr;
  std::uint64_t x = i + 1;
  for (;;) {
    if (last == nullptr || last->count == chunk::capacity) {
      auto* fresh = static_cast<chunk*>(heap.allocate(sizeof(chunk), alignof(chunk)));
      if (fresh == nullptr) {  // the heap is full: keep what was emitted, say it is incomplete
        out.complete = 0;
        break;
      }
      fresh->next = nullptr;
      fresh->count = 0;
      (last == nullptr ? out.first : last->next) = fresh;
      last = fresh;
    }
    last->values[last->count++] = x;
    ++out.values;
    if (x == 1) {
      break;
    }
    x = collatz_step(x);
  }
  lists[i] = out;
}

}  // namespace

int main() {
  devmr_samples::require_gpu("variable_length_output");
  devmr::managed_pool pool{devmr::pool_options{.initial_bytes = std::size_t{320} << 20}};
  devmr::slab_heap<devmr::memory_kind::managed> heap{
      pool, devmr::heap_options{.initial_bytes = std::size_t{256} << 20}};

  output_list* lists = nullptr;
  DEVMR_SAMPLE_CHECK(cudaMallocManaged(&lists, threads * sizeof(output_list)));
  emit<<<threads / block_threads, block_threads>>>(heap.ref(), lists);
  DEVMR_SAMPLE_CHECK(cudaDeviceSynchronize());
  devmr::heap_stats const live = heap.stats();

  // The host reads every list in place (managed memory) and collects the chunks' addresses.
  std::size_t chunks = 0;
  for (unsigned i = 0; i < threads; ++i) {
    for (chunk* c = lists[i].first; c != nullptr; c = c->next) {
      ++chunks;
    }
  }
  void** blocks = nullptr;
  DEVMR_SAMPLE_CHECK(cudaMallocManaged(&blocks, chunks * sizeof(void*)));
  std::size_t gathered = 0;
  unsigned wrong = 0;
  unsigned incomplete = 0;
  std::size_t total_values = 0;
  unsigned longest = 0;
  for (unsigned i = 0; i < threads; ++i) {
    incomplete += lists[i].complete == 0 ? 1u : 0u;
    std::uint64_t expect = i + 1;
    unsigned seen = 0;
    bool match = true;
    for (chunk* c = lists[i].first; c != nullptr; c = c->next) {
      blocks[gathered++] = c;
      for (unsigned k = 0; k < c->count; ++k, ++seen) {
        match = match && c->values[k] == expect;
        expect = collatz_step(expect);
      }
    }
    // A complete list ends at 1: the value after it would be 4.
    match = match && seen == lists[i].values && expect == 4;
    wrong += match ? 0u : 1u;
    total_values += seen;
    longest = seen > longest ? seen : longest;
  }
  heap.deallocate_bulk(cuda::std::span<void* const>{blocks, chunks},
                       cuda::stream_ref{cudaStream_t{}});
  devmr::heap_stats const done = heap.stats();  // waits for the frees

  std::printf(
      "%u threads emitted %zu values (longest list %u) in %zu chunks; %u wrong lists, "
      "%u incomplete\n",
      threads, total_values, longest, chunks, wrong, incomplete);
  std::printf("heap: %zu blocks in use after the kernel, %zu after deallocate_bulk\n",
              live.blocks_in_use, done.blocks_in_use);
  DEVMR_SAMPLE_CHECK(cudaFree(blocks));
  DEVMR_SAMPLE_CHECK(cudaFree(lists));
  bool const ok =
      wrong == 0 && incomplete == 0 && live.blocks_in_use == chunks && done.blocks_in_use == 0;
  std::printf("%s\n", ok ? "variable_length_output: OK" : "variable_length_output: FAILED");
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
