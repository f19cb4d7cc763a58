#pragma once

// The toolkit's CCCL 3.0 hides cuda::mr behind this macro; CCCL >= 3.1 ignores it.
#ifndef LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#endif

#include <cuda/memory_resource>
#include <cuda/std/version>

/// The oldest GPU architecture devmr's device code supports, as __CUDA_ARCH__ spells it: compute
/// capability 8.0 (Ampere), which the device code's warp reductions (__reduce_or_sync) need.
/// CMake checks the same at configure time (DEVMR_MINIMUM_CUDA_ARCHITECTURE,
/// cmake/devmrArchitectures.cmake); docs/architectures.md lists the supported GPUs.
#define DEVMR_MINIMUM_CUDA_ARCH 800

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < DEVMR_MINIMUM_CUDA_ARCH
#error "devmr needs compute capability 8.0 or newer (sm_80 and up: Ampere, Hopper, Blackwell)."
#error "This file is compiled for an older GPU: name 80 or newer in CMAKE_CUDA_ARCHITECTURES"
#error "(e.g. 90, or native) or in nvcc's -arch (e.g. -arch=sm_90). Naming none, nvcc 13 compiles"
#error "for sm_75. docs/architectures.md in devmr's sources lists the supported GPUs."
#endif

#if defined(__CUDACC__)
#define DEVMR_HOST_DEVICE __host__ __device__
#define DEVMR_DEVICE __device__
#else
#define DEVMR_HOST_DEVICE
#define DEVMR_DEVICE
#endif

/// Keeps a function out of line: one copy per kernel instead of one per call site. A direct call
/// of it still adds to the caller's registers (a called function gets registers above those its
/// callers hold live at the call); the heap's slow paths are called through the ABI instead
/// (detail/heap/out_of_line.hpp).
#if defined(__CUDACC__)
#define DEVMR_NOINLINE __noinline__
#else
#define DEVMR_NOINLINE __attribute__((noinline))
#endif

/// Puts a function inline in its caller, whatever its size: the heap's out-of-line slow paths
/// (detail/heap/out_of_line.hpp) make sure that the body of each is in the function the ABI
/// calls, not one more call away (each call restores what it saved after it returns).
#if defined(__CUDACC__)
#define DEVMR_FORCEINLINE __forceinline__
#else
#define DEVMR_FORCEINLINE inline __attribute__((always_inline))
#endif

/// Kernels defined in devmr's headers are hidden, so that two shared libraries that both include
/// devmr do not clash on their symbols.
#define DEVMR_KERNEL __attribute__((visibility("hidden"))) __global__

/// True when compiling device code.
#if defined(__CUDA_ARCH__)
#define DEVMR_IS_DEVICE_CODE 1
#else
#define DEVMR_IS_DEVICE_CODE 0
#endif

/// Keeps the loop that follows rolled in device code: slow paths whose unrolled, interleaved
/// iterations would raise the register count of every kernel that may call them.
#if defined(__CUDA_ARCH__)
#define DEVMR_ROLLED _Pragma("unroll 1")
#else
#define DEVMR_ROLLED
#endif

/// Unrolls the loop that follows in device code: a short loop of a known count whose
/// iterations' atomics go out together rather than each after the last one's answer.
#if defined(__CUDA_ARCH__)
#define DEVMR_UNROLLED _Pragma("unroll")
#else
#define DEVMR_UNROLLED
#endif
