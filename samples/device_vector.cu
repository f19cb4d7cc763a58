// A growable array in device code, built on devmr::allocator: push_back inside a kernel, growing
// by reallocation through the slab heap (a block twice as large, the elements copied, the old
// block freed). Two forms: one vector per thread, and one per warp that the warp's lanes push to
// together (one growth for the whole warp, its lanes copying the old elements side by side).
// The host checks what each vector held; the heap must hold no block afterwards.

#include "sample_support.hpp"

#include <devmr/devmr.hpp>

#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cg = cooperative_groups;

namespace {

constexpr unsigned threads = 1u << 16;
constexpr unsigned block_threads = 256;

using int_allocator = devmr::allocator<std::uint64_t, devmr::slab_ref<>>;

/// A growable array owned by one thread. Elements must be trivially copyable.
template <class T, class Allocator>
class device_vector {
 public:
  __device__ explicit device_vector(Allocator alloc) : alloc_{alloc} {}
  device_vector(device_vector const&) = delete;
  device_vector& operator=(device_vector const&) = delete;
  __device__ ~device_vector() {
    if (data_ != nullptr) {
      alloc_.deallocate(data_, capacity_);
    }
  }

  /// Appends `value`; false (and nothing appended) when the heap could not grow the array.
  __device__ bool push_back(T const& value) {
    if (size_ == capacity_ && !reserve(capacity_ == 0 ? 4 : 2 * capacity_)) {
      return false;
    }
    data_[size_++] = value;
    return true;
  }

  /// Makes room for `capacity` elements: a new block, the elements copied, the old block freed.
  __device__ bool reserve(std::size_t capacity) {
    if (capacity <= capacity_) {
      return true;
    }
    T* fresh = alloc_.allocate(capacity);
    if (fresh == nullptr) {
      return false;
    }
    for (std::size_t k = 0; k < size_; ++k) {
      fresh[k] = data_[k];
    }
    if (data_ != nullptr) {
      alloc_.deallocate(data_, capacity_);
    }
    data_ = fresh;
    capacity_ = capacity;
    return true;
  }

  __device__ T const& operator[](std::size_t k) const { return data_[k]; }
  __device__ std::size_t size() const { return size_; }
  __device__ std::size_t capacity() const { return capacity_; }

 private:
  Allocator alloc_;
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

/// A growable array that the lanes of one warp push to together. Every lane holds the same
/// state; every lane of the warp calls each member.
template <class T, class Allocator>
class warp_vector {
 public:
  using warp = cg::thread_block_tile<32>;

  __device__ warp_vector(warp const& w, Allocator alloc) : warp_{w}, alloc_{alloc} {}
  warp_vector(warp_vector const&) = delete;
  warp_vector& operator=(warp_vector const&) = delete;
  __device__ ~warp_vector() {
    warp_.sync();  // every lane is past its last read
    if (warp_.thread_rank() == 0 && data_ != nullptr) {
      alloc_.deallocate(data_, capacity_);
    }
  }

  /// Lanes with `has_value` append `value`, in lane order. False in every lane when the heap
  /// could not grow the array (nothing appended then).
  __device__ bool push_back(bool has_value, T const& value) {
    unsigned const pushing = warp_.ballot(has_value);
    unsigned const count = __popc(pushing);
    if (size_ + count > capacity_) {
      std::size_t wanted = capacity_ == 0 ? 32 : 2 * capacity_;
      while (wanted < size_ + count) {
        wanted *= 2;
      }
      if (!reserve(wanted)) {
        return false;
      }
    }
    if (has_value) {
      unsigned const before = __popc(pushing & ((1u << warp_.thread_rank()) - 1u));
      data_[size_ + before] = value;
    }
    size_ += count;
    return true;
  }

  __device__ bool reserve(std::size_t capacity) {
    T* fresh = nullptr;
    if (warp_.thread_rank() == 0) {
      fresh = alloc_.allocate(capacity);
    }
    fresh = warp_.shfl(fresh, 0);
    if (fresh == nullptr) {
      return false;
    }
    for (std::size_t k = warp_.thread_rank(); k < size_; k += warp_.size()) {
      fresh[k] = data_[k];
    }
    warp_.sync();  // the copies are done before the old block goes, and visible to every lane
    if (warp_.thread_rank() == 0 && data_ != nullptr) {
      alloc_.deallocate(data_, capacity_);
    }
    data_ = fresh;
    capacity_ = capacity;
    return true;
  }

  __device__ T const& operator[](std::size_t k) const { return data_[k]; }
  __device__ std::size_t size() const { return size_; }

 private:
  warp warp_;
  Allocator alloc_;
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

/// Per-thread result: how many values the vector held, their sum, and whether all pushes worked.
struct thread_result {
  unsigned long long count;
  unsigned long long sum;
  unsigned ok;
};

/// Each thread pushes the divisors of i + 1 (a count it learns as it goes), then reads them back.
__global__ void divisors_per_thread(devmr::slab_ref<> heap, thread_result* results) {
  unsigned const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= threads) {
    return;
  }
  device_vector<std::uint64_t, int_allocator> divisors{int_allocator{heap}};
  unsigned const n = i + 1;
  bool ok = true;
  for (unsigned d = 1; d * d <= n; ++d) {
    if (n % d == 0) {
      ok = ok && divisors.push_back(d);
      if (d != n / d) {
        ok = ok && divisors.push_back(n / d);
      }
    }
  }
  unsigned long long sum = 0;
  for (std::size_t k = 0; k < divisors.size(); ++k) {
    sum += divisors[k];
  }
  results[i] = {divisors.size(), sum, ok ? 1u : 0u};
}

/// How many values lane `lane` of warp `w` pushes: 0 to 47.
__host__ __device__ unsigned pushes_of(unsigned w, unsigned lane) {
  return (w * 32u + lane) * 2654435761u % 48u;
}

/// Each warp's lanes push 0 to 47 values each, round by round, into one vector of the warp; the
/// warp then adds up the vector's elements.
__global__ void values_per_warp(devmr::slab_ref<> heap, thread_result* results) {
  auto w = cg::tiled_partition<32>(cg::this_thread_block());
  unsigned const warp_id = (blockIdx.x * blockDim.x + threadIdx.x) / 32u;
  unsigned const lane = w.thread_rank();
  warp_vector<std::uint64_t, int_allocator> values{w, int_allocator{heap}};
  unsigned const mine = pushes_of(warp_id, lane);
  bool ok = true;
  for (unsigned round = 0; round < 48; ++round) {
    bool const has_value = round < mine;
    ok = values.push_back(has_value, std::uint64_t{warp_id} * 10000u + lane * 100u + round) && ok;
  }
  unsigned long long sum = 0;
  for (std::size_t k = lane; k < values.size(); k += 32) {
    sum += values[k];
  }
  sum = cg::reduce(w, sum, cg::plus<unsigned long long>());
  if (lane == 0) {
    results[warp_id] = {values.size(), sum, ok ? 1u : 0u};
  }
}

}  // namespace

int main() {
  devmr_samples::require_gpu("device_vector");
  devmr::device_pool pool{devmr::pool_options{.initial_bytes = std::size_t{640} << 20}};
  devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = std::size_t{512} << 20}};

  thread_result* results = nullptr;
  DEVMR_SAMPLE_CHECK(cudaMallocManaged(&results, threads * sizeof(thread_result)));

  divisors_per_thread<<<threads / block_threads, block_threads>>>(heap.ref(), results);
  DEVMR_SAMPLE_CHECK(cudaDeviceSynchronize());
  unsigned wrong_threads = 0;
  for (unsigned i = 0; i < threads; ++i) {
    unsigned long long count = 0;
    unsigned long long sum = 0;
    unsigned const n = i + 1;
    for (unsigned d = 1; d * d <= n; ++d) {
      if (n % d == 0) {
        count += d != n / d ? 2 : 1;
        sum += d != n / d ? d + n / d : d;
      }
    }
    bool const right = results[i].ok == 1 && results[i].count == count && results[i].sum == sum;
    wrong_threads += right ? 0u : 1u;
  }
  devmr::heap_stats const after_threads = heap.stats();

  unsigned const warps = threads / 32;
  values_per_warp<<<threads / block_threads, block_threads>>>(heap.ref(), results);
  DEVMR_SAMPLE_CHECK(cudaDeviceSynchronize());
  unsigned wrong_warps = 0;
  for (unsigned w = 0; w < warps; ++w) {
    unsigned long long count = 0;
    unsigned long long sum = 0;
    for (unsigned lane = 0; lane < 32; ++lane) {
      for (unsigned round = 0; round < pushes_of(w, lane); ++round) {
        ++count;
        sum += std::uint64_t{w} * 10000u + lane * 100u + round;
      }
    }
    bool const right = results[w].ok == 1 && results[w].count == count && results[w].sum == sum;
    wrong_warps += right ? 0u : 1u;
  }
  devmr::heap_stats const after_warps = heap.stats();

  std::printf("per thread: %u vectors of divisors, %u wrong\n", threads, wrong_threads);
  std::printf("per warp:   %u vectors of 0 to %u values, %u wrong\n", warps, 32u * 47u,
              wrong_warps);
  std::printf("heap: %zu and %zu blocks in use after the kernels, %llu failed allocations\n",
              after_threads.blocks_in_use, after_warps.blocks_in_use,
              static_cast<unsigned long long>(after_warps.failed_allocations));
  DEVMR_SAMPLE_CHECK(cudaFree(results));
  bool const ok = wrong_threads == 0 && wrong_warps == 0 && after_threads.blocks_in_use == 0 &&
                  after_warps.blocks_in_use == 0 && after_warps.failed_allocations == 0;
  std::printf("%s\n", ok ? "device_vector: OK" : "device_vector: FAILED");
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
