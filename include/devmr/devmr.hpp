#pragma once

// devmr: cuda::mr memory resources for host and device code. This umbrella header only includes.

#include <devmr/errors.hpp>
#include <devmr/memory_kind.hpp>
#include <devmr/pool_resource.hpp>
#include <devmr/slab_heap.hpp>
#include <devmr/slab_ref.hpp>
