#pragma once

// Lets a __host__ __device__ template call a resource whose functions exist on one side only.

#include <devmr/detail/config.hpp>

/// Put before a __host__ __device__ function template that calls a resource's members: nvcc then
/// does not refuse an instantiation whose resource is host-only (a pool) or device-only (a user's
/// device resource). The side that the resource lacks must not be called: nvcc compiles a
/// __device__ function for the host as a stub that ends the process.
#if defined(__CUDACC__) && !defined(__clang__)
#define DEVMR_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define DEVMR_EXEC_CHECK_DISABLE
#endif
