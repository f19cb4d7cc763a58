// What the benchmarks' event timer reads for a kernel that does nothing, with and without the
// hold kernel that event_timer enqueues first (see event_timer.hpp): the part of every timed
// kernel that is launch, not work. Grids of 1 to 16384 blocks of 256 threads (heap_bench's
// 2^16-thread rows run 256 blocks, its 2^22-thread rows 16384), 101 timings each, after one
// untimed launch; printed: p10, median, p90 and max in microseconds.
// Exit status: 0, or 2 without a GPU.

#include "device_line.hpp"
#include "event_timer.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace {

constexpr unsigned block_threads = 256;
constexpr int timings = 101;

/// Does nothing the compiler can drop: thread 1023 of block 0 would store, and none exists.
__global__ void empty_kernel(int* never) {
  if (never != nullptr && threadIdx.x == 1023) {
    *never = 1;
  }
}

void row(devmr_bench::event_timer& timer, char const* label, unsigned blocks) {
  std::vector<float> us;
  us.reserve(timings);
  for (int i = 0; i < timings; ++i) {
    us.push_back(1000.0f *
                 timer.time_ms([&] { empty_kernel<<<blocks, block_threads>>>(nullptr); }));
  }
  std::sort(us.begin(), us.end());
  std::printf("%-8s %6u %8.2f %8.2f %8.2f %8.2f\n", label, blocks, us[timings / 10],
              us[timings / 2], us[timings * 9 / 10], us.back());
}

}  // namespace

int main() {
  if (!devmr_bench::open_device("timer_bench",
                                "timer_bench (an empty kernel, timed idle and held)")) {
    return 2;
  }
  try {
    empty_kernel<<<1, block_threads>>>(nullptr);
    DEVMR_CUDA_TRY(cudaDeviceSynchronize());
    devmr_bench::event_timer idle{false};
    devmr_bench::event_timer held;
    std::printf("\ntimer    blocks   p10 us   med us   p90 us   max us\n");
    for (unsigned const blocks : {1u, 256u, 4096u, 16384u}) {
      row(idle, "idle", blocks);
      row(held, "held", blocks);
    }
  } catch (std::exception const& e) {
    std::fprintf(stderr, "timer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
