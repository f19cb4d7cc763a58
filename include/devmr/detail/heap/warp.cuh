#pragma once

// What the device paths read of the warp and the SM, and the release fence of their frees.

#include <devmr/detail/heap/atomics.hpp>

#include <cuda/ptx>
#include <nv/target>

namespace devmr::detail::heap {

__device__ __forceinline__ unsigned lane_id() {
  unsigned lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

/// The lanes of this warp below the calling one. Volatile, so that it stays where it is called
/// (early: the read of a special register takes some twenty cycles).
__device__ __forceinline__ unsigned lanes_below() {
  unsigned mask;
  asm volatile("mov.u32 %0, %%lanemask_lt;" : "=r"(mask));
  return mask;
}

__device__ __forceinline__ unsigned sm_id() {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  return sm;
}

/// The number of the warp's place on its SM (%warpid): a hint, which changes if the warp is
/// preempted and resumed elsewhere.
__device__ __forceinline__ unsigned warp_slot() {
  unsigned warp;
  asm volatile("mov.u32 %0, %%warpid;" : "=r"(warp));
  return warp;
}

/// A release fence at device scope: `fence.release.gpu` where the target has it (sm_90), which
/// unlike the `fence.acq_rel.gpu` of `cuda::atomic_thread_fence` leaves the L1 cache alone.
__device__ __forceinline__ void release_fence() {
  NV_IF_ELSE_TARGET(NV_PROVIDES_SM_90,
                    (cuda::ptx::fence(cuda::ptx::sem_release, cuda::ptx::scope_gpu);),
                    (cuda::atomic_thread_fence(release, cuda::thread_scope_device);))
}

}  // namespace devmr::detail::heap
