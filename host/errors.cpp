#include <devmr/errors.hpp>

#include <string>

namespace devmr {

cuda_error::cuda_error(cudaError_t status, std::string const& what)
    : std::runtime_error(what + ": " + cudaGetErrorName(status) + " (" +
                         cudaGetErrorString(status) + ")"),
      status_(status) {}

out_of_memory::out_of_memory(std::string what) : what_(std::move(what)) {}

namespace detail {

void throw_cuda_error(cudaError_t status, char const* call, char const* file, int line) {
  // Take the error off the runtime's last-error slot so that later, unrelated checks of
  // cudaGetLastError do not report it again.
  cudaGetLastError();
  throw cuda_error(status, std::string{call} + " at " + file + ":" + std::to_string(line));
}

void validate_alignment(std::size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw std::invalid_argument("devmr: alignment " + std::to_string(alignment) +
                                " is not a power of two");
  }
}

}  // namespace detail
}  // namespace devmr
