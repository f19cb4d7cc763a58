// Concept conformance of every devmr resource, for the CCCL in use: the toolkit's CCCL 3.0, or a
// newer CCCL (>= 3.1, renamed API) when the build points DEVMR_CCCL_NEXT_INCLUDE_DIR at one. The
// static_asserts are the test; the test cases check what can run without a GPU.

#include <devmr/devmr.hpp>

#include <catch2/catch.hpp>

#include <type_traits>

namespace {

using devmr::memory_kind;
using device_ref = devmr::slab_ref<memory_kind::device>;
using managed_ref = devmr::slab_ref<memory_kind::managed>;
using pinned_ref = devmr::slab_ref<memory_kind::pinned>;
using cuda::mr::device_accessible;
using cuda::mr::host_accessible;

static_assert(std::is_trivially_copyable_v<device_ref>);
static_assert(std::is_trivially_copyable_v<managed_ref>);
static_assert(!std::is_copy_constructible_v<devmr::device_pool>);
static_assert(std::is_nothrow_move_constructible_v<devmr::device_pool>);
static_assert(!std::is_copy_constructible_v<devmr::slab_heap<>>);
static_assert(std::is_nothrow_move_constructible_v<devmr::slab_heap<>>);

#if CCCL_MAJOR_VERSION > 3 || (CCCL_MAJOR_VERSION == 3 && CCCL_MINOR_VERSION >= 1)
// CCCL >= 3.1: resource is the stream-ordered concept, synchronous_resource the plain one.
static_assert(cuda::mr::resource_with<devmr::device_pool, device_accessible>);
static_assert(!cuda::mr::resource_with<devmr::device_pool, host_accessible>);
static_assert(cuda::mr::resource_with<devmr::managed_pool, device_accessible, host_accessible>);
static_assert(cuda::mr::resource_with<devmr::pinned_pool, device_accessible, host_accessible>);
static_assert(cuda::mr::synchronous_resource_with<devmr::device_pool, device_accessible>);
static_assert(cuda::mr::synchronous_resource_with<device_ref, device_accessible>);
static_assert(!cuda::mr::synchronous_resource_with<device_ref, host_accessible>);
static_assert(cuda::mr::synchronous_resource_with<managed_ref, device_accessible, host_accessible>);
static_assert(cuda::mr::synchronous_resource_with<pinned_ref, device_accessible, host_accessible>);
static_assert(
    std::is_constructible_v<cuda::mr::synchronous_resource_ref<device_accessible>, device_ref&>);
static_assert(
    !std::is_constructible_v<cuda::mr::synchronous_resource_ref<host_accessible>, device_ref&>);
constexpr char const* cccl_api = "CCCL >= 3.1";
#else
static_assert(cuda::mr::async_resource_with<devmr::device_pool, device_accessible>);
static_assert(!cuda::mr::async_resource_with<devmr::device_pool, host_accessible>);
static_assert(
    cuda::mr::async_resource_with<devmr::managed_pool, device_accessible, host_accessible>);
static_assert(
    cuda::mr::async_resource_with<devmr::pinned_pool, device_accessible, host_accessible>);
static_assert(cuda::mr::resource_with<device_ref, device_accessible>);
static_assert(!cuda::mr::resource_with<device_ref, host_accessible>);
static_assert(cuda::mr::resource_with<managed_ref, device_accessible, host_accessible>);
static_assert(cuda::mr::resource_with<pinned_ref, device_accessible, host_accessible>);
static_assert(std::is_constructible_v<cuda::mr::resource_ref<device_accessible>, device_ref&>);
static_assert(
    std::is_constructible_v<cuda::mr::async_resource_ref<device_accessible>, devmr::device_pool&>);
static_assert(!std::is_constructible_v<cuda::mr::resource_ref<host_accessible>, device_ref&>);
constexpr char const* cccl_api = "CCCL 3.0";
#endif

}  // namespace

TEST_CASE("slab_ref compares by heap and refuses host calls on no heap", "[concepts]") {
  INFO(cccl_api);
  device_ref a;
  device_ref b;
  CHECK(a == b);
  CHECK_FALSE(a != b);
  CHECK_FALSE(a.owns(&a));
  // A ref to no heap: the host path says so instead of launching anything.
  CHECK_THROWS_AS(a.allocate(64), std::invalid_argument);
  CHECK_THROWS_AS(a.allocate(64, 3), std::invalid_argument);
  CHECK(a.allocate(0) == nullptr);
}
