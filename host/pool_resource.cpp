// The CUDA side of pool_resource: arenas from the driver and stream ordering with CUDA events.

#include <devmr/detail/device_guard.hpp>
#include <devmr/pool_resource.hpp>

#include <cuda_runtime_api.h>

#include <string>

namespace devmr::detail {
namespace {

class driver_arena_source final : public arena_source {
 public:
  driver_arena_source(memory_kind kind, int device) : kind_(kind), device_(device) {}

  void* reserve(std::size_t bytes) override {
    device_guard const guard{device_};
    void* arena = nullptr;
    cudaError_t status = cudaSuccess;
    char const* call = "";
    switch (kind_) {
      case memory_kind::device:
        status = cudaMalloc(&arena, bytes);
        call = "cudaMalloc";
        break;
      case memory_kind::managed:
        status = cudaMallocManaged(&arena, bytes, cudaMemAttachGlobal);
        call = "cudaMallocManaged";
        break;
      case memory_kind::pinned:
        status = cudaMallocHost(&arena, bytes);
        call = "cudaMallocHost";
        break;
    }
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky, but take it off the last-error slot
      throw out_of_memory(std::string{"devmr: "} + call + " of " + std::to_string(bytes) +
                          " bytes for a " + to_string(kind_) + " pool on device " +
                          std::to_string(device_) + " failed: out of memory");
    }
    if (status != cudaSuccess) {
      throw_cuda_error(status, call, __FILE__, __LINE__);
    }
    return arena;
  }

  void give_back(void* arena, std::size_t) noexcept override {
    int previous = 0;
    bool const switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                          cudaSetDevice(device_) == cudaSuccess;
    cudaError_t const status = kind_ == memory_kind::pinned ? cudaFreeHost(arena) : cudaFree(arena);
    if (status != cudaSuccess) {
      cudaGetLastError();
    }
    if (switched) {
      cudaSetDevice(previous);
    }
  }

 private:
  memory_kind kind_;
  int device_;
};

class driver_stream_order final : public stream_order {
 public:
  explicit driver_stream_order(int device) : device_(device) {}

  void* create_event() override {
    device_guard const guard{device_};
    cudaEvent_t event = nullptr;
    DEVMR_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
  }
  void destroy_event(void* event) noexcept override {
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  void record(void* event, void* stream) override {
    DEVMR_CUDA_TRY(
        cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
  }
  bool done(void* event) override {
    cudaError_t const status = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (status == cudaErrorNotReady) {
      return false;
    }
    DEVMR_CUDA_TRY(status);
    return true;
  }
  void host_wait(void* event) override {
    DEVMR_CUDA_TRY(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  }
  void stream_wait(void* stream, void* event) override {
    DEVMR_CUDA_TRY(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
  }
  void device_wait() override {
    device_guard const guard{device_};
    DEVMR_CUDA_TRY(cudaDeviceSynchronize());
  }

 private:
  int device_;
};

}  // namespace

std::unique_ptr<pool_core> make_driver_pool(memory_kind kind, pool_options& options) {
  int count = 0;
  DEVMR_CUDA_TRY(cudaGetDeviceCount(&count));
  if (options.device == -1) {
    DEVMR_CUDA_TRY(cudaGetDevice(&options.device));
  } else if (options.device < 0 || options.device >= count) {
    throw cuda_error(cudaErrorInvalidDevice,
                     "devmr: " + std::string{to_string(kind)} + " pool on device " +
                         std::to_string(options.device) + " of " + std::to_string(count));
  }
  pool_core::config cfg;
  cfg.initial_bytes = options.initial_bytes;
  cfg.maximum_bytes = options.maximum_bytes;
  return std::make_unique<pool_core>(std::make_unique<driver_arena_source>(kind, options.device),
                                     std::make_unique<driver_stream_order>(options.device), cfg);
}

}  // namespace devmr::detail
