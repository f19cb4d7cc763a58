// Per-thread scratch memory whose size only the thread knows: each thread reads a sequence of its
// own length, copies it into a devmr::scratch buffer, and computes the length of its longest
// strictly increasing subsequence with a dynamic-programming table, a second scratch buffer of
// the same length. Both are freed when the thread ends. The host computes every answer again and
// compares; the heap must hold no block afterwards.

#include "sample_support.hpp"

#include <devmr/devmr.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr unsigned threads = 1u << 16;
constexpr unsigned block_threads = 256;
constexpr unsigned max_length = 256;

/// A bijective integer hash (murmur3's finalizer).
__host__ __device__ std::uint32_t mix(std::uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

/// The length of thread i's sequence: 1 to max_length.
__host__ __device__ unsigned length_of(unsigned i) {
  return 1u + mix(i) % max_length;
}

/// Element k of thread i's sequence.
__host__ __device__ int element(unsigned i, unsigned k) {
  return static_cast<int>(mix(i * 7919u + k) % 1000u);
}

/// Longest strictly increasing subsequence of values[0, n): dp[k] is the longest one ending at k.
template <class Values, class Table>
__host__ __device__ unsigned longest_increasing(Values const& values, Table& dp, unsigned n) {
  unsigned best = 0;
  for (unsigned k = 0; k < n; ++k) {
    unsigned longest = 1;
    for (unsigned j = 0; j < k; ++j) {
      if (values[j] < values[k] && dp[j] + 1 > longest) {
        longest = dp[j] + 1;
      }
    }
    dp[k] = longest;
    best = longest > best ? longest : best;
  }
  return best;
}

/// Result of a thread whose heap could not serve it (never expected here).
constexpr unsigned no_memory = ~0u;

__global__ void solve(devmr::slab_ref<> heap, unsigned* answers) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= threads) {
    return;
  }
  unsigned const n = length_of(i);
  devmr::scratch<int, devmr::slab_ref<>> values{heap, n};
  devmr::scratch<unsigned, devmr::slab_ref<>> dp{heap, n};
  if (!values || !dp) {  // the heap could not serve: report it, no crash
    answers[i] = no_memory;
    return;
  }
  for (unsigned k = 0; k < n; ++k) {
    values[k] = element(i, k);
  }
  answers[i] = longest_increasing(values, dp, n);
}  // values and dp are freed here

}  // namespace

int main() {
  devmr_samples::require_gpu("per_thread_scratch");
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = std::size_t{640} << 20}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = std::size_t{512} << 20}};

  unsigned* answers = nullptr;
  DEVMR_SAMPLE_CHECK(cudaMallocManaged(&answers, threads * sizeof(unsigned)));
  solve<<<threads / block_threads, block_threads>>>(heap.ref(), answers);
  DEVMR_SAMPLE_CHECK(cudaDeviceSynchronize());

  std::vector<int> values(max_length);
  std::vector<unsigned> dp(max_length);
  unsigned wrong = 0;
  unsigned longest = 0;
  for (unsigned i = 0; i < threads; ++i) {
    unsigned const n = length_of(i);
    for (unsigned k = 0; k < n; ++k) {
      values[k] = element(i, k);
    }
    unsigned const expect = longest_increasing(values, dp, n);
    wrong += answers[i] != expect ? 1u : 0u;
    longest = std::max(longest, expect);
  }
  devmr::heap_stats const stats = heap.stats();
  std::printf("%u threads, sequences of 1 to %u: longest increasing run %u; %u wrong answers\n",
              threads, max_length, longest, wrong);
  std::printf("heap after the kernel: %zu blocks in use, %llu failed allocations\n",
              stats.blocks_in_use, static_cast<unsigned long long>(stats.failed_allocations));
  DEVMR_SAMPLE_CHECK(cudaFree(answers));
  bool const ok = wrong == 0 && stats.blocks_in_use == 0 && stats.failed_allocations == 0;
  std::printf("%s\n", ok ? "per_thread_scratch: OK" : "per_thread_scratch: FAILED");
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
