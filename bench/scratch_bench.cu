// Per-thread scratch memory (devmr::scratch) against the same kernel with CUDA's device malloc and
// with a static preallocation that gives every thread the largest size, and the cost of calling
// the slab heap through device_resource_ref instead of slab_ref. One run, on the GPU:
//
//   scratch rows: 2^20 threads in 256-thread blocks; thread i needs scratch_bytes(i) bytes, drawn
//   uniformly from 16 B to 4 KiB (a multiple of 4); one kernel in which each thread gets its
//   buffer, writes a tag at its first and last word, reads both back (a mismatch is counted), and
//   frees it. Median of 5 runs, each timed with CUDA events behind the hold kernel
//   (event_timer.hpp); the heap is reset before each devmr run, as heap_bench does.
//   Footprint: what each strategy holds while every thread's buffer is live at once. devmr: the
//   heap's bytes in use (block sizes) after a kernel that allocates every buffer and keeps it,
//   with the slabs that hold them (from stats(): a slab counts for each of its two classes that
//   has blocks in it, so the slab bytes lie between the two figures printed); static: 4 KiB per
//   thread; CUDA malloc: not observable (its heap limit is printed).
//
//   device_resource_ref rows: 2^20 threads, sizes 16, 64, 256, 1024, 4096 B and mixed (16 <<
//   (fmix32(i) % 9)), heap_bench's alloc and free kernels (allocate and tag once; free once),
//   through slab_ref and through device_resource_ref<device_accessible> over the same heap; median
//   of 5 each.
//
// Targets: devmr scratch >= 1000x CUDA malloc's rate; devmr footprint (bytes in use) <= 1.5x the
// bytes requested; device_resource_ref time <= 1.2x slab_ref's on every alloc and free row.
//
// Exit status: 0 every check and target passed; 1 a check failed (a tag, a nullptr, a block left
// in the heap) or a target was missed, or a CUDA/devmr error; 2 no GPU; 64 bad command line.

#include "block_sizes.hpp"
#include "event_timer.hpp"

#include <devmr/device_resource_ref.hpp>
#include <devmr/pool_resource.hpp>
#include <devmr/scratch.hpp>
#include <devmr/slab_heap.hpp>
#include <devmr/slab_ref.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

namespace {

using devmr_bench::block_size;
using devmr_bench::fmix32;
using devmr_bench::mixed_size;

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t gib = std::size_t{1} << 30;

constexpr unsigned threads = 1u << 20;
constexpr unsigned block_threads = 256;
constexpr unsigned grid = threads / block_threads;
constexpr unsigned min_scratch_bytes = 16;
constexpr unsigned max_scratch_bytes = 4096;

/// devmr: every buffer live at once needs ~2.8 GiB of blocks; 8 GiB leaves every SM its slots.
constexpr std::size_t heap_bytes = 8 * gib;
constexpr std::size_t heap_pool_bytes = heap_bytes + 64 * mib;
/// CUDA malloc's heap limit, set before the first kernel.
constexpr std::size_t malloc_heap_bytes = 8 * gib;
/// CUDA malloc kernels give up past this (every later call is skipped and counted).
constexpr unsigned long long malloc_kernel_budget_ns = 5'000'000'000ull;
constexpr float malloc_slow_ms = 2000.0f;

constexpr double malloc_ratio_target = 1000.0;
constexpr double footprint_target = 1.5;
constexpr double erased_target = 1.2;

/// The bytes of thread i's scratch: uniform in [16, 4096], a multiple of 4.
__host__ __device__ constexpr unsigned scratch_bytes(unsigned i) {
  return (min_scratch_bytes +
          fmix32(i ^ 0x9e3779b9u) % (max_scratch_bytes - min_scratch_bytes + 1)) &
         ~3u;
}

__host__ __device__ constexpr std::uint32_t first_tag(unsigned i) {
  return fmix32(i) | 1u;
}
__host__ __device__ constexpr std::uint32_t last_tag(unsigned i) {
  return ~fmix32(i);
}

/// Counters the kernels write; zeroed before each run.
struct run_counters {
  unsigned long long tag_errors;
  unsigned long long nulls;
  unsigned long long abandoned;    ///< CUDA malloc calls skipped past the deadline
  unsigned long long deadline_ns;  ///< %globaltimer value past which CUDA malloc calls give up
};

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// What every strategy does with its buffer: tags the first and last word, reads them back.
__device__ void use_buffer(std::uint32_t* words, unsigned count, unsigned i, run_counters* c) {
  volatile std::uint32_t* const v = words;
  v[0] = first_tag(i);
  v[count - 1] = last_tag(i);
  if (v[0] != first_tag(i) || v[count - 1] != last_tag(i)) {
    atomicAdd(&c->tag_errors, 1ull);
  }
}

// ---- the three strategies of the scratch rows, as functors the kernel takes by value

/// devmr::scratch over the slab heap: allocated at construction, freed at scope exit.
struct devmr_strategy {
  devmr::slab_ref<> heap;
  __device__ void run(unsigned i, unsigned count, run_counters* c) const {
    devmr::scratch<std::uint32_t, devmr::slab_ref<>> buffer{heap, count};
    if (!buffer) {
      atomicAdd(&c->nulls, 1ull);
      return;
    }
    use_buffer(buffer.data(), count, i, c);
  }
};

/// CUDA's device malloc and free, with heap_bench's deadline: past it, calls are skipped.
struct malloc_strategy {
  __device__ void run(unsigned i, unsigned count, run_counters* c) const {
    if (global_timer_ns() > c->deadline_ns) {
      atomicAdd(&c->abandoned, 1ull);
      return;
    }
    auto* p = static_cast<std::uint32_t*>(malloc(count * sizeof(std::uint32_t)));
    if (p == nullptr) {
      atomicAdd(&c->nulls, 1ull);
      return;
    }
    use_buffer(p, count, i, c);
    free(p);
  }
};

/// A static preallocation: every thread owns the largest size, at a fixed place.
struct static_strategy {
  std::uint32_t* base;
  __device__ void run(unsigned i, unsigned count, run_counters* c) const {
    use_buffer(base + std::size_t{i} * (max_scratch_bytes / 4), count, i, c);
  }
};

template <class Strategy>
__global__ void scratch_kernel(Strategy strategy, run_counters* c) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < threads) {
    strategy.run(i, scratch_bytes(i) / 4, c);
  }
}

/// Every thread allocates its scratch size and keeps it (the footprint of every buffer live).
__global__ void keep_kernel(devmr::slab_ref<> heap, void** ptrs, run_counters* c) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < threads) {
    void* const p = heap.allocate(scratch_bytes(i), 16);
    if (p == nullptr) {
      atomicAdd(&c->nulls, 1ull);
    }
    ptrs[i] = p;
  }
}

__global__ void release_kernel(devmr::slab_ref<> heap, void** ptrs) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < threads) {
    heap.deallocate(ptrs[i], scratch_bytes(i), 16);
  }
}

__global__ void set_deadline_kernel(run_counters* c, unsigned long long budget_ns) {
  c->deadline_ns = global_timer_ns() + budget_ns;
}

// ---- the device_resource_ref rows: heap_bench's alloc and free kernels over any ref

template <class Ref>
__global__ void alloc_kernel(Ref ref, void** ptrs, unsigned size_arg) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= threads) {
    return;
  }
  unsigned const bytes = block_size(i, size_arg);
  void* const p = ref.allocate(bytes, 16);
  if (p != nullptr) {
    auto* const words = static_cast<std::uint32_t*>(p);
    words[0] = first_tag(i);
    words[bytes / 4u - 1u] = last_tag(i);
  }
  ptrs[i] = p;
}

__global__ void check_kernel(void* const* ptrs, unsigned size_arg, run_counters* c) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= threads) {
    return;
  }
  auto const* const words = static_cast<std::uint32_t const*>(ptrs[i]);
  if (words == nullptr) {
    atomicAdd(&c->nulls, 1ull);
    return;
  }
  unsigned const bytes = block_size(i, size_arg);
  if (words[0] != first_tag(i) || words[bytes / 4u - 1u] != last_tag(i)) {
    atomicAdd(&c->tag_errors, 1ull);
  }
}

template <class Ref>
__global__ void free_kernel(Ref ref, void** ptrs, unsigned size_arg) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= threads) {
    return;
  }
  ref.deallocate(ptrs[i], block_size(i, size_arg), 16);
  ptrs[i] = nullptr;
}

// ---- host side

std::optional<float> median(std::vector<float> v) {
  if (v.empty()) {
    return std::nullopt;
  }
  std::sort(v.begin(), v.end());
  std::size_t const m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5f * (v[m - 1] + v[m]);
}

struct options {
  int reps = 5;
  bool no_malloc = false;
};

[[noreturn]] void usage(char const* argv0, int status) {
  std::fprintf(status == 0 ? stdout : stderr,
               "usage: %s [--quick] [--no-malloc]\n"
               "  --quick      3 runs per kernel instead of 5\n"
               "  --no-malloc  leave out CUDA's device malloc (no ratio to it is checked)\n",
               argv0);
  std::exit(status);
}

class scratch_bench {
 public:
  scratch_bench(options const& opts, devmr::slab_heap<>& heap) : opts_{opts}, heap_{heap} {
    DEVMR_CUDA_TRY(cudaMalloc(&ptrs_, sizeof(void*) * threads));
    DEVMR_CUDA_TRY(cudaMalloc(&counters_, sizeof(run_counters)));
    DEVMR_CUDA_TRY(cudaMalloc(&static_buffer_, std::size_t{threads} * max_scratch_bytes));
  }
  ~scratch_bench() {
    cudaFree(static_buffer_);
    cudaFree(counters_);
    cudaFree(ptrs_);
  }
  scratch_bench(scratch_bench const&) = delete;
  scratch_bench& operator=(scratch_bench const&) = delete;

  /// Runs everything, prints the tables; false when a check failed or a target was missed.
  bool run() {
    warm_up();
    bool ok = scratch_rows();
    ok = erased_rows() && ok;
    return ok;
  }

 private:
  void zero_counters() { DEVMR_CUDA_TRY(cudaMemset(counters_, 0, sizeof(run_counters))); }
  run_counters read_counters() {
    run_counters c{};
    DEVMR_CUDA_TRY(cudaMemcpy(&c, counters_, sizeof(c), cudaMemcpyDeviceToHost));
    return c;
  }
  void reset_heap() {
    heap_.reset();
    DEVMR_CUDA_TRY(cudaDeviceSynchronize());
  }

  /// One untimed run of each kernel, so that no timed run pays for lazy setup.
  void warm_up() {
    zero_counters();
    scratch_kernel<<<grid, block_threads>>>(devmr_strategy{heap_.ref()}, counters_);
    scratch_kernel<<<grid, block_threads>>>(static_strategy{static_buffer_}, counters_);
    alloc_kernel<<<grid, block_threads>>>(heap_.ref(), ptrs_, 64);
    free_kernel<<<grid, block_threads>>>(
        devmr::device_resource_ref<cuda::mr::device_accessible>{heap_.ref()}, ptrs_, 64);
    if (!opts_.no_malloc) {
      set_deadline_kernel<<<1, 1>>>(counters_, malloc_kernel_budget_ns);
      scratch_kernel<<<64, block_threads>>>(malloc_strategy{}, counters_);
    }
    DEVMR_CUDA_TRY(cudaGetLastError());
    DEVMR_CUDA_TRY(cudaDeviceSynchronize());
    reset_heap();
  }

  struct timing {
    std::vector<float> ms;
    run_counters counters{};  ///< summed over the runs
    bool timed_out = false;
  };

  template <class Strategy>
  timing time_scratch(Strategy strategy, bool devmr_heap, bool malloc_deadline) {
    timing t;
    for (int rep = 0; rep < opts_.reps; ++rep) {
      if (devmr_heap) {
        reset_heap();
      }
      zero_counters();
      if (malloc_deadline) {
        set_deadline_kernel<<<1, 1>>>(counters_, malloc_kernel_budget_ns);
      }
      float const ms =
          timer_.time_ms([&] { scratch_kernel<<<grid, block_threads>>>(strategy, counters_); });
      run_counters const c = read_counters();
      t.counters.tag_errors += c.tag_errors;
      t.counters.nulls += c.nulls;
      t.counters.abandoned += c.abandoned;
      if (c.abandoned != 0) {
        t.timed_out = true;
        t.ms.push_back(ms);  // a lower bound: the kernel gave up part of its calls
        break;
      }
      t.ms.push_back(ms);
      if (malloc_deadline && ms > malloc_slow_ms) {
        break;  // slow rows: no more repetitions
      }
    }
    return t;
  }

  bool scratch_rows() {
    std::printf(
        "== per-thread scratch: 2^20 threads, %u-thread blocks, sizes uniform in [%u B, %u B]; "
        "median of %d runs\n",
        block_threads, min_scratch_bytes, max_scratch_bytes, opts_.reps);
    double requested = 0;
    for (unsigned i = 0; i < threads; ++i) {
      requested += scratch_bytes(i);
    }

    timing const devmr_t = time_scratch(devmr_strategy{heap_.ref()}, true, false);
    bool ok = devmr_t.counters.tag_errors == 0 && devmr_t.counters.nulls == 0;
    timing const static_t = time_scratch(static_strategy{static_buffer_}, false, false);
    ok = ok && static_t.counters.tag_errors == 0;
    std::optional<timing> malloc_t;
    if (!opts_.no_malloc) {
      malloc_t = time_scratch(malloc_strategy{}, false, true);
      ok = ok && malloc_t->counters.tag_errors == 0;
    }

    // Footprint: every buffer live at once.
    reset_heap();
    zero_counters();
    keep_kernel<<<grid, block_threads>>>(heap_.ref(), ptrs_, counters_);
    DEVMR_CUDA_TRY(cudaGetLastError());
    devmr::heap_stats const live = heap_.stats();
    run_counters const hold_c = read_counters();
    release_kernel<<<grid, block_threads>>>(heap_.ref(), ptrs_);
    DEVMR_CUDA_TRY(cudaGetLastError());
    devmr::heap_stats const after = heap_.stats();
    ok = ok && hold_c.nulls == 0 && after.blocks_in_use == 0 &&
         after.failed_allocations == live.failed_allocations;
    std::size_t slabs_low = 0;
    std::size_t slabs_high = 0;
    for (std::size_t c = 0; c + 1 < live.classes.size(); c += 2) {
      slabs_low += std::max(live.classes[c].slabs, live.classes[c + 1].slabs);
      slabs_high += live.classes[c].slabs + live.classes[c + 1].slabs;
    }

    double const devmr_ms = median(devmr_t.ms).value_or(0.0f);
    double const static_ms = median(static_t.ms).value_or(0.0f);
    double const rate = devmr_ms > 0 ? threads / (devmr_ms * 1e6) : 0.0;
    std::printf("%-22s %10s %12s %12s %16s %12s\n", "strategy", "ms", "G scratch/s", "devmr x",
                "footprint MiB", "/ requested");
    std::printf("%-22s %10.4f %12.4f %12s %16.1f %12.3f   (blocks; slabs %.0f..%.0f MiB)\n",
                "devmr scratch", devmr_ms, rate, "1", live.bytes_in_use / double(mib),
                live.bytes_in_use / requested, double(slabs_low), double(slabs_high));
    std::optional<double> malloc_ratio;
    if (malloc_t) {
      double const malloc_ms = median(malloc_t->ms).value_or(0.0f);
      malloc_ratio = devmr_ms > 0 ? malloc_ms / devmr_ms : 0.0;
      std::printf(
          "%-22s %10.3f%s %11.6f %11.0f%s %16s %12s   (%zu run%s; heap limit %zu MiB; "
          "%llu nulls)\n",
          "cuda malloc", malloc_ms, malloc_t->timed_out ? "+" : " ", threads / (malloc_ms * 1e6),
          *malloc_ratio, malloc_t->timed_out ? "+" : "x", "n/a", "n/a", malloc_t->ms.size(),
          malloc_t->ms.size() == 1 ? "" : "s", malloc_heap_bytes / mib,
          static_cast<unsigned long long>(malloc_t->counters.nulls));
    }
    std::printf("%-22s %10.4f %12.4f %11.2fx %16.1f %12.3f\n", "static (4 KiB each)", static_ms,
                static_ms > 0 ? threads / (static_ms * 1e6) : 0.0,
                devmr_ms > 0 ? static_ms / devmr_ms : 0.0,
                double(threads) * max_scratch_bytes / double(mib),
                double(threads) * max_scratch_bytes / requested);
    std::printf("requested: %.1f MiB (every buffer live at once)\n", requested / double(mib));
    if (!ok) {
      std::printf(
          "CHECK FAILED: devmr tags %llu, nulls %llu (hold: %llu); static tags %llu; "
          "blocks left %zu\n",
          static_cast<unsigned long long>(devmr_t.counters.tag_errors),
          static_cast<unsigned long long>(devmr_t.counters.nulls),
          static_cast<unsigned long long>(hold_c.nulls),
          static_cast<unsigned long long>(static_t.counters.tag_errors), after.blocks_in_use);
    }
    bool const footprint_ok = live.bytes_in_use / requested <= footprint_target;
    std::printf("target devmr footprint <= %.1fx requested: %.3fx %s\n", footprint_target,
                live.bytes_in_use / requested, footprint_ok ? "PASS" : "MISS");
    bool malloc_ok = true;
    if (malloc_ratio) {
      malloc_ok = *malloc_ratio >= malloc_ratio_target;
      std::printf("target devmr >= %.0fx CUDA malloc's rate: %s%.0fx %s\n", malloc_ratio_target,
                  malloc_t->timed_out ? ">= " : "", *malloc_ratio, malloc_ok ? "PASS" : "MISS");
    }
    return ok && footprint_ok && malloc_ok;
  }

  /// Median alloc and free times of one row through `ref`.
  template <class Ref>
  std::pair<float, float> time_ref(Ref ref, unsigned size_arg, bool& ok) {
    std::vector<float> alloc_ms;
    std::vector<float> free_ms;
    for (int rep = 0; rep < opts_.reps; ++rep) {
      reset_heap();
      zero_counters();
      alloc_ms.push_back(
          timer_.time_ms([&] { alloc_kernel<<<grid, block_threads>>>(ref, ptrs_, size_arg); }));
      check_kernel<<<grid, block_threads>>>(ptrs_, size_arg, counters_);
      free_ms.push_back(
          timer_.time_ms([&] { free_kernel<<<grid, block_threads>>>(ref, ptrs_, size_arg); }));
      run_counters const c = read_counters();
      ok = ok && c.nulls == 0 && c.tag_errors == 0;
    }
    ok = ok && heap_.stats().blocks_in_use == 0;
    return {median(alloc_ms).value_or(0.0f), median(free_ms).value_or(0.0f)};
  }

  bool erased_rows() {
    std::printf(
        "\n== device_resource_ref<device_accessible> against slab_ref: 2^20 threads, alloc and "
        "free kernels, median of %d runs (ratio: time through the erased ref / time through "
        "slab_ref; target <= %.1fx)\n",
        opts_.reps, erased_target);
    std::printf("%-8s %12s %12s %8s %12s %12s %8s %s\n", "size", "alloc ref", "alloc erased",
                "ratio", "free ref", "free erased", "ratio", "");
    bool all = true;
    constexpr unsigned sizes[] = {16, 64, 256, 1024, 4096, mixed_size};
    for (unsigned const size : sizes) {
      bool ok = true;
      auto const direct = time_ref(heap_.ref(), size, ok);
      auto const erased =
          time_ref(devmr::device_resource_ref<cuda::mr::device_accessible>{heap_.ref()}, size, ok);
      double const alloc_ratio = direct.first > 0 ? erased.first / direct.first : 0.0;
      double const free_ratio = direct.second > 0 ? erased.second / direct.second : 0.0;
      bool const pass = ok && alloc_ratio <= erased_target && free_ratio <= erased_target;
      std::printf("%-8s %12.4f %12.4f %7.3fx %12.4f %12.4f %7.3fx %s\n",
                  size == mixed_size ? "mixed" : (std::to_string(size) + " B").c_str(),
                  direct.first, erased.first, alloc_ratio, direct.second, erased.second, free_ratio,
                  !ok    ? "CHECK FAILED"
                  : pass ? "PASS"
                         : "MISS");
      all = all && pass;
    }
    return all;
  }

  options opts_;
  devmr::slab_heap<>& heap_;
  devmr_bench::event_timer timer_;
  void** ptrs_ = nullptr;
  run_counters* counters_ = nullptr;
  std::uint32_t* static_buffer_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  options opts;
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--quick") == 0) {
      opts.reps = 3;
    } else if (std::strcmp(argv[a], "--no-malloc") == 0) {
      opts.no_malloc = true;
    } else if (std::strcmp(argv[a], "--help") == 0) {
      usage(argv[0], 0);
    } else {
      usage(argv[0], 64);
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "scratch_bench: no CUDA device found\n");
    return 2;
  }
  try {
    DEVMR_CUDA_TRY(cudaDeviceSetLimit(cudaLimitMallocHeapSize, malloc_heap_bytes));
    cudaDeviceProp prop{};
    DEVMR_CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
    std::printf("scratch_bench on %s\n", prop.name);
    devmr::device_pool pool{devmr::pool_options{.initial_bytes = heap_pool_bytes}};
    devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = heap_bytes}};
    scratch_bench bench{opts, heap};
    bool const ok = bench.run();
    std::printf("\nscratch_bench: %s\n", ok ? "every check and target passed" : "FAILED");
    return ok ? 0 : 1;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "scratch_bench: %s\n", e.what());
    return 1;
  }
}
