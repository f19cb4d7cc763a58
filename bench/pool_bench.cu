// Host-side allocate + deallocate throughput of devmr::device_pool against cudaMalloc/cudaFree and
// cudaMallocAsync/cudaFreeAsync (one stream, the device's default memory pool with its release
// threshold raised so that it keeps its memory, as RMM's cuda_async_memory_resource does), in one
// run. Rows: pairs (allocate then free, repeated), batches (N allocations, then N frees) and an
// RMM-style churn (73% allocate, 27% free of a random live block; sizes uniform in [256 B, 1 MiB];
// fixed seed). ops/s counts every allocate and every free as one operation; each cell is the
// median of 5 timed runs after one untimed warm-up run.

#include <devmr/pool_resource.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

#define BENCH_CHECK(call)                                                                      \
  do {                                                                                         \
    cudaError_t const status_ = (call);                                                        \
    if (status_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "pool_bench: %s failed: %s\n", #call, cudaGetErrorString(status_)); \
      std::exit(EXIT_FAILURE);                                                                 \
    }                                                                                          \
  } while (false)

/// One allocator under test, as a pair of host calls.
struct method {
  char const* name;
  std::function<void*(std::size_t)> allocate;
  std::function<void(void*, std::size_t)> deallocate;
};

/// One workload: runs `ops` operations with the given method.
struct workload {
  std::string name;
  std::size_t ops;
  std::function<void(method const&)> run;
};

double seconds_of(std::function<void()> const& f) {
  auto const start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

workload pairs(std::size_t bytes, std::size_t iterations, char const* label) {
  return {std::string{"pairs   "} + label, 2 * iterations, [=](method const& m) {
            for (std::size_t i = 0; i < iterations; ++i) {
              m.deallocate(m.allocate(bytes), bytes);
            }
          }};
}

workload batch(std::size_t bytes, std::size_t count, char const* label) {
  return {std::string{"batch   "} + label + " x" + std::to_string(count), 2 * count,
          [=](method const& m) {
            std::vector<void*> blocks(count);
            for (auto& p : blocks) {
              p = m.allocate(bytes);
            }
            for (auto* p : blocks) {
              m.deallocate(p, bytes);
            }
          }};
}

/// RMM's random_allocations pattern: 73% allocate, 27% free a random live block.
workload churn(std::size_t ops) {
  struct op {
    bool allocate;
    std::size_t bytes_or_pick;
  };
  auto plan = std::make_shared<std::vector<op>>();
  std::mt19937_64 rng{20261130};
  std::uniform_int_distribution<std::size_t> size_dist{256, std::size_t{1} << 20};
  std::size_t live = 0;
  for (std::size_t i = 0; i < ops; ++i) {
    bool const allocate = live == 0 || rng() % 100 < 73;
    plan->push_back({allocate, allocate ? size_dist(rng) : rng()});
    if (allocate) {
      ++live;
    } else {
      --live;
    }
  }
  return {"churn   73/27 [256 B, 1 MiB]", ops, [plan](method const& m) {
            std::vector<std::pair<void*, std::size_t>> live_blocks;
            live_blocks.reserve(plan->size());
            for (auto const& o : *plan) {
              if (o.allocate) {
                live_blocks.emplace_back(m.allocate(o.bytes_or_pick), o.bytes_or_pick);
              } else {
                auto const i = o.bytes_or_pick % live_blocks.size();
                m.deallocate(live_blocks[i].first, live_blocks[i].second);
                live_blocks[i] = live_blocks.back();
                live_blocks.pop_back();
              }
            }
            for (auto const& [p, bytes] : live_blocks) {
              m.deallocate(p, bytes);
            }
          }};
}

}  // namespace

int main() {
  int devices = 0;
  cudaError_t const status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "pool_bench: no CUDA device (%s); this benchmark needs a GPU\n",
                 cudaGetErrorString(status));
    return EXIT_FAILURE;
  }
  int device = 0;
  BENCH_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, device));
  cudaStream_t stream = nullptr;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaMemPool_t default_pool = nullptr;
  BENCH_CHECK(cudaDeviceGetDefaultMemPool(&default_pool, device));
  std::uint64_t keep_everything = UINT64_MAX;
  BENCH_CHECK(
      cudaMemPoolSetAttribute(default_pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));

  devmr::device_pool pool;
  std::vector<method> const methods = {
      {"cudaMalloc",
       [](std::size_t bytes) {
         void* p = nullptr;
         BENCH_CHECK(cudaMalloc(&p, bytes));
         return p;
       },
       [](void* p, std::size_t) { BENCH_CHECK(cudaFree(p)); }},
      {"cudaMallocAsync",
       [stream](std::size_t bytes) {
         void* p = nullptr;
         BENCH_CHECK(cudaMallocAsync(&p, bytes, stream));
         return p;
       },
       [stream](void* p, std::size_t) { BENCH_CHECK(cudaFreeAsync(p, stream)); }},
      {"pool sync", [&pool](std::size_t bytes) { return pool.allocate(bytes); },
       [&pool](void* p, std::size_t bytes) { pool.deallocate(p, bytes); }},
      {"pool async",
       [&pool, stream](std::size_t bytes) { return pool.allocate_async(bytes, stream); },
       [&pool, stream](void* p, std::size_t bytes) { pool.deallocate_async(p, bytes, stream); }},
  };

  constexpr std::size_t kib = 1024;
  constexpr std::size_t mib = kib * kib;
  std::vector<workload> const workloads = {
      pairs(256, 20000, "256 B"),
      pairs(4 * kib, 20000, "4 KiB"),
      pairs(64 * kib, 20000, "64 KiB"),
      pairs(mib, 5000, "1 MiB"),
      pairs(64 * mib, 500, "64 MiB"),
      batch(256, 2000, "256 B"),
      batch(4 * kib, 2000, "4 KiB"),
      batch(64 * kib, 2000, "64 KiB"),
      batch(mib, 1000, "1 MiB"),
      batch(64 * mib, 64, "64 MiB"),
      churn(20000),
  };

  std::printf(
      "pool_bench on %s (device %d): host-side ops/s (allocate and free each count as "
      "one op), median of 5\n\n",
      prop.name, device);
  std::printf("%-34s %12s %12s %12s %12s %9s %9s\n", "workload", "cudaMalloc", "MallocAsync",
              "pool sync", "pool async", "sync/MA", "async/MA");
  for (auto const& w : workloads) {
    std::vector<double> rates;
    for (auto const& m : methods) {
      w.run(m);  // warm-up: pools reserve what the workload needs
      BENCH_CHECK(cudaDeviceSynchronize());
      std::vector<double> samples;
      for (int rep = 0; rep < 5; ++rep) {
        double const s = seconds_of([&] { w.run(m); });
        samples.push_back(static_cast<double>(w.ops) / s);
        BENCH_CHECK(cudaDeviceSynchronize());
      }
      std::nth_element(samples.begin(), samples.begin() + 2, samples.end());
      rates.push_back(samples[2]);
    }
    std::printf("%-34s %12.3g %12.3g %12.3g %12.3g %8.2fx %8.2fx\n", w.name.c_str(), rates[0],
                rates[1], rates[2], rates[3], rates[2] / rates[1], rates[3] / rates[1]);
    std::fflush(stdout);
  }
  auto const s = pool.stats();
  std::printf("\ndevice_pool after the run: %zu arenas, %zu bytes reserved, %lld blocks served\n",
              s.arenas, s.reserved_bytes, static_cast<long long>(s.blocks.total));
  BENCH_CHECK(cudaStreamDestroy(stream));
  return EXIT_SUCCESS;
}
