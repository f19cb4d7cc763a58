// The block sizes of the protocol's rows (README.md in this folder), which heap_bench and
// free_bound_bench must draw alike: one size for every thread, or 16 << (fmix32(i) % 9) bytes.
#pragma once

#include <devmr/detail/config.hpp>

#include <cstdint>

namespace devmr_bench {

/// The size argument of kernels that asks for mixed sizes.
inline constexpr unsigned mixed_size = 0;

/// murmur3's 32-bit finalizer: a bijective integer hash with good avalanche.
DEVMR_HOST_DEVICE constexpr std::uint32_t fmix32(std::uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

/// The block size of thread `i`: `size_arg` bytes, or 16 << (fmix32(i) % 9) for mixed rows.
DEVMR_HOST_DEVICE constexpr unsigned block_size(unsigned i, unsigned size_arg) {
  return size_arg != mixed_size ? size_arg : 16u << (fmix32(i) % 9u);
}

}  // namespace devmr_bench
