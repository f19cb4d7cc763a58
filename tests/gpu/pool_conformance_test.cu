// The conformance suite, instantiated for the three pools.

#include "conformance.hpp"

#include <devmr/pool_resource.hpp>

#include <tuple>

namespace {

template <devmr::memory_kind Kind>
struct pool_factory {
  using resource_type = devmr::pool_resource<Kind>;
  static constexpr char const* name = devmr::to_string(Kind);
  static constexpr bool host_accessible = devmr::is_host_accessible(Kind);
  resource_type& resource() { return pool; }
  resource_type pool{};
};

using pool_factories = std::tuple<pool_factory<devmr::memory_kind::device>,
                                  pool_factory<devmr::memory_kind::managed>,
                                  pool_factory<devmr::memory_kind::pinned>>;

}  // namespace

DEVMR_RESOURCE_CONFORMANCE_SUITE(pool_factories)
