// The reuse path's mechanisms (class_slots over block bitmaps and slab counts) on the GPU, over
// 1 MiB slabs of device memory, one claim and one free per thread: the steady-churn protocol of
// bench/README.md with tags checked on every free. Each thread has 4 slots; in every round slot
// j toggles with probability 2^-(j+1): a full one checks its block's tags and frees it, an empty
// one allocates a block and tags it. Half of the slots are full in the steady state, and the
// threads are as many as put 80% of the heap in live blocks.

#include "../slab_stack.hpp"

#include <devmr/detail/heap/class_ops.cuh>
#include <devmr/detail/heap/class_slots.hpp>
#include <devmr/detail/heap/layout.hpp>

#include "../../bench/block_sizes.hpp"

#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace reuse_engine_test {

using namespace devmr::detail::heap;

#define CUDA_CHECK(call) REQUIRE((call) == cudaSuccess)

/// The classes a test uses: 16 B to 4 KiB.
constexpr unsigned engine_classes = 9;
/// Stacks of empty slabs, so that the frees that empty slabs at once do not meet on one head.
constexpr unsigned empty_shards = 64;

struct stack_link {
  std::uint32_t* next;
  DEVMR_HOST_DEVICE std::uint32_t& operator()(std::uint32_t id) const { return next[id]; }
};

/// The Slabs policy of class_slots over device memory.
struct device_slabs {
  std::byte* base;
  std::uint32_t* avail_words;
  std::uint32_t* next_words;
  std::uint32_t* classes;
  std::uint32_t* bit_words;
  std::uint32_t* listed_words;
  std::uint32_t set_members;
  std::uint64_t* empty_heads;  // empty_shards stacks of empty slabs, by id; then two counts
  unsigned long long* stats;   // installs from empty slabs, slabs emptied

  DEVMR_HOST_DEVICE std::uint32_t blocks(unsigned c) const { return class_capacity(c); }
  DEVMR_HOST_DEVICE std::byte* data(std::uint32_t id) const {
    return base + (std::size_t{id} << slab_shift);
  }
  DEVMR_HOST_DEVICE std::uint32_t& avail(std::uint32_t id) const { return avail_words[id]; }
  DEVMR_HOST_DEVICE std::uint32_t* bits(std::uint32_t id) const {
    return bit_words + std::size_t{id} * bitmap_words_for(class_capacity(0));
  }
  DEVMR_HOST_DEVICE std::uint32_t list_parts() const { return 1; }
  DEVMR_HOST_DEVICE slab_set listed(unsigned c, std::uint32_t) const {
    return {listed_words + std::size_t{c} * slab_set_words(set_members),
            bitmap_words_for(set_members)};
  }
  DEVMR_HOST_DEVICE slab_set below(unsigned c, std::uint32_t part) const {
    return listed(engine_classes + c, part);
  }
  DEVMR_HOST_DEVICE std::uint32_t member(std::uint32_t id) const { return id; }
  DEVMR_HOST_DEVICE std::uint32_t part_of(std::uint32_t) const { return 0; }
  DEVMR_HOST_DEVICE std::uint32_t slab_of(std::uint32_t, std::uint32_t m) const { return m; }
  DEVMR_HOST_DEVICE void format(std::uint32_t id, unsigned c) const {
    atomic(classes[id]).store(c, relaxed);
  }
  // A heap that is never roomy: installs reuse listed slabs first (class_slots::take_roomy is
  // the host tests' to drive).
  DEVMR_HOST_DEVICE bool roomy() const { return false; }
  DEVMR_HOST_DEVICE void count_out(std::uint32_t) const {}
  DEVMR_HOST_DEVICE bool bump_fresh() const { return true; }
  // The counts of slabs in flight and of slabs moved (class_slots::final_search).
  DEVMR_HOST_DEVICE std::uint64_t& in_flight() const { return empty_heads[empty_shards]; }
  DEVMR_HOST_DEVICE std::uint64_t& moves() const { return empty_heads[empty_shards + 1]; }
  DEVMR_HOST_DEVICE slab_stack<stack_link> empty(unsigned shard) const {
    return {empty_heads[shard % empty_shards], stack_link{next_words}};
  }
  DEVMR_HOST_DEVICE std::uint32_t take_empty(unsigned hint) const {
    for (unsigned i = 0; i < empty_shards; ++i) {
      if (std::uint32_t const id = empty(hint + i).pop(); id != no_slab) {
        atomic(stats[0]).fetch_add(1, relaxed);
        return id;
      }
    }
    return no_slab;
  }
  DEVMR_HOST_DEVICE void give_empty(std::uint32_t id, unsigned) const {
    atomic(classes[id]).store(0xffu, relaxed);
    atomic(stats[1]).fetch_add(1, relaxed);
    empty(id).push(id);
  }
};

using engine = class_slots<device_slabs>;

__device__ unsigned this_sm() {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  return sm;
}

/// Class of thread `i`'s `n`th allocation in slot `j`: `fixed`, or mixed (16 << hash % 9).
__device__ unsigned class_for(int fixed, std::uint32_t i, unsigned j, std::uint32_t round) {
  if (fixed >= 0) {
    return static_cast<unsigned>(fixed);
  }
  return devmr_bench::fmix32(i * 4u + j + round * 0x9e3779b9u) % engine_classes;
}

struct churn_counts {
  unsigned long long allocations;
  unsigned long long frees;
  unsigned long long failures;
  unsigned long long bad_blocks;
};

__global__ void format_kernel(device_slabs s, std::uint32_t slabs) {
  for (std::uint32_t id = blockIdx.x * blockDim.x + threadIdx.x; id < slabs;
       id += gridDim.x * blockDim.x) {
    s.next_words[id] = id + empty_shards < slabs ? id + empty_shards : no_slab;
    s.classes[id] = 0xffu;
    s.avail_words[id] = avail_open | avail_no_class;
  }
}

/// One round of the steady churn. `held[4 i + j]`: thread i's block in slot j (or null), with
/// its class in `held_class`.
__global__ void churn_kernel(engine slots,
                             std::byte** held,
                             std::uint8_t* held_class,
                             std::uint32_t threads,
                             std::uint32_t round,
                             int fixed,
                             churn_counts* counts) {
  device_slabs const& s = slots.slabs();
  unsigned const sm = this_sm();
  unsigned const slot = sm % slots.slot_count();
  unsigned long long allocations = 0;
  unsigned long long frees = 0;
  unsigned long long failures = 0;
  unsigned long long bad = 0;
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < threads;
       i += gridDim.x * blockDim.x) {
    std::uint32_t const h = devmr_bench::fmix32(i ^ (round * 0x85ebca6bu) ^ 0x27d4eb2fu);
    for (unsigned j = 0; j < 4; ++j) {
      if ((h >> (8 * j)) % (2u << j) != 0) {
        continue;  // slot j toggles with probability 2^-(j+1)
      }
      std::byte*& p = held[4 * std::size_t{i} + j];
      std::uint32_t const tag = i * 4u + j;
      if (p != nullptr) {
        unsigned const c = held_class[4 * std::size_t{i} + j];
        std::size_t const bytes = class_bytes(c);
        auto const* words = reinterpret_cast<std::uint32_t const*>(p);
        if (words[0] != tag || words[bytes / 4 - 1] != ~tag) {
          ++bad;
        }
        std::size_t const off = static_cast<std::size_t>(p - s.base);
        unsigned const callers = __activemask();
        __syncwarp(callers);
        release_fence();
        warp_free(slots, static_cast<std::uint32_t>(off >> slab_shift), c,
                  static_cast<std::uint32_t>((off & (slab_bytes - 1)) >> (c + 4)), true, sm,
                  callers);
        p = nullptr;
        ++frees;
        continue;
      }
      unsigned const c = class_for(fixed, i, j, round);
      unsigned failed = 0;
      std::byte* const block = warp_allocate(slots, c, slot, sm, failed);
      failures += failed;
      if (block == nullptr) {
        continue;
      }
      auto* words = reinterpret_cast<std::uint32_t*>(block);
      words[0] = tag;
      words[class_bytes(c) / 4 - 1] = ~tag;
      p = block;
      held_class[4 * std::size_t{i} + j] = static_cast<std::uint8_t>(c);
      ++allocations;
    }
  }
  // One atomic per block and count: the test's own counting must not be what it measures.
  __shared__ unsigned long long block_counts[4];
  if (threadIdx.x < 4) {
    block_counts[threadIdx.x] = 0;
  }
  __syncthreads();
  atomicAdd(&block_counts[0], allocations);
  atomicAdd(&block_counts[1], frees);
  atomicAdd(&block_counts[2], failures);
  atomicAdd(&block_counts[3], bad);
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicAdd(&counts->allocations, block_counts[0]);
    atomicAdd(&counts->frees, block_counts[1]);
    atomicAdd(&counts->failures, block_counts[2]);
    atomicAdd(&counts->bad_blocks, block_counts[3]);
  }
}

/// Frees every block still held (the end of a run).
__global__ void free_all_kernel(engine slots,
                                std::byte** held,
                                std::uint8_t* held_class,
                                std::size_t count) {
  device_slabs const& s = slots.slabs();
  for (std::size_t k = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; k < count;
       k += std::size_t{gridDim.x} * blockDim.x) {
    if (held[k] != nullptr) {
      unsigned const c = held_class[k];
      std::size_t const off = static_cast<std::size_t>(held[k] - s.base);
      slots.lists().free_block(static_cast<std::uint32_t>(off >> slab_shift), c,
                               static_cast<std::uint32_t>((off & (slab_bytes - 1)) >> (c + 4)), 0);
      held[k] = nullptr;
    }
  }
}

__global__ void vacate_kernel(engine slots) {
  unsigned const c = blockIdx.x;
  for (unsigned s = threadIdx.x; s < slots.slot_count(); s += blockDim.x) {
    slots.vacate(c, s, s);
  }
}

/// The engine over `heap_bytes` of device memory.
struct device_engine {
  explicit device_engine(std::size_t heap_bytes, unsigned slot_count)
      : slabs{static_cast<std::uint32_t>(heap_bytes >> slab_shift)} {
    set_members = slabs;
    CUDA_CHECK(cudaMalloc(&data, heap_bytes));
    CUDA_CHECK(cudaMalloc(&avail, slabs * sizeof(std::uint32_t)));
    CUDA_CHECK(cudaMalloc(&next, slabs * sizeof(std::uint32_t)));
    CUDA_CHECK(cudaMalloc(&classes, slabs * sizeof(std::uint32_t)));
    bit_bytes = std::size_t{slabs} * bitmap_words_for(class_capacity(0)) * sizeof(std::uint32_t);
    CUDA_CHECK(cudaMalloc(&bits, bit_bytes));
    std::size_t const set_bytes = std::size_t{2 * engine_classes} * slab_set_words(slabs) * 4;
    CUDA_CHECK(cudaMalloc(&listed, set_bytes));
    CUDA_CHECK(cudaMemset(listed, 0, set_bytes));
    CUDA_CHECK(cudaMalloc(&empty_heads, (empty_shards + 2) * sizeof(std::uint64_t)));
    std::vector<std::uint64_t> heads(empty_shards + 2, 0);  // the two counts last, zero
    for (unsigned i = 0; i < empty_shards; ++i) {
      heads[i] = i < slabs ? i : empty_slab_stack;  // slab i on top of shard i, tag 0
    }
    CUDA_CHECK(cudaMemcpy(empty_heads, heads.data(), heads.size() * sizeof(std::uint64_t),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMallocManaged(&stats, 2 * sizeof(unsigned long long)));
    stats[0] = stats[1] = 0;
    words.resize(std::size_t{slot_count} * engine_classes, vacant_class_slot);
    CUDA_CHECK(cudaMalloc(&slot_words, words.size() * sizeof(std::uint64_t)));
    CUDA_CHECK(cudaMemcpy(slot_words, words.data(), words.size() * sizeof(std::uint64_t),
                          cudaMemcpyHostToDevice));
    format_kernel<<<(slabs + 255) / 256, 256>>>(policy(), slabs);
    CUDA_CHECK(cudaDeviceSynchronize());
    slots_ = engine{policy(), slot_words, engine_classes, slot_count};
  }
  ~device_engine() {
    for (void* p :
         {static_cast<void*>(data), static_cast<void*>(avail), static_cast<void*>(next),
          static_cast<void*>(classes), static_cast<void*>(bits), static_cast<void*>(listed),
          static_cast<void*>(empty_heads), static_cast<void*>(slot_words)}) {
      cudaFree(p);
    }
    cudaFree(stats);
  }
  device_engine(device_engine const&) = delete;
  device_engine& operator=(device_engine const&) = delete;

  device_slabs policy() const {
    return {data, avail, next, classes, bits, listed, set_members, empty_heads, stats};
  }
  engine const& slots() const { return slots_; }

  /// Every slab is empty, or of a class with every block free (listed slabs may stay so).
  void require_all_free() {
    std::vector<std::uint32_t> a(slabs);
    std::vector<std::uint32_t> c(slabs);
    CUDA_CHECK(cudaMemcpy(a.data(), avail, slabs * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(c.data(), classes, slabs * 4, cudaMemcpyDeviceToHost));
    std::uint64_t not_free = 0;
    for (std::uint32_t id = 0; id < slabs; ++id) {
      if (c[id] < engine_classes && (a[id] & avail_count_mask) != class_capacity(c[id])) {
        ++not_free;
      }
    }
    CHECK(not_free == 0);
  }

  std::uint32_t slabs;
  std::uint32_t set_members = 0;
  std::size_t bit_bytes = 0;
  std::byte* data = nullptr;
  std::uint32_t* avail = nullptr;
  std::uint32_t* next = nullptr;
  std::uint32_t* classes = nullptr;
  std::uint32_t* bits = nullptr;
  std::uint32_t* listed = nullptr;
  std::uint64_t* empty_heads = nullptr;
  unsigned long long* stats = nullptr;
  std::uint64_t* slot_words = nullptr;
  std::vector<std::uint64_t> words;
  engine slots_{device_slabs{}, nullptr, 0, 1};
};

/// Runs `rounds` rounds of the steady churn with blocks of class `fixed` (-1: mixed) on a heap
/// of `heap_bytes` at `live` of it; prints the row and returns the counts.
churn_counts steady_churn(std::size_t heap_bytes, double live, int fixed, unsigned rounds) {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::uint32_t const slabs = static_cast<std::uint32_t>(heap_bytes >> slab_shift);
  // As many slots as keep the slots' slabs within an eighth of the heap's.
  unsigned slot_count = slabs / (engine_classes * 8);
  slot_count = slot_count < 1 ? 1 : (slot_count > static_cast<unsigned>(sms) ? sms : slot_count);
  device_engine heap{heap_bytes, slot_count};
  double mean = 0;
  for (unsigned c = 0; c < engine_classes; ++c) {
    mean += static_cast<double>(class_bytes(c)) / engine_classes;
  }
  if (fixed >= 0) {
    mean = static_cast<double>(class_bytes(static_cast<unsigned>(fixed)));
  }
  auto const threads =
      static_cast<std::uint32_t>(live * static_cast<double>(heap_bytes) / (2 * mean));
  std::byte** held = nullptr;
  std::uint8_t* held_class = nullptr;
  churn_counts* counts = nullptr;
  CUDA_CHECK(cudaMalloc(&held, std::size_t{threads} * 4 * sizeof(std::byte*)));
  CUDA_CHECK(cudaMemset(held, 0, std::size_t{threads} * 4 * sizeof(std::byte*)));
  CUDA_CHECK(cudaMalloc(&held_class, std::size_t{threads} * 4));
  CUDA_CHECK(cudaMallocManaged(&counts, sizeof(churn_counts)));
  *counts = {};
  cudaEvent_t start;
  cudaEvent_t stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  unsigned const blocks = (threads + 255) / 256 < 65535u * 16 ? (threads + 255) / 256 : 65535u * 16;
  std::vector<float> round_ms;
  float ms = 0;
  for (unsigned r = 0; r < rounds; ++r) {
    CUDA_CHECK(cudaEventRecord(start));
    churn_kernel<<<blocks, 256>>>(heap.slots(), held, held_class, threads, r, fixed, counts);
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    round_ms.push_back(t);
    ms += t;
  }
  CUDA_CHECK(cudaGetLastError());
  std::vector<float> sorted = round_ms;
  std::sort(sorted.begin(), sorted.end());
  std::printf(
      "  rounds: first %.3f ms, median %.3f ms, max %.3f ms, last %.3f ms; installs from "
      "empty slabs %llu, slabs emptied %llu\n",
      round_ms.front(), sorted[sorted.size() / 2], sorted.back(), round_ms.back(), heap.stats[0],
      heap.stats[1]);
  churn_counts const result = *counts;
  double const ops = static_cast<double>(result.allocations + result.frees);
  std::printf(
      "engine churn %4zu MiB live %2.0f%% class %2d: %9u threads, %u rounds, %.3f ms/round, "
      "%.3f G ops/s, %llu failed of %llu allocations, %llu bad blocks, %u slots\n",
      heap_bytes >> 20, live * 100, fixed, threads, rounds, ms / rounds, ops / (ms * 1e6),
      result.failures, result.allocations + result.failures, result.bad_blocks, slot_count);
  free_all_kernel<<<1024, 256>>>(heap.slots(), held, held_class, std::size_t{threads} * 4);
  vacate_kernel<<<engine_classes, 64>>>(heap.slots());
  CUDA_CHECK(cudaDeviceSynchronize());
  heap.require_all_free();
  cudaFree(held);
  cudaFree(held_class);
  cudaFree(counts);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return result;
}

/// Each thread allocates one block of class `fixed` (mixed when -1) and tags it.
__global__ void warp_alloc_kernel(
    engine slots, std::byte** out, std::uint32_t n, int fixed, unsigned long long* failures) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  unsigned const c = class_for(fixed, i, 0, 0);
  unsigned const sm = this_sm();
  unsigned failed = 0;
  std::byte* const p = warp_allocate(slots, c, sm % slots.slot_count(), sm, failed);
  if (failed != 0) {
    atomicAdd(failures, failed);
  }
  if (p != nullptr) {
    auto* words = reinterpret_cast<std::uint32_t*>(p);
    words[0] = i;
    words[class_bytes(c) / 4 - 1] = ~i;
  }
  out[i] = p;
}

__global__ void check_kernel(std::byte* const* blocks,
                             std::uint32_t n,
                             int fixed,
                             unsigned long long* bad) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  unsigned const c = class_for(fixed, i, 0, 0);
  auto const* words = reinterpret_cast<std::uint32_t const*>(blocks[i]);
  if (words == nullptr || words[0] != i || words[class_bytes(c) / 4 - 1] != ~i ||
      reinterpret_cast<std::uintptr_t>(words) % class_bytes(c) != 0) {
    atomicAdd(bad, 1ull);
  }
}

__global__ void warp_free_kernel(engine slots,
                                 std::byte* const* blocks,
                                 std::uint32_t n,
                                 int fixed) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  device_slabs const& s = slots.slabs();
  std::byte* const p = blocks[i];
  unsigned const c = class_for(fixed, i, 0, 0);
  unsigned const callers = __activemask();
  __syncwarp(callers);
  release_fence();
  std::size_t const off = static_cast<std::size_t>(p - s.base);
  warp_free(slots, static_cast<std::uint32_t>(off >> slab_shift), c,
            static_cast<std::uint32_t>((off & (slab_bytes - 1)) >> (c + 4)), p != nullptr,
            this_sm(), callers);
}

/// The bump-pointer floor: one warp-aggregated atomic on one counter, blocks never freed.
__global__ void floor_alloc_kernel(
    std::byte* base, unsigned long long* top, std::byte** out, std::uint32_t n, int fixed) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  unsigned const c = class_for(fixed, i, 0, 0);
  unsigned const bytes = static_cast<unsigned>(class_bytes(c));
  unsigned const active = __activemask();
  unsigned const below = __popc(active & ((1u << (threadIdx.x % 32)) - 1));
  unsigned total = __reduce_add_sync(active, bytes);
  unsigned const leader = __ffs(active) - 1;
  unsigned long long start = 0;
  // Each lane's offset: the sizes of the lanes below it (sizes are powers of two >= 16, and a
  // 4 KiB block may follow a 16 B one: offsets stay 16-aligned, as the floor promises).
  unsigned offset = 0;
  for (unsigned l = 0; l < 32; ++l) {
    unsigned const b = __shfl_sync(active, bytes, l);
    if ((active >> l & 1u) != 0 && l < threadIdx.x % 32) {
      offset += b;
    }
  }
  (void)below;
  if (threadIdx.x % 32 == leader) {
    start = atomicAdd(top, static_cast<unsigned long long>(total));
  }
  start = __shfl_sync(active, start, leader);
  std::byte* p = base + start + offset;
  reinterpret_cast<std::uint32_t*>(p)[0] = i;
  out[i] = p;
}

float time_kernel(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms;
}

TEST_CASE("the reuse path's warp paths on a warm heap, beside the bump-pointer floor",
          "[reuse][big][timing]") {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::uint32_t const n = 1u << 20;
  device_engine heap{std::size_t{8} << 30, static_cast<unsigned>(sms)};
  std::byte** blocks = nullptr;
  std::byte* floor_base = nullptr;
  unsigned long long* counters = nullptr;  // failures, bad, floor top
  CUDA_CHECK(cudaMalloc(&blocks, n * sizeof(std::byte*)));
  CUDA_CHECK(cudaMalloc(&floor_base, std::size_t{5} << 30));
  CUDA_CHECK(cudaMallocManaged(&counters, 3 * sizeof(unsigned long long)));
  cudaEvent_t e[4];
  for (auto& ev : e) {
    CUDA_CHECK(cudaEventCreate(&ev));
  }
  for (int fixed : {0, 4, 8, -1}) {
    std::vector<float> alloc_ms;
    std::vector<float> free_ms;
    std::vector<float> floor_ms;
    counters[0] = counters[1] = 0;
    for (int run = 0; run < 5; ++run) {
      counters[2] = 0;
      CUDA_CHECK(cudaEventRecord(e[0]));
      warp_alloc_kernel<<<n / 256, 256>>>(heap.slots(), blocks, n, fixed, &counters[0]);
      CUDA_CHECK(cudaEventRecord(e[1]));
      check_kernel<<<n / 256, 256>>>(blocks, n, fixed, &counters[1]);
      CUDA_CHECK(cudaEventRecord(e[2]));
      warp_free_kernel<<<n / 256, 256>>>(heap.slots(), blocks, n, fixed);
      CUDA_CHECK(cudaEventRecord(e[3]));
      CUDA_CHECK(cudaEventSynchronize(e[3]));
      alloc_ms.push_back(time_kernel(e[0], e[1]));
      free_ms.push_back(time_kernel(e[2], e[3]));
      CUDA_CHECK(cudaEventRecord(e[0]));
      floor_alloc_kernel<<<n / 256, 256>>>(floor_base, &counters[2], blocks, n, fixed);
      CUDA_CHECK(cudaEventRecord(e[1]));
      CUDA_CHECK(cudaEventSynchronize(e[1]));
      floor_ms.push_back(time_kernel(e[0], e[1]));
    }
    CUDA_CHECK(cudaGetLastError());
    std::sort(alloc_ms.begin(), alloc_ms.end());
    std::sort(free_ms.begin(), free_ms.end());
    std::sort(floor_ms.begin(), floor_ms.end());
    std::printf(
        "engine warp paths, 2^20 threads, class %2d (warm, 5 runs): allocate %.1f us, free %.1f "
        "us, floor allocate %.1f us: allocation at %.2fx the floor\n",
        fixed, alloc_ms[2] * 1e3, free_ms[2] * 1e3, floor_ms[2] * 1e3, floor_ms[2] / alloc_ms[2]);
    CHECK(counters[0] == 0);
    CHECK(counters[1] == 0);
  }
  vacate_kernel<<<engine_classes, 64>>>(heap.slots());
  CUDA_CHECK(cudaDeviceSynchronize());
  heap.require_all_free();
  for (auto& ev : e) {
    cudaEventDestroy(ev);
  }
  cudaFree(blocks);
  cudaFree(floor_base);
  cudaFree(counters);
}

TEST_CASE("the reuse path serves a steady churn at 80% of a 512 MiB heap without failing",
          "[reuse][big][timing]") {
  std::vector<int> rows{0, 2, 8, -1};                        // 16 B, 64 B, 4 KiB, mixed
  if (char const* only = std::getenv("DEVMR_ENGINE_ROW")) {  // one row, for a profiler
    rows = {std::atoi(only)};
  }
  for (int fixed : rows) {
    churn_counts const got = steady_churn(std::size_t{512} << 20, 0.8, fixed, 100);
    CHECK(got.failures == 0);
    CHECK(got.bad_blocks == 0);
    CHECK(got.allocations > 0);
  }
}

TEST_CASE("the reuse path churns a small heap under compute-sanitizer", "[reuse]") {
  for (int fixed : {0, 8, -1}) {
    churn_counts const got = steady_churn(std::size_t{64} << 20, 0.8, fixed, 20);
    CHECK(got.failures == 0);
    CHECK(got.bad_blocks == 0);
  }
}

}  // namespace reuse_engine_test
