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

}  // namespace devmr::detail::heap
