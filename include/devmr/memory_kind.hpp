#pragma once

#include <devmr/detail/config.hpp>

namespace devmr {

/// @brief Where a pool's arenas live.
enum class memory_kind {
  device,   ///< device memory (cudaMalloc): device accessible only
  managed,  ///< managed memory (cudaMallocManaged): host and device accessible
  pinned,   ///< page-locked host memory (cudaMallocHost): host and device accessible
};

/// @brief True when memory of this kind can be read and written by host code.
constexpr bool is_host_accessible(memory_kind kind) noexcept {
  return kind != memory_kind::device;
}

/// @brief The name of a kind, for messages.
constexpr char const* to_string(memory_kind kind) noexcept {
  switch (kind) {
    case memory_kind::device:
      return "device";
    case memory_kind::managed:
      return "managed";
    case memory_kind::pinned:
      return "pinned";
  }
  return "unknown";
}

}  // namespace devmr
