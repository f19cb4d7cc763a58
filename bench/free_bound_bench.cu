// What a free that recycles slabs by count must cost at least, beside what devmr's free costs, in
// one run: heap_bench's free kernel (each thread frees its block and clears its pointer) over the
// blocks a devmr heap handed out, with the free replaced by less and less of one.
//
//   launch: the thread clears its pointer and loads nothing: what heap_bench's floor free times
//           when the compiler drops the load of a pointer that it does not use.
//   floor:  heap_bench's floor free: the pointer is loaded and looked at (a free must know where
//           the block lies), and the thread clears its pointer.
//   fence:  + the release that every free needs before its block may go to another thread: the
//           warp's lanes meet (`__syncwarp`), then one `fence.release.gpu`, issued as devmr
//           issues it, right after the load.
//   red:    + one `red.relaxed.gpu.add` per 1 MiB slab that the warp's blocks lie in, on a count of
//           its own (128 bytes apart, as devmr's slab metadata), from one lane per slab
//           (`__match_any_sync`): a count that no free waits for.
//   atom:   the same with `atom`, whose result the lane waits for: a free must see it, to know
//           whether it emptied the slab. The least that a free of this design does.
//   devmr:  `slab_ref::deallocate`: `atom`, and the lookup of the slab by address, and the mark
//           of each slab it empties.
//   group:  a design that is not devmr's: `fence`, then one `atom` per group of 32 warps (by
//           warp index), as if each warp's blocks, whatever their sizes, lay in one slab that the
//           next 31 warps' blocks share (1 KiB blocks fill a slab so). The least that a free
//           does where slabs hold blocks of several sizes.
//   classes: `group`, and one `red.add` per size class of the warp's blocks on a count of the
//           group's class, in the same 128-byte line as the group's count: what such slabs
//           would also need to keep the statistics per size class exact.
//   packed: `group`, with the per-class counts two to a 32-bit word (16 bits each): the warp sums
//           each word's part over its lanes (`__reduce_add_sync`, five words for nine classes),
//           and one instruction adds them, a `red.add` from each of up to five lanes, in the
//           group's line. Exact while no class of a group holds 65536 blocks or more.
//   vector: `group`, with the group's count and the nine per-class counts as the f32 lanes of
//           three 16-byte vectors in one line (floats hold counts exactly below 2^24): the warp
//           counts each class (`__ballot_sync`), one lane adds {count, classes 0-2} by
//           `atom.add.v4.f32` and waits for it, and up to two lanes add classes 3-6 and 7-8 by
//           `red.add.v4.f32` (sm_90 has both as one instruction each).
//   per1, per2, per3: `group`, with one slab per group for each size class (per1), for each two
//           classes (16 and 32 B, 64 and 128 B, ...: per2) or for each three (per3): one `atom`
//           per slab that the warp's blocks lie in, each count in a line of its own. per1 lays
//           the blocks out as devmr does and checks the emulation against `atom`; per2 and per3
//           bound slabs that hold two or three classes, whose per-class counts would be fields of
//           the one word (a 64-bit add changes them all).
// Rows: 2^16, 2^20 and 2^22 threads, 256-thread blocks; 16 B, 256 B, 1 KiB, 4 KiB and mixed sizes
// (16 << (hash(i) % 9) bytes, as heap_bench's mixed rows). Each run: the heap is reset, one kernel
// allocates every block, a copy of the pointers is kept (untimed); before each kernel the
// pointers are copied back (untimed). Median of 5 runs of each kernel, timed with CUDA events;
// each probe's time against the floor's from the same run.
//
// Exit status: 0 measured, every block freed; 1 an allocation failed, a block was left, or a
// CUDA/devmr call failed; 2 no GPU.

#include "block_sizes.hpp"
#include "device_line.hpp"
#include "event_timer.hpp"

#include <devmr/pool_resource.hpp>
#include <devmr/slab_heap.hpp>
#include <devmr/slab_ref.hpp>

#include <cuda_runtime_api.h>
#include <cuda/ptx>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

namespace {

using devmr_bench::block_size;
using devmr_bench::mixed_size;

constexpr std::size_t gib = std::size_t{1} << 30;
constexpr std::size_t mib = std::size_t{1} << 20;
constexpr unsigned block_threads = 256;
constexpr unsigned counter_stride = 32;  // 128 bytes
constexpr unsigned counter_slots = 1u << 16;
constexpr int runs = 5;

enum class probe : int {
  launch,
  floor,
  fence,
  red,
  atom,
  devmr,
  group,
  classes,
  packed,
  vector,
  per1,
  per2,
  per3,
  count
};
constexpr std::array<char const*, static_cast<int>(probe::count)> probe_names{
    "launch",  "floor",  "fence",  "red",  "atom", "devmr", "group",
    "classes", "packed", "vector", "per1", "per2", "per3"};
constexpr unsigned warps_per_group = 32;

__global__ void alloc_kernel(devmr::slab_ref<> ref, void** ptrs, unsigned n, unsigned size_arg) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    ptrs[i] = ref.allocate(block_size(i, size_arg));
  }
}

__device__ unsigned lane_id() {
  unsigned lane = 0;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

/// Adds to `counter` the number of this warp's active lanes with the same `key`, from the first
/// of them: by `red`, or (Wait) by `atom`, whose result the lane uses (`ptrs[n]` as below).
template <bool Wait>
__device__ void add_per_key(unsigned key, unsigned* counter, void** ptrs, unsigned n, void* p) {
  unsigned const peers = __match_any_sync(__activemask(), key);
  if (lane_id() != static_cast<unsigned>(__ffs(static_cast<int>(peers)) - 1)) {
    return;
  }
  auto const count = static_cast<unsigned>(__popc(peers));
  if constexpr (Wait) {
    unsigned old = 0;
    asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;"
                 : "=r"(old)
                 : "l"(counter), "r"(count)
                 : "memory");
    if (old == 0xffffffffu) {  // never (the counts start at zero and stay far below)
      ptrs[n] = p;
    }
  } else {
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;"
                 :
                 : "l"(counter), "r"(count)
                 : "memory");
  }
}

/// The size class of thread `i`'s block (a power of two from 16 B): log2(size) - 4, at most 8.
__device__ unsigned size_class(unsigned i, unsigned size_arg) {
  return 27u - static_cast<unsigned>(__clz(block_size(i, size_arg)));
}

/// The count of the warp's group and its per-class counts, three 16-byte vectors of floats at
/// `line` (see `vector` above): lane 0 adds {blocks, classes 0-2} and waits for the result;
/// lanes 1 and 2 add classes 3-6 and 7-8 where the warp has any. The counts start at zero.
__device__ void add_vectors(unsigned cls, float* line, void** ptrs, unsigned n, void* p) {
  unsigned const callers = __activemask();
  float sums[12] = {};
  sums[0] = static_cast<float>(__popc(callers));
  for (unsigned c = 0; c < 9u; ++c) {
    sums[1 + c] = static_cast<float>(__popc(__ballot_sync(callers, cls == c)));
  }
  unsigned const lane = lane_id();
  if (lane == 0) {
    float old[4];
    asm volatile("atom.relaxed.gpu.global.add.v4.f32 {%0, %1, %2, %3}, [%4], {%5, %6, %7, %8};"
                 : "=f"(old[0]), "=f"(old[1]), "=f"(old[2]), "=f"(old[3])
                 : "l"(line), "f"(sums[0]), "f"(sums[1]), "f"(sums[2]), "f"(sums[3])
                 : "memory");
    if (old[0] < 0.0f) {  // never (the counts start at zero and only grow)
      ptrs[n] = p;
    }
  } else if (lane < 3u) {
    unsigned const v = lane * 4u;
    if (sums[v] + sums[v + 1] + sums[v + 2] + sums[v + 3] != 0.0f) {
      asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                   :
                   : "l"(line + v), "f"(sums[v]), "f"(sums[v + 1]), "f"(sums[v + 2]),
                     "f"(sums[v + 3])
                   : "memory");
    }
  }
}

/// One probe over the pointers: `Probe` is the part of a free that it keeps. `ptrs[n]` is a slot
/// that only a result that never comes would write (so that the compiler keeps what yields it).
template <probe Probe>
__global__ void probe_kernel(
    void** ptrs, unsigned n, unsigned size_arg, unsigned* counters, float* float_counters) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  if constexpr (Probe == probe::launch) {
    ptrs[i] = nullptr;
    return;
  }
  void* p = ptrs[i];
  [[maybe_unused]] unsigned const group = i / 32 / warps_per_group;  // the probes of groups
  if constexpr (Probe != probe::floor) {
    __syncwarp(__activemask());
    cuda::ptx::fence(cuda::ptx::sem_release, cuda::ptx::scope_gpu);
  }
  asm volatile("" : "+l"(p));
  if (p == nullptr) {  // never (every allocation succeeded): the value is used
    ptrs[n] = p;
  }
  if constexpr (Probe == probe::group || Probe == probe::classes || Probe == probe::packed) {
    unsigned* const counter = counters + (group % counter_slots) * counter_stride;
    add_per_key<true>(group, counter, ptrs, n, p);
    if constexpr (Probe == probe::classes) {
      unsigned const cls = size_class(i, size_arg);
      add_per_key<false>(group * 16u + cls, counter + 1 + cls, ptrs, n, p);
    }
    if constexpr (Probe == probe::packed) {
      unsigned const cls = size_class(i, size_arg);
      unsigned const callers = __activemask();
      unsigned const part = 1u << (cls % 2u * 16u);
      unsigned mine = 0;  // lane w: the sum of word w over the warp
      for (unsigned w = 0; w < 5u; ++w) {
        unsigned const sum = __reduce_add_sync(callers, cls / 2u == w ? part : 0u);
        mine = lane_id() == w ? sum : mine;
      }
      if (mine != 0u) {
        asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;"
                     :
                     : "l"(counter + 1 + lane_id()), "r"(mine)
                     : "memory");
      }
    }
  }
  if constexpr (Probe == probe::vector) {
    add_vectors(size_class(i, size_arg), float_counters + (group % counter_slots) * counter_stride,
                ptrs, n, p);
  }
  if constexpr (Probe == probe::per1 || Probe == probe::per2 || Probe == probe::per3) {
    constexpr unsigned classes_per_slab = Probe == probe::per1   ? 1u
                                          : Probe == probe::per2 ? 2u
                                                                 : 3u;
    unsigned const slab = group * 16u + size_class(i, size_arg) / classes_per_slab;
    add_per_key<true>(slab, counters + (slab % counter_slots) * counter_stride, ptrs, n, p);
  }
  if constexpr (Probe == probe::red || Probe == probe::atom) {
    auto const slab = static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(p) >> 20);
    add_per_key<Probe == probe::atom>(slab, counters + (slab % counter_slots) * counter_stride,
                                      ptrs, n, p);
  }
  ptrs[i] = nullptr;
}

__global__ void free_kernel(devmr::slab_ref<> ref, void** ptrs, unsigned n, unsigned size_arg) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    ref.deallocate(ptrs[i], block_size(i, size_arg));
    ptrs[i] = nullptr;
  }
}

__global__ void count_nulls(void* const* ptrs, unsigned n, unsigned* nulls) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && ptrs[i] == nullptr) {
    atomicAdd(nulls, 1u);
  }
}

float median(std::vector<float> ms) {
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

class bench {
 public:
  bench() {
    DEVMR_CUDA_TRY(cudaMalloc(&ptrs_, (max_threads + 1) * sizeof(void*)));
    DEVMR_CUDA_TRY(cudaMalloc(&saved_, max_threads * sizeof(void*)));
    DEVMR_CUDA_TRY(cudaMalloc(&counters_, counter_slots * counter_stride * sizeof(unsigned)));
    DEVMR_CUDA_TRY(cudaMemset(counters_, 0, counter_slots * counter_stride * sizeof(unsigned)));
    DEVMR_CUDA_TRY(cudaMalloc(&float_counters_, counter_slots * counter_stride * sizeof(float)));
    DEVMR_CUDA_TRY(cudaMemset(float_counters_, 0, counter_slots * counter_stride * sizeof(float)));
    DEVMR_CUDA_TRY(cudaMalloc(&nulls_, sizeof(unsigned)));
  }
  ~bench() {
    cudaFree(nulls_);
    cudaFree(float_counters_);
    cudaFree(counters_);
    cudaFree(saved_);
    cudaFree(ptrs_);
  }
  bench(bench const&) = delete;
  bench& operator=(bench const&) = delete;

  /// One row; false when an allocation failed or a block was left after the free.
  bool row(unsigned log2_threads, unsigned size_arg) {
    unsigned const n = 1u << log2_threads;
    unsigned const grid = (n + block_threads - 1) / block_threads;
    std::array<std::vector<float>, static_cast<int>(probe::count)> ms;
    bool ok = true;
    for (int r = 0; r < runs; ++r) {
      heap_.reset();
      DEVMR_CUDA_TRY(cudaMemset(nulls_, 0, sizeof(unsigned)));
      alloc_kernel<<<grid, block_threads>>>(heap_.ref(), ptrs_, n, size_arg);
      count_nulls<<<grid, block_threads>>>(ptrs_, n, nulls_);
      DEVMR_CUDA_TRY(cudaMemcpy(saved_, ptrs_, n * sizeof(void*), cudaMemcpyDeviceToDevice));
      time_probes<probe::launch, probe::floor, probe::fence, probe::red, probe::atom, probe::group,
                  probe::classes, probe::packed, probe::vector, probe::per1, probe::per2,
                  probe::per3>(ms, grid, n, size_arg);
      restore(n);
      ms[static_cast<int>(probe::devmr)].push_back(timer_.time_ms(
          [&] { free_kernel<<<grid, block_threads>>>(heap_.ref(), ptrs_, n, size_arg); }));
      unsigned nulls = 0;
      DEVMR_CUDA_TRY(cudaMemcpy(&nulls, nulls_, sizeof(nulls), cudaMemcpyDeviceToHost));
      auto const s = heap_.stats();
      if (nulls != 0 || s.blocks_in_use != 0) {
        std::fprintf(stderr, "free_bound_bench: 2^%u threads: %u nullptrs, %llu blocks left\n",
                     log2_threads, nulls, static_cast<unsigned long long>(s.blocks_in_use));
        ok = false;
      }
    }
    char size[16];
    if (size_arg == mixed_size) {
      std::snprintf(size, sizeof(size), "mixed");
    } else {
      std::snprintf(size, sizeof(size), "%u B", size_arg);
    }
    double const floor = median(ms[static_cast<int>(probe::floor)]);
    std::printf("2^%-5u %-7s", log2_threads, size);
    for (auto const& m : ms) {
      std::printf(" %8.2f", static_cast<double>(n) / (median(m) * 1e6));
    }
    for (auto const& m : ms) {
      std::printf(" %6.2f", floor / median(m));
    }
    std::printf("\n");
    return ok;
  }

 private:
  static constexpr unsigned max_threads = 1u << 22;

  /// The pointers as the allocation left them (every probe clears them).
  void restore(unsigned n) {
    DEVMR_CUDA_TRY(cudaMemcpy(ptrs_, saved_, n * sizeof(void*), cudaMemcpyDeviceToDevice));
  }

  template <probe Probe>
  void time_probe(std::array<std::vector<float>, static_cast<int>(probe::count)>& ms,
                  unsigned grid,
                  unsigned n,
                  unsigned size_arg) {
    restore(n);
    ms[static_cast<int>(Probe)].push_back(timer_.time_ms([&] {
      probe_kernel<Probe><<<grid, block_threads>>>(ptrs_, n, size_arg, counters_, float_counters_);
    }));
  }

  /// time_probe for each of `Probes`, in that order.
  template <probe... Probes>
  void time_probes(std::array<std::vector<float>, static_cast<int>(probe::count)>& ms,
                   unsigned grid,
                   unsigned n,
                   unsigned size_arg) {
    (time_probe<Probes>(ms, grid, n, size_arg), ...);
  }

  devmr::device_pool pool_{devmr::pool_options{.initial_bytes = 24 * gib + 64 * mib}};
  devmr::slab_heap<> heap_{pool_, devmr::heap_options{.initial_bytes = 24 * gib}};
  devmr_bench::event_timer timer_;
  void** ptrs_ = nullptr;
  void** saved_ = nullptr;  ///< the pointers the allocation kernel wrote
  unsigned* counters_ = nullptr;
  float* float_counters_ = nullptr;  ///< the `vector` probe's counts
  unsigned* nulls_ = nullptr;
};

int run() {
  if (!devmr_bench::open_device(
          "free_bound_bench",
          "free_bound_bench (what a free that releases costs at least, beside devmr's)")) {
    return 2;
  }
  std::printf("%-7s %-7s", "threads", "size");
  for (char const* name : probe_names) {
    std::printf(" %8s", name);
  }
  for (char const* name : probe_names) {
    std::printf(" %6s", name);
  }
  std::printf("\n%-15s %s %s\n", "", "G frees/s (median of 5) for each probe, then",
              "the floor's time over each probe's (1 = the floor)");
  bench b;
  bool ok = true;
  for (unsigned const log2_threads : {16u, 20u, 22u}) {
    for (unsigned const size : {16u, 256u, 1024u, 4096u, mixed_size}) {
      ok = b.row(log2_threads, size) && ok;
    }
  }
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (std::exception const& e) {
    std::fprintf(stderr, "free_bound_bench: %s\n", e.what());
    return 1;
  }
}
