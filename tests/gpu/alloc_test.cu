// scratch, group_scratch, allocator, device_resource_ref, polymorphic_allocator and
// shared_resource on a GPU: contents written and checked in kernels, out-of-memory seen through
// operator bool, groups, every heap kind and a user's resource behind device_resource_ref, host
// containers over pools and managed heaps whose data kernels read.

#include <devmr/devmr.hpp>

#include <cooperative_groups.h>
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

namespace cg = cooperative_groups;

namespace alloc_test {

/// A user's device resource: a bump pointer over a device buffer that counts its frees. Three
/// words, trivially copyable, const members: a device_resource_ref keeps a copy.
struct bump_resource {
  char* base;
  unsigned long long* state;  ///< [0]: bytes handed out, [1]: frees
  __host__ __device__ void* allocate(std::size_t bytes, std::size_t alignment = 16) const {
#if defined(__CUDA_ARCH__)
    std::size_t const rounded = (bytes + alignment - 1) / alignment * alignment;
    return base + atomicAdd(&state[0], static_cast<unsigned long long>(rounded));
#else
    (void)bytes;
    (void)alignment;
    return nullptr;
#endif
  }
  __host__ __device__ void deallocate(void const*, std::size_t, std::size_t = 16) const {
#if defined(__CUDA_ARCH__)
    atomicAdd(&state[1], 1ull);
#endif
  }
  friend bool operator==(bump_resource const& a, bump_resource const& b) {
    return a.base == b.base;
  }
  friend bool operator!=(bump_resource const& a, bump_resource const& b) {
    return !(a == b);
  }
  friend __host__ __device__ void get_property(bump_resource const&,
                                               cuda::mr::device_accessible) noexcept {}
};

}  // namespace alloc_test

namespace {

#define CUDA_CHECK(call) REQUIRE((call) == cudaSuccess)

using alloc_test::bump_resource;
using cuda::mr::device_accessible;
using cuda::mr::host_accessible;
using devmr::memory_kind;

constexpr std::size_t mib = std::size_t{1} << 20;

/// Thread i's element count: 1 to 97, so that blocks of several classes are in use at once.
__host__ __device__ unsigned count_of(unsigned i) {
  return 1u + (i * 2654435761u >> 7) % 97u;
}

/// What thread i computes from its scratch: the sum of i * k + k for k below count_of(i).
__host__ __device__ unsigned long long expected_sum(unsigned i) {
  unsigned long long sum = 0;
  for (unsigned k = 0; k < count_of(i); ++k) {
    sum += static_cast<unsigned long long>(i) * k + k;
  }
  return sum;
}

/// Result codes a thread writes: its sum, or one of these when something went wrong.
constexpr unsigned long long no_memory = ~0ull;

/// Each thread fills a scratch of count_of(i) elements and sums it back; the scratch is freed at
/// the end of the thread.
template <class Ref>
__global__ void scratch_sums(Ref ref, unsigned n, unsigned long long* sums) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  devmr::scratch<unsigned long long, Ref> work{ref, count_of(i)};
  if (!work) {
    sums[i] = no_memory;
    return;
  }
  for (unsigned k = 0; k < work.size(); ++k) {
    work[k] = static_cast<unsigned long long>(i) * k + k;
  }
  // Moved into another scratch: the block goes with it, and is freed once.
  devmr::scratch<unsigned long long, Ref> moved{std::move(work)};
  unsigned long long sum = 0;
  for (unsigned long long x : moved) {
    sum += x;
  }
  sums[i] = work ? no_memory - 1 : sum;  // the moved-from scratch must be empty
}

/// Each thread asks for `bytes`; counts who got memory and who did not, holding it to the end.
template <class Ref>
__global__ void scratch_storm(Ref ref,
                              unsigned n,
                              std::size_t bytes,
                              unsigned long long* served,
                              unsigned long long* refused) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  devmr::scratch<std::uint32_t, Ref> work{ref, bytes / 4};
  if (work) {
    work[0] = i;
    work[work.size() - 1] = ~i;
  }
  __syncthreads();  // every thread of the block holds its block at once
  if (work) {
    bool const intact = work[0] == i && work[work.size() - 1] == ~i;
    atomicAdd(served, intact ? 1ull : 0ull);
  } else {
    atomicAdd(refused, 1ull);
  }
}

/// One buffer per warp and one per block: each member writes its slot, the group checks all.
template <class Ref>
__global__ void group_buffers(Ref ref, unsigned long long* bad, unsigned long long* empty) {
  auto block = cg::this_thread_block();
  auto warp = cg::tiled_partition<32>(block);
  {
    devmr::group_scratch<unsigned, Ref, decltype(warp)> shared{warp, ref, 32 * 8};
    if (!shared) {
      atomicAdd(empty, 1ull);
    } else {
      for (unsigned k = 0; k < 8; ++k) {
        shared[warp.thread_rank() * 8 + k] = blockIdx.x * 1000 + warp.meta_group_rank() * 40 + k;
      }
      warp.sync();
      unsigned const other = (warp.thread_rank() + 1) % 32;  // read a neighbour's writes
      for (unsigned k = 0; k < 8; ++k) {
        if (shared[other * 8 + k] != blockIdx.x * 1000 + warp.meta_group_rank() * 40 + k) {
          atomicAdd(bad, 1ull);
        }
      }
    }
  }
  devmr::group_scratch<unsigned, Ref, decltype(block)> whole{block, ref, block.size()};
  if (!whole) {
    atomicAdd(empty, 1ull);
    return;
  }
  whole[block.thread_rank()] = block.thread_rank() + blockIdx.x;
  block.sync();
  unsigned const mirror = block.size() - 1 - block.thread_rank();
  if (whole[mirror] != mirror + blockIdx.x) {
    atomicAdd(bad, 1ull);
  }
}

/// Each thread takes count_of(i) ints through allocator<int, Ref>, fills them, sums, frees.
template <class Ref>
__global__ void allocator_sums(Ref ref, unsigned n, unsigned long long* sums) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  devmr::allocator<unsigned long long, Ref> alloc{ref};
  unsigned const count = count_of(i);
  unsigned long long* p = alloc.allocate(count);
  if (p == nullptr) {
    sums[i] = no_memory;
    return;
  }
  for (unsigned k = 0; k < count; ++k) {
    p[k] = static_cast<unsigned long long>(i) * k + k;
  }
  unsigned long long sum = 0;
  for (unsigned k = 0; k < count; ++k) {
    sum += p[k];
  }
  alloc.deallocate(p, count);
  sums[i] = sum;
}

using erased_device = devmr::device_resource_ref<device_accessible>;
using erased_host_device = devmr::device_resource_ref<device_accessible, host_accessible>;

/// A device_resource_ref made in device code from a user's resource: the thunks' device
/// addresses, taken where they are.
__global__ void ref_made_in_kernel(bump_resource resource, unsigned n, unsigned long long* sums) {
  erased_device ref{resource};
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  devmr::scratch<unsigned long long, erased_device> work{ref, count_of(i)};
  unsigned long long sum = 0;
  for (unsigned k = 0; k < work.size(); ++k) {
    work[k] = static_cast<unsigned long long>(i) * k + k;
    sum += work[k];
  }
  sums[i] = work ? sum : no_memory;
}

/// Reads what the host wrote into a container's memory.
__global__ void sum_on_device(int const* data, std::size_t n, unsigned long long* sum) {
  unsigned long long local = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    local += static_cast<unsigned long long>(data[i]);
  }
  atomicAdd(sum, local);
}

/// Managed memory for results, freed by a unique_ptr.
template <class T>
struct managed_array {
  explicit managed_array(std::size_t n) : size{n} {
    T* p = nullptr;
    REQUIRE(cudaMallocManaged(&p, n * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemset(p, 0, n * sizeof(T)) == cudaSuccess);
    data.reset(p);
  }
  struct deleter {
    void operator()(T* p) const { cudaFree(p); }
  };
  std::unique_ptr<T, deleter> data;
  std::size_t size;
  T& operator[](std::size_t i) { return data.get()[i]; }
};

/// Counts the threads whose sum is not expected_sum.
std::size_t wrong_sums(managed_array<unsigned long long>& sums) {
  std::size_t wrong = 0;
  for (unsigned i = 0; i < sums.size; ++i) {
    wrong += sums[i] != expected_sum(i) ? 1 : 0;
  }
  return wrong;
}

constexpr unsigned threads = 1u << 16;
constexpr unsigned block_threads = 256;

struct heap_fixture {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 640 * mib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 512 * mib}};
};

}  // namespace

TEST_CASE("scratch: per-thread buffers of many sizes, over slab_ref and device_resource_ref",
          "[scratch]") {
  heap_fixture f;
  managed_array<unsigned long long> sums{threads};
  scratch_sums<<<threads / block_threads, block_threads>>>(f.heap.ref(), threads, sums.data.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(wrong_sums(sums) == 0);
  CHECK(f.heap.stats().blocks_in_use == 0);

  managed_array<unsigned long long> erased_sums{threads};
  scratch_sums<<<threads / block_threads, block_threads>>>(erased_device{f.heap.ref()}, threads,
                                                           erased_sums.data.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(wrong_sums(erased_sums) == 0);
  devmr::heap_stats const s = f.heap.stats();
  CHECK(s.blocks_in_use == 0);
  CHECK(s.failed_allocations == 0);
}

TEST_CASE("scratch: a heap that cannot serve everyone says so through operator bool", "[scratch]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 96 * mib}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = 32 * mib}};
  managed_array<unsigned long long> served{1};
  managed_array<unsigned long long> refused{1};
  // 2^14 threads x 64 KiB = 1 GiB from a 32 MiB heap: most must be refused, none may crash.
  unsigned const n = 1u << 14;
  scratch_storm<<<n / block_threads, block_threads>>>(heap.ref(), n, 64 * 1024, served.data.get(),
                                                      refused.data.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(served[0] + refused[0] == n);
  CHECK(served[0] > 0);
  CHECK(refused[0] > 0);
  devmr::heap_stats const s = heap.stats();
  CHECK(s.failed_allocations == refused[0]);
  CHECK(s.blocks_in_use == 0);
  // After the frees the heap serves again.
  managed_array<unsigned long long> sums{1024};
  scratch_sums<<<4, 256>>>(heap.ref(), 1024, sums.data.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(wrong_sums(sums) == 0);
}

TEST_CASE("group_scratch: one buffer per warp and per block, freed once by the group",
          "[scratch]") {
  heap_fixture f;
  managed_array<unsigned long long> bad{1};
  managed_array<unsigned long long> empty{1};
  group_buffers<<<512, 256>>>(f.heap.ref(), bad.data.get(), empty.data.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(bad[0] == 0);
  CHECK(empty[0] == 0);
  CHECK(f.heap.stats().blocks_in_use == 0);
  // Through a device_resource_ref: its own leader-and-broadcast path.
  group_buffers<<<512, 256>>>(erased_device{f.heap.ref()}, bad.data.get(), empty.data.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(bad[0] == 0);
  CHECK(empty[0] == 0);
  CHECK(f.heap.stats().blocks_in_use == 0);
}

TEST_CASE("allocator: in kernels over slab_ref and device_resource_ref", "[allocator]") {
  heap_fixture f;
  managed_array<unsigned long long> sums{threads};
  allocator_sums<<<threads / block_threads, block_threads>>>(f.heap.ref(), threads,
                                                             sums.data.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(wrong_sums(sums) == 0);
  managed_array<unsigned long long> erased_sums{threads};
  allocator_sums<<<threads / block_threads, block_threads>>>(erased_device{f.heap.ref()}, threads,
                                                             erased_sums.data.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(wrong_sums(erased_sums) == 0);
  CHECK(f.heap.stats().blocks_in_use == 0);
}

TEST_CASE("device_resource_ref: every heap kind, a user's resource, made on either side",
          "[device_resource_ref]") {
  managed_array<unsigned long long> sums{threads};
  SECTION("managed and pinned heaps, with host_accessible") {
    devmr::managed_pool managed{devmr::pool_options{.initial_bytes = 640 * mib}};
    devmr::slab_heap<memory_kind::managed> managed_heap{
        managed, devmr::heap_options{.initial_bytes = 512 * mib}};
    erased_host_device ref{managed_heap.ref()};
    scratch_sums<<<threads / block_threads, block_threads>>>(ref, threads, sums.data.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(wrong_sums(sums) == 0);
    // The host side of the same ref: managed memory the host writes and a kernel reads.
    int* p = static_cast<int*>(ref.allocate(1000 * sizeof(int), alignof(int)));
    std::iota(p, p + 1000, 0);
    managed_array<unsigned long long> total{1};
    sum_on_device<<<4, 256>>>(p, 1000, total.data.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(total[0] == 999ull * 1000 / 2);
    ref.deallocate(p, 1000 * sizeof(int), alignof(int));
    CHECK(managed_heap.stats().blocks_in_use == 0);

    devmr::pinned_pool pinned{devmr::pool_options{.initial_bytes = 160 * mib}};
    devmr::slab_heap<memory_kind::pinned> pinned_heap{
        pinned, devmr::heap_options{.initial_bytes = 128 * mib}};
    managed_array<unsigned long long> pinned_sums{1u << 12};
    scratch_sums<<<16, 256>>>(erased_host_device{pinned_heap}, 1u << 12, pinned_sums.data.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(wrong_sums(pinned_sums) == 0);
    CHECK(erased_device{erased_host_device{pinned_heap.ref()}} == erased_device{pinned_heap.ref()});
    CHECK(erased_device{pinned_heap.ref()} != erased_device{managed_heap.ref()});
  }
  SECTION("a user's resource, made on the host and in a kernel") {
    char* buffer = nullptr;
    unsigned long long* state = nullptr;
    std::size_t const bytes = std::size_t{threads} * 97 * sizeof(unsigned long long) * 2;
    CUDA_CHECK(cudaMalloc(&buffer, bytes));
    CUDA_CHECK(cudaMallocManaged(&state, 2 * sizeof(unsigned long long)));
    state[0] = state[1] = 0;
    bump_resource resource{buffer, state};
    erased_device ref{resource};
    scratch_sums<<<threads / block_threads, block_threads>>>(ref, threads, sums.data.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(wrong_sums(sums) == 0);
    CHECK(state[1] == threads);  // every scratch freed through the thunk
    state[0] = state[1] = 0;
    managed_array<unsigned long long> in_kernel{threads};
    ref_made_in_kernel<<<threads / block_threads, block_threads>>>(resource, threads,
                                                                   in_kernel.data.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(wrong_sums(in_kernel) == 0);
    CHECK(state[1] == threads);
    cudaFree(state);
    cudaFree(buffer);
  }
}

TEST_CASE("host containers over pools and managed heaps; kernels read their data",
          "[allocator][polymorphic_allocator][shared_resource]") {
  devmr::managed_pool pool{devmr::pool_options{.initial_bytes = 640 * mib}};
  devmr::slab_heap<memory_kind::managed> heap{pool,
                                              devmr::heap_options{.initial_bytes = 256 * mib}};
  managed_array<unsigned long long> total{1};
  auto device_sum = [&](int const* data, std::size_t n) {
    total[0] = 0;
    sum_on_device<<<8, 256>>>(data, n, total.data.get());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    return total[0];
  };
  constexpr int n = 100000;
  constexpr unsigned long long expect = static_cast<unsigned long long>(n - 1) * n / 2;

  SECTION("allocator over a managed heap's ref") {
    using alloc = devmr::allocator<int, devmr::slab_ref<memory_kind::managed>>;
    std::vector<int, alloc> v{alloc{heap.ref()}};
    for (int i = 0; i < n; ++i) {
      v.push_back(i);
    }
    CHECK(device_sum(v.data(), v.size()) == expect);
    CHECK(heap.stats().blocks_in_use == 1);
  }
  SECTION("allocator over a managed pool") {
    using alloc = devmr::allocator<int, devmr::managed_pool>;
    std::vector<int, alloc> v(n, 0, alloc{pool});
    std::iota(v.begin(), v.end(), 0);
    CHECK(device_sum(v.data(), v.size()) == expect);
    CHECK(pool.stats().blocks.current >= 1);
  }
  SECTION("polymorphic_allocator: one vector type over a pool, a heap and a pinned pool") {
    using alloc = devmr::polymorphic_allocator<int, device_accessible, host_accessible>;
    devmr::pinned_pool pinned{};
    // A cuda::mr reference points at the resource: here a slab_ref that outlives the vectors.
    auto heap_ref = heap.ref();
    std::vector<std::vector<int, alloc>> vectors;
    vectors.emplace_back(alloc{pool});
    vectors.emplace_back(alloc{heap_ref});
    vectors.emplace_back(alloc{pinned});
    for (auto& v : vectors) {
      v.resize(n);
      std::iota(v.begin(), v.end(), 0);
      CHECK(device_sum(v.data(), v.size()) == expect);
    }
  }
  SECTION("shared_resource keeps a pool alive for the containers that use it") {
    using shared = devmr::shared_resource<devmr::managed_pool>;
    using alloc = devmr::allocator<int, shared>;
    std::vector<int, alloc> v{alloc{shared{std::in_place, devmr::pool_options{}}}};
    {
      auto copy = v.get_allocator();
      CHECK(copy.resource().use_count() >= 2);
    }
    v.resize(n);
    std::iota(v.begin(), v.end(), 0);
    CHECK(device_sum(v.data(), v.size()) == expect);
    // A shared heap: the heap's ref serves, the pool lives in a shared_resource of its own.
    auto shared_pool = std::make_shared<devmr::managed_pool>();
    devmr::shared_resource<devmr::slab_heap<memory_kind::managed>> shared_heap{
        std::in_place, *shared_pool, devmr::heap_options{.initial_bytes = 64 * mib}};
    void* p = shared_heap.allocate(256);
    CHECK(shared_heap.get().stats().blocks_in_use == 1);
    shared_heap.deallocate(p, 256);
    CHECK(shared_heap.get().stats().blocks_in_use == 0);
  }
  CHECK(heap.stats().blocks_in_use == 0);
}
