#pragma once

#include <nvtx3/nvtx3.hpp>

namespace devmr {

/// @brief The NVTX domain of every range devmr opens.
struct devmr_domain {
  static constexpr char const* name{"devmr"};
};

namespace detail {
/// A range in devmr's domain that ends with its scope.
using scoped_range = ::nvtx3::scoped_range_in<devmr_domain>;
}  // namespace detail

}  // namespace devmr

/// Opens an NVTX range in the devmr domain named after the enclosing function, until scope exit.
#define DEVMR_FUNC_RANGE() NVTX3_FUNC_RANGE_IN(::devmr::devmr_domain)
