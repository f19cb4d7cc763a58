#pragma once

// The atomics of the heap's lock-free core: every shared word is touched through
// cuda::atomic_ref at device scope, so that host tests drive the same code from std::threads on
// host memory that kernels run on device memory.

#include <devmr/detail/config.hpp>

#include <cuda/atomic>
#include <cuda/std/type_traits>

#include <cstdint>
#if !DEVMR_IS_DEVICE_CODE
#include <functional>
#include <thread>
#endif

namespace devmr::detail::heap {

inline constexpr auto relaxed = cuda::std::memory_order_relaxed;
inline constexpr auto acquire = cuda::std::memory_order_acquire;
inline constexpr auto release = cuda::std::memory_order_release;
inline constexpr auto acq_rel = cuda::std::memory_order_acq_rel;

/// cuda::atomic_ref at device scope, whose 64-bit additions, ORs and ANDs name the global space on
/// the device. A generic address may point into shared memory, where the GPU has no 64-bit
/// addition or bitwise atomic: for each such operation on a generic address ptxas adds a test of
/// the address and a loop of CASes for shared memory. The heap's words are all in global memory,
/// so that code never runs, but it lies among the hot paths, and the instruction cache holds it
/// too (181 such loops, an eighth of the instructions of bench/steady_bench's round kernel).
template <class T>
class atomic_word : public cuda::atomic_ref<T, cuda::thread_scope_device> {
  using base = cuda::atomic_ref<T, cuda::thread_scope_device>;
  enum class op { add, bit_or, bit_and };

 public:
  DEVMR_HOST_DEVICE explicit atomic_word(T& word) : base{word}, word_{&word} {}

  DEVMR_HOST_DEVICE T fetch_add(T v, cuda::std::memory_order order) const {
    return apply<op::add>(v, order);
  }
  DEVMR_HOST_DEVICE T fetch_sub(T v, cuda::std::memory_order order) const {
    return apply<op::add>(static_cast<T>(T{0} - v), order);
  }
  DEVMR_HOST_DEVICE T fetch_or(T v, cuda::std::memory_order order) const {
    return apply<op::bit_or>(v, order);
  }
  DEVMR_HOST_DEVICE T fetch_and(T v, cuda::std::memory_order order) const {
    return apply<op::bit_and>(v, order);
  }

 private:
  /// `Op` on the word: one atom on the global space on the device where T is a 64-bit integer
  /// (sequentially consistent operations, which the heap does not make, go the generic way),
  /// else cuda::atomic_ref's.
  template <op Op>
  DEVMR_HOST_DEVICE T apply(T v, cuda::std::memory_order order) const {
#if DEVMR_IS_DEVICE_CODE
    if constexpr (sizeof(T) == 8 && cuda::std::is_integral_v<T>) {
      if (order != cuda::std::memory_order_seq_cst) {
        return global<Op>(v, order);
      }
    }
#endif
    if constexpr (Op == op::add) {
      return base::fetch_add(v, order);
    } else if constexpr (Op == op::bit_or) {
      return base::fetch_or(v, order);
    } else {
      return base::fetch_and(v, order);
    }
  }

#if DEVMR_IS_DEVICE_CODE
  /// One atom.<order>.gpu.global.<op> (order: not seq_cst).
  template <op Op>
  __device__ T global(T v, cuda::std::memory_order order) const {
    auto const at = static_cast<unsigned long long>(__cvta_generic_to_global(word_));
    auto const x = static_cast<unsigned long long>(v);
    unsigned long long r = 0;
#define DEVMR_ATOM_GLOBAL(sem, name)                            \
  asm volatile("atom." sem ".gpu.global." name " %0, [%1], %2;" \
               : "=l"(r)                                        \
               : "l"(at), "l"(x)                                \
               : "memory")
#define DEVMR_ATOM_GLOBAL_ORDERS(name)    \
  switch (order) {                        \
    case cuda::std::memory_order_relaxed: \
      DEVMR_ATOM_GLOBAL("relaxed", name); \
      break;                              \
    case cuda::std::memory_order_release: \
      DEVMR_ATOM_GLOBAL("release", name); \
      break;                              \
    case cuda::std::memory_order_acq_rel: \
      DEVMR_ATOM_GLOBAL("acq_rel", name); \
      break;                              \
    default: /* acquire, consume */       \
      DEVMR_ATOM_GLOBAL("acquire", name); \
      break;                              \
  }
    if constexpr (Op == op::add) {
      DEVMR_ATOM_GLOBAL_ORDERS("add.u64")
    } else if constexpr (Op == op::bit_or) {
      DEVMR_ATOM_GLOBAL_ORDERS("or.b64")
    } else {
      DEVMR_ATOM_GLOBAL_ORDERS("and.b64")
    }
#undef DEVMR_ATOM_GLOBAL_ORDERS
#undef DEVMR_ATOM_GLOBAL
    return static_cast<T>(r);
  }
#endif

  T* word_;
};

template <class T>
DEVMR_HOST_DEVICE auto atomic(T& word) {
  return atomic_word<T>{word};
}

/// Lets another thread run while this one waits for it: a short sleep on the device, a yield on
/// the host.
DEVMR_HOST_DEVICE inline void pause_briefly() {
#if DEVMR_IS_DEVICE_CODE
  __nanosleep(256);
#else
  std::this_thread::yield();
#endif
}

/// A number that differs from call to call and from thread to thread (`hint`: the caller's SM or
/// thread), so that threads that search a shared structure at the same moment start in different
/// places of it. Not a random number: only spread.
DEVMR_HOST_DEVICE inline std::uint32_t spread_seed(unsigned hint) {
#if DEVMR_IS_DEVICE_CODE
  auto x = static_cast<std::uint32_t>(clock64()) ^ (hint * 0x9e3779b9u);
#else
  thread_local std::uint32_t calls = 0;
  auto x = static_cast<std::uint32_t>(std::hash<std::thread::id>{}(std::this_thread::get_id())) ^
           (++calls * 0x9e3779b9u) ^ hint;
#endif
  x ^= x >> 16;  // the finalizer of MurmurHash3
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  return x ^ (x >> 16);
}

}  // namespace devmr::detail::heap
