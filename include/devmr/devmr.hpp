#pragma once

// devmr: cuda::mr memory resources for host and device code. This umbrella header only includes.

#include <devmr/allocator.hpp>
#include <devmr/device_resource_ref.hpp>
#include <devmr/errors.hpp>
#include <devmr/group_scratch.hpp>
#include <devmr/memory_kind.hpp>
#include <devmr/polymorphic_allocator.hpp>
#include <devmr/pool_resource.hpp>
#include <devmr/scratch.hpp>
#include <devmr/shared_resource.hpp>
#include <devmr/slab_heap.hpp>
#include <devmr/slab_ref.hpp>
