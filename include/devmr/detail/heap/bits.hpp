#pragma once

// Bit arithmetic that compiles to one instruction on either side.

#include <devmr/detail/config.hpp>

#include <bit>
#include <cstdint>

namespace devmr::detail::heap {

/// floor(log2(x)) for x > 0.
DEVMR_HOST_DEVICE inline unsigned floor_log2(std::uint64_t x) {
#if DEVMR_IS_DEVICE_CODE
  return 63u - static_cast<unsigned>(__clzll(static_cast<long long>(x)));
#else
  return 63u - static_cast<unsigned>(std::countl_zero(x));
#endif
}

/// ceil(log2(x)) for x > 0.
DEVMR_HOST_DEVICE inline unsigned ceil_log2(std::uint64_t x) {
  return x <= 1 ? 0u : floor_log2(x - 1) + 1u;
}

DEVMR_HOST_DEVICE constexpr bool is_power_of_two(std::size_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}

/// The number of set bits of `x`.
DEVMR_HOST_DEVICE inline unsigned popcount32(std::uint32_t x) {
#if DEVMR_IS_DEVICE_CODE
  return static_cast<unsigned>(__popc(x));
#else
  return static_cast<unsigned>(__builtin_popcount(x));
#endif
}

/// The index of the lowest set bit of `x` (not 0).
DEVMR_HOST_DEVICE inline std::uint32_t lowest_bit_index(std::uint32_t x) {
#if DEVMR_IS_DEVICE_CODE
  return static_cast<std::uint32_t>(__ffs(static_cast<int>(x)) - 1);
#else
  return static_cast<std::uint32_t>(__builtin_ctz(x));
#endif
}

/// The index of set bit number `k` modulo the set bits of `x` (not 0), counted from the lowest:
/// with `k` spread, a pick among the set bits that favours none.
DEVMR_HOST_DEVICE inline std::uint32_t nth_set_bit(std::uint32_t x, std::uint32_t k) {
  unsigned const n = k % popcount32(x);
#if DEVMR_IS_DEVICE_CODE
  return __fns(x, 0, static_cast<int>(n) + 1);
#else
  for (unsigned i = 0; i < n; ++i) {
    x &= x - 1;
  }
  return lowest_bit_index(x);
#endif
}

/// The `n` lowest set bits of `x` (all of them when it has no more than `n`).
DEVMR_HOST_DEVICE inline std::uint32_t lowest_bits(std::uint32_t x, unsigned n) {
#if DEVMR_IS_DEVICE_CODE
  unsigned const past = __fns(x, 0, static_cast<int>(n) + 1);  // the (n + 1)th set bit
  return past >= 32 ? x : x & ((1u << past) - 1);
#else
  std::uint32_t rest = x;
  for (unsigned i = 0; i < n && rest != 0; ++i) {
    rest &= rest - 1;
  }
  return x & ~rest;
#endif
}

}  // namespace devmr::detail::heap
