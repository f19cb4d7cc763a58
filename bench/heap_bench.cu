// Device-side allocate/free throughput of devmr's slab_ref against CUDA's device malloc/free and
// against the bump-pointer floor (a warp-aggregated atomic bump pointer that never frees), in one
// run, with the protocol of docs/design.md, "Performance contract" (bench/README.md spells it out):
//
//   threads 2^16, 2^20, 2^22 in 256-thread blocks; sizes 16, 64, 256, 1024, 4096 B and mixed
//   (16 << (fmix32(i) % 9)); per row: an allocation kernel (each thread allocates once and writes a
//   tag at the first and the last word of its block), an untimed check kernel (every tag and the
//   16-byte alignment), a free kernel (every thread frees); median of 5 runs of each kernel, timed
//   with CUDA events. Churn: one kernel, each thread 16 x (allocate 64 B, write, free).
//   devmr's heap is reset before a row's first run only: its later runs take the slabs that the
//   earlier ones freed, as a user's kernels do (--reset: before every run, from fresh slabs).
//
// G ops/s: alloc and free rows count one operation per thread; churn rows count the 16 allocations
// of each thread (each allocation comes with its free; the pair is one operation).
//
// Exit status: 0 all blocks checked out; 1 a check failed (wrong tag, misaligned block, a nullptr
// from devmr or the floor, a floor free that does not read its pointer) or a CUDA/devmr error;
// 2 no GPU; 64 bad command line.

#include "block_sizes.hpp"
#include "event_timer.hpp"

#include <devmr/pool_resource.hpp>
#include <devmr/slab_heap.hpp>
#include <devmr/slab_ref.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using devmr_bench::block_size;
using devmr_bench::fmix32;
using devmr_bench::mixed_size;

constexpr std::size_t gib = std::size_t{1} << 30;
constexpr std::size_t mib = std::size_t{1} << 20;

constexpr unsigned block_threads = 256;
constexpr unsigned churn_rounds = 16;
constexpr unsigned churn_bytes = 64;
constexpr unsigned full_mask = 0xffffffffu;

/// devmr: a 24 GiB heap serves the largest row (2^22 x 4096 B = 16 GiB) with slack.
/// The heap the rows run on, unless --heap says otherwise (GiB).
constexpr unsigned default_heap_gib = 24;
/// The heap's pool: the heap and room for its header, slab metadata and scratch.
constexpr std::size_t heap_pool_bytes(std::size_t heap_bytes) {
  return heap_bytes + 64 * mib;
}
/// CUDA malloc: its heap limit, set before the first kernel launch (2^20 x 4096 B = 4 GiB at most).
constexpr std::size_t malloc_heap_bytes = 20 * gib;
/// Floor: the bump buffer holds the largest row without reuse.
constexpr std::size_t floor_bytes = 16 * gib + mib;
/// Heap construction: a 64 GiB heap from a pool that reserved 65 GiB beforehand.
constexpr std::size_t construct_heap_bytes = 64 * gib;
constexpr std::size_t construct_pool_bytes = 65 * gib;
constexpr int construct_trials = 5;

/// CUDA malloc rows: one trial, and no more repetitions when a kernel took longer than this.
constexpr float malloc_slow_ms = 2000.0f;
/// CUDA malloc kernels give up (every later call returns nullptr / skips its free) past this.
constexpr unsigned long long malloc_kernel_budget_ns = 5'000'000'000ull;
/// CUDA malloc rows stop altogether once their timed kernels have used this much in total.
constexpr float malloc_total_budget_ms = 90'000.0f;

/// Targets of docs/design.md, "Performance contract": devmr's throughput over the floor's.
constexpr double alloc_target = 0.7;
constexpr double free_target = 0.5;
constexpr double churn_target = 0.33;

// ---- device helpers
// ------------------------------------------------------------------------------

/// Counters that the check, churn and free kernels write; zeroed before each run.
struct run_counters {
  unsigned long long tag_errors;     ///< first or last word not the tag its thread wrote
  unsigned long long align_errors;   ///< block not aligned to 16 bytes
  unsigned long long nulls;          ///< allocations that returned nullptr
  unsigned long long abandoned;      ///< CUDA malloc/free calls skipped past the kernel deadline
  unsigned long long foreign_frees;  ///< frees of a pointer the floor did not hand out
  unsigned long long deadline_ns;    ///< %globaltimer value past which CUDA malloc kernels give up
};

__device__ __forceinline__ unsigned lane_index() {
  unsigned lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Tags of thread `i`: distinct per thread (fmix32 is a bijection), first and last word differ.
__host__ __device__ constexpr std::uint32_t first_tag(unsigned i) {
  return fmix32(i) | 1u;
}
__host__ __device__ constexpr std::uint32_t last_tag(unsigned i) {
  return ~fmix32(i);
}

// ---- the three allocators, as functors the kernels take by value
// ---------------------------------

/// devmr's device heap.
struct devmr_allocator {
  devmr::slab_ref<> ref;
  __device__ void* allocate(std::size_t bytes) const { return ref.allocate(bytes, 16); }
  __device__ void deallocate(void* p, std::size_t bytes) const { ref.deallocate(p, bytes, 16); }
};

/// CUDA's device malloc/free. Each call first looks at the kernel deadline so that a pathological
/// row cannot hold the GPU for minutes: past it, calls are skipped and counted as abandoned (the
/// row is then reported as "timeout", its times are not used).
struct cuda_malloc_allocator {
  run_counters* counters;
  __device__ bool past_deadline() const { return global_timer_ns() > counters->deadline_ns; }
  __device__ void* allocate(std::size_t bytes) const {
    if (past_deadline()) {
      atomicAdd(&counters->abandoned, 1ull);
      return nullptr;
    }
    return malloc(bytes);
  }
  __device__ void deallocate(void* p, std::size_t) const {
    if (p == nullptr) {
      return;
    }
    if (past_deadline()) {
      atomicAdd(&counters->abandoned, 1ull);
      return;
    }
    free(p);
  }
};

/// The floor: a warp-aggregated bump pointer that never frees. The active lanes of a warp add up
/// their sizes (rounded to 16 B), one lane reserves the total with a single 64-bit atomicAdd, and
/// each lane takes its slice at its exclusive prefix sum. Every slice is 16-byte aligned because
/// the buffer is (cudaMalloc: 256 B) and every size is a multiple of 16.
struct floor_allocator {
  std::byte* base;
  unsigned long long* offset;
  unsigned long long capacity;
  run_counters* counters;

  /// Lane sums are 32-bit (one shuffle each): fine for requests below 128 MiB, and this bench asks
  /// for 4096 B at most.
  __device__ void* allocate(std::size_t bytes) const {
    unsigned const need = (static_cast<unsigned>(bytes) + 15u) & ~15u;
    unsigned const active = __activemask();
    unsigned const lane = lane_index();
    unsigned end = 0;    // inclusive prefix sum of `need` over the active lanes up to this one
    unsigned total = 0;  // sum of `need` over the active lanes
    unsigned leader = 0;
    if (active == full_mask) {  // the common case: a whole warp
      unsigned const first = __shfl_sync(full_mask, need, 0);
      if (__all_sync(full_mask, need == first)) {  // one size: no scan
        end = need * (lane + 1u);
        total = need * 32u;
      } else {  // Hillis-Steele inclusive scan over the 32 lanes
        end = need;
        for (unsigned d = 1; d < 32u; d <<= 1) {
          unsigned const below = __shfl_up_sync(full_mask, end, d);
          if (lane >= d) {
            end += below;
          }
        }
        total = __shfl_sync(full_mask, end, 31);
      }
    } else {  // a partial warp: visit the active lanes one by one (every lane runs the same loop)
      for (unsigned rest = active; rest != 0u; rest &= rest - 1u) {
        unsigned const j = static_cast<unsigned>(__ffs(static_cast<int>(rest))) - 1u;
        unsigned const v = __shfl_sync(active, need, j);
        total += v;
        if (j <= lane) {
          end += v;
        }
      }
      leader = static_cast<unsigned>(__ffs(static_cast<int>(active))) - 1u;
    }
    unsigned long long start = 0;
    if (lane == leader) {
      start = atomicAdd(offset, static_cast<unsigned long long>(total));
    }
    start = __shfl_sync(active, start, leader);
    if (start + end > capacity) {
      return nullptr;
    }
    return base + (start + end - need);
  }

  /// The least a free does: it looks at the pointer it is given, and returns. So the free
  /// kernel loads the pointer, as it does for every allocator. (It counts a pointer that it did
  /// not hand out, which the bench never gives it; a use that the compiler keeps. An empty asm
  /// statement that takes the pointer is not enough: ptxas drops the load, and the floor's free
  /// kernel only stores the nullptrs.)
  __device__ void deallocate(void* p, std::size_t) const {
    auto const at = reinterpret_cast<std::uintptr_t>(p);
    auto const first = reinterpret_cast<std::uintptr_t>(base);
    if (p != nullptr && (at < first || at - first >= capacity)) {
      atomicAdd(&counters->foreign_frees, 1ull);
    }
  }
};

// ---- kernels -----------------------------------------------------------------------------------

/// Each thread allocates its block, writes its tags at the first and the last word, and stores the
/// pointer (nullptr when the allocation failed).
template <class Allocator>
__global__ void alloc_kernel(Allocator allocator, void** ptrs, unsigned n, unsigned size_arg) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  unsigned const bytes = block_size(i, size_arg);
  void* const p = allocator.allocate(bytes);
  if (p != nullptr) {
    auto* const words = static_cast<std::uint32_t*>(p);
    words[0] = first_tag(i);
    words[bytes / 4u - 1u] = last_tag(i);
  }
  ptrs[i] = p;
}

/// Verifies every block: non-null, 16-byte aligned, both tags intact (untimed).
__global__ void check_kernel(void* const* ptrs, unsigned n, unsigned size_arg, run_counters* c) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  void* const p = ptrs[i];
  if (p == nullptr) {
    atomicAdd(&c->nulls, 1ull);
    return;
  }
  if (reinterpret_cast<std::uintptr_t>(p) % 16u != 0u) {
    atomicAdd(&c->align_errors, 1ull);
    return;
  }
  unsigned const bytes = block_size(i, size_arg);
  auto const* const words = static_cast<std::uint32_t const*>(p);
  if (words[0] != first_tag(i) || words[bytes / 4u - 1u] != last_tag(i)) {
    atomicAdd(&c->tag_errors, 1ull);
  }
}

/// Each thread frees its block and clears its slot of the pointer array.
template <class Allocator>
__global__ void free_kernel(Allocator allocator, void** ptrs, unsigned n, unsigned size_arg) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  allocator.deallocate(ptrs[i], block_size(i, size_arg));
  ptrs[i] = nullptr;
}

/// Each thread: 16 x (allocate 64 B, write a tag at the first and the last word, free).
template <class Allocator>
__global__ void churn_kernel(Allocator allocator, unsigned n, run_counters* c) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  unsigned failed = 0;
  for (unsigned r = 0; r < churn_rounds; ++r) {
    void* const p = allocator.allocate(churn_bytes);
    if (p == nullptr) {
      ++failed;
      continue;
    }
    auto* const words = static_cast<std::uint32_t*>(p);
    words[0] = first_tag(i * churn_rounds + r);
    words[churn_bytes / 4u - 1u] = last_tag(i * churn_rounds + r);
    allocator.deallocate(p, churn_bytes);
  }
  if (failed != 0u) {
    atomicAdd(&c->nulls, static_cast<unsigned long long>(failed));
  }
}

/// Sets the deadline of the next CUDA malloc kernel (launched right before it, outside the timing).
__global__ void set_deadline_kernel(run_counters* c, unsigned long long budget_ns) {
  c->deadline_ns = global_timer_ns() + budget_ns;
}

// ---- host side ---------------------------------------------------------------------------------

enum class allocator_kind { devmr, malloc, floor };
constexpr int num_allocators = 3;
char const* const allocator_names[num_allocators] = {"devmr", "cuda malloc", "floor"};

/// The timings of one phase (alloc, free or churn) of one allocator in one row.
struct phase_times {
  std::vector<float> ms;
  bool skipped = false;    ///< not run (thread count, --no-malloc, or the malloc budget)
  bool timed_out = false;  ///< calls were abandoned past the kernel deadline: no valid time
  [[nodiscard]] std::optional<float> median() const {
    if (skipped || timed_out || ms.empty()) {
      return std::nullopt;
    }
    std::vector<float> v = ms;
    std::sort(v.begin(), v.end());
    std::size_t const m = v.size() / 2;
    return v.size() % 2 == 1 ? v[m] : 0.5f * (v[m - 1] + v[m]);
  }
};

/// One row of the protocol for all three allocators.
struct row {
  unsigned threads = 0;
  unsigned size_arg = 0;  ///< bytes, or mixed_size
  bool churn = false;
  phase_times alloc[num_allocators];
  phase_times free[num_allocators];  ///< unused for churn rows
  unsigned long long nulls[num_allocators] = {};
  unsigned long long tag_errors[num_allocators] = {};
  unsigned long long align_errors[num_allocators] = {};
  unsigned long long foreign_frees = 0;  ///< the floor's
};

row make_row(unsigned threads, unsigned size_arg, bool churn) {
  row r;
  r.threads = threads;
  r.size_arg = size_arg;
  r.churn = churn;
  return r;
}

/// A row fails when a block of any allocator failed its check, or devmr or the floor returned
/// nullptr (both are sized never to run out; CUDA malloc's nullptrs are only reported).
bool row_failed(row const& r) {
  if (r.foreign_frees != 0) {
    return true;
  }
  for (int k = 0; k < num_allocators; ++k) {
    if (r.tag_errors[k] != 0 || r.align_errors[k] != 0 || (k != 1 && r.nulls[k] != 0)) {
      return true;
    }
  }
  return false;
}

/// The size argument of a row selected by --row that stands for the churn row of its thread count.
constexpr unsigned churn_row = ~0u;

struct options {
  bool quick = false;
  bool no_malloc = false;
  bool reset = false;            ///< devmr: reset the heap before every run, not only a row's first
  bool floor_walk = false;       ///< the floor goes on through its buffer from run to run of a row
  bool floor_occupancy = false;  ///< the floor's kernels run as many blocks an SM as devmr's
  unsigned heap_gib = default_heap_gib;             ///< --heap: the heap's size
  std::vector<std::pair<unsigned, unsigned>> only;  ///< --row: threads, size_arg or churn_row
  std::string only_flags;                           ///< those --row and --heap arguments, as given

  /// True when the row of `threads` and `size_arg` runs: every row, or the ones --row names.
  [[nodiscard]] bool runs(unsigned threads, unsigned size_arg) const {
    return only.empty() ||
           std::find(only.begin(), only.end(), std::pair{threads, size_arg}) != only.end();
  }
};

[[noreturn]] void usage(char const* argv0, int status) {
  std::fprintf(
      status == 0 ? stdout : stderr,
      "usage: %s [--quick] [--no-malloc] [--reset] [--floor-walk] [--floor-occupancy] [--heap G]\n"
      "       [--row T:S]...\n"
      "  --quick      only 2^20 threads, 3 runs per phase instead of 5\n"
      "  --no-malloc  leave out CUDA's device malloc\n"
      "  --reset      devmr: reset the heap before every run of a row, not only before the first\n"
      "               (every run then starts from fresh slabs instead of recycled ones)\n"
      "  --floor-walk the floor's allocation runs go on through its buffer where the run before\n"
      "               ended, rather than each from its first byte (memory the kernels before did\n"
      "               not write just now, as devmr's slots go on through their slabs: what the\n"
      "               floor's blocks gain from the L2 cache)\n"
      "  --floor-occupancy the floor's kernels run with no more blocks an SM than devmr's kernel\n"
      "               of the same phase (dynamic shared memory holds them back): whether\n"
      "               devmr's registers cost it against the floor\n"
      "  --heap G     a heap of G GiB (default 24; 2^22 threads of 4 KiB blocks need over 16)\n"
      "  --row T:S    only this row (repeatable): T = 16, 20 or 22 (2^T threads), S = 16, 64,\n"
      "               256, 1024, 4096, mixed or churn; for profiling one row, or comparing "
      "builds\n",
      argv0);
  std::exit(status);
}

/// The block sizes of the rows, in the order they run (mixed last).
constexpr unsigned row_sizes[] = {16, 64, 256, 1024, 4096, mixed_size};
/// The largest block any row asks for (mixed sizes included).
constexpr std::uint64_t largest_row_block = 4096;

/// A row named on the command line as T:S (see usage); nothing when it names no row.
std::optional<std::pair<unsigned, unsigned>> parse_row(std::string_view text) {
  auto const colon = text.find(':');
  if (colon == std::string_view::npos) {
    return std::nullopt;
  }
  std::string_view const t = text.substr(0, colon);
  std::string_view const s = text.substr(colon + 1);
  unsigned threads = 0;
  for (unsigned const log2 : {16u, 20u, 22u}) {
    if (t == std::to_string(log2)) {
      threads = 1u << log2;
    }
  }
  if (threads == 0) {
    return std::nullopt;
  }
  if (s == "churn") {
    return std::pair{threads, churn_row};
  }
  if (s == "mixed") {
    return std::pair{threads, mixed_size};
  }
  for (unsigned const size : row_sizes) {
    if (size != mixed_size && s == std::to_string(size)) {
      return std::pair{threads, size};
    }
  }
  return std::nullopt;
}

std::string size_label(unsigned size_arg) {
  return size_arg == mixed_size ? std::string{"mixed"} : std::to_string(size_arg) + " B";
}

std::string threads_label(unsigned threads) {
  unsigned log2 = 0;
  while ((1u << log2) < threads) {
    ++log2;
  }
  return "2^" + std::to_string(log2);
}

/// Blocks of `block_threads` threads that an SM holds of `kernel`, with `smem` bytes of dynamic
/// shared memory a block.
template <class Kernel>
int blocks_per_sm(Kernel kernel, std::size_t smem) {
  int blocks = 0;
  DEVMR_CUDA_TRY(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, block_threads, smem));
  return blocks;
}

/// Dynamic shared memory a block with which an SM holds as many blocks of `floor_kernel` as of
/// `devmr_kernel` (--floor-occupancy): 0 where it holds no more already. No kernel here uses
/// shared memory: it only keeps blocks off the SM.
template <class Floor, class Devmr>
std::size_t matching_smem(Floor floor_kernel, Devmr devmr_kernel) {
  int const want = blocks_per_sm(devmr_kernel, 0);
  if (blocks_per_sm(floor_kernel, 0) <= want) {
    return 0;
  }
  int device = 0;
  int per_sm = 0;
  DEVMR_CUDA_TRY(cudaGetDevice(&device));
  DEVMR_CUDA_TRY(
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  // From the share of want + 1 blocks up, within the 48 KiB a block gets without opting in.
  for (auto smem = static_cast<std::size_t>(per_sm) / static_cast<std::size_t>(want + 1);
       smem <= 48 * 1024; smem += 128) {
    if (blocks_per_sm(floor_kernel, smem) <= want) {
      return smem;
    }
  }
  std::fprintf(stderr,
               "heap_bench: --floor-occupancy: no shared memory size holds the floor's "
               "kernel to devmr's blocks an SM\n");
  std::exit(1);
}

/// Runs the rows, owns the device memory that all of them share.
class heap_bench {
 public:
  heap_bench(options const& opts, devmr::slab_heap<>& heap)
      : opts_{opts}, heap_{heap}, reps_{opts.quick ? 3 : 5} {
    DEVMR_CUDA_TRY(cudaMalloc(&ptrs_, sizeof(void*) * (std::size_t{1} << 22)));
    DEVMR_CUDA_TRY(cudaMalloc(&counters_, sizeof(run_counters)));
    DEVMR_CUDA_TRY(cudaMalloc(&floor_offset_, sizeof(unsigned long long)));
    DEVMR_CUDA_TRY(cudaMalloc(&floor_buffer_, floor_bytes));
    if (opts.floor_occupancy) {
      hold_floor_back();
    }
  }
  ~heap_bench() {
    cudaFree(floor_buffer_);
    cudaFree(floor_offset_);
    cudaFree(counters_);
    cudaFree(ptrs_);
  }
  heap_bench(heap_bench const&) = delete;
  heap_bench& operator=(heap_bench const&) = delete;

  /// One untimed alloc/check/free of each allocator, so that no first run pays for lazy setup
  /// (CUDA's malloc heap, module loading, the first touch of the heap's metadata).
  void warm_up() {
    row r = make_row(1u << 16, 64, false);
    run_alloc_free(r, allocator_kind::devmr, 1);
    if (!opts_.no_malloc) {
      run_alloc_free(r, allocator_kind::malloc, 1);
    }
    run_alloc_free(r, allocator_kind::floor, 1);
    if (row_failed(r)) {
      warnings_.push_back("WARNING the warm-up run (2^16 threads, 64 B) failed its checks");
    }
    check_floor_free();
    heap_.reset();
    DEVMR_CUDA_TRY(cudaDeviceSynchronize());
    malloc_spent_ms_ = 0.0f;
  }

  row run_row(unsigned threads, unsigned size_arg) {
    std::fprintf(stderr, "heap_bench: %s threads, %s ...\n", threads_label(threads).c_str(),
                 size_label(size_arg).c_str());
    row r = make_row(threads, size_arg, false);
    run_alloc_free(r, allocator_kind::devmr, reps_);
    if (malloc_wanted(threads)) {
      run_alloc_free(r, allocator_kind::malloc, reps_);
    } else {
      r.alloc[1].skipped = r.free[1].skipped = true;
    }
    run_alloc_free(r, allocator_kind::floor, reps_);
    return r;
  }

  row run_churn_row(unsigned threads) {
    std::fprintf(stderr, "heap_bench: %s threads, churn ...\n", threads_label(threads).c_str());
    row r = make_row(threads, churn_bytes, true);
    run_churn(r, allocator_kind::devmr);
    if (malloc_wanted(threads)) {
      run_churn(r, allocator_kind::malloc);
    } else {
      r.alloc[1].skipped = true;
    }
    run_churn(r, allocator_kind::floor);
    return r;
  }

  [[nodiscard]] std::vector<std::string> const& warnings() const { return warnings_; }
  /// False when the floor's free kernel did not read the pointer it was given.
  [[nodiscard]] bool floor_free_reads() const { return floor_free_reads_; }

 private:
  /// The floor's free must look at its pointer; one that does not (the compiler drops a load
  /// whose value goes unused) times an empty grid. One thread frees a pointer that the floor did
  /// not hand out (the counters' own), which it must count.
  void check_floor_free() {
    DEVMR_CUDA_TRY(cudaMemsetAsync(counters_, 0, sizeof(run_counters), 0));
    void* const foreign = counters_;
    DEVMR_CUDA_TRY(cudaMemcpy(ptrs_, &foreign, sizeof(void*), cudaMemcpyHostToDevice));
    free_kernel<<<1, 1>>>(floor_alloc(), ptrs_, 1, 64);
    DEVMR_CUDA_TRY(cudaGetLastError());
    floor_free_reads_ = read_counters().foreign_frees == 1;
    if (!floor_free_reads_) {
      warnings_.push_back(
          "WARNING the floor's free kernel did not count a foreign pointer: it does not read its "
          "pointer, and its free rows time an empty grid");
    }
  }

  /// --floor-occupancy: sizes the floor's shared memory so that an SM holds as many blocks of
  /// each of its kernels as of devmr's, and prints both counts.
  void hold_floor_back() {
    floor_smem_.alloc = matching_smem(alloc_kernel<floor_allocator>, alloc_kernel<devmr_allocator>);
    floor_smem_.free = matching_smem(free_kernel<floor_allocator>, free_kernel<devmr_allocator>);
    floor_smem_.churn = matching_smem(churn_kernel<floor_allocator>, churn_kernel<devmr_allocator>);
    std::printf(
        "floor held to devmr's blocks an SM (devmr, floor as built, floor held): alloc %d %d %d, "
        "free %d %d %d, churn %d %d %d\n",
        blocks_per_sm(alloc_kernel<devmr_allocator>, 0),
        blocks_per_sm(alloc_kernel<floor_allocator>, 0),
        blocks_per_sm(alloc_kernel<floor_allocator>, floor_smem_.alloc),
        blocks_per_sm(free_kernel<devmr_allocator>, 0),
        blocks_per_sm(free_kernel<floor_allocator>, 0),
        blocks_per_sm(free_kernel<floor_allocator>, floor_smem_.free),
        blocks_per_sm(churn_kernel<devmr_allocator>, 0),
        blocks_per_sm(churn_kernel<floor_allocator>, 0),
        blocks_per_sm(churn_kernel<floor_allocator>, floor_smem_.churn));
    std::fflush(stdout);
  }

  [[nodiscard]] bool malloc_wanted(unsigned threads) const {
    return !opts_.no_malloc && threads < (1u << 22) && malloc_spent_ms_ < malloc_total_budget_ms;
  }

  [[nodiscard]] devmr_allocator devmr_alloc() const { return devmr_allocator{heap_.ref()}; }
  [[nodiscard]] cuda_malloc_allocator malloc_alloc() const {
    return cuda_malloc_allocator{counters_};
  }
  [[nodiscard]] floor_allocator floor_alloc() const {
    return floor_allocator{static_cast<std::byte*>(floor_buffer_), floor_offset_, floor_bytes,
                           counters_};
  }

  /// Brings an allocator to the state a run starts from (devmr: a reset before the row's first
  /// run, or before every run with --reset; the floor: its offset at 0, or with --floor-walk
  /// where the run before left it while `floor_run_bytes` more still fit); sets the malloc
  /// deadline.
  void prepare(allocator_kind kind, bool first_run, std::uint64_t floor_run_bytes) {
    DEVMR_CUDA_TRY(cudaMemsetAsync(counters_, 0, sizeof(run_counters), 0));
    switch (kind) {
      case allocator_kind::devmr:
        if (first_run || opts_.reset) {
          heap_.reset();
        }
        break;
      case allocator_kind::floor:
        if (!opts_.floor_walk || first_run || floor_walked_ + floor_run_bytes > floor_bytes) {
          DEVMR_CUDA_TRY(cudaMemsetAsync(floor_offset_, 0, sizeof(unsigned long long), 0));
          floor_walked_ = 0;
        }
        floor_walked_ += floor_run_bytes;
        break;
      case allocator_kind::malloc:
        arm_deadline();
        break;
    }
    DEVMR_CUDA_TRY(cudaDeviceSynchronize());
  }

  void arm_deadline() {
    set_deadline_kernel<<<1, 1>>>(counters_, malloc_kernel_budget_ns);
    DEVMR_CUDA_TRY(cudaGetLastError());
  }

  run_counters read_counters() {
    run_counters c{};
    DEVMR_CUDA_TRY(cudaMemcpy(&c, counters_, sizeof(c), cudaMemcpyDeviceToHost));
    return c;
  }

  /// `smem`: dynamic shared memory a block, which no kernel uses (--floor-occupancy).
  template <class Allocator>
  float time_alloc(Allocator a, unsigned n, unsigned size_arg, std::size_t smem = 0) {
    unsigned const grid = (n + block_threads - 1) / block_threads;
    return timer_.time_ms(
        [&] { alloc_kernel<<<grid, block_threads, smem>>>(a, ptrs_, n, size_arg); });
  }
  template <class Allocator>
  float time_free(Allocator a, unsigned n, unsigned size_arg, std::size_t smem = 0) {
    unsigned const grid = (n + block_threads - 1) / block_threads;
    return timer_.time_ms(
        [&] { free_kernel<<<grid, block_threads, smem>>>(a, ptrs_, n, size_arg); });
  }
  template <class Allocator>
  float time_churn(Allocator a, unsigned n, std::size_t smem = 0) {
    unsigned const grid = (n + block_threads - 1) / block_threads;
    return timer_.time_ms([&] { churn_kernel<<<grid, block_threads, smem>>>(a, n, counters_); });
  }

  float alloc_phase(allocator_kind kind, unsigned n, unsigned size_arg) {
    switch (kind) {
      case allocator_kind::devmr:
        return time_alloc(devmr_alloc(), n, size_arg);
      case allocator_kind::malloc:
        return time_alloc(malloc_alloc(), n, size_arg);
      case allocator_kind::floor:
        return time_alloc(floor_alloc(), n, size_arg, floor_smem_.alloc);
    }
    return 0.0f;
  }
  float free_phase(allocator_kind kind, unsigned n, unsigned size_arg) {
    switch (kind) {
      case allocator_kind::devmr:
        return time_free(devmr_alloc(), n, size_arg);
      case allocator_kind::malloc:
        return time_free(malloc_alloc(), n, size_arg);
      case allocator_kind::floor:
        return time_free(floor_alloc(), n, size_arg, floor_smem_.free);
    }
    return 0.0f;
  }
  float churn_phase(allocator_kind kind, unsigned n) {
    switch (kind) {
      case allocator_kind::devmr:
        return time_churn(devmr_alloc(), n);
      case allocator_kind::malloc:
        return time_churn(malloc_alloc(), n);
      case allocator_kind::floor:
        return time_churn(floor_alloc(), n, floor_smem_.churn);
    }
    return 0.0f;
  }

  /// After a devmr run: every block is freed, and no allocation failed since the row began.
  void check_heap(row const& r, std::uint64_t failed_before, char const* what) {
    devmr::heap_stats const s = heap_.stats();
    if (s.blocks_in_use != 0 || s.failed_allocations != failed_before) {
      std::string w =
          "WARNING devmr " + threads_label(r.threads) + " " + size_label(r.size_arg) + " " + what +
          ": blocks_in_use after the free phase = " + std::to_string(s.blocks_in_use) +
          ", failed_allocations grew by " + std::to_string(s.failed_allocations - failed_before);
      std::fprintf(stderr, "heap_bench: %s\n", w.c_str());
      warnings_.push_back(std::move(w));
    }
  }

  void run_alloc_free(row& r, allocator_kind kind, int reps) {
    auto const k = static_cast<int>(kind);
    unsigned const grid = (r.threads + block_threads - 1) / block_threads;
    std::uint64_t const failed_before =
        kind == allocator_kind::devmr ? heap_.stats().failed_allocations : 0;
    for (int rep = 0; rep < reps; ++rep) {
      prepare(kind, rep == 0, std::uint64_t{r.threads} * largest_row_block);
      float const alloc_ms = alloc_phase(kind, r.threads, r.size_arg);
      check_kernel<<<grid, block_threads>>>(ptrs_, r.threads, r.size_arg, counters_);
      DEVMR_CUDA_TRY(cudaGetLastError());
      if (kind == allocator_kind::malloc) {
        arm_deadline();
      }
      float const free_ms = free_phase(kind, r.threads, r.size_arg);
      run_counters const c = read_counters();
      r.nulls[k] += c.nulls;
      r.tag_errors[k] += c.tag_errors;
      r.align_errors[k] += c.align_errors;
      r.foreign_frees += c.foreign_frees;
      if (kind == allocator_kind::devmr) {
        check_heap(r, failed_before, "alloc/free");
      }
      if (kind == allocator_kind::malloc) {
        malloc_spent_ms_ += alloc_ms + free_ms;
        if (c.abandoned != 0) {
          r.alloc[k].timed_out = r.free[k].timed_out = true;
          break;
        }
      }
      r.alloc[k].ms.push_back(alloc_ms);
      r.free[k].ms.push_back(free_ms);
      if (kind == allocator_kind::malloc &&
          (alloc_ms > malloc_slow_ms || free_ms > malloc_slow_ms ||
           malloc_spent_ms_ >= malloc_total_budget_ms)) {
        break;  // the rule for slow rows: no more repetitions
      }
    }
  }

  void run_churn(row& r, allocator_kind kind) {
    auto const k = static_cast<int>(kind);
    std::uint64_t const failed_before =
        kind == allocator_kind::devmr ? heap_.stats().failed_allocations : 0;
    for (int rep = 0; rep < reps_; ++rep) {
      prepare(kind, rep == 0, floor_bytes);  // churn: every run from the first byte
      float const ms = churn_phase(kind, r.threads);
      run_counters const c = read_counters();
      r.nulls[k] += c.nulls;
      r.foreign_frees += c.foreign_frees;
      if (kind == allocator_kind::devmr) {
        check_heap(r, failed_before, "churn");
      }
      if (kind == allocator_kind::malloc) {
        malloc_spent_ms_ += ms;
        if (c.abandoned != 0) {
          r.alloc[k].timed_out = true;
          break;
        }
      }
      r.alloc[k].ms.push_back(ms);
      if (kind == allocator_kind::malloc &&
          (ms > malloc_slow_ms || malloc_spent_ms_ >= malloc_total_budget_ms)) {
        break;
      }
    }
  }

  options opts_;
  devmr::slab_heap<>& heap_;
  int reps_;
  devmr_bench::event_timer timer_;
  void** ptrs_ = nullptr;
  run_counters* counters_ = nullptr;
  unsigned long long* floor_offset_ = nullptr;
  /// Dynamic shared memory of the floor's kernels, a block (--floor-occupancy; else none).
  struct {
    std::size_t alloc = 0;
    std::size_t free = 0;
    std::size_t churn = 0;
  } floor_smem_;
  std::uint64_t floor_walked_ = 0;  ///< the most the floor's runs took since its offset was 0
  void* floor_buffer_ = nullptr;
  float malloc_spent_ms_ = 0.0f;
  std::vector<std::string> warnings_;
  bool floor_free_reads_ = true;
};

/// Heap construction time: a 64 GiB heap from a pool that holds 65 GiB already. Each trial builds
/// the heap (timed on the host clock, up to a device synchronization) and destroys it (untimed).
void time_heap_construction() {
  std::optional<devmr::device_pool> pool;
  try {
    pool.emplace(devmr::pool_options{.initial_bytes = construct_pool_bytes});
  } catch (std::exception const& e) {
    std::printf("heap construction: skipped, the 65 GiB pool could not be reserved (%s)\n",
                e.what());
    return;
  }
  std::vector<double> ms;
  for (int t = 0; t < construct_trials; ++t) {
    std::optional<devmr::slab_heap<>> heap;
    auto const t0 = std::chrono::steady_clock::now();
    heap.emplace(*pool, devmr::heap_options{.initial_bytes = construct_heap_bytes});
    DEVMR_CUDA_TRY(cudaDeviceSynchronize());
    auto const t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    heap = std::nullopt;  // destroys the heap, outside the timing
  }
  double const first = ms.front();
  std::sort(ms.begin(), ms.end());
  double const median = ms[ms.size() / 2];
  std::printf(
      "heap construction: 64 GiB slab_heap from a 65 GiB pool: median %.3f ms of %d (first %.3f "
      "ms, max %.3f ms); target < 2 ms: %s\n",
      median, construct_trials, first, ms.back(), median < 2.0 ? "PASS" : "MISS");
}

std::string format_gops(phase_times const& p, unsigned long long ops, int reps) {
  if (p.skipped) {
    return "skipped";
  }
  if (p.timed_out) {
    return "timeout";
  }
  std::optional<float> const m = p.median();
  if (!m) {
    return "-";
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f%s", static_cast<double>(ops) / (*m * 1e6),
                static_cast<int>(p.ms.size()) < reps ? "*" : "");
  return buf;
}

std::optional<double> gops(phase_times const& p, unsigned long long ops) {
  std::optional<float> const m = p.median();
  if (!m || *m <= 0.0f) {
    return std::nullopt;
  }
  return static_cast<double>(ops) / (static_cast<double>(*m) * 1e6);
}

std::string format_ratio(std::optional<double> a, std::optional<double> b) {
  if (!a || !b) {
    return "-";
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", *a / *b);
  return buf;
}

/// Prints the table; returns the number of rows whose checks failed.
int print_table(std::vector<row> const& rows, int reps) {
  std::printf("\n%-7s %-6s %-6s %12s %12s %12s %11s %12s %7s %-7s %12s %s\n", "threads", "size",
              "phase", "devmr Gop/s", "malloc Gop/s", "floor Gop/s", "devmr/floor", "devmr/malloc",
              "target", "verdict", "malloc nulls", "notes");
  int failures = 0;
  for (row const& r : rows) {
    bool const bad = row_failed(r);
    std::string notes;
    for (int k = 0; k < num_allocators; ++k) {
      if (r.tag_errors[k] + r.align_errors[k] != 0 || (k != 1 && r.nulls[k] != 0)) {
        notes += std::string{allocator_names[k]} + ": " + std::to_string(r.tag_errors[k]) +
                 " tag, " + std::to_string(r.align_errors[k]) + " alignment errors, " +
                 std::to_string(r.nulls[k]) + " nullptr; ";
      }
    }
    if (r.foreign_frees != 0) {
      notes += "floor: " + std::to_string(r.foreign_frees) + " frees of pointers not its own; ";
    }
    failures += bad ? 1 : 0;
    int const phases = r.churn ? 1 : 2;
    for (int ph = 0; ph < phases; ++ph) {
      phase_times const* const t = ph == 0 ? r.alloc : r.free;
      unsigned long long const ops =
          r.churn ? static_cast<unsigned long long>(r.threads) * churn_rounds : r.threads;
      double const target = r.churn ? churn_target : ph == 0 ? alloc_target : free_target;
      std::optional<double> const d = gops(t[0], ops);
      std::optional<double> const m = gops(t[1], ops);
      std::optional<double> const f = gops(t[2], ops);
      char const* verdict = "-";
      if (bad) {
        verdict = "ERROR";
      } else if (d && f) {
        verdict = *d / *f >= target ? "PASS" : "MISS";
      }
      char target_text[16];
      std::snprintf(target_text, sizeof(target_text), ">=%.2f", target);
      std::string const malloc_nulls = t[1].skipped ? "-" : std::to_string(r.nulls[1]);
      std::printf("%-7s %-6s %-6s %12s %12s %12s %11s %12s %7s %-7s %12s %s\n",
                  threads_label(r.threads).c_str(),
                  r.churn ? "64 B" : size_label(r.size_arg).c_str(),
                  r.churn   ? "churn"
                  : ph == 0 ? "alloc"
                            : "free",
                  format_gops(t[0], ops, reps).c_str(), format_gops(t[1], ops, reps).c_str(),
                  format_gops(t[2], ops, reps).c_str(), format_ratio(d, f).c_str(),
                  format_ratio(d, m).c_str(), target_text, verdict,
                  ph == 0 ? malloc_nulls.c_str() : "", ph == 0 ? notes.c_str() : "");
    }
  }
  return failures;
}

int run(options const& opts) {
  int device_count = 0;
  cudaError_t const status = cudaGetDeviceCount(&device_count);
  if (status != cudaSuccess || device_count == 0) {
    std::fprintf(stderr,
                 "heap_bench: no CUDA GPU available (%s); this benchmark needs one, nothing was "
                 "measured\n",
                 status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
    return 2;
  }
  int device = 0;
  DEVMR_CUDA_TRY(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  DEVMR_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  int driver = 0;
  int runtime = 0;
  DEVMR_CUDA_TRY(cudaDriverGetVersion(&driver));
  DEVMR_CUDA_TRY(cudaRuntimeGetVersion(&runtime));

  // CUDA's malloc heap must be sized before the first kernel launch of the context.
  if (!opts.no_malloc) {
    DEVMR_CUDA_TRY(cudaDeviceSetLimit(cudaLimitMallocHeapSize, malloc_heap_bytes));
  }
  std::size_t malloc_limit = 0;
  DEVMR_CUDA_TRY(cudaDeviceGetLimit(&malloc_limit, cudaLimitMallocHeapSize));

  char date[64];
  std::time_t const now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  std::printf("heap_bench (devmr slab_ref vs CUDA device malloc vs bump-pointer floor)\n");
  std::printf("date: %s\n", date);
  std::printf("device %d: %s, sm_%d%d, %d SMs, %.1f GiB; driver %d, runtime %d\n", device,
              prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / static_cast<double>(gib), driver, runtime);
  std::printf("flags:%s%s%s%s%s%s; CUDA malloc heap limit %.1f GiB\n", opts.quick ? " --quick" : "",
              opts.no_malloc ? " --no-malloc" : "", opts.reset ? " --reset" : "",
              opts.floor_walk ? " --floor-walk" : "",
              opts.floor_occupancy ? " --floor-occupancy" : "", opts.only_flags.c_str(),
              static_cast<double>(malloc_limit) / static_cast<double>(gib));
  std::fflush(stdout);

  time_heap_construction();  // first, with its own pool, freed before the rest is reserved
  std::fflush(stdout);

  std::size_t const heap_bytes = std::size_t{opts.heap_gib} * gib;
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = heap_pool_bytes(heap_bytes)}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = heap_bytes}};
  std::vector<row> rows;
  int const reps = opts.quick ? 3 : 5;
  {
    heap_bench bench{opts, heap};
    bench.warm_up();
    std::vector<unsigned> const thread_counts =
        opts.quick && opts.only.empty() ? std::vector<unsigned>{1u << 20}
                                        : std::vector<unsigned>{1u << 16, 1u << 20, 1u << 22};
    for (unsigned const n : thread_counts) {
      for (unsigned const s : row_sizes) {
        if (opts.runs(n, s)) {
          rows.push_back(bench.run_row(n, s));
        }
      }
    }
    for (unsigned const n : thread_counts) {
      if (opts.runs(n, churn_row)) {
        rows.push_back(bench.run_churn_row(n));
      }
    }

    int const failures = print_table(rows, reps);
    std::printf(
        "\nG ops/s = operations / median kernel time (CUDA events), median of %d runs; alloc and "
        "free rows: one operation per thread; churn rows: 16 allocations per thread, each with its "
        "free (the pair counts as one operation).\n",
        reps);
    std::printf(
        "targets (devmr/floor): alloc >= %.2fx, free >= %.2fx, churn >= %.2fx; PASS/MISS per row, "
        "ERROR when a check failed.\n",
        alloc_target, free_target, churn_target);
    std::printf(
        "malloc: '*' fewer than %d runs (a run took > %.0f s, or the %.0f s malloc budget ran "
        "out); 'timeout' calls abandoned after %.0f s in one kernel; 'skipped' 2^22 threads, "
        "--no-malloc or budget spent; malloc nulls = nullptr returned (not an error).\n",
        reps, static_cast<double>(malloc_slow_ms) / 1000.0,
        static_cast<double>(malloc_total_budget_ms) / 1000.0,
        static_cast<double>(malloc_kernel_budget_ns) / 1e9);
    for (std::string const& w : bench.warnings()) {
      std::printf("%s\n", w.c_str());
    }
    std::printf("warnings: %zu, rows with failed checks: %d\n", bench.warnings().size(), failures);
    if (failures != 0 || !bench.floor_free_reads()) {
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options opts;
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--quick") == 0) {
      opts.quick = true;
    } else if (std::strcmp(argv[a], "--no-malloc") == 0) {
      opts.no_malloc = true;
    } else if (std::strcmp(argv[a], "--reset") == 0) {
      opts.reset = true;
    } else if (std::strcmp(argv[a], "--floor-walk") == 0) {
      opts.floor_walk = true;
    } else if (std::strcmp(argv[a], "--floor-occupancy") == 0) {
      opts.floor_occupancy = true;
    } else if (std::strcmp(argv[a], "--heap") == 0) {
      unsigned long const g = a + 1 == argc ? 0 : std::strtoul(argv[++a], nullptr, 10);
      if (g == 0 || g > 1024) {
        std::fprintf(stderr, "heap_bench: --heap needs a size in GiB, 1 to 1024\n");
        usage(argv[0], 64);
      }
      opts.heap_gib = static_cast<unsigned>(g);
      opts.only_flags += " --heap " + std::to_string(g);
    } else if (std::strcmp(argv[a], "--row") == 0) {
      if (a + 1 == argc) {
        std::fprintf(stderr, "heap_bench: --row needs a row, e.g. --row 16:4096\n");
        usage(argv[0], 64);
      }
      auto const selected = parse_row(argv[++a]);
      if (!selected) {
        std::fprintf(stderr, "heap_bench: bad row '%s' (expected T:S, e.g. 16:4096 or 20:mixed)\n",
                     argv[a]);
        usage(argv[0], 64);
      }
      opts.only.push_back(*selected);
      opts.only_flags += std::string{" --row "} + argv[a];
    } else if (std::strcmp(argv[a], "--help") == 0 || std::strcmp(argv[a], "-h") == 0) {
      usage(argv[0], 0);
    } else {
      std::fprintf(stderr, "heap_bench: unknown argument '%s'\n", argv[a]);
      usage(argv[0], 64);
    }
  }
  try {
    return run(opts);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "heap_bench: %s\n", e.what());
    return 1;
  }
}
