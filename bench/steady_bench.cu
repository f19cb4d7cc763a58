// Steady churn (docs/design.md, "Steady churn"): a heap in long-running use, where blocks live
// for a few kernels and the live set stays near a fixed share of the heap.
//
//   One heap per row, rounds of one kernel. n logical threads with 4 slots each; a slot holds a
//   block's pointer (and the round that allocated it) in device arrays kept between rounds. In
//   round r, slot j of thread i toggles when the low j + 1 bits of hash(seed, r, i, j) are zero
//   (probability 2^-(j+1)): a full slot checks its block's tags and frees it; an empty one
//   allocates a block and writes its tags (a nullptr counts as a failed allocation and leaves the
//   slot empty). Half of the slots are full in the steady state, so
//   n = live share x heap bytes / (2 x mean block size) puts the expected live bytes at that
//   share of the heap. The first rounds fill toward the steady state; the report covers every
//   round and names the first round with a failed allocation.
//
//   Rows: heaps of 512 MiB and 4 GiB, live shares 50% and 80%, blocks of 16 B, 64 B, 4 KiB and
//   mixed (16 << (hash % 9) bytes, drawn anew for each allocation; its free recomputes the size
//   from the hash of the round that allocated it); 60 rounds. Tags: a 4-byte word at the first
//   and at the last word of the block, derived from (seed, round allocated, thread, slot).
//
//   The same kernel runs CUDA's device malloc/free on the 512 MiB rows (cudaLimitMallocHeapSize
//   512 MiB). Each allocator's row is capped at a budget of kernel time (devmr 20 s,
//   --devmr-budget; malloc 20 s, and 120 s over all rows): a round is not started when the last
//   one says it would pass the budget, and a %globaltimer deadline abandons a round that does (its
//   time and counts are dropped). A capped row's note gives the rounds that ran, which its numbers
//   cover. devmr/malloc compares the two over the first rounds that both ran.
//
//   The kernel runs a resident grid (occupancy x SMs, 256-thread blocks) that strides over the n
//   logical threads; each round is timed with CUDA events (event_timer.hpp). After the last round,
//   untimed: the live blocks and bytes are counted, heap.stats() read, every block checked and
//   freed (under a 30 s deadline, past which blocks are left), and heap.stats() read again.
//
// Exit status: 0 every block's tags and alignment checked out; 1 a bad block (a wrong tag, a
// block not aligned to 16 bytes), or a CUDA or devmr call failed; 2 no GPU; 64 bad command line.
// Targets missed (no failed allocation, >= 1 G ops/s with >= 2^20 threads, >= 300x CUDA malloc)
// are printed and do not change the exit status.

#include "block_sizes.hpp"
#include "event_timer.hpp"

#include <devmr/pool_resource.hpp>
#include <devmr/slab_heap.hpp>
#include <devmr/slab_ref.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace {

using devmr_bench::mixed_size;

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t gib = std::size_t{1} << 30;

constexpr unsigned block_threads = 256;
constexpr unsigned slots = 4;
constexpr unsigned full_mask = 0xffffffffu;

constexpr unsigned default_rounds = 60;
constexpr unsigned quick_rounds = 20;
/// A slot keeps the round that allocated its block in 16 bits.
constexpr unsigned max_rounds = 65535;
constexpr std::uint64_t default_seed = 0x5eedu;

/// Slack of the pool above the largest heap, for the heap's header and slab metadata.
constexpr std::size_t pool_slack_bytes = 64 * mib;

/// CUDA malloc: its heap limit (set before the first kernel launch); rows of this heap size only.
constexpr std::size_t malloc_heap_bytes = 512 * mib;
/// CUDA malloc: kernel time one row may take, and all rows together (later rows are skipped).
constexpr double malloc_row_budget_ms = 20'000.0;
constexpr double malloc_total_budget_ms = 120'000.0;
/// devmr: kernel time one row may take (--devmr-budget), and the most the option accepts.
constexpr double default_devmr_budget_ms = 20'000.0;
constexpr double max_devmr_budget_s = 1e6;
/// Either allocator: the deadline of the untimed kernel that frees a row's blocks.
constexpr unsigned long long drain_budget_ns = 30'000'000'000ull;

/// Targets of docs/design.md ("Targets").
constexpr double gops_target = 1.0;
constexpr std::size_t gops_target_threads = std::size_t{1} << 20;
constexpr double malloc_ratio_target = 300.0;

// ---- the counter-based hash that draws toggles, sizes and tags ---------------------------------

/// splitmix64's finalizer: a bijective 64-bit mix with full avalanche.
__host__ __device__ constexpr std::uint64_t mix64(std::uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z;
}

/// The hash of (seed, round, thread, slot); `seed_key` is mix64(seed). Rows keep 4 n < 2^32.
__host__ __device__ constexpr std::uint64_t slot_hash(std::uint64_t seed_key,
                                                      unsigned round,
                                                      std::size_t thread,
                                                      unsigned slot) {
  std::uint64_t const key =
      (std::uint64_t{round} << 32) | (static_cast<std::uint64_t>(thread) * slots + slot);
  return mix64(key ^ seed_key);
}

/// Slot j toggles when the low j + 1 bits of its hash are zero: probability 2^-(j+1).
__host__ __device__ constexpr bool toggles(std::uint64_t h, unsigned slot) {
  return (h & ((std::uint64_t{2} << slot) - 1u)) == 0u;
}

/// The size of the block allocated with hash `h`: `size_arg`, or 16 << (hash % 9) for mixed rows
/// (from the high half of the hash, which the toggle does not look at).
__host__ __device__ constexpr unsigned block_bytes(std::uint64_t h, unsigned size_arg) {
  return size_arg != mixed_size ? size_arg : 16u << (static_cast<unsigned>(h >> 32) % 9u);
}

/// The tags of the block allocated with hash `h`: odd at the first word, even at the last, so the
/// two differ even where a 16-byte block's words could be confused.
__host__ __device__ constexpr std::uint32_t first_tag(std::uint64_t h) {
  return static_cast<std::uint32_t>(mix64(h)) | 1u;
}
__host__ __device__ constexpr std::uint32_t last_tag(std::uint64_t h) {
  return static_cast<std::uint32_t>(mix64(h) >> 32) & ~1u;
}

/// The mean block size of a row: what n is computed from.
constexpr double mean_bytes(unsigned size_arg) {
  if (size_arg != mixed_size) {
    return size_arg;
  }
  double sum = 0.0;
  for (unsigned k = 0; k < 9; ++k) {
    sum += 16u << k;
  }
  return sum / 9.0;
}

// ---- device side -------------------------------------------------------------------------------

/// What one kernel counted; one per round, zeroed before a row's first round.
struct round_counters {
  unsigned long long allocations;   ///< allocate calls (failed ones included)
  unsigned long long frees;         ///< deallocate calls
  unsigned long long failed;        ///< allocations that returned nullptr
  unsigned long long tag_errors;    ///< blocks whose first or last word lost its tag
  unsigned long long align_errors;  ///< blocks not aligned to 16 bytes (freed at once)
  unsigned long long abandoned;     ///< logical threads (drain: blocks) skipped past the deadline
};

/// The blocks counted after the last round.
struct live_counters {
  unsigned long long blocks;
  unsigned long long bytes;  ///< bytes asked for
};

/// The slots: entry j * n + i is slot j of thread i (so a warp's loads of one slot coalesce).
struct slot_arrays {
  void** ptrs;
  std::uint16_t* born;  ///< the round that allocated the slot's block
  std::size_t n;
};

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v) {
  for (unsigned d = 16; d != 0u; d >>= 1) {
    v += __shfl_down_sync(full_mask, v, d);
  }
  return v;
}

/// Adds a whole warp's count to `*total`: one atomic per warp. Every lane of the warp calls it.
__device__ __forceinline__ void add_warp_count(unsigned long long* total, unsigned long long v) {
  unsigned long long const sum = warp_sum(v);
  if ((threadIdx.x & 31u) == 0u && sum != 0u) {
    atomicAdd(total, sum);
  }
}

/// devmr's device heap, with the deadline past which a kernel stops calling it.
struct devmr_allocator {
  devmr::slab_ref<> ref;
  unsigned long long const* deadline_ns;
  __device__ void* allocate(std::size_t bytes) const { return ref.allocate(bytes, 16); }
  __device__ void deallocate(void* p, std::size_t bytes) const { ref.deallocate(p, bytes, 16); }
  __device__ bool past_deadline() const { return global_timer_ns() > *deadline_ns; }
};

/// CUDA's device malloc/free, with the deadline past which a kernel stops calling them.
struct cuda_malloc_allocator {
  unsigned long long const* deadline_ns;
  __device__ void* allocate(std::size_t bytes) const { return malloc(bytes); }
  __device__ void deallocate(void* p, std::size_t) const { free(p); }
  __device__ bool past_deadline() const { return global_timer_ns() > *deadline_ns; }
};

__device__ __forceinline__ bool tags_hold(void const* p, unsigned bytes, std::uint64_t h) {
  auto const* const words = static_cast<std::uint32_t const*>(p);
  return words[0] == first_tag(h) && words[bytes / 4u - 1u] == last_tag(h);
}

/// Frees the block in slot `j` of thread `i` (full), after checking its tags, and empties the
/// slot: its size and tags follow from the round that allocated it. False when a tag changed.
template <class Allocator>
__device__ bool free_slot(Allocator& allocator,
                          slot_arrays const& s,
                          unsigned size_arg,
                          std::uint64_t seed_key,
                          std::size_t i,
                          unsigned j) {
  std::size_t const at = j * s.n + i;
  void* const p = s.ptrs[at];
  std::uint64_t const born = slot_hash(seed_key, s.born[at], i, j);
  unsigned const bytes = block_bytes(born, size_arg);
  bool const intact = tags_hold(p, bytes, born);
  allocator.deallocate(p, bytes);
  s.ptrs[at] = nullptr;
  return intact;
}

/// One round: every toggled slot frees its block (after checking its tags) or allocates one.
template <class Allocator>
__global__ void round_kernel(Allocator allocator,
                             slot_arrays s,
                             unsigned size_arg,
                             std::uint64_t seed_key,
                             unsigned round,
                             round_counters* c) {
  unsigned allocations = 0;
  unsigned frees = 0;
  unsigned failed = 0;
  unsigned tag_errors = 0;
  unsigned align_errors = 0;
  unsigned abandoned = 0;
  std::size_t const stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < s.n; i += stride) {
    if (allocator.past_deadline()) {
      ++abandoned;
      continue;
    }
    for (unsigned j = 0; j < slots; ++j) {
      std::uint64_t const h = slot_hash(seed_key, round, i, j);
      if (!toggles(h, j)) {
        continue;
      }
      std::size_t const at = j * s.n + i;
      void* p = s.ptrs[at];
      if (p != nullptr) {
        tag_errors += free_slot(allocator, s, size_arg, seed_key, i, j) ? 0u : 1u;
        ++frees;
        continue;
      }
      unsigned const bytes = block_bytes(h, size_arg);
      p = allocator.allocate(bytes);
      ++allocations;
      if (p == nullptr) {
        ++failed;
        continue;
      }
      if (reinterpret_cast<std::uintptr_t>(p) % 16u != 0u) {
        ++align_errors;
        allocator.deallocate(p, bytes);
        continue;
      }
      auto* const words = static_cast<std::uint32_t*>(p);
      words[0] = first_tag(h);
      words[bytes / 4u - 1u] = last_tag(h);
      s.ptrs[at] = p;
      s.born[at] = static_cast<std::uint16_t>(round);
    }
  }
  add_warp_count(&c->allocations, allocations);
  add_warp_count(&c->frees, frees);
  add_warp_count(&c->failed, failed);
  add_warp_count(&c->tag_errors, tag_errors);
  add_warp_count(&c->align_errors, align_errors);
  add_warp_count(&c->abandoned, abandoned);
}

/// Counts the full slots and the bytes their blocks asked for (untimed).
__global__ void survey_kernel(slot_arrays s,
                              unsigned size_arg,
                              std::uint64_t seed_key,
                              live_counters* c) {
  unsigned long long blocks = 0;
  unsigned long long bytes = 0;
  std::size_t const stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < s.n; i += stride) {
    for (unsigned j = 0; j < slots; ++j) {
      std::size_t const at = j * s.n + i;
      if (s.ptrs[at] != nullptr) {
        ++blocks;
        bytes += block_bytes(slot_hash(seed_key, s.born[at], i, j), size_arg);
      }
    }
  }
  add_warp_count(&c->blocks, blocks);
  add_warp_count(&c->bytes, bytes);
}

/// Checks the tags of every full slot's block and frees it (untimed). Past the deadline the slots
/// stay full, counted as abandoned.
template <class Allocator>
__global__ void drain_kernel(Allocator allocator,
                             slot_arrays s,
                             unsigned size_arg,
                             std::uint64_t seed_key,
                             round_counters* c) {
  unsigned frees = 0;
  unsigned tag_errors = 0;
  unsigned abandoned = 0;
  std::size_t const stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < s.n; i += stride) {
    for (unsigned j = 0; j < slots; ++j) {
      std::size_t const at = j * s.n + i;
      void* const p = s.ptrs[at];
      if (p == nullptr) {
        continue;
      }
      if (allocator.past_deadline()) {
        ++abandoned;
        continue;
      }
      tag_errors += free_slot(allocator, s, size_arg, seed_key, i, j) ? 0u : 1u;
      ++frees;
    }
  }
  add_warp_count(&c->frees, frees);
  add_warp_count(&c->tag_errors, tag_errors);
  add_warp_count(&c->abandoned, abandoned);
}

/// Sets the deadline of the next round or drain kernel (enqueued right before it, untimed).
__global__ void set_deadline_kernel(unsigned long long* deadline_ns, unsigned long long budget_ns) {
  *deadline_ns = global_timer_ns() + budget_ns;
}

// ---- rows and options --------------------------------------------------------------------------

struct row_spec {
  std::size_t heap_bytes = 0;
  unsigned live_percent = 0;
  unsigned size_arg = 0;  ///< bytes, or mixed_size

  /// n = live share x heap bytes / (2 x mean block size): half of the 4 n slots are full.
  [[nodiscard]] std::size_t threads() const {
    return static_cast<std::size_t>(static_cast<double>(heap_bytes) * live_percent / 100.0 /
                                    (2.0 * mean_bytes(size_arg)));
  }
};

std::string heap_label(std::size_t bytes) {
  return bytes % gib == 0 ? std::to_string(bytes / gib) + " GiB"
                          : std::to_string(bytes / mib) + " MiB";
}

/// A kernel-time budget as the notes give it: "20 s", "0.5 s".
std::string seconds_label(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", ms / 1000.0);
  return buf;
}

std::string size_label(unsigned size_arg) {
  if (size_arg == mixed_size) {
    return "mixed";
  }
  return size_arg % 1024u == 0u ? std::to_string(size_arg / 1024u) + " KiB"
                                : std::to_string(size_arg) + " B";
}

struct options {
  bool quick = false;
  bool no_malloc = false;
  bool round_times = false;  ///< --round-times
  unsigned rounds = 0;       ///< 0: the default (60, --quick 20)
  double devmr_budget_ms = default_devmr_budget_ms;
  std::uint64_t seed = default_seed;
  std::vector<row_spec> only;  ///< --row
  std::string flags;           ///< the command line's options, as given
};

[[noreturn]] void usage(char const* argv0, int status) {
  std::fprintf(
      status == 0 ? stdout : stderr,
      "usage: %s [--quick] [--no-malloc] [--rounds N] [--seed S] [--devmr-budget SECONDS]\n"
      "          [--row HEAP:LIVE:SIZE]... [--round-times]\n"
      "  --quick             512 MiB rows only, 20 rounds\n"
      "  --no-malloc         leave out CUDA's device malloc\n"
      "  --round-times       after the table, each row's kernel time of every round (ms)\n"
      "  --rounds N          rounds per row (default 60; 1 to 65535)\n"
      "  --seed S            the hash's seed (default %llu)\n"
      "  --devmr-budget S    devmr's kernel time per row in seconds (default %.0f; above 0, at "
      "most %.0f)\n"
      "  --row H:L:S         only this row (repeatable): H heap (512M, 4G, ...), L live percent "
      "(50, 80,\n"
      "                      ...), S block size (16, 64, 4096 or 4K, ... a power of two up to "
      "512K) or\n"
      "                      mixed; e.g. --row 512M:80:mixed\n",
      argv0, static_cast<unsigned long long>(default_seed), default_devmr_budget_ms / 1000.0,
      max_devmr_budget_s);
  std::exit(status);
}

/// A decimal number of at most 9 digits; nothing when the text is not one.
std::optional<std::size_t> parse_count(std::string_view text) {
  if (text.empty() || text.size() > 9) {
    return std::nullopt;
  }
  std::size_t value = 0;
  for (char const ch : text) {
    if (ch < '0' || ch > '9') {
      return std::nullopt;
    }
    value = value * 10 + static_cast<std::size_t>(ch - '0');
  }
  return value;
}

/// A number with an optional binary suffix (K, M, G); nothing when the text is not one.
std::optional<std::size_t> parse_bytes(std::string_view text) {
  if (text.empty()) {
    return std::nullopt;
  }
  std::size_t unit = 1;
  switch (text.back()) {
    case 'K':
    case 'k':
      unit = std::size_t{1} << 10;
      break;
    case 'M':
    case 'm':
      unit = mib;
      break;
    case 'G':
    case 'g':
      unit = gib;
      break;
    default:
      break;
  }
  if (unit != 1) {
    text.remove_suffix(1);
  }
  auto const value = parse_count(text);
  if (!value) {
    return std::nullopt;
  }
  return *value * unit;
}

/// HEAP:LIVE:SIZE (see usage); nothing when it names no row.
std::optional<row_spec> parse_row(std::string_view text) {
  auto const first = text.find(':');
  auto const second = first == std::string_view::npos ? first : text.find(':', first + 1);
  if (second == std::string_view::npos) {
    return std::nullopt;
  }
  auto const heap = parse_bytes(text.substr(0, first));
  auto const live = parse_count(text.substr(first + 1, second - first - 1));
  std::string_view const size_text = text.substr(second + 1);
  if (!heap || *heap < 64 * mib || !live || *live == 0 || *live > 99) {
    return std::nullopt;
  }
  row_spec r{*heap, static_cast<unsigned>(*live), mixed_size};
  if (size_text != "mixed") {
    auto const size = parse_bytes(size_text);
    if (!size || *size < 16 || *size > 512 * 1024 || (*size & (*size - 1)) != 0) {
      return std::nullopt;
    }
    r.size_arg = static_cast<unsigned>(*size);
  }
  return r;
}

/// The protocol's rows, in the order they run.
std::vector<row_spec> protocol_rows(bool quick) {
  std::vector<row_spec> rows;
  for (std::size_t const heap : {512 * mib, 4 * gib}) {
    if (quick && heap != 512 * mib) {
      continue;
    }
    for (unsigned const live : {50u, 80u}) {
      for (unsigned const size : {16u, 64u, 4096u, mixed_size}) {
        rows.push_back(row_spec{heap, live, size});
      }
    }
  }
  return rows;
}

// ---- one allocator's run of one row ------------------------------------------------------------

/// What one allocator did on one row.
struct run_result {
  bool ran = false;
  std::string note;                        ///< why it was skipped or stopped early
  std::vector<float> round_ms;             ///< the rounds counted: those completed within budget
  std::vector<round_counters> rounds;      ///< their counters
  round_counters drain{};                  ///< the untimed free of what was left
  live_counters live{};                    ///< after the last round
  std::optional<devmr::heap_stats> stats;  ///< devmr, after the last round

  /// Sums `field` over the first `k` rounds (all with k = -1).
  [[nodiscard]] unsigned long long total(unsigned long long round_counters::*field,
                                         std::size_t k = ~std::size_t{0}) const {
    unsigned long long sum = 0;
    for (std::size_t r = 0; r < rounds.size() && r < k; ++r) {
      sum += rounds[r].*field;
    }
    return sum;
  }
  [[nodiscard]] double total_ms(std::size_t k = ~std::size_t{0}) const {
    double sum = 0.0;
    for (std::size_t r = 0; r < round_ms.size() && r < k; ++r) {
      sum += round_ms[r];
    }
    return sum;
  }
  [[nodiscard]] std::optional<double> median_ms() const {
    if (round_ms.empty()) {
      return std::nullopt;
    }
    std::vector<float> v = round_ms;
    std::sort(v.begin(), v.end());
    std::size_t const m = v.size() / 2;
    return v.size() % 2 == 1 ? v[m] : 0.5 * (static_cast<double>(v[m - 1]) + v[m]);
  }
  /// Allocate + free calls per second, in G, over the first `k` rounds.
  [[nodiscard]] std::optional<double> gops(std::size_t k = ~std::size_t{0}) const {
    double const ms = total_ms(k);
    if (ms <= 0.0) {
      return std::nullopt;
    }
    auto const ops = total(&round_counters::allocations, k) + total(&round_counters::frees, k);
    return static_cast<double>(ops) / (ms * 1e6);
  }
  [[nodiscard]] std::optional<std::size_t> first_failure() const {
    for (std::size_t r = 0; r < rounds.size(); ++r) {
      if (rounds[r].failed != 0) {
        return r;
      }
    }
    return std::nullopt;
  }
  [[nodiscard]] unsigned long long bad_blocks() const {
    return total(&round_counters::tag_errors) + total(&round_counters::align_errors) +
           drain.tag_errors + drain.align_errors;
  }
};

/// Bytes the heap holds for its live blocks: the slabs that hold them, whole (heap_stats's
/// held_bytes: the blocks in use and the free space of the partly used slabs around them).
std::optional<std::size_t> held_bytes(devmr::heap_stats const& s) {
  return s.held_bytes;
}

struct row_result {
  row_spec spec;
  std::size_t threads = 0;
  run_result devmr;
  run_result malloc;
};

/// Runs the rows; owns the device memory that all of them share.
class steady_bench {
 public:
  steady_bench(options const& opts, std::vector<row_spec> const& rows, unsigned rounds)
      : opts_{opts}, rounds_{rounds}, seed_key_{mix64(opts.seed)} {
    std::size_t max_threads = 0;
    std::size_t max_heap = 0;
    for (row_spec const& r : rows) {
      max_threads = std::max(max_threads, r.threads());
      max_heap = std::max(max_heap, r.heap_bytes);
    }
    DEVMR_CUDA_TRY(cudaGetDeviceProperties(&prop_, 0));
    DEVMR_CUDA_TRY(cudaMalloc(&ptrs_, sizeof(void*) * slots * max_threads));
    DEVMR_CUDA_TRY(cudaMalloc(&born_, sizeof(std::uint16_t) * slots * max_threads));
    DEVMR_CUDA_TRY(cudaMalloc(&counters_, sizeof(round_counters) * (rounds_ + 1)));
    DEVMR_CUDA_TRY(cudaMalloc(&live_, sizeof(live_counters)));
    DEVMR_CUDA_TRY(cudaMalloc(&deadline_ns_, sizeof(unsigned long long)));
    pool_.emplace(devmr::pool_options{.initial_bytes = max_heap + pool_slack_bytes});
  }
  ~steady_bench() {
    pool_.reset();
    cudaFree(deadline_ns_);
    cudaFree(live_);
    cudaFree(counters_);
    cudaFree(born_);
    cudaFree(ptrs_);
  }
  steady_bench(steady_bench const&) = delete;
  steady_bench& operator=(steady_bench const&) = delete;

  /// Launches each kernel once on no threads, so that no timed round pays for loading it.
  void warm_up() {
    slot_arrays const none{ptrs_, born_, 0};
    devmr_allocator const d{{}, deadline_ns_};
    set_deadline_kernel<<<1, 1>>>(deadline_ns_, 0);
    round_kernel<<<1, block_threads>>>(d, none, 16, seed_key_, 0, counters_);
    drain_kernel<<<1, block_threads>>>(d, none, 16, seed_key_, counters_);
    survey_kernel<<<1, block_threads>>>(none, 16, seed_key_, live_);
    if (!opts_.no_malloc) {
      cuda_malloc_allocator const m{deadline_ns_};
      round_kernel<<<1, block_threads>>>(m, none, 16, seed_key_, 0, counters_);
      drain_kernel<<<1, block_threads>>>(m, none, 16, seed_key_, counters_);
    }
    DEVMR_CUDA_TRY(cudaGetLastError());
    DEVMR_CUDA_TRY(cudaDeviceSynchronize());
  }

  row_result run_row(row_spec const& spec) {
    row_result r;
    r.spec = spec;
    r.threads = spec.threads();
    std::fprintf(stderr, "steady_bench: %s heap, %u%% live, %s: %zu threads ...\n",
                 heap_label(spec.heap_bytes).c_str(), spec.live_percent,
                 size_label(spec.size_arg).c_str(), r.threads);
    run_devmr(spec, r.threads, r.devmr);
    if (opts_.no_malloc) {
      r.malloc.note = "--no-malloc";
    } else if (spec.heap_bytes != malloc_heap_bytes) {
      r.malloc.note = "512 MiB rows only";
    } else if (!malloc_usable_) {
      r.malloc.note = "skipped: CUDA malloc's heap still holds an earlier row's blocks";
    } else if (malloc_spent_ms_ >= malloc_total_budget_ms) {
      r.malloc.note = "skipped: the 120 s malloc budget is spent";
    } else {
      run_malloc(spec, r.threads, r.malloc);
    }
    return r;
  }

  [[nodiscard]] std::vector<std::string> const& warnings() const { return warnings_; }

 private:
  [[nodiscard]] slot_arrays arrays(std::size_t n) const { return slot_arrays{ptrs_, born_, n}; }

  /// A grid that the GPU holds at once for `kernel` (occupancy x SMs), no larger than n needs.
  template <class Kernel>
  unsigned resident_grid(Kernel kernel, std::size_t n) const {
    int per_sm = 0;
    DEVMR_CUDA_TRY(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block_threads, 0));
    std::size_t const resident =
        static_cast<std::size_t>(std::max(per_sm, 1)) * prop_.multiProcessorCount;
    std::size_t const needed = (n + block_threads - 1) / block_threads;
    return static_cast<unsigned>(std::max<std::size_t>(1, std::min(resident, needed)));
  }

  void clear(std::size_t n) {
    DEVMR_CUDA_TRY(cudaMemset(ptrs_, 0, sizeof(void*) * slots * n));
    DEVMR_CUDA_TRY(cudaMemset(counters_, 0, sizeof(round_counters) * (rounds_ + 1)));
    DEVMR_CUDA_TRY(cudaMemset(live_, 0, sizeof(live_counters)));
  }

  round_counters read_counter(std::size_t index) {
    round_counters c{};
    DEVMR_CUDA_TRY(
        cudaMemcpy(&c, counters_ + index, sizeof(round_counters), cudaMemcpyDeviceToHost));
    return c;
  }

  live_counters survey(row_spec const& spec, std::size_t n) {
    survey_kernel<<<resident_grid(survey_kernel, n), block_threads>>>(arrays(n), spec.size_arg,
                                                                      seed_key_, live_);
    DEVMR_CUDA_TRY(cudaGetLastError());
    live_counters c{};
    DEVMR_CUDA_TRY(cudaMemcpy(&c, live_, sizeof(c), cudaMemcpyDeviceToHost));
    return c;
  }

  void warn(row_spec const& spec, std::string const& what) {
    std::string w = "WARNING " + heap_label(spec.heap_bytes) + " " +
                    std::to_string(spec.live_percent) + "% " + size_label(spec.size_arg) + ": " +
                    what;
    std::fprintf(stderr, "steady_bench: %s\n", w.c_str());
    warnings_.push_back(std::move(w));
  }

  void run_devmr(row_spec const& spec, std::size_t n, run_result& out) {
    devmr::slab_heap<> heap{*pool_, devmr::heap_options{.initial_bytes = spec.heap_bytes,
                                                        .maximum_bytes = spec.heap_bytes}};
    DEVMR_CUDA_TRY(cudaDeviceSynchronize());
    clear(n);
    devmr_allocator const a{heap.ref(), deadline_ns_};
    out.ran = true;
    round_counters const dropped = run_rounds(a, spec, n, opts_.devmr_budget_ms, out);
    out.live = survey(spec, n);
    out.stats = heap.stats();
    round_counters const d = drain(a, spec, n);
    out.drain.frees += d.frees;
    out.drain.tag_errors += d.tag_errors;
    out.drain.abandoned += d.abandoned;
    devmr::heap_stats const after = heap.stats();

    if (out.stats->blocks_in_use != out.live.blocks) {
      warn(spec, "heap stats count " + std::to_string(out.stats->blocks_in_use) +
                     " blocks in use after the last round, the slots hold " +
                     std::to_string(out.live.blocks));
    }
    // The heap also counted the failures of a round left out past the budget.
    unsigned long long const failed = out.total(&round_counters::failed) + dropped.failed;
    if (out.stats->failed_allocations != failed) {
      warn(spec, "heap stats count " + std::to_string(out.stats->failed_allocations) +
                     " failed allocations, the kernels saw " + std::to_string(failed));
    }
    if (d.abandoned != 0) {
      warn(spec, "devmr: " + std::to_string(d.abandoned) +
                     " blocks not freed within 30 s; the heap's destruction returns them");
    }
    if (after.blocks_in_use != d.abandoned) {
      warn(spec, "heap stats count " + std::to_string(after.blocks_in_use) +
                     (d.abandoned == 0 ? " blocks in use after every block was freed"
                                       : " blocks in use after the final free, which left " +
                                             std::to_string(d.abandoned)));
    }
  }

  void arm_deadline(unsigned long long budget_ns) {
    set_deadline_kernel<<<1, 1>>>(deadline_ns_, budget_ns);
    DEVMR_CUDA_TRY(cudaGetLastError());
  }

  /// Runs the row's rounds with `a` within `budget_ms` of kernel time: a round is not started
  /// when the last one says it would pass the budget, and each starts with a deadline where the
  /// budget runs out, past which its threads skip their slots (abandoned). A round that abandoned
  /// threads ends the row; its time and counts are left out of `out` (its bad blocks stay in), the
  /// note says so and it is returned (zeros when every round ran whole). The slots stay
  /// consistent either way: a thread skips all of its slots or none. CUDA malloc: the rows'
  /// total budget also stops the row.
  template <class Allocator>
  round_counters run_rounds(
      Allocator const& a, row_spec const& spec, std::size_t n, double budget_ms, run_result& out) {
    constexpr bool is_malloc = std::is_same_v<Allocator, cuda_malloc_allocator>;
    unsigned const grid = resident_grid(round_kernel<Allocator>, n);
    std::string const budget = seconds_label(budget_ms);
    double spent_ms = 0.0;
    for (unsigned round = 0; round < rounds_; ++round) {
      if (round > 0 && spent_ms + out.round_ms.back() > budget_ms) {
        out.note = "stopped after " + std::to_string(round) + " of " + std::to_string(rounds_) +
                   " rounds: the next would pass " + budget;
        break;
      }
      if constexpr (is_malloc) {
        if (malloc_spent_ms_ >= malloc_total_budget_ms) {
          out.note = "stopped after " + std::to_string(round) + " of " + std::to_string(rounds_) +
                     " rounds: the 120 s malloc budget is spent";
          break;
        }
      }
      arm_deadline(static_cast<unsigned long long>((budget_ms - spent_ms) * 1e6));
      float const ms = timer_.time_ms([&] {
        round_kernel<<<grid, block_threads>>>(a, arrays(n), spec.size_arg, seed_key_, round,
                                              counters_ + round);
      });
      if constexpr (is_malloc) {
        malloc_spent_ms_ += ms;
      }
      round_counters const c = read_counter(round);
      if (c.abandoned != 0) {
        out.note = "stopped in round " + std::to_string(round) + " of " + std::to_string(rounds_) +
                   ": it passed " + budget + " (" + std::to_string(c.abandoned) +
                   " threads abandoned; that round is not counted" +
                   (c.failed != 0 ? ", " + std::to_string(c.failed) + " of its allocations failed"
                                  : std::string{}) +
                   ")";
        if (c.tag_errors + c.align_errors != 0) {  // a bad block counts, counted round or not
          out.drain.tag_errors += c.tag_errors;
          out.drain.align_errors += c.align_errors;
        }
        return c;
      }
      spent_ms += ms;
      out.round_ms.push_back(ms);
      out.rounds.push_back(c);
    }
    return round_counters{};
  }

  /// Checks and frees every full slot's block (untimed), within drain_budget_ns; returns what the
  /// drain counted (abandoned: the blocks left past the deadline).
  template <class Allocator>
  round_counters drain(Allocator const& a, row_spec const& spec, std::size_t n) {
    DEVMR_CUDA_TRY(cudaMemset(counters_ + rounds_, 0, sizeof(round_counters)));
    arm_deadline(drain_budget_ns);
    drain_kernel<<<resident_grid(drain_kernel<Allocator>, n), block_threads>>>(
        a, arrays(n), spec.size_arg, seed_key_, counters_ + rounds_);
    DEVMR_CUDA_TRY(cudaGetLastError());
    return read_counter(rounds_);
  }

  void run_malloc(row_spec const& spec, std::size_t n, run_result& out) {
    clear(n);
    DEVMR_CUDA_TRY(cudaDeviceSynchronize());
    cuda_malloc_allocator const a{deadline_ns_};
    out.ran = true;
    run_rounds(a, spec, n, malloc_row_budget_ms, out);
    out.live = survey(spec, n);
    round_counters const d = drain(a, spec, n);
    out.drain.frees += d.frees;
    out.drain.tag_errors += d.tag_errors;
    out.drain.abandoned += d.abandoned;
    if (d.abandoned != 0) {
      malloc_usable_ = false;
      warn(spec, "CUDA malloc: " + std::to_string(d.abandoned) +
                     " blocks not freed within 30 s; later malloc rows are skipped");
    }
  }

  options const& opts_;
  unsigned rounds_;
  std::uint64_t seed_key_;
  cudaDeviceProp prop_{};
  devmr_bench::event_timer timer_;
  std::optional<devmr::device_pool> pool_;
  void** ptrs_ = nullptr;
  std::uint16_t* born_ = nullptr;
  round_counters* counters_ = nullptr;
  live_counters* live_ = nullptr;
  unsigned long long* deadline_ns_ = nullptr;
  double malloc_spent_ms_ = 0.0;
  bool malloc_usable_ = true;
  std::vector<std::string> warnings_;
};

// ---- the table ---------------------------------------------------------------------------------

std::string fixed(std::optional<double> v, int decimals) {
  if (!v) {
    return "-";
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, *v);
  return buf;
}

std::string mib_text(std::optional<std::size_t> bytes) {
  if (!bytes) {
    return "-";
  }
  return fixed(static_cast<double>(*bytes) / static_cast<double>(mib), 1);
}

void print_line(row_result const& row, run_result const& run, bool is_devmr) {
  row_spec const& s = row.spec;
  std::string const heap = heap_label(s.heap_bytes);
  std::string const live = std::to_string(s.live_percent) + "%";
  std::string const size = size_label(s.size_arg);
  char const* const name = is_devmr ? "devmr" : "malloc";
  if (!run.ran) {
    std::printf("%-8s %-4s %-6s %10zu %-6s %s\n", heap.c_str(), live.c_str(), size.c_str(),
                row.threads, name, run.note.c_str());
    return;
  }
  unsigned long long const allocations = run.total(&round_counters::allocations);
  unsigned long long const failed = run.total(&round_counters::failed);
  std::optional<double> const failed_share =
      allocations == 0 ? std::nullopt
                       : std::optional<double>{100.0 * static_cast<double>(failed) /
                                               static_cast<double>(allocations)};
  std::optional<std::size_t> const first_failure = run.first_failure();
  std::optional<double> const gops = run.gops();
  unsigned long long const tag_errors =
      run.total(&round_counters::tag_errors) + run.drain.tag_errors;
  unsigned long long const align_errors =
      run.total(&round_counters::align_errors) + run.drain.align_errors;

  std::optional<std::size_t> in_use;
  std::optional<std::size_t> held;
  if (run.stats) {
    in_use = run.stats->bytes_in_use;
    held = held_bytes(*run.stats);
  }

  // Targets: devmr lines only.
  std::string no_fail = "-";
  std::string rate = "-";
  std::string versus = "-";
  std::string ratio_verdict = "-";
  std::string notes = run.note;
  if (is_devmr) {
    if (!run.rounds.empty()) {  // a row the budget stopped in its first round has no verdict
      no_fail = failed == 0 ? "PASS" : "FAIL";
    }
    if (row.threads >= gops_target_threads && gops) {
      rate = *gops >= gops_target ? "PASS" : "MISS";
    }
    if (row.malloc.ran && !row.malloc.rounds.empty()) {
      // Over the first rounds that both ran (either may have been stopped by its budget).
      std::size_t const k = std::min(row.malloc.rounds.size(), run.rounds.size());
      std::optional<double> const mine = run.gops(k);
      std::optional<double> const theirs = row.malloc.gops(k);
      if (mine && theirs && *theirs > 0.0) {
        double const ratio = *mine / *theirs;
        versus = fixed(ratio, 1);
        ratio_verdict = ratio >= malloc_ratio_target ? "PASS" : "MISS";
        if (k < run.rounds.size() || k < row.malloc.rounds.size()) {
          notes += (notes.empty() ? "" : "; ") + std::string{"devmr/malloc over the first "} +
                   std::to_string(k) + " rounds";
        }
      }
    }
  }
  std::printf(
      "%-8s %-4s %-6s %10zu %-6s %6zu %12llu %10llu %8s %5s %9s %10s %9s %7llu %7llu %9s %9s %9s "
      "%-7s %-10s %12s %-6s %s\n",
      heap.c_str(), live.c_str(), size.c_str(), row.threads, name, run.rounds.size(), allocations,
      failed, fixed(failed_share, 4).c_str(),
      first_failure ? std::to_string(*first_failure).c_str() : "-",
      fixed(run.median_ms(), 3).c_str(), fixed(run.total_ms(), 1).c_str(), fixed(gops, 4).c_str(),
      tag_errors, align_errors, mib_text(run.live.bytes).c_str(), mib_text(in_use).c_str(),
      mib_text(held).c_str(), no_fail.c_str(), rate.c_str(), versus.c_str(), ratio_verdict.c_str(),
      notes.c_str());
}

void print_table(std::vector<row_result> const& rows) {
  std::printf(
      "\n%-8s %-4s %-6s %10s %-6s %6s %12s %10s %8s %5s %9s %10s %9s %7s %7s %9s %9s %9s %-7s "
      "%-10s %12s %-6s %s\n",
      "heap", "live", "size", "threads", "alloc", "rounds", "allocations", "failed", "failed%",
      "1st", "ms/round", "total ms", "G ops/s", "badtag", "misalgn", "live MiB", "inuse MiB",
      "held MiB", "no-fail", ">=1G ops/s", "devmr/malloc", ">=300x", "notes");
  for (row_result const& r : rows) {
    print_line(r, r.devmr, true);
    if (r.malloc.ran || r.malloc.note.starts_with("skipped")) {
      print_line(r, r.malloc, false);
    }
  }
}

/// Each row's kernel time of every round it counted, in order (--round-times).
void print_round_times(std::vector<row_result> const& results) {
  std::printf("\nround times (ms, round 0 first):\n");
  for (row_result const& r : results) {
    for (auto const* run : {&r.devmr, &r.malloc}) {
      if (run->round_ms.empty()) {
        continue;
      }
      std::printf("%s %u%% %s %s:", heap_label(r.spec.heap_bytes).c_str(), r.spec.live_percent,
                  size_label(r.spec.size_arg).c_str(), run == &r.devmr ? "devmr" : "malloc");
      for (float const ms : run->round_ms) {
        std::printf(" %.4f", static_cast<double>(ms));
      }
      std::printf("\n");
    }
  }
}

int run(options const& opts) {
  int devices = 0;
  cudaError_t const status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::fprintf(stderr,
                 "steady_bench: no CUDA GPU available (%s); this benchmark needs one, nothing was "
                 "measured\n",
                 status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
    return 2;
  }
  DEVMR_CUDA_TRY(cudaSetDevice(0));
  std::vector<row_spec> const rows = opts.only.empty() ? protocol_rows(opts.quick) : opts.only;
  unsigned const rounds = opts.rounds != 0 ? opts.rounds
                          : opts.quick     ? quick_rounds
                                           : default_rounds;
  for (row_spec const& r : rows) {
    std::size_t const n = r.threads();
    if (n == 0 || n >= (std::size_t{1} << 30)) {
      std::fprintf(stderr, "steady_bench: the row %s %u%% %s needs %zu threads (1 to 2^30 - 1)\n",
                   heap_label(r.heap_bytes).c_str(), r.live_percent, size_label(r.size_arg).c_str(),
                   n);
      return 64;
    }
  }

  // CUDA's malloc heap must be sized before the first kernel launch of the context.
  bool const malloc_rows =
      !opts.no_malloc && std::any_of(rows.begin(), rows.end(), [](row_spec const& r) {
        return r.heap_bytes == malloc_heap_bytes;
      });
  if (malloc_rows) {
    DEVMR_CUDA_TRY(cudaDeviceSetLimit(cudaLimitMallocHeapSize, malloc_heap_bytes));
  }
  std::size_t malloc_limit = 0;
  DEVMR_CUDA_TRY(cudaDeviceGetLimit(&malloc_limit, cudaLimitMallocHeapSize));

  cudaDeviceProp prop{};
  DEVMR_CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
  int driver = 0;
  int runtime = 0;
  DEVMR_CUDA_TRY(cudaDriverGetVersion(&driver));
  DEVMR_CUDA_TRY(cudaRuntimeGetVersion(&runtime));
  char date[64];
  std::time_t const now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  std::printf("steady_bench (devmr slab_ref in steady churn, vs CUDA device malloc)\n");
  std::printf("date: %s\n", date);
  std::printf("device 0: %s, sm_%d%d, %d SMs, %.1f GiB; driver %d, runtime %d\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / static_cast<double>(gib), driver, runtime);
  std::printf(
      "flags:%s; %u rounds per row, seed %llu; devmr budget %s per row; CUDA malloc heap limit "
      "%.1f MiB\n",
      opts.flags.c_str(), rounds, static_cast<unsigned long long>(opts.seed),
      seconds_label(opts.devmr_budget_ms).c_str(),
      static_cast<double>(malloc_limit) / static_cast<double>(mib));
  std::fflush(stdout);

  std::vector<row_result> results;
  unsigned long long bad = 0;
  {
    steady_bench bench{opts, rows, rounds};
    bench.warm_up();
    for (row_spec const& r : rows) {
      results.push_back(bench.run_row(r));
      bad += results.back().devmr.bad_blocks() + results.back().malloc.bad_blocks();
    }
    print_table(results);
    if (opts.round_times) {
      print_round_times(results);
    }
    std::printf(
        "\nthreads n = live share x heap / (2 x mean block size), 4 slots each; slot j toggles "
        "with probability 2^-(j+1) per round. allocations: allocate calls; failed%%: of them; "
        "1st: the first round (from 0) with a failed allocation; ms/round: median kernel time of "
        "the "
        "rounds (CUDA events); G ops/s: (allocate + free calls) / total kernel time; badtag, "
        "misalgn: blocks whose tags changed, blocks not 16-byte aligned (rounds and the final "
        "free); live MiB: bytes the full slots asked for after the last round; inuse MiB: "
        "heap.stats().bytes_in_use then; held MiB: heap.stats().held_bytes then, the slabs that "
        "hold the live blocks, whole.\n");
    std::printf(
        "targets (devmr): no failed allocation; >= %.0f G ops/s with >= 2^20 threads; >= %.0fx "
        "CUDA malloc's ops/s over the rounds both ran (512 MiB rows, malloc capped at %.0f s of "
        "kernel time per row and %.0f s in all). devmr rows are capped at %s of kernel time "
        "each; a row the cap stopped says after how many rounds, and its numbers cover those "
        "rounds only.\n",
        gops_target, malloc_ratio_target, malloc_row_budget_ms / 1000.0,
        malloc_total_budget_ms / 1000.0, seconds_label(opts.devmr_budget_ms).c_str());
    for (std::string const& w : bench.warnings()) {
      std::printf("%s\n", w.c_str());
    }
    std::printf("warnings: %zu, bad blocks: %llu\n", bench.warnings().size(), bad);
  }
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  options opts;
  for (int a = 1; a < argc; ++a) {
    std::string_view const arg = argv[a];
    bool const has_value = a + 1 < argc;
    if (arg == "--quick") {
      opts.quick = true;
      opts.flags += " --quick";
    } else if (arg == "--no-malloc") {
      opts.no_malloc = true;
      opts.flags += " --no-malloc";
    } else if (arg == "--round-times") {
      opts.round_times = true;
      opts.flags += " --round-times";
    } else if (arg == "--rounds" && has_value) {
      auto const n = parse_count(argv[++a]);
      if (!n || *n == 0 || *n > max_rounds) {
        std::fprintf(stderr, "steady_bench: bad round count '%s' (1 to %u)\n", argv[a], max_rounds);
        usage(argv[0], 64);
      }
      opts.rounds = static_cast<unsigned>(*n);
      opts.flags += std::string{" --rounds "} + argv[a];
    } else if (arg == "--seed" && has_value) {
      char* end = nullptr;
      opts.seed = std::strtoull(argv[++a], &end, 0);
      if (end == argv[a] || *end != '\0') {
        std::fprintf(stderr, "steady_bench: bad seed '%s'\n", argv[a]);
        usage(argv[0], 64);
      }
      opts.flags += std::string{" --seed "} + argv[a];
    } else if (arg == "--devmr-budget" && has_value) {
      char* end = nullptr;
      double const seconds = std::strtod(argv[++a], &end);
      if (end == argv[a] || *end != '\0' || !(seconds > 0.0) || seconds > max_devmr_budget_s) {
        std::fprintf(stderr,
                     "steady_bench: bad devmr budget '%s' (seconds, above 0, at most %.0f)\n",
                     argv[a], max_devmr_budget_s);
        usage(argv[0], 64);
      }
      opts.devmr_budget_ms = seconds * 1000.0;
      opts.flags += std::string{" --devmr-budget "} + argv[a];
    } else if (arg == "--row" && has_value) {
      auto const row = parse_row(argv[++a]);
      if (!row) {
        std::fprintf(stderr,
                     "steady_bench: bad row '%s' (expected HEAP:LIVE:SIZE, e.g. "
                     "512M:80:mixed)\n",
                     argv[a]);
        usage(argv[0], 64);
      }
      opts.only.push_back(*row);
      opts.flags += std::string{" --row "} + argv[a];
    } else if (arg == "--help" || arg == "-h") {
      usage(argv[0], 0);
    } else {
      std::fprintf(stderr, "steady_bench: unknown or incomplete argument '%s'\n", argv[a]);
      usage(argv[0], 64);
    }
  }
  try {
    return run(opts);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "steady_bench: %s\n", e.what());
    return 1;
  }
}
