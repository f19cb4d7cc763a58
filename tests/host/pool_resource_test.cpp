// The pool's logic (pool_core) over host memory and fake streams, and the CUDA pools' contract at
// compile time. Needs no GPU.

#include <devmr/pool_resource.hpp>

#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

// The pools model both CCCL spellings' concepts (pool_resource.hpp asserts them too).
static_assert(cuda::mr::resource_with<devmr::device_pool, cuda::mr::device_accessible>);
static_assert(cuda::mr::async_resource_with<devmr::device_pool, cuda::mr::device_accessible>);
static_assert(!cuda::mr::resource_with<devmr::device_pool, cuda::mr::host_accessible>);
static_assert(cuda::mr::async_resource_with<devmr::managed_pool,
                                            cuda::mr::device_accessible,
                                            cuda::mr::host_accessible>);
static_assert(cuda::mr::async_resource_with<devmr::pinned_pool,
                                            cuda::mr::device_accessible,
                                            cuda::mr::host_accessible>);
static_assert(!std::is_copy_constructible_v<devmr::device_pool>);
static_assert(std::is_nothrow_move_constructible_v<devmr::device_pool>);
static_assert(std::is_nothrow_move_assignable_v<devmr::managed_pool>);

using devmr::pool_stats;
using devmr::detail::pool_core;

namespace {

constexpr std::size_t kib = std::size_t{1} << 10;
constexpr std::size_t mib = std::size_t{1} << 20;

/// What a host_arena_source did, kept by the test while the pool owns the source.
struct arena_log {
  std::atomic<std::size_t> reserves{0};
  std::atomic<std::size_t> give_backs{0};
  std::atomic<std::size_t> held_bytes{0};
  /// reserve fails like the driver when this many bytes would be held (0: never)
  std::size_t driver_limit = 0;
  /// reserve throws devmr::cuda_error while set
  bool driver_broken = false;
};

class host_arena_source final : public devmr::detail::arena_source {
 public:
  explicit host_arena_source(arena_log& log) : log_(log) {}
  void* reserve(std::size_t bytes) override {
    if (log_.driver_broken) {
      throw devmr::cuda_error(cudaErrorLaunchFailure, "test: broken driver");
    }
    if (log_.driver_limit != 0 && log_.held_bytes + bytes > log_.driver_limit) {
      throw devmr::out_of_memory("test: driver out of memory");
    }
    void* arena = std::aligned_alloc(4096, bytes);
    if (arena == nullptr) {
      throw devmr::out_of_memory("test: aligned_alloc failed");
    }
    ++log_.reserves;
    log_.held_bytes += bytes;
    return arena;
  }
  void give_back(void* arena, std::size_t bytes) noexcept override {
    std::free(arena);
    ++log_.give_backs;
    log_.held_bytes -= bytes;
  }

 private:
  arena_log& log_;
};

/// Streams whose work the test starts and finishes by hand; events complete when the work that
/// was enqueued on their stream when they were recorded has finished.
class fake_streams final : public devmr::detail::stream_order {
 public:
  struct event {
    void* stream = nullptr;
    long long work = 0;
  };
  void* create_event() override {
    events_.push_back(std::make_unique<event>());
    return events_.back().get();
  }
  void destroy_event(void*) noexcept override { ++destroyed; }
  void record(void* e, void* stream) override {
    *static_cast<event*>(e) = {stream, enqueued_[stream]};
    ++records;
  }
  bool done(void* e) override {
    auto const& ev = *static_cast<event*>(e);
    return finished_[ev.stream] >= ev.work;
  }
  void host_wait(void* e) override {
    auto const& ev = *static_cast<event*>(e);
    finished_[ev.stream] = std::max(finished_[ev.stream], ev.work);
    ++host_waits;
  }
  void stream_wait(void*, void*) override { ++stream_waits; }
  void device_wait() override {
    finished_ = enqueued_;
    ++device_waits;
  }

  void launch(void* stream) { ++enqueued_[stream]; }
  void finish(void* stream) { finished_[stream] = enqueued_[stream]; }

  int host_waits = 0;
  int stream_waits = 0;
  int device_waits = 0;
  int records = 0;
  int destroyed = 0;

 private:
  std::vector<std::unique_ptr<event>> events_;
  std::map<void*, long long> enqueued_;
  std::map<void*, long long> finished_;
};

void* stream(std::uintptr_t id) {
  return reinterpret_cast<void*>(id);
}

/// A pool core over host memory, with small arenas so that tests see growth and release.
struct test_pool {
  explicit test_pool(pool_core::config cfg = small_arenas()) {
    auto streams_owned = std::make_unique<fake_streams>();
    streams = streams_owned.get();
    core = std::make_unique<pool_core>(std::make_unique<host_arena_source>(log),
                                       std::move(streams_owned), cfg);
  }
  static pool_core::config small_arenas() {
    pool_core::config cfg;
    cfg.min_arena_bytes = 4 * mib;
    cfg.arena_rounding = mib;
    return cfg;
  }
  arena_log log;
  fake_streams* streams = nullptr;
  std::unique_ptr<pool_core> core;
};

void fill(void* p, std::size_t bytes, unsigned char tag) {
  std::memset(p, tag, bytes);
}

bool holds(void const* p, std::size_t bytes, unsigned char tag) {
  auto const* c = static_cast<unsigned char const*>(p);
  return std::all_of(c, c + bytes, [tag](unsigned char x) { return x == tag; });
}

void check_counters(pool_stats const& s,
                    std::int64_t bytes,
                    std::int64_t bytes_peak,
                    std::int64_t bytes_total,
                    std::int64_t blocks,
                    std::int64_t blocks_peak,
                    std::int64_t blocks_total) {
  CHECK(s.bytes.current == bytes);
  CHECK(s.bytes.peak == bytes_peak);
  CHECK(s.bytes.total == bytes_total);
  CHECK(s.blocks.current == blocks);
  CHECK(s.blocks.peak == blocks_peak);
  CHECK(s.blocks.total == blocks_total);
}

}  // namespace

TEST_CASE("pool core serves small blocks from one arena, stats exact", "[pool][core]") {
  test_pool pool;
  check_counters(pool.core->stats(), 0, 0, 0, 0, 0, 0);
  CHECK(pool.core->stats().arenas == 0);

  void* a = pool.core->allocate(100, 256);
  REQUIRE(a != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 256 == 0);
  check_counters(pool.core->stats(), 100, 100, 100, 1, 1, 1);
  CHECK(pool.core->stats().arenas == 1);
  CHECK(pool.core->stats().reserved_bytes == 4 * mib);

  void* b = pool.core->allocate(1000, 16);
  CHECK(reinterpret_cast<std::uintptr_t>(b) % 256 == 0);  // every block starts on a granule
  check_counters(pool.core->stats(), 1100, 1100, 1100, 2, 2, 2);
  pool.core->deallocate(a, 100);
  check_counters(pool.core->stats(), 1000, 1100, 1100, 1, 2, 2);
  void* c = pool.core->allocate(50, 256);
  check_counters(pool.core->stats(), 1050, 1100, 1150, 2, 2, 3);
  pool.core->deallocate(b, 1000);
  pool.core->deallocate(c, 50);
  check_counters(pool.core->stats(), 0, 1100, 1150, 0, 2, 3);

  // A thousand small blocks never reach the source again.
  std::vector<void*> blocks;
  for (int i = 0; i < 1000; ++i) {
    blocks.push_back(pool.core->allocate(1 + static_cast<std::size_t>(i), 256));
  }
  CHECK(pool.log.reserves == 1);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    pool.core->deallocate(blocks[i], 1 + i);
  }
  CHECK(pool.core->stats().blocks.current == 0);
  CHECK(pool.core->ready_bytes() == 4 * mib);  // everything merged back
}

TEST_CASE("pool core: zero bytes, null pointers, unknown pointers", "[pool][core]") {
  test_pool pool;
  CHECK(pool.core->allocate(0, 256) == nullptr);
  CHECK(pool.core->allocate_async(0, 256, stream(1)) == nullptr);
  pool.core->deallocate(nullptr, 0);
  pool.core->deallocate_async(nullptr, 0, stream(1));
  check_counters(pool.core->stats(), 0, 0, 0, 0, 0, 0);
  CHECK(pool.log.reserves == 0);

  void* a = pool.core->allocate(512, 256);
  int not_from_pool = 0;
  pool.core->deallocate(&not_from_pool, 4);  // reported on stderr and ignored
  pool.core->deallocate(static_cast<char*>(a) + 256, 256);
  check_counters(pool.core->stats(), 512, 512, 512, 1, 1, 1);
  pool.core->deallocate(a, 512);
  pool.core->deallocate(a, 512);  // double free: ignored
  check_counters(pool.core->stats(), 0, 512, 512, 0, 1, 1);
}

TEST_CASE("pool core honours every power-of-two alignment and rejects others", "[pool][core]") {
  test_pool pool;
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t alignment = 1; alignment <= mib; alignment *= 2) {
    CAPTURE(alignment);
    void* p = pool.core->allocate(alignment + 1, alignment);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % alignment == 0);
    fill(p, alignment + 1, static_cast<unsigned char>(blocks.size()));
    blocks.emplace_back(p, alignment + 1);
  }
  auto const before = pool.core->stats();
  for (std::size_t bad : {std::size_t{0}, std::size_t{3}, std::size_t{48}, std::size_t{257}}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(pool.core->allocate(64, bad), std::invalid_argument);
    CHECK_THROWS_AS(pool.core->allocate_async(64, bad, stream(1)), std::invalid_argument);
  }
  auto const after = pool.core->stats();
  CHECK(after.blocks.total == before.blocks.total);
  CHECK(after.bytes.current == before.bytes.current);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    CHECK(holds(blocks[i].first, blocks[i].second, static_cast<unsigned char>(i)));
    pool.core->deallocate(blocks[i].first, blocks[i].second);
  }
  CHECK(pool.core->stats().blocks.current == 0);
  // Padding went back to the free lists: all of it is free again.
  CHECK(pool.core->ready_bytes() == pool.core->stats().reserved_bytes);
}

TEST_CASE("pool core honours maximum_bytes; earlier blocks survive out_of_memory", "[pool][core]") {
  auto cfg = test_pool::small_arenas();
  cfg.maximum_bytes = 10 * mib;
  test_pool pool{cfg};

  void* a = pool.core->allocate(3 * mib, 256);
  fill(a, 3 * mib, 0xa1);
  CHECK(pool.core->stats().reserved_bytes == 4 * mib);  // one growth chunk
  void* b = pool.core->allocate(3 * mib, 256);
  fill(b, 3 * mib, 0xb2);
  CHECK(pool.core->stats().reserved_bytes == 8 * mib);  // a second chunk: 8 MiB <= 10 MiB
  // 4 MiB more would pass the cap; an arena of just what is needed (2 MiB) fits under it.
  void* c = pool.core->allocate(2 * mib, 256);
  fill(c, 2 * mib, 0xc3);
  CHECK(pool.core->stats().reserved_bytes == 10 * mib);
  CHECK(pool.core->stats().arenas == 3);

  auto const before = pool.core->stats();
  CHECK_THROWS_AS(pool.core->allocate(2 * mib, 256), devmr::out_of_memory);
  CHECK_THROWS_AS(pool.core->allocate(2 * mib, 256), std::bad_alloc);
  CHECK_THROWS_AS(pool.core->allocate_async(2 * mib, 256, stream(3)), devmr::out_of_memory);
  CHECK_THROWS_AS(pool.core->allocate(64 * mib, 256), devmr::out_of_memory);
  auto const after = pool.core->stats();
  CHECK(after.reserved_bytes == 10 * mib);
  CHECK(after.blocks.total == before.blocks.total);
  CHECK(after.bytes.current == before.bytes.current);
  CHECK(holds(a, 3 * mib, 0xa1));
  CHECK(holds(b, 3 * mib, 0xb2));
  CHECK(holds(c, 2 * mib, 0xc3));

  // What is left in the arenas still serves.
  void* d = pool.core->allocate(mib, 256);
  fill(d, mib, 0xd4);
  CHECK(holds(a, 3 * mib, 0xa1));
  pool.core->deallocate(a, 3 * mib);
  void* e = pool.core->allocate(3 * mib, 256);  // a's room again, no new arena
  CHECK(pool.core->stats().reserved_bytes == 10 * mib);
  for (auto [p, n] :
       {std::pair{b, 3 * mib}, std::pair{c, 2 * mib}, std::pair{d, mib}, std::pair{e, 3 * mib}}) {
    pool.core->deallocate(p, n);
  }
  CHECK(pool.core->stats().blocks.current == 0);
}

TEST_CASE("pool core: the driver's own failures leave the pool intact", "[pool][core]") {
  test_pool pool;
  pool.log.driver_limit = 7 * mib;
  void* a = pool.core->allocate(3 * mib, 256);  // a 4 MiB arena, 1 MiB of it left
  fill(a, 3 * mib, 0x5a);
  // A second 4 MiB arena would pass the driver's limit; the pool falls back to an arena of just
  // what is needed.
  void* b = pool.core->allocate(2 * mib, 256);
  CHECK(pool.core->stats().reserved_bytes == 6 * mib);
  pool.core->deallocate(b, 2 * mib);
  pool.core->release();
  CHECK(pool.core->stats().reserved_bytes == 4 * mib);

  pool.log.driver_limit = 5 * mib;
  CHECK_THROWS_AS(pool.core->allocate(2 * mib, 256), devmr::out_of_memory);
  CHECK(holds(a, 3 * mib, 0x5a));
  CHECK(pool.core->stats().blocks.current == 1);

  pool.log.driver_limit = 0;
  pool.log.driver_broken = true;
  CHECK_THROWS_AS(pool.core->allocate(8 * mib, 256), devmr::cuda_error);
  CHECK(holds(a, 3 * mib, 0x5a));
  void* small = pool.core->allocate(kib, 256);  // served from the arena the pool has
  CHECK(small != nullptr);
  pool.log.driver_broken = false;
  void* big = pool.core->allocate(8 * mib, 256);
  CHECK(big != nullptr);
  pool.core->deallocate(big, 8 * mib);
  pool.core->deallocate(small, kib);
  pool.core->deallocate(a, 3 * mib);
  CHECK(pool.core->stats().blocks.current == 0);
}

TEST_CASE("pool core reserves initial_bytes up front and refuses an initial size over the cap",
          "[pool][core]") {
  auto cfg = test_pool::small_arenas();
  cfg.initial_bytes = 6 * mib + 1;
  {
    test_pool pool{cfg};
    CHECK(pool.core->stats().reserved_bytes == 7 * mib);
    CHECK(pool.core->stats().arenas == 1);
    void* a = pool.core->allocate(6 * mib, 256);  // fits in the initial arena
    CHECK(pool.log.reserves == 1);
    pool.core->deallocate(a, 6 * mib);
  }
  cfg.maximum_bytes = 6 * mib;
  CHECK_THROWS_AS(test_pool{cfg}, devmr::out_of_memory);
}

TEST_CASE("pool core release returns only fully free arenas", "[pool][core]") {
  test_pool pool;
  void* a = pool.core->allocate(3 * mib, 256);  // arena 1 (4 MiB)
  void* b = pool.core->allocate(3 * mib, 256);  // arena 2
  void* c = pool.core->allocate(3 * mib, 256);  // arena 3
  CHECK(pool.core->stats().arenas == 3);
  pool.core->release();  // all in use
  CHECK(pool.core->stats().arenas == 3);
  CHECK(pool.log.give_backs == 0);

  pool.core->deallocate(b, 3 * mib);
  pool.core->release();
  CHECK(pool.core->stats().arenas == 2);
  CHECK(pool.core->stats().reserved_bytes == 8 * mib);
  CHECK(pool.log.give_backs == 1);
  fill(a, 3 * mib, 1);
  fill(c, 3 * mib, 2);

  // A block freed on a stream whose work is pending: release waits for it, then returns its arena.
  pool.streams->launch(stream(7));
  pool.core->deallocate_async(c, 3 * mib, stream(7));
  pool.core->release();
  CHECK(pool.streams->host_waits == 1);
  CHECK(pool.core->stats().arenas == 1);
  CHECK(holds(a, 3 * mib, 1));
  pool.core->deallocate(a, 3 * mib);
  pool.core->release();
  CHECK(pool.core->stats().arenas == 0);
  CHECK(pool.core->stats().reserved_bytes == 0);
  CHECK(pool.log.held_bytes == 0);
  check_counters(pool.core->stats(), 0, 9 * mib, 9 * mib, 0, 3, 3);
  // And it grows again afterwards.
  void* d = pool.core->allocate(kib, 256);
  CHECK(pool.core->stats().arenas == 1);
  pool.core->deallocate(d, kib);
}

TEST_CASE("pool core hands a block freed on a stream to others only in order", "[pool][core]") {
  auto cfg = test_pool::small_arenas();
  cfg.maximum_bytes = 4 * mib;  // one arena: a second block must reuse the first one's memory
  test_pool pool{cfg};
  auto* const streams = pool.streams;
  void* const a_stream = stream(1);
  void* const b_stream = stream(2);

  SECTION("the same stream reuses the block at once") {
    void* p = pool.core->allocate_async(4 * mib, 256, a_stream);
    streams->launch(a_stream);  // a kernel on A uses p
    pool.core->deallocate_async(p, 4 * mib, a_stream);
    void* q = pool.core->allocate_async(4 * mib, 256, a_stream);
    CHECK(q == p);
    CHECK(streams->host_waits == 0);
    CHECK(streams->stream_waits == 0);
    pool.core->deallocate_async(q, 4 * mib, a_stream);
  }
  SECTION("another stream waits for the event, without host blocking") {
    void* p = pool.core->allocate_async(4 * mib, 256, a_stream);
    streams->launch(a_stream);
    pool.core->deallocate_async(p, 4 * mib, a_stream);
    void* q = pool.core->allocate_async(4 * mib, 256, b_stream);
    CHECK(q == p);
    CHECK(streams->stream_waits == 1);
    CHECK(streams->host_waits == 0);
    // Now the block belongs to B's order: B reuses it at once, a synchronous allocate must wait.
    streams->launch(b_stream);
    pool.core->deallocate_async(q, 4 * mib, b_stream);
    void* r = pool.core->allocate(4 * mib, 256);
    CHECK(r == p);
    CHECK(streams->host_waits == 1);
    pool.core->deallocate(r, 4 * mib);
  }
  SECTION("a finished stream's blocks are free for everyone, with no wait at all") {
    void* p = pool.core->allocate_async(4 * mib, 256, a_stream);
    streams->launch(a_stream);
    pool.core->deallocate_async(p, 4 * mib, a_stream);
    streams->finish(a_stream);
    void* q = pool.core->allocate_async(4 * mib, 256, b_stream);
    CHECK(q == p);
    CHECK(streams->stream_waits == 0);
    CHECK(streams->host_waits == 0);
    pool.core->deallocate(q, 4 * mib);
  }
  SECTION("a synchronous allocate waits on the host for a pending block") {
    void* p = pool.core->allocate_async(4 * mib, 256, a_stream);
    streams->launch(a_stream);
    pool.core->deallocate_async(p, 4 * mib, a_stream);
    void* q = pool.core->allocate(4 * mib, 256);
    CHECK(q == p);
    CHECK(streams->host_waits == 1);
    pool.core->deallocate(q, 4 * mib);
  }
  SECTION("while memory lasts, another stream gets a different block and nobody waits") {
    void* p = pool.core->allocate_async(mib, 256, a_stream);
    streams->launch(a_stream);
    pool.core->deallocate_async(p, mib, a_stream);
    void* q = pool.core->allocate_async(mib, 256, b_stream);
    CHECK(q != p);
    void* r = pool.core->allocate(mib, 256);
    CHECK(r != p);
    CHECK(streams->stream_waits == 0);
    CHECK(streams->host_waits == 0);
    pool.core->deallocate(q, mib);
    pool.core->deallocate(r, mib);
  }
  SECTION("small blocks freed on a stream stay with it until an event covers them") {
    void* p = pool.core->allocate_async(kib, 256, a_stream);
    streams->launch(a_stream);
    pool.core->deallocate_async(p, kib, a_stream);
    CHECK(streams->records == 0);  // a small free makes no CUDA call
    void* q = pool.core->allocate_async(kib, 256, b_stream);
    CHECK(q != p);
    void* r = pool.core->allocate_async(kib, 256, a_stream);
    CHECK(r == p);
    pool.core->deallocate_async(r, kib, a_stream);
    pool.core->deallocate(q, kib);
    // The rest of the arena serves a synchronous allocate, without touching A's block...
    void* s = pool.core->allocate(4 * mib - kib, 256);
    CHECK(streams->device_waits == 0);
    pool.core->deallocate(s, 4 * mib - kib);
    // ...but the whole arena needs it: with no event to wait for, the device is synchronized.
    void* t = pool.core->allocate(4 * mib, 256);
    CHECK(t == p);
    CHECK(streams->device_waits == 1);
    CHECK(streams->host_waits == 0);
    pool.core->deallocate(t, 4 * mib);
  }
  SECTION("every 64th small free records an event; then other streams can wait for it") {
    std::vector<void*> blocks;
    for (int i = 0; i < 64; ++i) {
      blocks.push_back(pool.core->allocate_async(kib, 256, a_stream));
    }
    streams->launch(a_stream);
    for (int i = 0; i < 63; ++i) {
      pool.core->deallocate_async(blocks[static_cast<std::size_t>(i)], kib, a_stream);
    }
    CHECK(streams->records == 0);
    pool.core->deallocate_async(blocks[63], kib, a_stream);
    CHECK(streams->records == 1);
    // All 64 KiB are sealed now: a synchronous allocate of the whole arena waits for the event.
    void* t = pool.core->allocate(4 * mib, 256);
    CHECK(streams->host_waits == 1);
    CHECK(streams->device_waits == 0);
    pool.core->deallocate(t, 4 * mib);
  }
  SECTION("a seal hands the previous seal's blocks to everyone once their work is done") {
    std::vector<void*> blocks;
    for (int i = 0; i < 128; ++i) {
      blocks.push_back(pool.core->allocate_async(kib, 256, a_stream));
    }
    std::size_t const ready_before = pool.core->ready_bytes();
    streams->launch(a_stream);
    for (std::size_t i = 0; i < 64; ++i) {
      pool.core->deallocate_async(blocks[i], kib, a_stream);
    }
    CHECK(streams->records == 1);
    CHECK(pool.core->ready_bytes() == ready_before);
    streams->finish(a_stream);
    streams->launch(a_stream);  // new work that uses the second 64
    for (std::size_t i = 64; i < 128; ++i) {
      pool.core->deallocate_async(blocks[i], kib, a_stream);
    }
    CHECK(streams->records == 2);
    CHECK(pool.core->ready_bytes() == ready_before + 64 * kib);  // the first 64 are ready
    void* t = pool.core->allocate(4 * mib, 256);                 // the second 64 need their event
    CHECK(streams->host_waits == 1);
    pool.core->deallocate(t, 4 * mib);
  }
  auto const s = pool.core->stats();
  CHECK(s.blocks.current == 0);
  CHECK(s.bytes.current == 0);
  CHECK(s.arenas == 1);
}

TEST_CASE("pool core frees its arenas on destruction, even with blocks allocated", "[pool][core]") {
  auto pool = std::make_unique<test_pool>();
  arena_log const* const log = &pool->log;
  void* a = pool->core->allocate(kib, 256);  // never freed: reported on stderr
  void* b = pool->core->allocate(5 * mib, 256);
  pool->core->deallocate_async(b, 5 * mib, stream(4));
  (void)a;
  CHECK(log->held_bytes == pool->core->stats().reserved_bytes);
  pool->core.reset();
  CHECK(log->held_bytes == 0);
  CHECK(log->give_backs == log->reserves);
}

TEST_CASE("pool core: 8 threads x 100k random allocations never overlap", "[pool][core][threads]") {
  auto cfg = test_pool::small_arenas();
  cfg.min_arena_bytes = 16 * mib;
  test_pool pool{cfg};
  constexpr int thread_count = 8;
  constexpr int ops_per_thread = 100'000;
  std::atomic<long long> failures{0};

  auto worker = [&](int id) {
    std::mt19937_64 rng{static_cast<std::uint64_t>(id) * 7919 + 1};
    struct block {
      std::uint64_t* p;
      std::size_t bytes;
      std::uint64_t tag;
    };
    std::vector<block> live;
    auto check = [&](block const& b) {
      // Tags at the first and last words and in the middle: another live block over this one
      // would have overwritten at least one of them.
      std::size_t const words = b.bytes / 8;
      if (b.p[0] != b.tag || b.p[words - 1] != b.tag || b.p[words / 2] != b.tag) {
        ++failures;
      }
    };
    for (int op = 0; op < ops_per_thread; ++op) {
      bool const do_alloc = live.empty() || (live.size() < 256 && rng() % 100 < 55);
      if (do_alloc) {
        std::size_t const bytes = 8 * (1 + rng() % 8192);  // 8 B .. 64 KiB
        std::size_t const alignment = std::size_t{1} << (rng() % 13);
        auto* p = static_cast<std::uint64_t*>(pool.core->allocate(bytes, alignment));
        if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0) {
          ++failures;
        }
        std::uint64_t const tag =
            (static_cast<std::uint64_t>(id) << 32) | static_cast<unsigned>(op);
        block const b{p, bytes, tag};
        std::size_t const words = bytes / 8;
        p[0] = tag;
        p[words / 2] = tag;
        p[words - 1] = tag;
        live.push_back(b);
      } else {
        std::size_t const i = rng() % live.size();
        check(live[i]);
        pool.core->deallocate(live[i].p, live[i].bytes);
        live[i] = live.back();
        live.pop_back();
      }
    }
    for (auto const& b : live) {
      check(b);
      pool.core->deallocate(b.p, b.bytes);
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < thread_count; ++i) {
    threads.emplace_back(worker, i);
  }
  for (auto& t : threads) {
    t.join();
  }
  CHECK(failures == 0);
  auto const s = pool.core->stats();
  CHECK(s.blocks.current == 0);
  CHECK(s.bytes.current == 0);
  CHECK(s.blocks.total > thread_count * ops_per_thread / 3);
  CHECK(s.blocks.peak <= thread_count * 256);
  CHECK(pool.core->ready_bytes() == s.reserved_bytes);  // everything merged back
  pool.core->release();
  CHECK(pool.core->stats().arenas == 0);
}

TEST_CASE("device_pool: a CUDA error where there is no GPU, a working pool where there is one",
          "[pool][cuda]") {
  int count = 0;
  cudaError_t const status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    REQUIRE_THROWS_AS(devmr::device_pool{}, devmr::cuda_error);
    try {
      devmr::device_pool pool{};
    } catch (devmr::cuda_error const& e) {
      std::string const what = e.what();
      CHECK(what.find(cudaGetErrorName(status)) != std::string::npos);
      CHECK(e.status() == status);
    }
    CHECK_THROWS_AS(devmr::pinned_pool{}, devmr::cuda_error);
    CHECK_THROWS_AS(devmr::managed_pool{devmr::pool_options{.device = 0}}, devmr::cuda_error);
    return;
  }
  devmr::device_pool pool{};
  CHECK(pool.device() >= 0);
  CHECK_THROWS_AS(devmr::device_pool{devmr::pool_options{.device = count}}, devmr::cuda_error);
  cuda::mr::resource_ref<cuda::mr::device_accessible> ref{pool};
  void* p = ref.allocate(1024, 256);
  CHECK(p != nullptr);
  ref.deallocate(p, 1024, 256);
  CHECK(pool.stats().blocks.total == 1);
}
