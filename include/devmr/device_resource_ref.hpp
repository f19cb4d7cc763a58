#pragma once

#include <devmr/detail/alloc/erased_user_resource.hpp>
#include <devmr/detail/alloc/group_ops.hpp>
#include <devmr/detail/cccl_concepts.hpp>
#include <devmr/detail/config.hpp>
#include <devmr/memory_kind.hpp>
#include <devmr/slab_ref.hpp>

#include <cuda/memory_resource>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <type_traits>

namespace devmr {

template <class... Properties>
class device_resource_ref;

template <memory_kind Kind>
class pool_resource;

template <memory_kind Kind>
class slab_heap;

namespace detail::alloc {
template <class T>
inline constexpr bool is_device_resource_ref = false;
template <class... Properties>
inline constexpr bool is_device_resource_ref<device_resource_ref<Properties...>> = true;

template <class T>
inline constexpr bool is_slab_ref = false;
template <memory_kind Kind>
inline constexpr bool is_slab_ref<slab_ref<Kind>> = true;

template <class T>
inline constexpr bool is_devmr_owner = false;
template <memory_kind Kind>
inline constexpr bool is_devmr_owner<pool_resource<Kind>> = true;
template <memory_kind Kind>
inline constexpr bool is_devmr_owner<slab_heap<Kind>> = true;

/// True when `Property` is among `Others`.
template <class Property, class... Others>
inline constexpr bool contains_property = (std::is_same_v<Property, Others> || ...);

/// True when every one of `Properties` is among `Others`.
template <class... Others>
struct property_set {
  template <class... Properties>
  static constexpr bool includes = (contains_property<Properties, Others...> && ...);
};

/// A type with allocate(bytes, alignment) and deallocate(p, bytes, alignment).
template <class Resource>
concept allocating = requires(Resource& r, void* p, std::size_t n) {
  { r.allocate(n, n) } -> std::convertible_to<void*>;
  r.deallocate(p, n, n);
};

/// A user's resource that a device_resource_ref can point at: not a devmr type with a ref of
/// its own, with allocate/deallocate, device accessible, and with every property asked for.
template <class Resource, class... Properties>
concept erasable_user_resource =
    !is_device_resource_ref<std::remove_cv_t<Resource>> &&
    !is_slab_ref<std::remove_cv_t<Resource>> && !is_devmr_owner<std::remove_cv_t<Resource>> &&
    allocating<Resource> && cuda::has_property<Resource, cuda::mr::device_accessible> &&
    (... && cuda::has_property<Resource, Properties>);

/// What a device_resource_ref refers to.
enum class erased_target : std::uint32_t {
  none,          ///< nothing: a default-constructed ref
  user,          ///< a user's resource, through its thunks
  device_slab,   ///< a slab_ref<memory_kind::device>, held by value
  managed_slab,  ///< a slab_ref<memory_kind::managed>, held as its device path (see slab_path)
  pinned_slab,   ///< a slab_ref<memory_kind::pinned>, the same
};

/// True for the targets held as a slab_ref.
DEVMR_HOST_DEVICE constexpr bool is_slab(erased_target t) noexcept {
  return t >= erased_target::device_slab;
}

/// The calls of a slab_ref of any kind, as a slab_ref<memory_kind::device>: the same class
/// template, whose allocate, deallocate and owns do not depend on the kind (the kind says where
/// the pool's memory lives, which only the properties reflect). Holding every kind as one type
/// gives a kernel one inlined copy of slab_ref's fast path instead of one per kind: with three,
/// a kernel that allocates and frees once needs a third more registers than slab_ref alone
/// (ptxas, sm_90); with one, no more. The GPU tests call refs of every kind in kernels.
template <memory_kind Kind>
DEVMR_HOST_DEVICE slab_ref<memory_kind::device> slab_path(slab_ref<Kind> const& ref) noexcept {
  static_assert(sizeof(slab_ref<Kind>) == sizeof(slab_ref<memory_kind::device>) &&
                std::is_trivially_copyable_v<slab_ref<Kind>>);
  slab_ref<memory_kind::device> path;
  std::memcpy(static_cast<void*>(&path), &ref, sizeof(path));
  return path;
}

/// A user's resource: both sides' thunks and the object (inline, or a pointer to it).
struct erased_user {
  thunk_pair host;
  thunk_pair device;
  object_words object;
};

/// One of the targets, as the tag says. Every member is trivially copyable, and so the ref is.
union erased_storage {
  DEVMR_HOST_DEVICE erased_storage() noexcept : user{} {}
  slab_ref<memory_kind::device> slab;  ///< every kind, as slab_path holds it
  erased_user user;
};
}  // namespace detail::alloc

/**
 * @brief A non-owning, trivially copyable, type-erased reference to a resource that device code
 * can call: any devmr slab heap's ref, of every memory kind, or a user's type with `__device__`
 * allocate/deallocate that declares its properties.
 *
 * The properties are checked when the ref is made: a `device_resource_ref<device_accessible,
 * host_accessible>` can be made from a managed or pinned heap's ref, and not from a device heap's
 * (the constructor does not exist: `std::is_constructible_v` is false). A ref converts to a ref
 * of fewer properties.
 *
 * How it dispatches, and why: device code can call neither host function pointers nor virtual
 * functions of objects made on the host, so the ref carries a small tag. For the resources devmr
 * knows (slab_ref of each kind) it holds the slab_ref itself, by value, and a call tests the tag
 * and runs slab_ref's own inline fast path: no indirect call, nothing the compiler cannot inline,
 * one uniform branch on a kernel parameter on top of slab_ref (a load of the tag, a compare and a
 * branch before the heap's first atomic). Every kind is held as the device kind's slab_ref, whose
 * calls are the same, so that a kernel holds one copy of the fast path, not one per kind. Any other
 * type goes through a pair of thunks made for it: the host's address for host calls, and a
 * `__device__` address for device calls, which the ref takes from the type's `__device__` table
 * when it is made in device code, and reads from that table once per type and device
 * (`cudaMemcpyFromSymbol`) when it is made on the host. Without relocatable device code each
 * translation unit is a module of its own, and the host reads the table of one of the modules that
 * name the type: keep the kernels that call host-made refs to a user's type in one translation unit
 * per type, or link with relocatable device code (refs to slab heaps have no such limit).
 *
 * The branch to a user's type can cost registers even in a kernel that never takes it: its call
 * through a function pointer has a callee ptxas cannot see, so values live across it stay in the
 * registers the calling convention preserves. In scratch_bench's allocation kernel the count is
 * the same as through a slab_ref (74, sm_90); where a kernel's count does grow, take a slab_ref.
 *
 * A user's type that is trivially copyable, at most 16 bytes and whose allocate/deallocate are
 * const (a ref-like type) is copied into the ref; any other is pointed at, so it must live in
 * memory that the calling side can read (device or managed memory for device calls) and outlive
 * every use of the ref. Host calls of a user type's ref call the type's host functions: a type
 * with `__device__`-only members must not be called on the host (nvcc's host stub of a
 * `__device__` function ends the process).
 *
 * Lifetime: the ref owns nothing. The heap (or the user's resource) must outlive every ref made
 * from it and every kernel that uses one; a heap destroyed while blocks are still allocated
 * reports the count on stderr.
 *
 * @tparam Properties the properties the ref guarantees, e.g. `cuda::mr::device_accessible`
 */
template <class... Properties>
class device_resource_ref {
  static_assert((... && !cuda::property_with_value<Properties>),
                "device_resource_ref supports properties without a value only");

  template <class Resource>
  static constexpr bool admits = (... && cuda::has_property<Resource, Properties>);

 public:
  /// Alignment of a block when none is asked for (slab_ref's).
  static constexpr std::size_t default_alignment = 16;

  /// @brief A ref to nothing: device calls return nullptr, host calls throw.
  DEVMR_HOST_DEVICE device_resource_ref() noexcept : target_{detail::alloc::erased_target::none} {}

  /**
   * @brief Refers to the heap of `ref`, which it copies (a slab_ref is itself a reference).
   * Exists only when a slab_ref of this kind has every one of `Properties`.
   */
  template <memory_kind Kind>
  requires admits<slab_ref<Kind>> DEVMR_HOST_DEVICE device_resource_ref(slab_ref<Kind> ref)
  noexcept : target_{target_of<Kind>()} { held_.slab = detail::alloc::slab_path(ref); }

  /// @brief Refers to `heap`, through its ref (host code: the heap is a host object).
  template <memory_kind Kind>
  requires admits<slab_ref<Kind>> device_resource_ref(slab_heap<Kind> const& heap)
  noexcept : device_resource_ref{heap.ref()} {}

  /**
   * @brief Refers to a user's resource (see the class comment: kept inline when it is a small
   * ref-like value, else pointed at). Exists only when `Resource` is device accessible and has
   * every one of `Properties`.
   * @throw devmr::cuda_error (host) when the thunks' device addresses cannot be read
   */
  template <class Resource>
  requires detail::alloc::erasable_user_resource<Resource, Properties...> DEVMR_HOST_DEVICE
  device_resource_ref(Resource& resource)
      : target_{detail::alloc::erased_target::user} {
    auto& user = held_.user;
    if constexpr (detail::alloc::inline_resource<std::remove_const_t<Resource>>) {
      std::memcpy(user.object.words, static_cast<void const*>(&resource), sizeof(Resource));
    } else {
      Resource* object = &resource;
      std::memcpy(user.object.words, &object, sizeof(object));
    }
#if DEVMR_IS_DEVICE_CODE
    // Read from the type's __device__ table: naming it here, in code that device compilation
    // sees, is what makes nvcc emit the table that a ref made on the host reads.
    user.device = detail::alloc::device_thunks<Resource>;
    user.host = {};  // device code knows no host address: a ref made here is for device code only
#else
    user.host = detail::alloc::this_side_thunks<Resource>();
    user.device = detail::alloc::device_thunks_on_current_device<Resource>();
#endif
  }

  /// @brief A ref of fewer properties from one of more.
  template <class... Others>
  requires(!std::is_same_v<device_resource_ref<Others...>, device_resource_ref> &&
           detail::alloc::property_set<Others...>::template includes<Properties...>)
      DEVMR_HOST_DEVICE device_resource_ref(device_resource_ref<Others...> const& other)
  noexcept : target_{other.target_}, held_{other.held_} {}

  /**
   * @brief Allocates `bytes` from the resource referred to.
   * @return the block; nullptr in device code when the resource cannot serve (or refers to
   * nothing)
   * @throw (host) what the resource throws; std::invalid_argument for a ref to nothing
   */
  DEVMR_HOST_DEVICE void* allocate(std::size_t bytes,
                                   std::size_t alignment = default_alignment) const {
    if (detail::alloc::is_slab(target_)) {
      return held_.slab.allocate(bytes, alignment);
    }
    if (target_ == detail::alloc::erased_target::user) {
      return this_side().allocate(held_.user.object, bytes, alignment);
    }
    return refer_to_nothing();
  }

  /// @brief Frees a block of the resource referred to; `bytes` and `alignment` as allocated.
  DEVMR_HOST_DEVICE void deallocate(void const* p,
                                    std::size_t bytes,
                                    std::size_t alignment = default_alignment) const {
    if (detail::alloc::is_slab(target_)) {
      held_.slab.deallocate(p, bytes, alignment);
    } else if (target_ == detail::alloc::erased_target::user) {
      this_side().deallocate(held_.user.object, p, bytes, alignment);
    }
  }

  /// @brief CCCL >= 3.1 spelling of allocate.
  DEVMR_HOST_DEVICE void* allocate_sync(std::size_t bytes,
                                        std::size_t alignment = default_alignment) const {
    return allocate(bytes, alignment);
  }
  /// @brief CCCL >= 3.1 spelling of deallocate.
  DEVMR_HOST_DEVICE void deallocate_sync(void const* p,
                                         std::size_t bytes,
                                         std::size_t alignment = default_alignment) const {
    deallocate(p, bytes, alignment);
  }

#if defined(__CUDACC__)
  /// @brief One block for a whole cooperative group, the same pointer to every member; every
  /// member of `g` must call it.
  template <thread_group Group>
  __device__ void* allocate(Group const& g,
                            std::size_t bytes,
                            std::size_t alignment = default_alignment) const {
    return detail::alloc::leader_allocate(g, *this, bytes, alignment);
  }
  /// @brief Frees a block allocated for group `g`, once all members are past their last use.
  template <thread_group Group>
  __device__ void deallocate(Group const& g,
                             void const* p,
                             std::size_t bytes,
                             std::size_t alignment = default_alignment) const {
    detail::alloc::leader_deallocate(g, *this, p, bytes, alignment);
  }
#endif

  /// @brief Two refs are equal when they refer to the same heap, or to the same user object
  /// of the same type (inline ones: the same bytes).
  DEVMR_HOST_DEVICE friend bool operator==(device_resource_ref const& a,
                                           device_resource_ref const& b) noexcept {
    using detail::alloc::erased_target;
    if (a.target_ != b.target_) {
      return false;
    }
    if (detail::alloc::is_slab(a.target_)) {
      return a.held_.slab == b.held_.slab;
    }
    if (a.target_ == erased_target::user) {
      // The thunks name the type; the object's bytes (a copy, or its address) the instance.
      return a.held_.user.host.allocate == b.held_.user.host.allocate &&
             a.held_.user.device.allocate == b.held_.user.device.allocate &&
             same_words(a.held_.user.object, b.held_.user.object);
    }
    return true;  // both refer to nothing
  }
  /// @brief Unequal when the refs refer to different heaps or user objects.
  DEVMR_HOST_DEVICE friend bool operator!=(device_resource_ref const& a,
                                           device_resource_ref const& b) noexcept {
    return !(a == b);
  }

  /// @brief The ref has each of its `Properties`.
  template <class Property>
  requires(std::is_same_v<Property, Properties> || ...) DEVMR_HOST_DEVICE
      friend void get_property(device_resource_ref const&, Property) noexcept {}

 private:
  template <class...>
  friend class device_resource_ref;

  template <memory_kind Kind>
  static constexpr detail::alloc::erased_target target_of() noexcept {
    using detail::alloc::erased_target;
    return Kind == memory_kind::device    ? erased_target::device_slab
           : Kind == memory_kind::managed ? erased_target::managed_slab
                                          : erased_target::pinned_slab;
  }

  /// Equality of two user objects' storage (memcmp is not a device function).
  DEVMR_HOST_DEVICE static bool same_words(detail::alloc::object_words const& a,
                                           detail::alloc::object_words const& b) noexcept {
    for (std::size_t i = 0; i < std::size(a.words); ++i) {
      if (a.words[i] != b.words[i]) {
        return false;
      }
    }
    return true;
  }

  /// The user type's thunks for the side this code runs on.
  DEVMR_HOST_DEVICE detail::alloc::thunk_pair const& this_side() const noexcept {
#if DEVMR_IS_DEVICE_CODE
    return held_.user.device;
#else
    return held_.user.host;
#endif
  }

  DEVMR_HOST_DEVICE static void* refer_to_nothing() {
#if DEVMR_IS_DEVICE_CODE
    return nullptr;
#else
    throw std::invalid_argument("devmr: device_resource_ref refers to no resource");
#endif
  }

  detail::alloc::erased_target target_;
  detail::alloc::erased_storage held_;
};

static_assert(std::is_trivially_copyable_v<device_resource_ref<cuda::mr::device_accessible>>);
static_assert(detail::synchronous_resource_with<device_resource_ref<cuda::mr::device_accessible>,
                                                cuda::mr::device_accessible>);
static_assert(std::is_constructible_v<device_resource_ref<cuda::mr::device_accessible>,
                                      slab_ref<memory_kind::device>>);
static_assert(!std::is_constructible_v<
              device_resource_ref<cuda::mr::device_accessible, cuda::mr::host_accessible>,
              slab_ref<memory_kind::device>>);

}  // namespace devmr
