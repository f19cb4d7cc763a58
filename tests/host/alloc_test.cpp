// scratch, allocator, polymorphic_allocator, device_resource_ref and shared_resource without a
// GPU: C++ Allocator conformance through std::allocator_traits and the properties at compile
// time (the static_asserts are the test), and the host side of each over a resource of host
// memory that counts its blocks.

#include <devmr/devmr.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdlib>
#include <list>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

namespace {

using cuda::mr::device_accessible;
using cuda::mr::host_accessible;
using devmr::memory_kind;
using device_ref = devmr::slab_ref<memory_kind::device>;
using managed_ref = devmr::slab_ref<memory_kind::managed>;
using pinned_ref = devmr::slab_ref<memory_kind::pinned>;

/// What a counting_resource has handed out.
struct block_counts {
  long live = 0;
  long allocations = 0;
  std::size_t last_alignment = 0;
  std::size_t limit = ~std::size_t{0};  ///< requests above it fail (nullptr)
};

/// A ref-like resource of host memory (it claims both properties, as a managed one would): 8
/// bytes, trivially copyable, const members, so a device_resource_ref keeps it inline.
struct counting_resource {
  block_counts* counts;
  void* allocate(std::size_t bytes, std::size_t alignment = 16) const {
    if (bytes > counts->limit) {
      return nullptr;
    }
    ++counts->live;
    ++counts->allocations;
    counts->last_alignment = alignment;
    std::size_t const align = alignment < 16 ? 16 : alignment;
    return std::aligned_alloc(align, (bytes + align - 1) / align * align);
  }
  void deallocate(void const* p, std::size_t, std::size_t = 16) const {
    if (p != nullptr) {
      --counts->live;
      std::free(const_cast<void*>(p));
    }
  }
  // CCCL >= 3.1 spellings.
  void* allocate_sync(std::size_t bytes, std::size_t alignment = 16) const {
    return allocate(bytes, alignment);
  }
  void deallocate_sync(void const* p, std::size_t bytes, std::size_t alignment = 16) const {
    deallocate(p, bytes, alignment);
  }
  friend bool operator==(counting_resource const& a, counting_resource const& b) {
    return a.counts == b.counts;
  }
  friend bool operator!=(counting_resource const& a, counting_resource const& b) {
    return !(a == b);
  }
  friend void get_property(counting_resource const&, device_accessible) noexcept {}
  friend void get_property(counting_resource const&, host_accessible) noexcept {}
};

/// The same, with state of its own and non-const members: a device_resource_ref points at it.
struct stateful_resource {
  block_counts counts;
  char padding[64] = {};
  void* allocate(std::size_t bytes, std::size_t alignment = 16) {
    return counting_resource{&counts}.allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = 16) {
    counting_resource{&counts}.deallocate(p, bytes, alignment);
  }
  friend bool operator==(stateful_resource const& a, stateful_resource const& b) {
    return &a == &b;
  }
  friend bool operator!=(stateful_resource const& a, stateful_resource const& b) {
    return !(a == b);
  }
  friend void get_property(stateful_resource const&, device_accessible) noexcept {}
};

/// Host memory that claims no device access: no device_resource_ref can refer to it.
struct host_only_resource {
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) {}
  friend bool operator==(host_only_resource const&, host_only_resource const&) { return true; }
  friend bool operator!=(host_only_resource const&, host_only_resource const&) { return false; }
  friend void get_property(host_only_resource const&, host_accessible) noexcept {}
};

// ---- allocator: the C++ Allocator requirements, through allocator_traits

template <class Alloc>
constexpr bool allocator_requirements() {
  using traits = std::allocator_traits<Alloc>;
  using T = typename Alloc::value_type;
  static_assert(std::is_same_v<typename traits::pointer, T*>);
  static_assert(std::is_same_v<typename traits::const_pointer, T const*>);
  static_assert(std::is_same_v<typename traits::size_type, std::size_t>);
  static_assert(std::is_same_v<typename traits::difference_type, std::ptrdiff_t>);
  static_assert(std::is_same_v<typename traits::template rebind_traits<T>::allocator_type, Alloc>);
  using rebound = typename traits::template rebind_alloc<double>;
  static_assert(std::is_same_v<typename std::allocator_traits<rebound>::value_type, double>);
  static_assert(
      std::is_same_v<typename std::allocator_traits<rebound>::template rebind_alloc<T>, Alloc>);
  static_assert(std::is_nothrow_copy_constructible_v<Alloc>);
  static_assert(std::is_nothrow_move_constructible_v<Alloc>);
  static_assert(std::is_copy_assignable_v<Alloc>);
  static_assert(std::is_nothrow_constructible_v<Alloc, rebound const&>);  // A a(b)
  static_assert(std::is_convertible_v<rebound const&, Alloc>);            // A a = b
  static_assert(!std::is_default_constructible_v<Alloc>);  // a resource is always named
  static_assert(requires(Alloc a, rebound b, T * p, std::size_t n) {
    { traits::allocate(a, n) } -> std::same_as<T*>;
    traits::deallocate(a, p, n);
    { a == b } -> std::convertible_to<bool>;
    { a != b } -> std::convertible_to<bool>;
    { a == a } -> std::convertible_to<bool>;
    { traits::max_size(a) } -> std::same_as<std::size_t>;
    { traits::select_on_container_copy_construction(a) } -> std::same_as<Alloc>;
  });
  return true;
}

using int_over_managed_ref = devmr::allocator<int, managed_ref>;
using int_over_device_ref = devmr::allocator<int, device_ref>;
using int_over_pool = devmr::allocator<int, devmr::managed_pool>;
using int_over_shared_pool = devmr::allocator<int, devmr::shared_resource<devmr::managed_pool>>;
using int_over_erased = devmr::allocator<int, devmr::device_resource_ref<device_accessible>>;
using int_over_counting = devmr::allocator<int, counting_resource>;
using int_polymorphic = devmr::polymorphic_allocator<int, device_accessible, host_accessible>;

static_assert(allocator_requirements<int_over_managed_ref>());
static_assert(allocator_requirements<int_over_device_ref>());
static_assert(allocator_requirements<int_over_pool>());
static_assert(allocator_requirements<int_over_shared_pool>());
static_assert(allocator_requirements<int_over_erased>());
static_assert(allocator_requirements<int_over_counting>());
static_assert(allocator_requirements<int_polymorphic>());

// Propagation: allocator goes with the blocks; polymorphic_allocator stays, as std::pmr's.
static_assert(
    std::allocator_traits<int_over_managed_ref>::propagate_on_container_move_assignment::value);
static_assert(
    std::allocator_traits<int_over_managed_ref>::propagate_on_container_copy_assignment::value);
static_assert(std::allocator_traits<int_over_managed_ref>::propagate_on_container_swap::value);
static_assert(!std::allocator_traits<int_over_managed_ref>::is_always_equal::value);
static_assert(
    !std::allocator_traits<int_polymorphic>::propagate_on_container_move_assignment::value);
static_assert(!std::allocator_traits<int_polymorphic>::propagate_on_container_swap::value);

// An allocator over a ref holds the ref (trivially copyable, so kernels take it by value); over
// a pool it holds the pool's address.
static_assert(std::is_trivially_copyable_v<int_over_managed_ref>);
static_assert(sizeof(int_over_managed_ref) == sizeof(managed_ref));
static_assert(sizeof(int_over_pool) == sizeof(void*));
static_assert(
    std::is_same_v<decltype(std::declval<int_over_pool>().resource()), devmr::managed_pool&>);

// polymorphic_allocator: from the synchronous and the stream-ordered reference, and from
// resources that convert to them, only with the properties it asks for.
static_assert(std::is_constructible_v<int_polymorphic, managed_ref&>);
static_assert(!std::is_constructible_v<int_polymorphic, device_ref&>);
static_assert(
    std::is_constructible_v<int_polymorphic, devmr::shared_resource<devmr::managed_pool>&>);
#if CCCL_MAJOR_VERSION > 3 || (CCCL_MAJOR_VERSION == 3 && CCCL_MINOR_VERSION >= 1)
// CCCL >= 3.1 makes references only from copyable resources, so a pool goes in a shared_resource
// (the question whether a pool converts does not compile there, so it is not asked).
#else
static_assert(std::is_constructible_v<int_polymorphic, devmr::managed_pool&>);
static_assert(!std::is_constructible_v<int_polymorphic, devmr::device_pool&>);
#endif
static_assert(std::is_constructible_v<
              int_polymorphic,
              devmr::detail::alloc::synchronous_ref<device_accessible, host_accessible>>);
static_assert(std::is_constructible_v<
              int_polymorphic,
              devmr::detail::alloc::stream_ordered_ref<device_accessible, host_accessible>>);

// ---- device_resource_ref: properties checked at compile time

using erased_device = devmr::device_resource_ref<device_accessible>;
using erased_host_device = devmr::device_resource_ref<device_accessible, host_accessible>;

static_assert(std::is_trivially_copyable_v<erased_device>);
static_assert(std::is_trivially_copyable_v<erased_host_device>);
static_assert(devmr::detail::synchronous_resource_with<erased_device, device_accessible>);
static_assert(!devmr::detail::synchronous_resource_with<erased_device, host_accessible>);
static_assert(devmr::detail::synchronous_resource_with<erased_host_device,
                                                       device_accessible,
                                                       host_accessible>);
// Every heap's ref where its properties allow.
static_assert(std::is_constructible_v<erased_device, device_ref>);
static_assert(std::is_constructible_v<erased_device, managed_ref>);
static_assert(std::is_constructible_v<erased_device, pinned_ref>);
static_assert(std::is_constructible_v<erased_host_device, managed_ref>);
static_assert(std::is_constructible_v<erased_host_device, pinned_ref>);
// A device heap's memory is not host accessible: no such ref from it.
static_assert(!std::is_constructible_v<erased_host_device, device_ref>);
static_assert(!std::is_convertible_v<device_ref, erased_host_device>);
// Fewer properties from more, never more from fewer.
static_assert(std::is_convertible_v<erased_host_device, erased_device>);
static_assert(!std::is_constructible_v<erased_host_device, erased_device>);
// User types with the properties asked for, never host-only ones nor owning pools and heaps.
static_assert(std::is_constructible_v<erased_host_device, counting_resource&>);
static_assert(std::is_constructible_v<erased_device, stateful_resource&>);
static_assert(!std::is_constructible_v<erased_host_device, stateful_resource&>);
static_assert(!std::is_constructible_v<erased_device, host_only_resource&>);
static_assert(!std::is_constructible_v<erased_device, devmr::device_pool&>);
// A heap gives its ref; a pool serves no device code.
static_assert(std::is_constructible_v<erased_device, devmr::slab_heap<>&>);
static_assert(std::is_constructible_v<erased_host_device, devmr::managed_heap&>);
static_assert(!std::is_constructible_v<erased_host_device, devmr::device_heap&>);
// It converts to cuda::mr's host reference like any resource.
static_assert(std::is_constructible_v<devmr::detail::alloc::synchronous_ref<device_accessible>,
                                      erased_device&>);

// ---- scratch: move-only
using int_scratch = devmr::scratch<int, device_ref>;
static_assert(!std::is_copy_constructible_v<int_scratch>);
static_assert(!std::is_copy_assignable_v<int_scratch>);
static_assert(std::is_nothrow_move_constructible_v<int_scratch>);
static_assert(std::is_nothrow_move_assignable_v<int_scratch>);
static_assert(int_scratch::alignment == 16);

// ---- shared_resource: models what it holds
#if CCCL_MAJOR_VERSION > 3 || (CCCL_MAJOR_VERSION == 3 && CCCL_MINOR_VERSION >= 1)
static_assert(cuda::mr::resource_with<devmr::shared_resource<devmr::managed_pool>,
                                      device_accessible,
                                      host_accessible>);
static_assert(
    cuda::mr::resource_with<devmr::shared_resource<devmr::device_pool>, device_accessible>);
#else
static_assert(cuda::mr::async_resource_with<devmr::shared_resource<devmr::managed_pool>,
                                            device_accessible,
                                            host_accessible>);
static_assert(
    cuda::mr::async_resource_with<devmr::shared_resource<devmr::device_pool>, device_accessible>);
#endif
static_assert(!devmr::detail::synchronous_resource_with<devmr::shared_resource<devmr::device_pool>,
                                                        host_accessible>);
static_assert(devmr::detail::synchronous_resource_with<
              devmr::shared_resource<devmr::slab_heap<memory_kind::managed>>,
              device_accessible,
              host_accessible>);
static_assert(!devmr::detail::synchronous_resource_with<devmr::shared_resource<devmr::slab_heap<>>,
                                                        host_accessible>);
static_assert(std::is_copy_constructible_v<devmr::shared_resource<devmr::device_pool>>);

}  // namespace

TEST_CASE("allocator: std::vector and std::list over a resource, through allocator_traits",
          "[alloc]") {
  block_counts counts;
  counting_resource resource{&counts};
  {
    std::vector<int, int_over_counting> v{int_over_counting{resource}};
    for (int i = 0; i < 1000; ++i) {
      v.push_back(i);
    }
    CHECK(counts.live == 1);
    CHECK(counts.last_alignment == alignof(int));
    long sum = 0;
    for (int x : v) {
      sum += x;
    }
    CHECK(sum == 999 * 1000 / 2);
    // A rebound copy (std::list allocates nodes, not ints) frees what the original allocated.
    std::list<int, int_over_counting> l{int_over_counting{resource}};
    l.assign(v.begin(), v.end());
    CHECK(l.size() == 1000);
    CHECK(counts.live == 1001);
  }
  CHECK(counts.live == 0);

  using traits = std::allocator_traits<int_over_counting>;
  int_over_counting a{resource};
  std::allocator_traits<int_over_counting>::rebind_alloc<double> b{a};
  CHECK(a == b);
  CHECK_FALSE(a != b);
  double* d = std::allocator_traits<decltype(b)>::allocate(b, 3);
  CHECK(counts.last_alignment == alignof(double));
  a.resource().deallocate(d, 3 * sizeof(double), alignof(double));
  CHECK(counts.live == 0);
  CHECK_THROWS_AS(traits::allocate(a, traits::max_size(a) + 1), std::bad_array_new_length);

  block_counts other_counts;
  int_over_counting c{counting_resource{&other_counts}};
  CHECK(a != c);
}

TEST_CASE("allocator: propagation moves the resource with the blocks", "[alloc]") {
  block_counts first_counts;
  block_counts second_counts;
  std::vector<int, int_over_counting> first{int_over_counting{counting_resource{&first_counts}}};
  std::vector<int, int_over_counting> second{int_over_counting{counting_resource{&second_counts}}};
  first.assign(100, 7);
  second = std::move(first);  // takes first's block and resource: no copy
  CHECK(second.get_allocator().resource().counts == &first_counts);
  CHECK(second_counts.allocations == 0);
  second.clear();
  second.shrink_to_fit();
  CHECK(first_counts.live == 0);
}

TEST_CASE("polymorphic_allocator: one container type over different resources", "[alloc]") {
  block_counts counts;
  counting_resource resource{&counts};
  using vector = std::vector<int, int_polymorphic>;
  {
    vector v{int_polymorphic{resource}};
    v.assign(50, 3);
    CHECK(counts.live == 1);
    CHECK(counts.last_alignment == alignof(int));
    vector w{int_polymorphic{resource}};
    CHECK(v.get_allocator() == w.get_allocator());
    w = v;  // no propagation: w keeps its resource (the same one here)
    CHECK(counts.live == 2);
  }
  CHECK(counts.live == 0);
}

TEST_CASE("device_resource_ref: host calls reach the resource referred to", "[alloc]") {
  block_counts counts;
  counting_resource resource{&counts};
  erased_host_device inline_ref{resource};  // 8 bytes, ref-like: copied into the ref
  void* p = inline_ref.allocate(100, 32);
  CHECK(p != nullptr);
  CHECK(counts.live == 1);
  CHECK(counts.last_alignment == 32);
  inline_ref.deallocate(p, 100, 32);
  CHECK(counts.live == 0);
  erased_device fewer = inline_ref;
  CHECK(fewer.allocate_sync(8) != nullptr);
  CHECK(counts.live == 1);

  stateful_resource owner;
  erased_device pointing{owner};  // pointed at: its state is the one that changes
  void* q = pointing.allocate(64);
  CHECK(owner.counts.live == 1);
  pointing.deallocate(q, 64);
  CHECK(owner.counts.live == 0);

  CHECK(erased_device{owner} == pointing);
  CHECK(erased_host_device{resource} == inline_ref);
  CHECK(fewer != pointing);
  erased_device none;
  CHECK(none == erased_device{});
  CHECK_THROWS_AS(none.allocate(16), std::invalid_argument);
  // A ref to a heap that does not exist: the slab_ref's host path refuses it.
  erased_device no_heap{device_ref{}};
  CHECK_THROWS_AS(no_heap.allocate(16), std::invalid_argument);
  CHECK(no_heap != none);
}

TEST_CASE("scratch: owns its elements, frees them at scope exit, reports failure", "[alloc]") {
  // scratch is a device type; a host compiler compiles it for the host, which lets this test
  // run its logic over host memory.
  block_counts counts;
  counting_resource resource{&counts};
  {
    devmr::scratch<double, counting_resource> s{resource, 10};
    REQUIRE(s);
    CHECK(s.size() == 10);
    CHECK(counts.last_alignment == 16);
    for (std::size_t i = 0; i < s.size(); ++i) {
      s[i] = static_cast<double>(i);
    }
    double sum = 0;
    for (double x : s) {
      sum += x;
    }
    CHECK(sum == 45.0);
    devmr::scratch<double, counting_resource> t{std::move(s)};
    CHECK_FALSE(s);
    CHECK(t.size() == 10);
    CHECK(counts.live == 1);
    t = devmr::scratch<double, counting_resource>{resource, 3};
    CHECK(counts.live == 1);
    CHECK(t.size() == 3);
  }
  CHECK(counts.live == 0);
  counts.limit = 64;
  devmr::scratch<int, counting_resource> too_big{resource, 100};
  CHECK_FALSE(too_big);
  CHECK(too_big.size() == 0);
  CHECK(too_big.data() == nullptr);
  devmr::scratch<int, counting_resource> none{resource, 0};
  CHECK_FALSE(none);
  devmr::scratch<int, counting_resource> overflow{resource, ~std::size_t{0}};
  CHECK_FALSE(overflow);
  CHECK(counts.live == 0);
}
