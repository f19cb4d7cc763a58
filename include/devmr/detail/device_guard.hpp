#pragma once

// Makes a device current for a scope, and the caller's device current again after it.

#include <devmr/errors.hpp>

#include <cuda_runtime_api.h>

namespace devmr::detail {

/// Makes `device` current until the end of the scope (host code only).
class device_guard {
 public:
  /// @throw devmr::cuda_error when the device cannot be made current
  explicit device_guard(int device) {
    DEVMR_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ != device) {
      DEVMR_CUDA_TRY(cudaSetDevice(device));
      switched_ = true;
    }
  }
  ~device_guard() {
    if (switched_) {
      cudaSetDevice(previous_);
    }
  }
  device_guard(device_guard const&) = delete;
  device_guard& operator=(device_guard const&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace devmr::detail
