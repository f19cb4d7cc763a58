// The pools on a GPU: sizes, alignments, overlap, memory kinds, the cap, the exceptions, threads,
// stream ordering and statistics.

#include "conformance.hpp"

#include <devmr/pool_resource.hpp>

#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

using devmr::test::tagged_block;
using devmr::test::verify;
using devmr::test::write_and_verify;

namespace {

constexpr std::size_t kib = std::size_t{1} << 10;
constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t gib = std::size_t{1} << 30;

tagged_block block_of(void* p, std::size_t bytes, std::uint32_t tag) {
  return {static_cast<std::uint32_t*>(p), bytes / 4, tag};
}

/// Spins for about `cycles` clock cycles, then writes tag into every word of p and copies p into
/// out: work on stream A that uses a pool block for a while.
__global__ void spin_write_copy(
    std::uint32_t* p, std::uint32_t* out, std::size_t words, std::uint32_t tag, long long cycles) {
  long long const start = clock64();
  while (clock64() - start < cycles) {
  }
  auto const stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
    p[i] = tag;
  }
  __syncthreads();
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
    out[i] = p[i];
  }
}

__global__ void fill_words(std::uint32_t* p, std::size_t words, std::uint32_t tag) {
  auto const stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
    p[i] = tag;
  }
}

std::size_t count_not(std::vector<std::uint32_t> const& words, std::uint32_t tag) {
  std::size_t n = 0;
  for (auto w : words) {
    n += (w != tag) ? 1 : 0;
  }
  return n;
}

long long cycles_for_ms(double ms) {
  int khz = 0;
  int device = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device);
  return static_cast<long long>(ms * khz);
}

/// Allocates every size at every alignment from 1 to 4096, all live at once, then checks
/// alignment, overlap (a kernel writes every block, another verifies) and statistics.
void sizes_and_alignments(std::vector<std::size_t> const& sizes) {
  devmr::device_pool pool;
  std::vector<tagged_block> blocks;
  std::vector<std::pair<void*, std::size_t>> live;
  std::uint32_t tag = 1;
  for (auto const bytes : sizes) {
    for (std::size_t alignment = 1; alignment <= 4096; alignment *= 2) {
      CAPTURE(bytes, alignment);
      void* p = pool.allocate(bytes, alignment);
      REQUIRE(p != nullptr);
      CHECK(devmr::test::is_aligned(p, std::max<std::size_t>(alignment, 256)));
      live.emplace_back(p, bytes);
      blocks.push_back(block_of(p, bytes, tag++));
    }
  }
  CHECK(write_and_verify(blocks) == 0);
  auto const s = pool.stats();
  CHECK(s.blocks.current == static_cast<std::int64_t>(live.size()));
  std::int64_t requested = 0;
  for (auto const& [p, bytes] : live) {
    requested += static_cast<std::int64_t>(bytes);
  }
  CHECK(s.bytes.current == requested);
  CHECK(s.reserved_bytes >= static_cast<std::size_t>(requested));
  for (auto const& [p, bytes] : live) {
    pool.deallocate(p, bytes, 1);
  }
  CHECK(pool.stats().blocks.current == 0);
  pool.release();
  CHECK(pool.stats().arenas == 0);
  CHECK(pool.stats().reserved_bytes == 0);
}

}  // namespace

TEST_CASE("device_pool serves 1 B to 16 MiB at alignments 1 to 4096, without overlap",
          "[pool][gpu]") {
  sizes_and_alignments({1, 3, 4, 100, 256, 1000, 4097, 64 * kib, mib + 4, 16 * mib});
}

TEST_CASE("device_pool serves 256 MiB and 1 GiB at alignments 1 to 4096, without overlap",
          "[pool][gpu][big]") {
  sizes_and_alignments({256 * mib, gib, 1, 100});
}

TEST_CASE("managed and pinned blocks written by a kernel read back on the host, and back",
          "[pool][gpu]") {
  devmr::managed_pool managed;
  devmr::pinned_pool pinned;
  constexpr std::size_t words = 1 << 20;
  auto* m = static_cast<std::uint32_t*>(managed.allocate(words * 4));
  auto* h = static_cast<std::uint32_t*>(pinned.allocate(words * 4));
  fill_words<<<256, 256>>>(m, words, 0xabcd0001u);
  fill_words<<<256, 256>>>(h, words, 0xabcd0002u);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(count_not(std::vector<std::uint32_t>(m, m + words), 0xabcd0001u) == 0);
  CHECK(count_not(std::vector<std::uint32_t>(h, h + words), 0xabcd0002u) == 0);
  // The host writes, a kernel reads.
  for (std::size_t i = 0; i < words; ++i) {
    m[i] = 11;
    h[i] = 12;
  }
  CHECK(verify({{m, words, 11}, {h, words, 12}}) == 0);
  cudaPointerAttributes attributes{};
  REQUIRE(cudaPointerGetAttributes(&attributes, m) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeManaged);
  REQUIRE(cudaPointerGetAttributes(&attributes, h) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeHost);
  devmr::device_pool device;
  void* d = device.allocate(4096);
  REQUIRE(cudaPointerGetAttributes(&attributes, d) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeDevice);
  device.deallocate(d, 4096);
  managed.deallocate(m, words * 4);
  pinned.deallocate(h, words * 4);
}

TEST_CASE("device_pool honours maximum_bytes; out_of_memory leaves blocks valid", "[pool][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.maximum_bytes = 96 * mib}};
  void* a = pool.allocate(60 * mib);
  CHECK(write_and_verify({block_of(a, 60 * mib, 0xa)}) == 0);
  void* b = pool.allocate(30 * mib);
  CHECK(write_and_verify({block_of(b, 30 * mib, 0xb)}) == 0);
  CHECK(pool.stats().reserved_bytes <= 96 * mib);
  CHECK_THROWS_AS(pool.allocate(32 * mib), devmr::out_of_memory);
  CHECK_THROWS_AS(pool.allocate(32 * mib), std::bad_alloc);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  CHECK_THROWS_AS(pool.allocate_async(32 * mib, 256, stream), devmr::out_of_memory);
  CHECK(pool.stats().reserved_bytes <= 96 * mib);
  CHECK(verify({block_of(a, 60 * mib, 0xa), block_of(b, 30 * mib, 0xb)}) == 0);
  CHECK(pool.stats().blocks.current == 2);
  pool.deallocate(a, 60 * mib);
  void* c = pool.allocate_async(32 * mib, 256, stream);  // fits in a's room now
  pool.deallocate_async(c, 32 * mib, 256, stream);
  pool.deallocate(b, 30 * mib);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("the pools' exceptions, and nothing lost after them", "[pool][gpu]") {
  devmr::device_pool pool;
  void* a = pool.allocate(mib);
  CHECK(write_and_verify({block_of(a, mib, 0x77)}) == 0);

  for (std::size_t bad : {std::size_t{0}, std::size_t{3}, std::size_t{48}}) {
    CHECK_THROWS_AS(pool.allocate(64, bad), std::invalid_argument);
    CHECK_THROWS_AS(pool.allocate_async(64, bad, cuda::stream_ref{}), std::invalid_argument);
  }
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  try {
    devmr::pinned_pool bad{devmr::pool_options{.device = count}};
    FAIL("a pool on a device that does not exist was built");
  } catch (devmr::cuda_error const& e) {
    CHECK(std::string{e.what()}.find("cudaErrorInvalidDevice") != std::string::npos);
  }
  CHECK(verify({block_of(a, mib, 0x77)}) == 0);
  CHECK(pool.stats().blocks.current == 1);
  CHECK(pool.allocate(0) == nullptr);
  pool.deallocate(nullptr, 0);
  pool.deallocate(a, mib);
  CHECK(pool.stats().blocks.current == 0);
}

TEST_CASE("device_pool: the driver running out throws out_of_memory, blocks stay valid",
          "[pool][gpu][big]") {
  // [big]: the driver's refusal shows as an API error under compute-sanitizer.
  devmr::device_pool pool;
  void* a = pool.allocate(mib);
  CHECK(write_and_verify({block_of(a, mib, 0x78)}) == 0);
  CHECK_THROWS_AS(pool.allocate(std::size_t{1} << 50), devmr::out_of_memory);  // 1 PiB
  CHECK(cudaGetLastError() == cudaSuccess);  // the driver's error was taken off
  CHECK(verify({block_of(a, mib, 0x78)}) == 0);
  void* b = pool.allocate(mib);
  CHECK(write_and_verify({block_of(a, mib, 0x78), block_of(b, mib, 0x79)}) == 0);
  pool.deallocate(b, mib);
  pool.deallocate(a, mib);
  CHECK(pool.stats().blocks.current == 0);
}

TEST_CASE("device_pool: stats exact after each step", "[pool][gpu]") {
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = 8 * mib}};
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  auto s = pool.stats();
  CHECK(s.arenas == 1);
  CHECK(s.reserved_bytes == 8 * mib);
  CHECK(s.blocks.total == 0);

  void* a = pool.allocate(100);
  s = pool.stats();
  CHECK((s.bytes.current == 100 && s.bytes.peak == 100 && s.bytes.total == 100));
  CHECK((s.blocks.current == 1 && s.blocks.peak == 1 && s.blocks.total == 1));
  void* b = pool.allocate_async(1000, 256, stream);
  s = pool.stats();
  CHECK((s.bytes.current == 1100 && s.bytes.peak == 1100 && s.bytes.total == 1100));
  CHECK((s.blocks.current == 2 && s.blocks.peak == 2 && s.blocks.total == 2));
  pool.deallocate_async(b, 1000, 256, stream);
  s = pool.stats();
  CHECK((s.bytes.current == 100 && s.bytes.peak == 1100 && s.bytes.total == 1100));
  CHECK((s.blocks.current == 1 && s.blocks.peak == 2 && s.blocks.total == 2));
  void* c = pool.allocate_sync(5000);  // the CCCL >= 3.1 spellings count the same
  void* d = pool.allocate(cuda::stream_ref{stream}, 7);
  s = pool.stats();
  CHECK((s.bytes.current == 5107 && s.bytes.peak == 5107 && s.bytes.total == 6107));
  CHECK((s.blocks.current == 3 && s.blocks.peak == 3 && s.blocks.total == 4));
  pool.deallocate(cuda::stream_ref{stream}, d, 7);
  pool.deallocate_sync(c, 5000);
  pool.deallocate(a, 100);
  s = pool.stats();
  CHECK((s.bytes.current == 0 && s.bytes.peak == 5107 && s.bytes.total == 6107));
  CHECK((s.blocks.current == 0 && s.blocks.peak == 3 && s.blocks.total == 4));
  CHECK(s.arenas == 1);  // small blocks never reached the driver
  pool.release();
  s = pool.stats();
  CHECK(s.arenas == 0);
  CHECK(s.reserved_bytes == 0);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("device_pool: 8 host threads allocating and freeing at once", "[pool][gpu][threads]") {
  devmr::device_pool pool;
  constexpr int thread_count = 8;
  std::mutex mutex;
  std::vector<tagged_block> survivors;
  std::atomic<int> errors{0};
  auto worker = [&](int id) {
    cudaStream_t stream = nullptr;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
      ++errors;
      return;
    }
    std::mt19937 rng{static_cast<unsigned>(id) + 17};
    std::vector<std::pair<std::uint32_t*, std::size_t>> live;
    for (int op = 0; op < 4000; ++op) {
      bool const async = rng() % 2 == 0;
      if (live.empty() || rng() % 100 < 60) {
        std::size_t const bytes = 4 * (1 + rng() % (64 * 1024));
        auto* p = static_cast<std::uint32_t*>(async ? pool.allocate_async(bytes, 256, stream)
                                                    : pool.allocate(bytes, 256));
        // Touch the block on the thread's stream: stream-ordered frees must not hand it out
        // while this runs.
        if (async) {
          fill_words<<<4, 256, 0, stream>>>(p, bytes / 4, static_cast<std::uint32_t>(op));
        }
        live.emplace_back(p, bytes);
      } else {
        std::size_t const i = rng() % live.size();
        if (async) {
          pool.deallocate_async(live[i].first, live[i].second, 256, stream);
        } else {
          // A synchronous free promises that no work still uses the block.
          if (cudaStreamSynchronize(stream) != cudaSuccess) {
            ++errors;
          }
          pool.deallocate(live[i].first, live[i].second);
        }
        live[i] = live.back();
        live.pop_back();
      }
    }
    if (cudaStreamSynchronize(stream) != cudaSuccess || cudaStreamDestroy(stream) != cudaSuccess) {
      ++errors;
    }
    std::lock_guard const guard{mutex};
    for (auto const& [p, bytes] : live) {
      survivors.push_back({p, bytes / 4, static_cast<std::uint32_t>(survivors.size() + 1)});
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < thread_count; ++i) {
    threads.emplace_back(worker, i);
  }
  for (auto& t : threads) {
    t.join();
  }
  CHECK(errors == 0);
  CHECK(pool.stats().blocks.current == static_cast<std::int64_t>(survivors.size()));
  CHECK(write_and_verify(survivors) == 0);  // no two live blocks overlap
  for (auto const& b : survivors) {
    pool.deallocate(b.words, b.word_count * 4);
  }
  CHECK(pool.stats().blocks.current == 0);
  CHECK(pool.stats().bytes.current == 0);
}

TEST_CASE("device_pool: a block freed on stream A is not handed to stream B too early",
          "[pool][gpu][streams]") {
  // One arena exactly: the second allocation must reuse the first block's memory.
  constexpr std::size_t bytes = 64 * mib;
  constexpr std::size_t words = bytes / 4;
  devmr::device_pool pool{devmr::pool_options{.maximum_bytes = bytes}};
  cudaStream_t a = nullptr;
  cudaStream_t b = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  std::uint32_t* out = nullptr;
  REQUIRE(cudaMalloc(&out, bytes) == cudaSuccess);

  SECTION("allocate_async on another stream") {
    auto* p = static_cast<std::uint32_t*>(pool.allocate_async(bytes, 256, a));
    spin_write_copy<<<264, 256, 0, a>>>(p, out, words, 0xaaaa, cycles_for_ms(200));
    pool.deallocate_async(p, bytes, 256, a);
    auto* q = static_cast<std::uint32_t*>(pool.allocate_async(bytes, 256, b));
    CHECK(q == p);  // the cap leaves no other memory
    fill_words<<<264, 256, 0, b>>>(q, words, 0xbbbb);
    // If B's kernel ran before A's was done, A would have copied 0xbbbb, or B's words been
    // overwritten by A.
    CHECK(cudaStreamQuery(a) == cudaErrorNotReady);  // no host blocking happened
    REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);
    std::vector<std::uint32_t> host(words);
    REQUIRE(cudaMemcpy(host.data(), out, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(count_not(host, 0xaaaa) == 0);
    REQUIRE(cudaMemcpy(host.data(), q, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(count_not(host, 0xbbbb) == 0);
    pool.deallocate_async(q, bytes, 256, b);
  }
  SECTION("a synchronous allocate waits for stream A") {
    auto* p = static_cast<std::uint32_t*>(pool.allocate_async(bytes, 256, a));
    spin_write_copy<<<264, 256, 0, a>>>(p, out, words, 0xaaaa, cycles_for_ms(200));
    pool.deallocate_async(p, bytes, 256, a);
    auto* q = static_cast<std::uint32_t*>(pool.allocate(bytes));
    CHECK(q == p);
    CHECK(cudaStreamQuery(a) == cudaSuccess);  // A's work is done before q is handed out
    pool.deallocate(q, bytes);
  }
  SECTION("the same stream reuses the block at once") {
    auto* p = static_cast<std::uint32_t*>(pool.allocate_async(bytes, 256, a));
    spin_write_copy<<<264, 256, 0, a>>>(p, out, words, 0xaaaa, cycles_for_ms(200));
    pool.deallocate_async(p, bytes, 256, a);
    auto* q = static_cast<std::uint32_t*>(pool.allocate_async(bytes, 256, a));
    CHECK(q == p);
    CHECK(cudaStreamQuery(a) == cudaErrorNotReady);
    fill_words<<<264, 256, 0, a>>>(q, words, 0xcccc);
    REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);
    std::vector<std::uint32_t> host(words);
    REQUIRE(cudaMemcpy(host.data(), out, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(count_not(host, 0xaaaa) == 0);
    pool.deallocate_async(q, bytes, 256, a);
  }
  REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(pool.stats().blocks.current == 0);
  REQUIRE(cudaFree(out) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(a) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
}

TEST_CASE("pools are resources through cuda::mr refs of both kinds", "[pool][gpu]") {
  devmr::device_pool device;
  devmr::managed_pool managed;
  devmr::pinned_pool pinned;
  cuda::mr::resource_ref<cuda::mr::device_accessible> d_ref{device};
  cuda::mr::async_resource_ref<cuda::mr::device_accessible> d_async{device};
  cuda::mr::resource_ref<cuda::mr::device_accessible, cuda::mr::host_accessible> m_ref{managed};
  cuda::mr::async_resource_ref<cuda::mr::host_accessible> m_async{managed};
  cuda::mr::resource_ref<cuda::mr::host_accessible> p_ref{pinned};
  cuda::mr::async_resource_ref<cuda::mr::device_accessible, cuda::mr::host_accessible> p_async{
      pinned};
  void* a = d_ref.allocate(1000, 64);
  void* b = d_async.allocate_async(1000, 64, cuda::stream_ref{});
  auto* c = static_cast<int*>(m_ref.allocate(sizeof(int), 4));
  auto* d = static_cast<int*>(m_async.allocate_async(sizeof(int), 4, cuda::stream_ref{}));
  auto* e = static_cast<int*>(p_ref.allocate(sizeof(int), 4));
  auto* f = static_cast<int*>(p_async.allocate_async(sizeof(int), 4, cuda::stream_ref{}));
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
  *c = 1;
  *d = 2;
  *e = 3;
  *f = 4;
  CHECK(*c + *d + *e + *f == 10);
  d_ref.deallocate(a, 1000, 64);
  d_async.deallocate_async(b, 1000, 64, cuda::stream_ref{});
  m_ref.deallocate(c, sizeof(int), 4);
  m_async.deallocate_async(d, sizeof(int), 4, cuda::stream_ref{});
  p_ref.deallocate(e, sizeof(int), 4);
  p_async.deallocate_async(f, sizeof(int), 4, cuda::stream_ref{});
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
  CHECK(device.stats().blocks.total == 2);
  CHECK(managed.stats().blocks.current == 0);
  CHECK(pinned.stats().blocks.current == 0);
}
