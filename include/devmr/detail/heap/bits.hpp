#pragma once

// Bit arithmetic that compiles to one instruction, or a few, on either side.

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

/// The index of set bit number `n` of `x`, counted from the lowest from 0 (`n` below the set bits
/// of `x`): five halving steps, each a population count of the lower half. (The intrinsic __fns
/// gives the same in about twice the instructions.)
DEVMR_HOST_DEVICE inline std::uint32_t set_bit_index(std::uint32_t x, unsigned n) {
  std::uint32_t at = 0;
  for (unsigned half = 16; half != 0; half /= 2) {
    unsigned const below = popcount32(x & ((1u << half) - 1));
    if (n >= below) {
      n -= below;
      x >>= half;
      at += half;
    }
  }
  return at;
}

/// The index of one set bit of `x` (not 0) that `k` picks, counted from the lowest: of its n set
/// bits, number floor(m * n / 2^32), where m is `k` times an odd constant modulo 2^32 (which
/// spreads small `k` over the whole range). With `k` spread, a pick that favours none. A multiply,
/// not a remainder by n: the compiler makes a remainder of small values a call to a division
/// routine, and the registers that a caller holds across any call count in its kernel.
DEVMR_HOST_DEVICE inline std::uint32_t nth_set_bit(std::uint32_t x, std::uint32_t k) {
  std::uint32_t const m = k * 0x9e37'79b9u;
  return set_bit_index(x, static_cast<unsigned>((std::uint64_t{m} * popcount32(x)) >> 32));
}

/// The `n` lowest set bits of `x` (all of them when it has no more than `n`).
DEVMR_HOST_DEVICE inline std::uint32_t lowest_bits(std::uint32_t x, unsigned n) {
  return n >= popcount32(x) ? x : x & ((1u << set_bit_index(x, n)) - 1);
}

}  // namespace devmr::detail::heap
