// The slab heap on the GPU: every block tagged at both ends and checked for overlap by sorting,
// alignment, out-of-memory storms, churn, groups, frees across the host/device line, growth,
// checked heaps, host threads beside kernels.

#include "../../bench/block_sizes.hpp"
#include "conformance.hpp"

#include <devmr/slab_heap.hpp>

#include <cooperative_groups.h>
#include <thrust/device_ptr.h>
#include <thrust/sort.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace cg = cooperative_groups;

// Group allocation takes a block (the pointer goes through its shared memory) or a tile or
// coalesced group (a shuffle); groups that span blocks, and the type-erased thread_group (maybe
// one of several tiles of a block, with no shuffle), do not compile.
static_assert(devmr::thread_group<cg::thread_block>);
static_assert(devmr::thread_group<cg::thread_block_tile<32>>);
static_assert(devmr::thread_group<cg::thread_block_tile<4>>);
static_assert(devmr::thread_group<cg::thread_block_tile<64>>);
static_assert(devmr::thread_group<cg::coalesced_group>);
static_assert(!devmr::thread_group<cg::thread_group>);
static_assert(!devmr::thread_group<cg::grid_group>);
#if defined(_CG_HAS_CLUSTER_GROUP)
static_assert(!devmr::thread_group<cg::cluster_group>);
#endif

namespace {

#define CUDA_CHECK(call) REQUIRE((call) == cudaSuccess)

constexpr std::size_t gib = std::size_t{1} << 30;
constexpr std::size_t mib = std::size_t{1} << 20;

/// The benchmark protocol's hash (bench/block_sizes.hpp), which draws its mixed sizes too.
using devmr_bench::fmix32;

/// A `fixed` size for size_of: mixed small sizes, and one block in 16 of 1 to 4 MiB (and a bit).
/// No request is that large.
constexpr std::size_t mixed_and_runs = ~std::size_t{0};

/// Size of thread i's block: `fixed`, or mixed (16 << (hash % 9)) when fixed is 0.
__host__ __device__ std::size_t size_of(std::size_t fixed, std::uint32_t i) {
  if (fixed == mixed_and_runs && fmix32(i) % 16 == 0) {
    return (std::size_t{1} + fmix32(i + 1) % 4) * mib + fmix32(i + 2) % 4096;
  }
  return fixed != 0 && fixed != mixed_and_runs ? fixed : std::size_t{16} << (fmix32(i) % 9);
}

/// Offset of the last whole 4-byte word of a block of `bytes` (>= 4) bytes.
__host__ __device__ std::size_t last_word(std::size_t bytes) {
  return (bytes - 4) & ~std::size_t{3};
}

/// Tags a block at its first and last word; a block of under 4 bytes gets a byte of the tag.
__device__ void write_tags(void* p, std::size_t bytes, std::uint32_t tag) {
  if (bytes < 4) {
    *static_cast<std::uint8_t*>(p) = static_cast<std::uint8_t>(tag);
    return;
  }
  auto* first = static_cast<std::uint32_t*>(p);
  auto* last = reinterpret_cast<std::uint32_t*>(static_cast<char*>(p) + last_word(bytes));
  *first = tag;
  *last = ~tag;
}

template <class Ref>
__global__ void allocate_all(Ref ref,
                             void** blocks,
                             std::size_t* sizes,
                             std::uint32_t n,
                             std::size_t fixed,
                             std::size_t alignment) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  std::size_t const bytes = size_of(fixed, i);
  void* p = ref.allocate(bytes, alignment);
  if (p != nullptr) {
    write_tags(p, bytes, i);
  }
  blocks[i] = p;
  sizes[i] = bytes;
}

/// Counts blocks whose tags were overwritten or that are misaligned; counts null blocks apart.
__global__ void verify_all(void* const* blocks,
                           std::size_t const* sizes,
                           std::uint32_t n,
                           std::size_t alignment,
                           unsigned long long* bad,
                           unsigned long long* null) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  void* p = blocks[i];
  if (p == nullptr) {
    atomicAdd(null, 1ull);
    return;
  }
  bool intact = false;
  if (sizes[i] < 4) {
    intact = *static_cast<std::uint8_t const*>(p) == static_cast<std::uint8_t>(i);
  } else {
    auto const* first = static_cast<std::uint32_t const*>(p);
    auto const* last =
        reinterpret_cast<std::uint32_t const*>(static_cast<char*>(p) + last_word(sizes[i]));
    intact = *first == i && *last == ~i;
  }
  std::size_t const need = alignment < 16 ? 16 : alignment;
  if (!intact || reinterpret_cast<std::uintptr_t>(p) % need != 0) {
    atomicAdd(bad, 1ull);
  }
}

/// Frees every block with the size and alignment it was allocated with (which say its class).
template <class Ref>
__global__ void free_all(Ref ref,
                         void* const* blocks,
                         std::size_t const* sizes,
                         std::uint32_t n,
                         std::size_t alignment = 16) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    ref.deallocate(blocks[i], sizes[i], alignment);
  }
}

/// Frees the blocks of two tables, `a`'s at even threads and `b`'s at odd ones, so that each
/// warp frees blocks of both (of two arenas, where the tables come from two).
template <class Ref>
__global__ void free_interleaved(Ref ref,
                                 void* const* a_blocks,
                                 std::size_t const* a_sizes,
                                 void* const* b_blocks,
                                 std::size_t const* b_sizes,
                                 std::uint32_t n) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 2 * n) {
    void* const* blocks = i % 2 == 0 ? a_blocks : b_blocks;
    std::size_t const* sizes = i % 2 == 0 ? a_sizes : b_sizes;
    ref.deallocate(blocks[i / 2], sizes[i / 2]);
  }
}

/// Sorted by address, each non-null block must end before the next begins.
__global__ void count_overlaps(std::uintptr_t const* starts,
                               std::size_t const* sizes,
                               std::uint32_t n,
                               unsigned long long* overlaps) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i + 1 < n && starts[i] != 0 && starts[i] + sizes[i] > starts[i + 1]) {
    atomicAdd(overlaps, 1ull);
  }
}

/// Device buffers for n blocks and the counters the checks fill.
struct block_table {
  explicit block_table(std::uint32_t n) : n{n} {
    CUDA_CHECK(cudaMalloc(&blocks, n * sizeof(void*)));
    CUDA_CHECK(cudaMalloc(&sizes, n * sizeof(std::size_t)));
    CUDA_CHECK(cudaMalloc(&counters, 3 * sizeof(unsigned long long)));
  }
  ~block_table() {
    cudaFree(blocks);
    cudaFree(sizes);
    cudaFree(counters);
  }
  block_table(block_table const&) = delete;
  block_table& operator=(block_table const&) = delete;

  unsigned grid() const { return (n + 255) / 256; }

  struct result {
    unsigned long long bad, null, overlaps;
  };
  /// Verifies tags and alignment, then sorts a copy of the addresses and looks for overlaps.
  result verify(std::size_t alignment) {
    CUDA_CHECK(cudaMemset(counters, 0, 3 * sizeof(unsigned long long)));
    verify_all<<<grid(), 256>>>(blocks, sizes, n, alignment, counters, counters + 1);
    std::uintptr_t* starts = nullptr;
    std::size_t* lengths = nullptr;
    CUDA_CHECK(cudaMalloc(&starts, n * sizeof(std::uintptr_t)));
    CUDA_CHECK(cudaMalloc(&lengths, n * sizeof(std::size_t)));
    CUDA_CHECK(cudaMemcpy(starts, blocks, n * sizeof(void*), cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(lengths, sizes, n * sizeof(std::size_t), cudaMemcpyDeviceToDevice));
    thrust::sort_by_key(thrust::device_pointer_cast(starts),
                        thrust::device_pointer_cast(starts + n),
                        thrust::device_pointer_cast(lengths));
    count_overlaps<<<grid(), 256>>>(starts, lengths, n, counters + 2);
    CUDA_CHECK(cudaDeviceSynchronize());
    result r{};
    CUDA_CHECK(cudaMemcpy(&r, counters, sizeof(r), cudaMemcpyDeviceToHost));
    cudaFree(starts);
    cudaFree(lengths);
    return r;
  }

  std::uint32_t n;
  void** blocks = nullptr;
  std::size_t* sizes = nullptr;
  unsigned long long* counters = nullptr;
};

/// What stats() should report while every block of allocate_all is live: worked out here from
/// the sizes, not by the library's code. A request takes the smallest power of two of at least
/// 16 B, its size and its alignment, up to 512 KiB; above, a run of whole 1 MiB slabs.
struct expected_use {
  expected_use(std::uint32_t n, std::size_t fixed, std::size_t alignment) {
    for (std::uint32_t i = 0; i < n; ++i) {
      std::size_t const size = std::max(size_of(fixed, i), alignment);
      if (size > 512 * 1024) {
        std::size_t const slabs = (size + mib - 1) / mib;
        ++large_blocks;
        large_bytes += slabs * mib;
        continue;
      }
      std::size_t cls = 0;
      while ((std::size_t{16} << cls) < size) {
        ++cls;
      }
      ++blocks[cls];
      bytes += std::size_t{16} << cls;
    }
    bytes += large_bytes;
  }
  std::array<std::size_t, devmr::heap_stats::num_size_classes> blocks{};
  std::size_t large_blocks = 0;
  std::size_t large_bytes = 0;
  std::size_t bytes = 0;  ///< small and large
};

/// Checks the per-class and large-block figures of `s` against `want`.
void check_use(devmr::heap_stats const& s, expected_use const& want) {
  for (std::size_t c = 0; c < devmr::heap_stats::num_size_classes; ++c) {
    INFO("size class " << c);
    std::size_t const block = std::size_t{16} << c;
    CHECK(s.classes[c].block_bytes == block);
    CHECK(s.classes[c].blocks_in_use == want.blocks[c]);
    CHECK(s.classes[c].slabs * (mib / block) >= want.blocks[c]);  // its slabs hold its blocks
  }
  CHECK(s.large_blocks_in_use == want.large_blocks);
  CHECK(s.large_bytes_in_use == want.large_bytes);
  CHECK(s.bytes_in_use == want.bytes);
  // The slabs that hold the blocks in use, whole, and the others free: together the heap.
  CHECK(s.held_bytes >= s.bytes_in_use);
  CHECK((s.bytes_in_use == 0) == (s.held_bytes == 0));
  CHECK(s.held_bytes + s.free_slabs * mib == s.capacity_bytes);
}

template <class Heap>
void allocate_verify_free(Heap& heap,
                          block_table& table,
                          std::size_t fixed,
                          std::size_t alignment) {
  auto ref = heap.ref();
  auto const before = heap.stats();
  allocate_all<<<table.grid(), 256>>>(ref, table.blocks, table.sizes, table.n, fixed, alignment);
  CUDA_CHECK(cudaGetLastError());
  auto const r = table.verify(alignment);
  INFO("block size " << fixed << " (0: mixed), alignment " << alignment << ", threads " << table.n);
  CHECK(r.null == 0);
  CHECK(r.bad == 0);
  CHECK(r.overlaps == 0);
  auto in_use = heap.stats();
  CHECK(in_use.blocks_in_use == table.n);
  check_use(in_use, expected_use{table.n, fixed, alignment});
  free_all<<<table.grid(), 256>>>(ref, table.blocks, table.sizes, table.n, alignment);
  CUDA_CHECK(cudaDeviceSynchronize());
  auto const after = heap.stats();
  CHECK(after.blocks_in_use == 0);
  check_use(after, expected_use{0, fixed, alignment});
  CHECK(after.failed_allocations == before.failed_allocations);
  CHECK(after.invalid_frees == before.invalid_frees);
}

}  // namespace

TEST_CASE("2^20 threads, every size class and mixed sizes: no overlap, aligned, all returned",
          "[heap][gpu][big]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 20 * gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 18 * gib}};
  block_table table{1u << 20};
  // Twice: the 16 KiB pass needs 16516 of the 18432 slabs, the second time all from slabs freed
  // before (no fresh ones left), so slow slab searches that make waiting warps give up and
  // strand half-used slabs show as failed allocations.
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round);
    for (std::size_t size = 16; size <= 16384; size *= 2) {
      allocate_verify_free(heap, table, size, 16);
    }
    allocate_verify_free(heap, table, 0, 16);
    allocate_verify_free(heap, table, 1, 16);  // below the smallest class
    allocate_verify_free(heap, table, 12, 16);
    allocate_verify_free(heap, table, 24, 16);    // between classes
    allocate_verify_free(heap, table, 1000, 16);  // between classes
  }
}

TEST_CASE("2^22 threads, every size class to 4 KiB and mixed sizes: no overlap, all returned",
          "[heap][gpu][big]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 20 * gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 18 * gib}};
  block_table table{1u << 22};
  allocate_verify_free(heap, table, 0, 16);
  for (std::size_t size = 16; size <= 4096; size *= 2) {  // 8 KiB blocks would need 32 GiB
    allocate_verify_free(heap, table, size, 16);
  }
}

TEST_CASE("rows of slabs on a 16 GiB heap: kernels of 2^16 threads, each freeing the last",
          "[heap][gpu][big][long]") {
  // A heap that gives every class every slot takes rows of four slabs for its larger classes
  // (docs/heap-internals.md, Rows): a slot of 4 KiB blocks serves four such kernels from one
  // row, then closes it and takes another, from the marks its frees left. Eight kernels of each
  // size and mixed sizes: no overlap, exact statistics while the rows are open, nothing lost.
  // (Left out under compute-sanitizer, [long]: the [big] tests of 18 GiB heaps take rows there.)
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 17 * gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 16 * gib}};
  block_table table{1u << 16};
  for (std::size_t const size : {std::size_t{1024}, std::size_t{4096}, std::size_t{65536}}) {
    for (int kernel = 0; kernel < 8; ++kernel) {
      INFO("kernel " << kernel);
      allocate_verify_free(heap, table, size, 16);
    }
  }
  for (int kernel = 0; kernel < 8; ++kernel) {
    allocate_verify_free(heap, table, 0, 16);
  }
  CHECK(heap.stats().failed_allocations == 0);
}

TEST_CASE("large classes and runs of slabs from kernels", "[heap][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 9 * gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 8 * gib}};
  // First one block of half the heap, while the heap is in one piece, then again from its stack.
  block_table one{1};
  allocate_verify_free(heap, one, 4 * gib, 16);
  allocate_verify_free(heap, one, 4 * gib, 16);  // the same run again, from its free stack
  block_table table{1u << 10};
  for (std::size_t size :
       {std::size_t{32768}, std::size_t{65536}, std::size_t{131072}, std::size_t{262144},
        std::size_t{524288}, std::size_t{524289}, std::size_t{1000000}, std::size_t{3} << 20}) {
    allocate_verify_free(heap, table, size, 16);
  }
}

TEST_CASE("every power-of-two alignment up to 1 MiB is honoured", "[heap][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 3 * gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 2 * gib}};
  block_table table{1u << 16};
  for (std::size_t alignment = 1; alignment <= 4096; alignment *= 2) {
    allocate_verify_free(heap, table, 24, alignment);
    allocate_verify_free(heap, table, 0, alignment);
  }
  // Above 4 KiB a block takes the class of its alignment (1 MiB: a run of one slab), so fewer.
  block_table few{1u << 10};
  for (std::size_t alignment = 8192; alignment <= mib; alignment *= 2) {
    allocate_verify_free(heap, few, 24, alignment);
    allocate_verify_free(heap, few, 0, alignment);
  }
}

namespace {

__global__ void misuse(devmr::slab_ref<> ref, void** results) {
  results[0] = ref.allocate(0);                         // nothing, and no failure
  results[1] = ref.allocate(64, 3);                     // not a power of two: counted
  results[2] = ref.allocate(64, std::size_t{1} << 21);  // above a slab: counted
  ref.deallocate(nullptr, 64);                          // nothing, and no invalid free
  void const* block = ref.allocate(64);                 // freed through a pointer to const
  results[3] = const_cast<void*>(block);
  ref.deallocate(block, 64);
  ref.deallocate(ref.allocate(32), 32, 0);  // alignment 0: the class of 32 B (a large class)
}

}  // namespace

TEST_CASE("zero bytes, bad alignments and null frees", "[heap][gpu]") {
  devmr::device_pool pool{};
  void** results = nullptr;
  CUDA_CHECK(cudaMallocManaged(&results, 4 * sizeof(void*)));
  for (bool const checked : {false, true}) {
    INFO("checked heap: " << checked);
    devmr::slab_heap<> heap{pool, devmr::heap_options{.checked = checked}};
    misuse<<<1, 1>>>(heap.ref(), results);
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(results[0] == nullptr);
    CHECK(results[1] == nullptr);
    CHECK(results[2] == nullptr);
    CHECK(results[3] != nullptr);
    auto ref = heap.ref();
    CHECK(ref.allocate(0) == nullptr);  // the host path too
    ref.deallocate(nullptr, 64);
    auto const s = heap.stats();
    CHECK(s.bad_alignments == 2);
    CHECK(s.failed_allocations == 0);
    CHECK(s.invalid_frees == 0);
    CHECK(s.double_frees == 0);
    CHECK(s.blocks_in_use == 0);
    CHECK(s.bytes_in_use == 0);
    CHECK(s.classes[1].blocks_in_use == 0);  // the 32 B block came back to its class
  }
  cudaFree(results);
}

TEST_CASE("out-of-memory storms return nullptr, count it, and recover after frees", "[heap][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 256 * mib}};
  // Ask for twice the heap in 1 KiB blocks, then in mixed sizes (16 B to 4 KiB, 900 B on
  // average), then in 1 KiB blocks again.
  block_table table{(512u * 1024 * 1024) / 1024};
  std::uint64_t failed_before = 0;
  for (std::size_t const size : {std::size_t{1024}, std::size_t{0}, std::size_t{1024}}) {
    INFO("block size " << size << " (0: mixed)");
    allocate_all<<<table.grid(), 256>>>(heap.ref(), table.blocks, table.sizes, table.n, size, 16);
    auto const r = table.verify(16);
    CHECK(r.bad == 0);
    CHECK(r.overlaps == 0);
    CHECK(r.null > 0);
    auto const s = heap.stats();
    CHECK(s.failed_allocations - failed_before == r.null);  // every nullptr counted, once
    failed_before = s.failed_allocations;
    // Nearly all the heap was handed out before the failures: the slots keep a few slabs partly
    // used, up to one per slot for each of the five groups of mixed sizes (32 slots here), whose
    // live blocks keep them from other groups.
    INFO("in use: " << s.bytes_in_use << " of " << heap.capacity() << " bytes");
    CHECK(s.bytes_in_use >= heap.capacity() * (size == 0 ? 7 : 9) / 10);
    CHECK(s.blocks_in_use == table.n - r.null);
    free_all<<<table.grid(), 256>>>(heap.ref(), table.blocks, table.sizes, table.n);
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(heap.stats().blocks_in_use == 0);
  }
  // After the storms, nine tenths of the heap succeed again, in another class.
  block_table most{static_cast<std::uint32_t>(heap.capacity() * 9 / 10 / 4096)};
  allocate_verify_free(heap, most, 4096, 16);
}

/// One block of threads allocates `bytes` for every entry of `blocks`, in turns. A block of 1024
/// threads has 64 registers a thread: the bounds tell ptxas so (see README, Limits).
template <class Ref>
__global__ void __launch_bounds__(1024) allocate_in_one_block(
    Ref ref, void** blocks, std::size_t* sizes, std::uint32_t n, std::size_t bytes) {
  for (std::uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
    void* p = ref.allocate(bytes);
    if (p != nullptr) {
      write_tags(p, bytes, i);
    }
    blocks[i] = p;
    sizes[i] = bytes;
  }
}

TEST_CASE("one SM fills the heap: every slab comes to it", "[heap][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 2 * gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = gib}};
  // A kernel on one SM asking for twice the heap in 4 KiB blocks gets every block of it.
  block_table table{static_cast<std::uint32_t>(2 * heap.capacity() / 4096)};
  allocate_in_one_block<<<1, 1024>>>(heap.ref(), table.blocks, table.sizes, table.n, 4096);
  CUDA_CHECK(cudaGetLastError());
  auto const r = table.verify(16);
  CHECK(r.bad == 0);
  CHECK(r.overlaps == 0);
  auto const s = heap.stats();
  CHECK(s.blocks_in_use == table.n - r.null);
  CHECK(s.bytes_in_use >= heap.capacity() * 99 / 100);
  free_all<<<table.grid(), 256>>>(heap.ref(), table.blocks, table.sizes, table.n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(heap.stats().blocks_in_use == 0);
}

/// One round of the steady-churn protocol (docs/design.md): slot j of thread i toggles with
/// probability 2^-(j+1); a full slot checks its block's tags and frees it, an empty one allocates
/// a block (of `fixed` bytes, or mixed sizes when 0) and tags it. Counts failed allocations and
/// damaged tags.
__global__ void steady_round(devmr::slab_ref<> ref,
                             void** held,
                             std::uint32_t* held_bytes,
                             std::uint32_t n,
                             std::uint32_t round,
                             std::size_t fixed,
                             unsigned long long* failures,
                             unsigned long long* bad) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  std::uint32_t const h = fmix32(i ^ (round * 0x85ebca6bu) ^ 0x27d4eb2fu);
  for (unsigned j = 0; j < 4; ++j) {
    if ((h >> (8 * j)) % (2u << j) != 0) {
      continue;
    }
    void*& p = held[4 * std::size_t{i} + j];
    std::uint32_t const tag = (i * 4u + j) ^ round;
    if (p != nullptr) {
      std::size_t const bytes = held_bytes[4 * std::size_t{i} + j];
      auto const* words = static_cast<std::uint32_t const*>(p);
      std::uint32_t const was = words[0];
      if (words[last_word(bytes) / 4] != ~was || (was ^ (i * 4u + j)) >= 1024) {
        atomicAdd(bad, 1ull);
      }
      ref.deallocate(p, bytes);
      p = nullptr;
      continue;
    }
    std::size_t const bytes =
        fixed != 0 ? fixed : std::size_t{16} << (fmix32(i * 4 + j + round * 7919u) % 9);
    p = ref.allocate(bytes);
    if (p == nullptr) {
      atomicAdd(failures, 1ull);
      continue;
    }
    held_bytes[4 * std::size_t{i} + j] = static_cast<std::uint32_t>(bytes);
    write_tags(p, bytes, tag);
  }
}

__global__ void free_held(devmr::slab_ref<> ref,
                          void** held,
                          std::uint32_t const* held_bytes,
                          std::size_t n) {
  for (std::size_t k = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; k < n;
       k += std::size_t{gridDim.x} * blockDim.x) {
    ref.deallocate(held[k], held_bytes[k]);
    held[k] = nullptr;
  }
}

/// Runs `rounds` rounds of steady churn with enough threads that the live bytes are `share` of
/// the heap (half the slots full, blocks of `fixed` bytes or mixed, which average 455 B); checks
/// that no allocation failed, no tag was damaged, the heap holds no more than it must, and every
/// block comes back. With `per_round`, the failed allocations of each round go there instead of
/// being checked.
void steady_churn(devmr::slab_heap<>& heap,
                  std::size_t fixed,
                  double share,
                  int rounds,
                  std::vector<unsigned long long>* per_round = nullptr) {
  double const mean = fixed != 0 ? static_cast<double>(fixed) : 8176.0 / 9;
  auto const n =
      static_cast<std::uint32_t>(share * static_cast<double>(heap.capacity()) / (2 * mean));
  void** held = nullptr;
  std::uint32_t* held_bytes = nullptr;
  unsigned long long* counts = nullptr;
  CUDA_CHECK(cudaMalloc(&held, 4 * std::size_t{n} * sizeof(void*)));
  CUDA_CHECK(cudaMalloc(&held_bytes, 4 * std::size_t{n} * sizeof(std::uint32_t)));
  CUDA_CHECK(cudaMalloc(&counts, 2 * sizeof(unsigned long long)));
  CUDA_CHECK(cudaMemset(held, 0, 4 * std::size_t{n} * sizeof(void*)));
  // free_held reads the size of every slot, empty ones too (an empty slot frees nullptr).
  CUDA_CHECK(cudaMemset(held_bytes, 0, 4 * std::size_t{n} * sizeof(std::uint32_t)));
  CUDA_CHECK(cudaMemset(counts, 0, 2 * sizeof(unsigned long long)));
  for (int round = 0; round < rounds; ++round) {
    steady_round<<<(n + 255) / 256, 256>>>(heap.ref(), held, held_bytes, n,
                                           static_cast<std::uint32_t>(round), fixed, counts,
                                           counts + 1);
    CUDA_CHECK(cudaGetLastError());
    if (per_round != nullptr) {
      unsigned long long failed = 0;
      CUDA_CHECK(cudaMemcpy(&failed, counts, sizeof(failed), cudaMemcpyDeviceToHost));
      per_round->push_back(failed);
    }
  }
  unsigned long long found[2] = {};
  CUDA_CHECK(cudaMemcpy(found, counts, sizeof(found), cudaMemcpyDeviceToHost));
  if (per_round != nullptr) {
    std::adjacent_difference(per_round->begin(), per_round->end(), per_round->begin());
  } else {
    CHECK(found[0] == 0);  // failed allocations
  }
  CHECK(found[1] == 0);  // damaged tags
  auto const s = heap.stats();
  CHECK(s.failed_allocations == found[0]);
  CHECK(s.bytes_in_use <= heap.capacity());
  CHECK(s.held_bytes >= s.bytes_in_use);
  CHECK(s.held_bytes + s.free_slabs * mib == heap.capacity());
  free_held<<<264, 256>>>(heap.ref(), held, held_bytes, 4 * std::size_t{n});
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(heap.stats().blocks_in_use == 0);
  CUDA_CHECK(cudaFree(held));
  CUDA_CHECK(cudaFree(held_bytes));
  CUDA_CHECK(cudaFree(counts));
}

TEST_CASE("steady churn with mixed lifetimes reuses freed blocks: no allocation fails at 80%",
          "[heap][gpu][reuse]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 600 * mib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 512 * mib}};
  SECTION("mixed sizes, 80% live") {
    steady_churn(heap, 0, 0.8, 40);
  }
  SECTION("4 KiB, 80% live") {
    steady_churn(heap, 4096, 0.8, 40);
  }
  SECTION("64 B, 50% live") {
    steady_churn(heap, 64, 0.5, 20);
  }
}

TEST_CASE("a class spread over the slots of its old width gives back the slabs it no longer needs",
          "[heap][gpu][reuse][width][long]") {
  // 4 KiB blocks alone at 80% live widen their class to 128 slots of the 512 MiB heap. Then
  // every size: the first claims of the next kernel read the old width, before the installs of
  // the classes new to the heap narrow it. The slots past the new width give their slabs up
  // then, and installs there take no empty slab: no allocation may fail.
  auto const phase_change = [](double share, int rounds) {
    devmr::device_pool pool{devmr::pool_options{.initial_bytes = 600 * mib}};
    devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 512 * mib}};
    steady_churn(heap, 4096, 0.8, 20);
    std::vector<unsigned long long> failed;
    steady_churn(heap, 0, share, rounds, &failed);
    return failed;
  };
  for (auto const& [share, rounds] : {std::pair{0.75, 60}, std::pair{0.8, 90}}) {
    INFO("every size at " << share << " of the heap live");
    auto const failed = phase_change(share, rounds);
    INFO("failed allocations: " << std::accumulate(failed.begin(), failed.end(), 0ull)
                                << ", in the last 30 rounds: "
                                << std::accumulate(failed.end() - 30, failed.end(), 0ull));
    CHECK(std::count(failed.begin(), failed.end(), 0ull) == rounds);
  }
}

TEST_CASE("steady churn over a checked heap: no misuse, no failure", "[heap][gpu][reuse]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 300 * mib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 256 * mib, .checked = true}};
  steady_churn(heap, 0, 0.7, 20);
  auto const s = heap.stats();
  CHECK(s.invalid_frees == 0);
  CHECK(s.double_frees == 0);
}

TEST_CASE("a thousand rounds of steady churn at 80% live, 2^20 threads and more, every size",
          "[heap][gpu][reuse][long]") {
  // Heaps sized so that 80% live takes more than 2^20 threads at each size.
  auto const run = [](std::size_t heap_bytes, std::size_t fixed) {
    devmr::device_pool pool{devmr::pool_options{.initial_bytes = heap_bytes + 64 * mib}};
    devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = heap_bytes}};
    steady_churn(heap, fixed, 0.8, 1000);
  };
  SECTION("16 B: 1.68 M threads on 64 MiB") {
    run(64 * mib, 16);
  }
  SECTION("64 B: 1.68 M threads on 256 MiB") {
    run(256 * mib, 64);
  }
  SECTION("4 KiB: 1.26 M threads on 12 GiB") {
    run(12 * gib, 4096);
  }
  SECTION("mixed: 1.42 M threads on 3 GiB") {
    run(3 * gib, 0);
  }
}

TEST_CASE("free slabs merge again: one block as large as the heap", "[heap][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 256 * mib}};
  block_table whole{1};
  // Twice the heap in 4 KiB blocks: every slab is taken, each emptied on its own when freed.
  block_table table{(512u * 1024 * 1024) / 4096};
  allocate_all<<<table.grid(), 256>>>(heap.ref(), table.blocks, table.sizes, table.n, 4096, 16);
  auto const r = table.verify(16);
  CHECK(r.bad == 0);
  CHECK(r.overlaps == 0);
  CHECK(r.null >= table.n / 2);
  free_all<<<table.grid(), 256>>>(heap.ref(), table.blocks, table.sizes, table.n);
  CUDA_CHECK(cudaDeviceSynchronize());
  allocate_verify_free(heap, whole, heap.capacity(), 16);
  // Mixed sizes: the slots of five groups hold slabs partly handed out; a block that needs
  // them all makes the slots give them up. (Under compute-sanitizer installs take so long that
  // waiting warps give up on them: one takes over, the others wait again. When each installed a
  // slab of its own, this pass failed a fifth of its blocks there.)
  block_table mixed{1u << 16};
  allocate_verify_free(heap, mixed, 0, 16);
  allocate_verify_free(heap, whole, heap.capacity(), 16);
  // From the host side of the ref too, and then small blocks again.
  for (int round = 0; round < 2; ++round) {
    void* halves[2] = {heap.ref().allocate(heap.capacity() / 2),
                       heap.ref().allocate(heap.capacity() / 2)};
    CHECK(heap.stats().blocks_in_use == 2);
    heap.ref().deallocate(halves[0], heap.capacity() / 2);
    heap.ref().deallocate(halves[1], heap.capacity() / 2);
    allocate_verify_free(heap, mixed, 0, 16);
  }
  CHECK(heap.stats().blocks_in_use == 0);
}

TEST_CASE("runs and small blocks from one kernel in a tight heap: no overlap, all merge back",
          "[heap][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 512 * mib}};
  // About 2^11 runs of 1 to 5 slabs ask for ten times the heap; the small blocks find room
  // between them, and failed runs gather free slabs while the kernel runs.
  block_table table{1u << 15};
  for (int round = 0; round < 4; ++round) {
    allocate_all<<<table.grid(), 256>>>(heap.ref(), table.blocks, table.sizes, table.n,
                                        mixed_and_runs, 16);
    auto const r = table.verify(16);
    CHECK(r.bad == 0);
    CHECK(r.overlaps == 0);
    CHECK(r.null > 0);
    CHECK(heap.stats().blocks_in_use == table.n - r.null);
    free_all<<<table.grid(), 256>>>(heap.ref(), table.blocks, table.sizes, table.n);
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(heap.stats().blocks_in_use == 0);
  }
  block_table whole{1};
  allocate_verify_free(heap, whole, heap.capacity(), 16);
}

namespace {

/// Each thread: `rounds` times allocate 64 B (or mixed), write, check, free. Counts failures.
/// Each thread `rounds` x (allocate, tag, pause, check the tags, free). Counts null blocks in
/// `errors[0]` and overwritten tags in `errors[1]`.
__global__ void churn(devmr::slab_ref<> ref, int rounds, bool mixed, unsigned long long* errors) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  for (int r = 0; r < rounds; ++r) {
    std::size_t const bytes = mixed ? size_of(0, i * 131 + r) : 64;
    auto* p = static_cast<std::uint32_t*>(ref.allocate(bytes));
    if (p == nullptr) {
      atomicAdd(&errors[0], 1ull);
      continue;
    }
    write_tags(p, bytes, i ^ r);
    __nanosleep(fmix32(i + r) % 64);
    auto const* last =
        reinterpret_cast<std::uint32_t const*>(reinterpret_cast<char*>(p) + last_word(bytes));
    if (*p != (i ^ r) || *last != ~(i ^ r)) {
      atomicAdd(&errors[1], 1ull);
    }
    ref.deallocate(p, bytes);
  }
}

/// Each thread `rounds` x (allocate, write both ends, free) with nothing in between: what a
/// kernel with scratch blocks does. Counts null blocks.
__global__ void tight_churn(devmr::slab_ref<> ref,
                            int rounds,
                            bool mixed,
                            unsigned long long* nulls) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  for (int r = 0; r < rounds; ++r) {
    std::size_t const bytes = mixed ? size_of(0, i * 131 + r) : 64;
    void* p = ref.allocate(bytes);
    if (p == nullptr) {
      atomicAdd(nulls, 1ull);
      continue;
    }
    write_tags(p, bytes, i ^ r);
    ref.deallocate(p, bytes);
  }
}

/// Each thread `rounds` x (allocate 32 KiB to 256 KiB, tag, check the tags, free without the
/// size, as bulk frees do). Blocks of groups whose slabs hold 4 to 64 units: claims often make
/// the fronts of a slab meet while frees into it look for their blocks' class, and those frees
/// leave their blocks to the claim. Counts null blocks in `errors[0]` and overwritten tags in
/// `errors[1]`.
__global__ void sizeless_churn(devmr::slab_ref<> ref, int rounds, unsigned long long* errors) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  for (int r = 0; r < rounds; ++r) {
    std::size_t const bytes = std::size_t{32 << 10} << (fmix32(i * 7 + r) % 4);
    auto* p = static_cast<std::uint32_t*>(ref.allocate(bytes));
    if (p == nullptr) {
      atomicAdd(&errors[0], 1ull);
      continue;
    }
    write_tags(p, bytes, i ^ r);
    auto const* last =
        reinterpret_cast<std::uint32_t const*>(reinterpret_cast<char*>(p) + last_word(bytes));
    if (*p != (i ^ r) || *last != ~(i ^ r)) {
      atomicAdd(&errors[1], 1ull);
    }
    ref.deallocate(p, 0);
  }
}

}  // namespace

TEST_CASE("churn of 10^8 allocate/free pairs leaves no block behind", "[heap][gpu][big]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 2 * gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = gib}};
  unsigned long long* errors = nullptr;
  CUDA_CHECK(cudaMallocManaged(&errors, 2 * sizeof(unsigned long long)));
  errors[0] = errors[1] = 0;
  std::uint32_t const threads = 1u << 20;
  churn<<<threads / 256, 256>>>(heap.ref(), 48, false, errors);
  churn<<<threads / 256, 256>>>(heap.ref(), 48, true, errors);  // 2 x 48 x 2^20 > 10^8
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(errors[0] == 0);  // null blocks
  CHECK(errors[1] == 0);  // overwritten tags
  auto const s = heap.stats();
  CHECK(s.blocks_in_use == 0);
  CHECK(s.failed_allocations == 0);
  cudaFree(errors);
}

TEST_CASE("frees without sizes racing the claims that use their slabs up lose no block",
          "[heap][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 2 * gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = gib}};
  unsigned long long* errors = nullptr;
  CUDA_CHECK(cudaMallocManaged(&errors, 2 * sizeof(unsigned long long)));
  errors[0] = errors[1] = 0;
  // 4096 threads hold about 0.5 GiB at a time.
  sizeless_churn<<<16, 256>>>(heap.ref(), 64, errors);
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(errors[1] == 0);                // overwritten tags
  CHECK(errors[0] < 4096u * 64 / 100);  // null blocks: out of memory now and then at most
  auto const s = heap.stats();
  CHECK(s.blocks_in_use == 0);
  CHECK(s.bytes_in_use == 0);
  // Every slab came back: one block takes the whole heap.
  void* whole = heap.ref().allocate(heap.capacity());
  CHECK(whole != nullptr);
  heap.ref().deallocate(whole, heap.capacity());
  CHECK(heap.stats().blocks_in_use == 0);
  cudaFree(errors);
}

namespace {

template <class Group>
__device__ void group_round_trip(devmr::slab_ref<> ref,
                                 Group const& g,
                                 std::uint32_t group_id,
                                 std::size_t bytes,
                                 void** firsts,
                                 unsigned long long* errors) {
  auto* p = static_cast<std::uint32_t*>(ref.allocate(g, bytes));
  if (p == nullptr) {
    if (g.thread_rank() == 0) {
      atomicAdd(errors, 1ull);
    }
    return;
  }
  if (g.thread_rank() == 0) {
    firsts[group_id] = p;
  }
  // Each member tags its share of the words and, after the sync, checks the next member's share
  // and that it holds the first member's pointer: members with blocks of their own would fail.
  std::size_t const words = bytes / 4;
  for (std::size_t w = g.thread_rank(); w < words; w += g.size()) {
    p[w] = group_id;
  }
  g.sync();
  unsigned long long wrong = firsts[group_id] != p ? 1 : 0;
  for (std::size_t w = (g.thread_rank() + 1) % g.size(); w < words; w += g.size()) {
    wrong += p[w] != group_id ? 1 : 0;
  }
  if (wrong != 0) {
    atomicAdd(errors, wrong);
  }
  ref.deallocate(g, p, bytes);
}

__global__ void tile_groups(devmr::slab_ref<> ref, void** firsts, unsigned long long* errors) {
  auto const tile = cg::tiled_partition<32>(cg::this_thread_block());
  std::uint32_t const id = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  group_round_trip(ref, tile, id, 2048, firsts, errors);
}

__global__ void block_groups(devmr::slab_ref<> ref, void** firsts, unsigned long long* errors) {
  group_round_trip(ref, cg::this_thread_block(), blockIdx.x, 64 * 1024, firsts, errors);
}

__global__ void small_tiles(devmr::slab_ref<> ref, void** firsts, unsigned long long* errors) {
  auto const tile = cg::tiled_partition<4>(cg::this_thread_block());
  std::uint32_t const id = (blockIdx.x * blockDim.x + threadIdx.x) / 4;
  group_round_trip(ref, tile, id, 48, firsts, errors);
}

}  // namespace

TEST_CASE("group allocation: one block per group, the same pointer to every member",
          "[heap][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 512 * mib}};
  unsigned long long* errors = nullptr;
  void** firsts = nullptr;
  CUDA_CHECK(cudaMallocManaged(&errors, sizeof(unsigned long long)));
  CUDA_CHECK(cudaMallocManaged(&firsts, (1u << 16) * sizeof(void*)));
  *errors = 0;
  tile_groups<<<1024, 256>>>(heap.ref(), firsts, errors);
  block_groups<<<1024, 256>>>(heap.ref(), firsts, errors);
  small_tiles<<<256, 256>>>(heap.ref(), firsts, errors);
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(*errors == 0);
  CHECK(heap.stats().blocks_in_use == 0);
  cudaFree(errors);
  cudaFree(firsts);
}

TEST_CASE("the host frees kernel blocks, kernels free host blocks", "[heap][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 256 * mib}};
  auto ref = heap.ref();
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  block_table table{1u << 16};

  // Kernel blocks freed by the host: in bulk, and one by one.
  allocate_all<<<table.grid(), 256, 0, stream>>>(ref, table.blocks, table.sizes, table.n, 0, 16);
  heap.deallocate_bulk({table.blocks, table.n - 2}, stream);
  std::vector<void*> last(2);
  CUDA_CHECK(cudaMemcpyAsync(last.data(), table.blocks + table.n - 2, 2 * sizeof(void*),
                             cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CHECK(heap.stats(stream).blocks_in_use == 2);
  heap.deallocate_async(last[0], size_of(0, table.n - 2), 16, stream);
  heap.deallocate_async(last[1], size_of(0, table.n - 1), 16, stream);
  CHECK(heap.stats(stream).blocks_in_use == 0);

  // Host blocks (through the host path of the ref, and a cuda::mr::resource_ref) freed by a kernel.
  cuda::mr::resource_ref<cuda::mr::device_accessible> erased{ref};
  std::vector<void*> host_blocks;
  std::vector<std::size_t> host_sizes;
  for (std::size_t i = 0; i < 64; ++i) {
    std::size_t const bytes = 16 << (i % 16);
    host_blocks.push_back(i % 2 == 0 ? ref.allocate(bytes, 16) : erased.allocate(bytes, 16));
    host_sizes.push_back(bytes);
    CHECK(ref.owns(host_blocks.back()));
    CHECK(reinterpret_cast<std::uintptr_t>(host_blocks.back()) % 16 == 0);
  }
  CHECK_FALSE(ref.owns(&stream));
  CHECK(heap.stats().blocks_in_use == 64);
  CUDA_CHECK(
      cudaMemcpy(table.blocks, host_blocks.data(), 64 * sizeof(void*), cudaMemcpyHostToDevice));
  CUDA_CHECK(
      cudaMemcpy(table.sizes, host_sizes.data(), 64 * sizeof(std::size_t), cudaMemcpyHostToDevice));
  free_all<<<1, 64>>>(ref, table.blocks, table.sizes, 64);
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(heap.stats().blocks_in_use == 0);

  // Host errors: bad alignment, more than the heap holds; nothing allocated before is lost.
  void* kept = ref.allocate(100);
  auto const before_errors = heap.stats();
  CHECK_THROWS_AS(ref.allocate(64, 3), std::invalid_argument);
  CHECK_THROWS_AS(ref.allocate(gib), devmr::out_of_memory);
  CHECK(ref.allocate(0) == nullptr);
  auto const after_errors = heap.stats();
  CHECK(after_errors.blocks_in_use == 1);
  // The host throws for the alignment before asking the heap; the failed request is counted.
  CHECK(after_errors.bad_alignments == before_errors.bad_alignments);
  CHECK(after_errors.failed_allocations == before_errors.failed_allocations + 1);
  ref.deallocate(kept, 100);
  CHECK(heap.stats().blocks_in_use == 0);
  cudaStreamDestroy(stream);
}

TEST_CASE("grow while blocks are live: nothing moves, new memory serves new kernels",
          "[heap][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 64 * mib}};
  std::uint32_t const n = (64u * 1024 * 1024) / 4096 + 4096;  // more than the first arena holds
  block_table first{n};
  allocate_all<<<first.grid(), 256>>>(heap.ref(), first.blocks, first.sizes, n, 4096, 16);
  auto const before = first.verify(16);
  CHECK(before.null >= 4096);
  CHECK(before.bad == 0);
  devmr::slab_ref<> const taken_before = heap.ref();  // copies arena 0's entry, not the others
  heap.grow(128 * mib);
  CHECK(heap.capacity() == 192 * mib);
  block_table second{n};
  allocate_all<<<second.grid(), 256>>>(heap.ref(), second.blocks, second.sizes, n, 4096, 16);
  auto const after = second.verify(16);
  CHECK(after.null == 0);
  CHECK(after.bad == 0);
  auto const again = first.verify(16);  // the first blocks are intact and where they were
  CHECK(again.bad == 0);
  CHECK(again.null == before.null);
  // A ref taken before the growth frees blocks of the new arena too, and each warp frees blocks
  // of both arenas: its lanes part between arena 0's way to a slab and the other arenas'.
  free_interleaved<<<2 * first.grid(), 256>>>(taken_before, first.blocks, first.sizes,
                                              second.blocks, second.sizes, n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(heap.stats().blocks_in_use == 0);
  CHECK(heap.stats().invalid_frees == 0);
  devmr::heap_options const capped_options{.initial_bytes = 32 * mib, .maximum_bytes = 64 * mib};
  devmr::slab_heap<> capped{pool, capped_options};
  CHECK_THROWS_AS(capped.grow(64 * mib), devmr::out_of_memory);
  CHECK(capped.capacity() == 32 * mib);  // unchanged by the refused growth
  CHECK_NOTHROW(capped.grow(32 * mib));
}

TEST_CASE("reset frees every block at once", "[heap][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 256 * mib}};
  block_table table{1u << 16};
  allocate_all<<<table.grid(), 256>>>(heap.ref(), table.blocks, table.sizes, table.n, 0, 16);
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(heap.stats().blocks_in_use == table.n);
  heap.reset();
  CHECK(heap.stats().blocks_in_use == 0);
  allocate_verify_free(heap, table, 0, 16);
}

/// Each thread allocates a block (a warp's blocks share a slab) and tags it; then the lanes of
/// each warp free theirs in four turns, a different quarter of the warp first in each warp, with
/// a pause between turns: every free comes from part of a warp, and the blocks of one slab come
/// back at different times. Counts null blocks and broken tags.
__global__ void staggered_frees(devmr::slab_ref<> ref,
                                std::size_t bytes,
                                unsigned long long* errors) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  auto* const p = static_cast<std::uint32_t*>(ref.allocate(bytes));
  if (p == nullptr) {
    atomicAdd(&errors[0], 1ull);
    return;
  }
  write_tags(p, bytes, i);
  for (unsigned turn = 0; turn < 4; ++turn) {
    if ((threadIdx.x + i / 32) % 4 == turn) {
      auto const* last =
          reinterpret_cast<std::uint32_t const*>(reinterpret_cast<char*>(p) + last_word(bytes));
      if (*p != i || *last != ~i) {
        atomicAdd(&errors[1], 1ull);
      }
      ref.deallocate(p, bytes);
    }
    __nanosleep(200);
  }
}

TEST_CASE("frees from parts of warps, at different times, each give back one block",
          "[heap][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 3 * gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 2 * gib}};
  unsigned long long* errors = nullptr;
  CUDA_CHECK(cudaMallocManaged(&errors, 2 * sizeof(unsigned long long)));
  for (std::size_t bytes : {std::size_t{16}, std::size_t{256}, std::size_t{4096}}) {
    for (int run = 0; run < 3; ++run) {  // later runs take the slabs the earlier ones emptied
      errors[0] = errors[1] = 0;
      staggered_frees<<<(1u << 18) / 256, 256>>>(heap.ref(), bytes, errors);
      CUDA_CHECK(cudaDeviceSynchronize());
      INFO("bytes " << bytes << ", run " << run);
      CHECK(errors[0] == 0);
      CHECK(errors[1] == 0);
      auto const s = heap.stats();
      CHECK(s.blocks_in_use == 0);
      CHECK(s.invalid_frees == 0);
    }
  }
  block_table table{1u << 18};  // and the recycled slabs hand out every block once
  allocate_verify_free(heap, table, 0, 16);
  cudaFree(errors);
}

/// Each warp frees, in one call, blocks of the heap (lanes 0 and 2 of every 4), pointers no block
/// of the heap starts at (lane 1: nullptr in even warps, memory that is not the heap's in odd
/// ones), and addresses 2^52 bytes past the lane's own block (lane 3: its slab's index, taken
/// to 32 bits, is that of the block's slab); then lanes 1 and 3 free their own blocks. A free
/// that grouped a stranger with the blocks of a slab would give back too many of them.
__global__ void frees_with_strangers(devmr::slab_ref<> ref,
                                     std::size_t fixed,
                                     std::byte const* foreign,
                                     unsigned long long* errors) {
  std::uint32_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  std::size_t const bytes = size_of(fixed, i);
  void* const p = ref.allocate(bytes);
  if (p == nullptr) {
    atomicAdd(&errors[0], 1ull);
  } else {
    write_tags(p, bytes, i);
  }
  unsigned const lane = threadIdx.x % 32;
  auto const* stranger = reinterpret_cast<void const*>(reinterpret_cast<std::uintptr_t>(p) +
                                                       (std::uintptr_t{1} << 52));
  if (lane % 4 == 1) {
    stranger = (i / 32) % 2 == 0 ? nullptr : foreign + i;
  }
  __syncwarp();
  ref.deallocate(lane % 2 == 0 ? p : stranger, bytes);
  __syncwarp();
  if (lane % 2 == 1) {
    ref.deallocate(p, bytes);
  }
}

TEST_CASE("a warp frees blocks, nullptrs and foreign pointers in one call", "[heap][gpu]") {
  constexpr unsigned threads = 1u << 18;
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 3 * gib}};
  std::byte* foreign = nullptr;
  CUDA_CHECK(cudaMalloc(&foreign, threads));
  unsigned long long* errors = nullptr;
  CUDA_CHECK(cudaMallocManaged(&errors, sizeof(unsigned long long)));
  for (bool const checked : {false, true}) {
    devmr::slab_heap<> heap{pool,
                            devmr::heap_options{.initial_bytes = 2 * gib, .checked = checked}};
    for (std::size_t const fixed : {std::size_t{16}, std::size_t{4096}, std::size_t{0}}) {
      for (int run = 0; run < 2; ++run) {  // the second run takes the slabs the first emptied
        INFO("checked " << checked << ", block size " << fixed << " (0: mixed), run " << run);
        *errors = 0;
        auto const before = heap.stats();
        frees_with_strangers<<<threads / 256, 256>>>(heap.ref(), fixed, foreign, errors);
        CUDA_CHECK(cudaDeviceSynchronize());
        auto const s = heap.stats();
        CHECK(*errors == 0);
        CHECK(s.blocks_in_use == 0);
        // lane 3 of every 4, and lane 1 in odd warps (nullptr is no misuse)
        CHECK(s.invalid_frees - before.invalid_frees == threads / 4 + threads / 8);
        CHECK(s.double_frees == 0);
      }
    }
    block_table table{threads};  // and the slabs those frees emptied hand out every block once
    allocate_verify_free(heap, table, 0, 16);
  }
  cudaFree(errors);
  cudaFree(foreign);
}

TEST_CASE("tight churn, run after run, leaves no block behind", "[heap][gpu]") {
  // No pause between allocating and freeing: warps free while their neighbours claim, and warps
  // straddle two slabs often. Every run must end with every block back (a free that a warp's
  // aggregation lost shows up here as blocks still in use). Overlaps are the other tests' job.
  // 16 GiB: every SM has its own slots.
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 17 * gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 16 * gib}};
  unsigned long long* nulls = nullptr;
  CUDA_CHECK(cudaMallocManaged(&nulls, sizeof(unsigned long long)));
  *nulls = 0;
  for (int run = 0; run < 8; ++run) {
    heap.reset();
    tight_churn<<<(1u << 20) / 256, 256>>>(heap.ref(), 16, run % 2 == 1, nulls);
    CUDA_CHECK(cudaDeviceSynchronize());
    INFO("run " << run);
    CHECK(*nulls == 0);
    CHECK(heap.stats().blocks_in_use == 0);
  }
  cudaFree(nulls);
}

namespace {

__global__ void double_free(devmr::slab_ref<> ref, void** blocks) {
  void* p = ref.allocate(64);
  ref.deallocate(p, 64);
  ref.deallocate(p, 64);                                  // double
  ref.deallocate(static_cast<char*>(blocks[0]) + 8, 64);  // not a block start
  ref.deallocate(blocks, 64);                             // not the heap's
}

}  // namespace

TEST_CASE("checked heaps record invalid and double frees; check throws heap_error", "[heap][gpu]") {
  devmr::device_pool pool{};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.checked = true}};
  void** blocks = nullptr;
  CUDA_CHECK(cudaMallocManaged(&blocks, sizeof(void*)));
  blocks[0] = heap.ref().allocate(256);
  double_free<<<1, 1>>>(heap.ref(), blocks);
  CUDA_CHECK(cudaDeviceSynchronize());
  auto const s = heap.stats();
  CHECK(s.double_frees == 1);
  CHECK(s.invalid_frees == 2);
  CHECK(s.blocks_in_use == 1);
  CHECK_THROWS_AS(heap.check(), devmr::heap_error);
  CHECK_NOTHROW(heap.check());  // reported once
  heap.ref().deallocate(blocks[0], 256);
  CHECK(heap.stats().blocks_in_use == 0);
  cudaFree(blocks);
}

TEST_CASE("checked heaps reject frees of blocks from before a reset", "[heap][gpu]") {
  // Every block of a 64-slab heap is handed out, the heap reset, and the old pointers freed.
  // Their slabs were not handed out since the reset: metadata from before it must not pass them
  // for blocks, or the slabs would be marked empty while the frontier hands them out as well.
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 256 * mib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 64 * mib, .checked = true}};
  std::uint32_t const fits = 64 * 1024;  // 1 KiB blocks
  block_table old{fits};
  allocate_all<<<old.grid(), 256>>>(heap.ref(), old.blocks, old.sizes, old.n, 1024, 16);
  auto const first = old.verify(16);
  REQUIRE(first.overlaps == 0);
  heap.reset();
  free_all<<<old.grid(), 256>>>(heap.ref(), old.blocks, old.sizes, old.n);
  CUDA_CHECK(cudaDeviceSynchronize());
  auto const s = heap.stats();
  CHECK(s.invalid_frees == fits - first.null);
  CHECK(s.double_frees == 0);
  CHECK(s.blocks_in_use == 0);
  // Twice what the heap holds: the slabs go out once each, so no two blocks overlap.
  block_table twice{2 * fits};
  allocate_all<<<twice.grid(), 256>>>(heap.ref(), twice.blocks, twice.sizes, twice.n, 1024, 16);
  auto const r = twice.verify(16);
  CHECK(r.overlaps == 0);
  CHECK(r.bad == 0);
  CHECK(r.null >= fits);
  free_all<<<twice.grid(), 256>>>(heap.ref(), twice.blocks, twice.sizes, twice.n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(heap.stats().blocks_in_use == 0);
  CHECK_THROWS_AS(heap.check(), devmr::heap_error);  // the rejected frees are reported
}

TEST_CASE("host threads and kernels use one heap at once", "[heap][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = gib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 512 * mib}};
  unsigned long long* errors = nullptr;
  CUDA_CHECK(cudaMallocManaged(&errors, 2 * sizeof(unsigned long long)));
  errors[0] = errors[1] = 0;
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  churn<<<256, 256, 0, stream>>>(heap.ref(), 64, true, errors);
  std::atomic<int> host_errors{0};
  std::mutex failure_mutex;
  std::string failure;  // the first exception a host thread caught
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto ref = heap.ref();
      std::vector<std::pair<void*, std::size_t>> mine;
      try {
        for (int i = 0; i < 100; ++i) {
          std::size_t const bytes = size_of(0, t * 1000 + i);
          void* p = ref.allocate(bytes);
          if (p == nullptr || !ref.owns(p)) {
            ++host_errors;
          }
          mine.emplace_back(p, bytes);
        }
        for (auto [p, bytes] : mine) {
          ref.deallocate(p, bytes);
        }
      } catch (std::exception const& e) {
        ++host_errors;
        std::lock_guard lock{failure_mutex};
        if (failure.empty()) {
          failure = e.what();
        }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  INFO("first exception in a host thread: " << failure);
  CHECK(host_errors == 0);
  CHECK(errors[0] == 0);  // null blocks
  CHECK(errors[1] == 0);  // overwritten tags
  CHECK(heap.stats().blocks_in_use == 0);
  cudaStreamDestroy(stream);
  cudaFree(errors);
}

namespace {

__global__ void fill_managed(devmr::slab_ref<devmr::memory_kind::managed> ref, int** out) {
  int* p = static_cast<int*>(ref.allocate(1024 * sizeof(int)));
  for (int i = 0; i < 1024; ++i) {
    p[i] = i * 3;
  }
  *out = p;
}

}  // namespace

TEST_CASE("managed and pinned heaps: the host reads what kernels wrote", "[heap][gpu]") {
  devmr::managed_pool pool{devmr::pool_options{.initial_bytes = 256 * mib}};
  devmr::slab_heap<devmr::memory_kind::managed> heap{pool, {.initial_bytes = 64 * mib}};
  int** out = nullptr;
  CUDA_CHECK(cudaMallocManaged(&out, sizeof(int*)));
  fill_managed<<<1, 1>>>(heap.ref(), out);
  CUDA_CHECK(cudaDeviceSynchronize());
  int* p = *out;
  REQUIRE(p != nullptr);
  bool same = true;
  for (int i = 0; i < 1024; ++i) {
    same = same && p[i] == i * 3;
  }
  CHECK(same);
  heap.ref().deallocate(p, 1024 * sizeof(int));
  CHECK(heap.stats().blocks_in_use == 0);
  cudaFree(out);

  devmr::pinned_pool pinned{devmr::pool_options{.initial_bytes = 128 * mib}};
  devmr::slab_heap<devmr::memory_kind::pinned> pinned_heap{pinned, {.initial_bytes = 32 * mib}};
  auto* q = static_cast<int*>(pinned_heap.ref().allocate(4096));
  q[0] = 7;  // host accessible
  CHECK(q[0] == 7);
  pinned_heap.ref().deallocate(q, 4096);
  CHECK(pinned_heap.stats().blocks_in_use == 0);
}

TEST_CASE("construction does not depend on the heap's size", "[heap][gpu][big][timing]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 65 * gib}};
  // Median of 5 constructions, each until its priming kernel has run.
  auto time_ms = [&](std::size_t bytes) {
    std::vector<double> times;
    for (int run = 0; run < 5; ++run) {
      auto const start = std::chrono::steady_clock::now();
      devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = bytes}};
      CUDA_CHECK(cudaDeviceSynchronize());
      auto const stop = std::chrono::steady_clock::now();
      times.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
    }
    std::sort(times.begin(), times.end());
    return times[2];
  };
  time_ms(gib);  // warm-up
  double const small = time_ms(64 * mib);
  double const large = time_ms(64 * gib);
  INFO("64 MiB heap: " << small << " ms, 64 GiB heap: " << large << " ms");
  CHECK(large < 2.0);              // the target of the issue, on the H200
  CHECK(large < small * 4 + 0.5);  // a thousand times the memory, not a thousand times the time
  WARN("heap construction (median of 5): 64 MiB " << small << " ms, 64 GiB " << large << " ms");
}

namespace {

/// slab_ref joins the resource conformance suite (through its host path).
template <devmr::memory_kind Kind>
struct heap_factory {
  using resource_type = devmr::slab_ref<Kind>;
  static constexpr char const* name = devmr::to_string(Kind);
  static constexpr bool host_accessible = devmr::is_host_accessible(Kind);
  resource_type& resource() { return ref; }
  devmr::pool_resource<Kind> pool{devmr::pool_options{.initial_bytes = 256 * mib}};
  devmr::slab_heap<Kind> heap{pool, devmr::heap_options{.initial_bytes = 128 * mib}};
  resource_type ref = heap.ref();
};

using heap_factories = std::tuple<heap_factory<devmr::memory_kind::device>,
                                  heap_factory<devmr::memory_kind::managed>,
                                  heap_factory<devmr::memory_kind::pinned>>;

}  // namespace

DEVMR_RESOURCE_CONFORMANCE_SUITE(heap_factories)
