#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>

namespace devmr {

/// @brief A CUDA call failed; the message names the call, the CUDA error and its text.
class cuda_error : public std::runtime_error {
 public:
  /// @param status the failing status @param what the call or context that failed
  cuda_error(cudaError_t status, std::string const& what);
  /// @return the CUDA status that caused this error
  [[nodiscard]] cudaError_t status() const noexcept { return status_; }

 private:
  cudaError_t status_;
};

/// @brief A pool or heap could not serve a request; everything allocated before stays valid.
class out_of_memory : public std::bad_alloc {
 public:
  /// @param what why the request could not be served
  explicit out_of_memory(std::string what);
  /// @return why the request could not be served
  [[nodiscard]] char const* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

/// @brief Kernels recorded invalid or double frees on a checked heap.
class heap_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {
/// Throws cuda_error for a failing status; clears the sticky-free last error first.
void throw_cuda_error(cudaError_t status, char const* call, char const* file, int line);
/// Throws std::invalid_argument unless alignment is a power of two.
void validate_alignment(std::size_t alignment);
}  // namespace detail

}  // namespace devmr

/// Checks a CUDA runtime call and throws devmr::cuda_error naming it when it fails.
#define DEVMR_CUDA_TRY(call)                                                       \
  do {                                                                             \
    cudaError_t const devmr_status_ = (call);                                      \
    if (devmr_status_ != cudaSuccess) {                                            \
      ::devmr::detail::throw_cuda_error(devmr_status_, #call, __FILE__, __LINE__); \
    }                                                                              \
  } while (false)
