#pragma once

// How device_resource_ref reaches a user's resource type that devmr does not know: a pair of
// thunks per type, compiled for both sides, whose host addresses the host takes directly and
// whose device addresses a __device__ table of the type holds. Device code reads the table; a ref
// made on the host copies it (cudaMemcpyFromSymbol), once per type and device.

#include <devmr/detail/alloc/exec_check.hpp>
#include <devmr/detail/config.hpp>
#include <devmr/errors.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <type_traits>

namespace devmr::detail::alloc {

/// Bytes of a resource that a ref keeps inline instead of pointing at it.
inline constexpr std::size_t inline_object_bytes = 16;

/// A user's resource as a ref holds it: a copy of it, or its address. Passed to the thunks by
/// value, so that a call takes no address of the ref (a kernel parameter, which taking an address
/// of would copy to the stack). Held as 64-bit words, not bytes: a byte array passed by value
/// reaches the call one byte at a time (shifts and byte permutes, ptxas sm_90), two words as two
/// 64-bit moves.
struct object_words {
  std::uint64_t words[inline_object_bytes / sizeof(std::uint64_t)];
};

using allocate_fn = void* (*)(object_words object, std::size_t bytes, std::size_t alignment);
using deallocate_fn = void (*)(object_words object,
                               void const* p,
                               std::size_t bytes,
                               std::size_t alignment);

/// The two entry points of one side (host or device) for one resource type.
struct thunk_pair {
  allocate_fn allocate = nullptr;
  deallocate_fn deallocate = nullptr;
};

/// A type whose allocate and deallocate are const members.
template <class Resource>
concept const_allocating = requires(Resource const& r, void* p, std::size_t n) {
  { r.allocate(n, n) } -> std::convertible_to<void*>;
  r.deallocate(p, n, n);
};

/// True when a copy of the resource fits in a ref's object bytes.
template <class Resource>
inline constexpr bool fits_inline = sizeof(Resource) <= inline_object_bytes &&
                                    alignof(Resource) <= alignof(object_words);

/// A resource kept inline: a trivially copyable value of a few words whose allocate and
/// deallocate are const (a ref-like type, such as a user's own ref into device memory). A copy
/// behaves as the original, so the ref needs no pointer to memory the device can read.
template <class Resource>
concept inline_resource =
    std::is_trivially_copyable_v<Resource> && fits_inline<Resource> && const_allocating<Resource>;

/// Calls `f` with the resource that `object` holds: a copy of it, or the one it points at.
template <class Resource, class F>
DEVMR_HOST_DEVICE decltype(auto) with_object(object_words const& object, F&& f) {
  if constexpr (inline_resource<std::remove_const_t<Resource>>) {
    // Trivially copyable: copying its bytes into storage makes a copy of the resource.
    alignas(Resource) std::byte storage[sizeof(Resource)];
    std::memcpy(storage, object.words, sizeof(Resource));
    return f(*std::launder(reinterpret_cast<Resource const*>(storage)));
  } else {
    Resource* pointer = nullptr;
    std::memcpy(static_cast<void*>(&pointer), object.words, sizeof(pointer));
    return f(*pointer);
  }
}

DEVMR_EXEC_CHECK_DISABLE
template <class Resource>
DEVMR_HOST_DEVICE void* allocate_thunk(object_words object,
                                       std::size_t bytes,
                                       std::size_t alignment) {
  return with_object<Resource>(object,
                               [&](auto& r) -> void* { return r.allocate(bytes, alignment); });
}

DEVMR_EXEC_CHECK_DISABLE
template <class Resource>
DEVMR_HOST_DEVICE void deallocate_thunk(object_words object,
                                        void const* p,
                                        std::size_t bytes,
                                        std::size_t alignment) {
  with_object<Resource>(object,
                        [&](auto& r) { r.deallocate(const_cast<void*>(p), bytes, alignment); });
}

/// The thunks of the side this code is compiled for.
template <class Resource>
DEVMR_HOST_DEVICE thunk_pair this_side_thunks() {
  return {&allocate_thunk<Resource>, &deallocate_thunk<Resource>};
}

#if defined(__CUDACC__)
/// The device addresses of a type's thunks. nvcc emits it where device code names it (the
/// constructor of device_resource_ref does, in every translation unit that makes a ref of the
/// type), and host code reads it from there.
template <class Resource>
__device__ thunk_pair device_thunks{&allocate_thunk<Resource>, &deallocate_thunk<Resource>};
#endif

/// Most devices a process caches thunk addresses for.
inline constexpr int max_cached_devices = 64;

/// The device addresses of a type's thunks on the current device. Host code only. Without
/// relocatable device code they are addresses in one module that names the type (the one whose
/// table the runtime registered for the symbol): kernels of that module may call them.
/// @throw devmr::cuda_error when the addresses cannot be read
template <class Resource>
thunk_pair device_thunks_on_current_device() {
#if defined(__CUDACC__)
  static std::mutex mutex;
  static std::array<thunk_pair, max_cached_devices> cache{};
  int device = 0;
  DEVMR_CUDA_TRY(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock{mutex};
  if (device >= 0 && device < max_cached_devices && cache[device].allocate != nullptr) {
    return cache[device];
  }
  thunk_pair fns{};
  DEVMR_CUDA_TRY(cudaMemcpyFromSymbol(&fns, device_thunks<Resource>, sizeof(fns)));
  if (device >= 0 && device < max_cached_devices) {
    cache[device] = fns;
  }
  return fns;
#else
  return {};  // a host compiler has no device code to point at
#endif
}

}  // namespace devmr::detail::alloc
