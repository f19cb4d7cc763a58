// Must not compile with CCCL >= 3.1: CTest's polymorphic_allocator_refuses_pool compiles it and
// expects the error to name polymorphic_allocator's deleted constructor (which says to wrap the
// pool in a devmr::shared_resource), not only CCCL's own complaint that a pool is not copyable.

#include <devmr/devmr.hpp>

void make_allocator(devmr::managed_pool& pool) {
  devmr::polymorphic_allocator<int, cuda::mr::device_accessible, cuda::mr::host_accessible> a{pool};
  (void)a;
}
