// Fill (docs/design.md, "Performance contract"): how much of a fresh heap its blocks can use.
//
//   For each size (16, 64, 256, 1024, 4096 B and mixed: 16 << (fmix32(g) % 9) bytes for the g-th
//   allocation of the fill), a fresh 256 MiB heap is filled in rounds of one kernel of 2^18
//   threads, each allocating one block and writing a 4-byte tag at its first and last word; the
//   blocks are kept. The fill stops after the first round in which an allocation failed. Then,
//   untimed: every block's tags and 16-byte alignment are checked, heap.stats() is read, and every
//   block is freed.
//
//   Share of the heap = bytes asked for by the successful blocks (of every round, the last one's
//   included) / the heap's bytes; target >= 95% at every size. The table also shows the rounds,
//   the blocks, heap.stats().bytes_in_use at the full point and the fill kernels' time.
//
// Exit status: 0 every block's tags and alignment checked out; 1 a bad block, or a CUDA or devmr
// call failed; 2 no GPU. A share below the target is printed and does not change the exit status.

#include "block_sizes.hpp"
#include "device_line.hpp"
#include "event_timer.hpp"

#include <devmr/pool_resource.hpp>
#include <devmr/slab_heap.hpp>
#include <devmr/slab_ref.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace {

using devmr_bench::block_size;
using devmr_bench::fmix32;
using devmr_bench::mixed_size;

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t heap_bytes = 256 * mib;
/// Slack of the pool above the heap, for the heap's header and slab metadata.
constexpr std::size_t pool_bytes = heap_bytes + 64 * mib;
constexpr unsigned round_threads = 1u << 18;
constexpr unsigned block_threads = 256;
constexpr unsigned full_mask = 0xffffffffu;
/// A 256 MiB heap holds 64 rounds of 16 B blocks; no fill gets past this many.
constexpr unsigned max_rounds = heap_bytes / (std::size_t{round_threads} * 16) + 2;
constexpr double share_target = 0.95;

constexpr unsigned sizes[] = {16, 64, 256, 1024, 4096, mixed_size};

/// Tags of the g-th allocation: distinct per allocation (fmix32 is a bijection), ends differ.
__host__ __device__ constexpr std::uint32_t first_tag(unsigned g) {
  return fmix32(g) | 1u;
}
__host__ __device__ constexpr std::uint32_t last_tag(unsigned g) {
  return ~fmix32(g);
}

struct fill_counters {
  unsigned long long blocks;        ///< successful allocations
  unsigned long long bytes;         ///< bytes they asked for
  unsigned long long failed;        ///< allocations that returned nullptr
  unsigned long long tag_errors;    ///< blocks whose first or last word lost its tag
  unsigned long long align_errors;  ///< blocks not aligned to 16 bytes
};

__device__ __forceinline__ void add_warp_count(unsigned long long* total, unsigned long long v) {
  for (unsigned d = 16; d != 0u; d >>= 1) {
    v += __shfl_down_sync(full_mask, v, d);
  }
  if ((threadIdx.x & 31u) == 0u && v != 0u) {
    atomicAdd(total, v);
  }
}

/// One round: thread i makes allocation g = first + i, tags it and keeps it in blocks[g].
__global__ void fill_kernel(
    devmr::slab_ref<> ref, void** blocks, unsigned first, unsigned size_arg, fill_counters* c) {
  unsigned const g = first + blockIdx.x * blockDim.x + threadIdx.x;
  unsigned const bytes = block_size(g, size_arg);
  void* const p = ref.allocate(bytes, 16);
  if (p != nullptr) {
    auto* const words = static_cast<std::uint32_t*>(p);
    words[0] = first_tag(g);
    words[bytes / 4u - 1u] = last_tag(g);
  }
  blocks[g] = p;
  add_warp_count(&c->blocks, p != nullptr ? 1u : 0u);
  add_warp_count(&c->bytes, p != nullptr ? bytes : 0u);
  add_warp_count(&c->failed, p != nullptr ? 0u : 1u);
}

/// Checks every kept block's tags and alignment (untimed).
__global__ void check_kernel(void* const* blocks, unsigned n, unsigned size_arg, fill_counters* c) {
  unsigned const g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= n || blocks[g] == nullptr) {
    return;
  }
  void* const p = blocks[g];
  if (reinterpret_cast<std::uintptr_t>(p) % 16u != 0u) {
    atomicAdd(&c->align_errors, 1ull);
    return;
  }
  unsigned const bytes = block_size(g, size_arg);
  auto const* const words = static_cast<std::uint32_t const*>(p);
  if (words[0] != first_tag(g) || words[bytes / 4u - 1u] != last_tag(g)) {
    atomicAdd(&c->tag_errors, 1ull);
  }
}

__global__ void free_kernel(devmr::slab_ref<> ref,
                            void* const* blocks,
                            unsigned n,
                            unsigned size_arg) {
  unsigned const g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g < n && blocks[g] != nullptr) {
    ref.deallocate(blocks[g], block_size(g, size_arg), 16);
  }
}

std::string size_label(unsigned size_arg) {
  return size_arg == mixed_size ? std::string{"mixed"} : std::to_string(size_arg) + " B";
}

/// Fills a fresh heap with one size; prints its line; returns its bad blocks.
unsigned long long fill_row(devmr::device_pool& pool,
                            void** blocks,
                            fill_counters* counters,
                            unsigned size_arg,
                            devmr_bench::event_timer& timer) {
  std::fprintf(stderr, "fill_share_bench: %s ...\n", size_label(size_arg).c_str());
  devmr::slab_heap<> heap{
      pool, devmr::heap_options{.initial_bytes = heap_bytes, .maximum_bytes = heap_bytes}};
  DEVMR_CUDA_TRY(cudaMemset(counters, 0, sizeof(fill_counters)));
  DEVMR_CUDA_TRY(cudaDeviceSynchronize());
  fill_counters c{};
  unsigned rounds = 0;
  double fill_ms = 0.0;
  while (rounds < max_rounds && c.failed == 0) {
    unsigned const first = rounds * round_threads;
    fill_ms += timer.time_ms([&] {
      fill_kernel<<<round_threads / block_threads, block_threads>>>(heap.ref(), blocks, first,
                                                                    size_arg, counters);
    });
    ++rounds;
    DEVMR_CUDA_TRY(cudaMemcpy(&c, counters, sizeof(c), cudaMemcpyDeviceToHost));
  }
  unsigned const n = rounds * round_threads;
  unsigned const grid = n / block_threads;
  check_kernel<<<grid, block_threads>>>(blocks, n, size_arg, counters);
  DEVMR_CUDA_TRY(cudaGetLastError());
  DEVMR_CUDA_TRY(cudaMemcpy(&c, counters, sizeof(c), cudaMemcpyDeviceToHost));
  devmr::heap_stats const full = heap.stats();
  free_kernel<<<grid, block_threads>>>(heap.ref(), blocks, n, size_arg);
  DEVMR_CUDA_TRY(cudaGetLastError());
  devmr::heap_stats const empty = heap.stats();

  double const capacity = static_cast<double>(heap.capacity());
  double const share = static_cast<double>(c.bytes) / capacity;
  double const in_use = static_cast<double>(full.bytes_in_use) / capacity;
  unsigned long long const bad = c.tag_errors + c.align_errors;
  std::string notes;
  if (c.failed == 0) {
    notes += "no allocation failed in " + std::to_string(rounds) + " rounds; ";
  }
  if (full.blocks_in_use != c.blocks) {
    notes += "WARNING heap stats count " + std::to_string(full.blocks_in_use) +
             " blocks in use, the fill kept " + std::to_string(c.blocks) + "; ";
  }
  if (empty.blocks_in_use != 0) {
    notes += "WARNING heap stats count " + std::to_string(empty.blocks_in_use) +
             " blocks in use after every block was freed; ";
  }
  std::printf("%-6s %6u %10llu %10llu %11.1f %8.2f%% %10.2f%% %9.2f %7llu %7llu %-6s %s\n",
              size_label(size_arg).c_str(), rounds, c.blocks, c.failed,
              static_cast<double>(c.bytes) / static_cast<double>(mib), 100.0 * share,
              100.0 * in_use, fill_ms, c.tag_errors, c.align_errors,
              share >= share_target ? "PASS" : "MISS", notes.c_str());
  std::fflush(stdout);
  return bad;
}

int run() {
  if (!devmr_bench::open_device("fill_share_bench",
                                "fill_share_bench (devmr slab_heap: the share of a fresh 256 MiB "
                                "heap its blocks use)")) {
    return 2;
  }
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = pool_bytes}};
  void** blocks = nullptr;
  fill_counters* counters = nullptr;
  DEVMR_CUDA_TRY(cudaMalloc(&blocks, sizeof(void*) * max_rounds * round_threads));
  DEVMR_CUDA_TRY(cudaMalloc(&counters, sizeof(fill_counters)));
  devmr_bench::event_timer timer;
  std::printf("\n%-6s %6s %10s %10s %11s %9s %11s %9s %7s %7s %-6s %s\n", "size", "rounds",
              "blocks", "failed", "asked MiB", "share", "in use", "fill ms", "badtag", "misalgn",
              ">=95%", "notes");
  unsigned long long bad = 0;
  try {
    for (unsigned const size : sizes) {
      bad += fill_row(pool, blocks, counters, size, timer);
    }
  } catch (...) {
    cudaFree(counters);
    cudaFree(blocks);
    throw;
  }
  DEVMR_CUDA_TRY(cudaFree(counters));
  DEVMR_CUDA_TRY(cudaFree(blocks));
  std::printf(
      "\nrounds of 2^18 allocations (one per thread) until the first round with a failure; "
      "share = bytes asked for by the successful blocks / heap bytes (%zu MiB); in use = "
      "heap.stats().bytes_in_use / heap bytes at that point; fill ms: the rounds' kernel time "
      "(CUDA events). Target: share >= 95%% at every size.\n",
      heap_bytes / mib);
  std::printf("bad blocks: %llu\n", bad);
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (std::exception const& e) {
    std::fprintf(stderr, "fill_share_bench: %s\n", e.what());
    return 1;
  }
}
