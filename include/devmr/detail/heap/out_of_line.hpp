#pragma once

// How the heap's slow paths are called: out of line, with the ABI, so that the allocating
// kernel's count of registers is what its own code holds across a call plus the largest slow
// path, not the sum along its deepest chain of calls.
//
// ptxas gives a function that it calls directly registers above those that its callers hold
// live at the call: a kernel's count is then the chain added up (the allocation's fast path,
// what it holds across the install, what the install holds across its search of the slab
// supply, that search). A function in a cycle of calls cannot be placed so, since it is among
// its own callers: ptxas compiles it with the ABI, saving the registers it uses that the ABI
// keeps for its callers, and restoring them when it returns. Each slow path therefore carries a
// call to itself that never runs (its condition, that the GPU has no SM, is one ptxas cannot
// decide). The price is paid on the slow path: the saves and restores around each call, and a
// stack that ptxas cannot bound at compile time (docs/heap-internals.md, How the slow paths are
// called). A call through a function pointer would do the same for the callee, but every
// kernel that makes any call through a pointer (device_resource_ref's calls of a user's
// resource) would then count the registers of every function whose address is taken.
//
// A slow path runs on a view that it rebuilds from a handle (view_handle): the heap's header for
// the views of a heap, so that the caller keeps no copy of its view in memory for the call.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/layout.hpp>

namespace devmr::detail::heap {

/// How an out-of-line call hands its object over: `of(view)` makes the handle that the call
/// takes, `view(handle)` makes the object again on the other side. By default a view of one
/// heap, rebuilt from the heap's header (`View{header}`).
template <class View>
struct view_handle {
  DEVMR_HOST_DEVICE static heap_header* of(View const& v) { return v.header(); }
  DEVMR_HOST_DEVICE static View view(heap_header* h) { return View{h}; }
};

/// A view_handle that hands the object over by its address (the caller keeps it in memory), for
/// views that cannot be rebuilt from less: a specialization derives from it.
template <class View>
struct address_handle {
  DEVMR_HOST_DEVICE static View const* of(View const& v) { return &v; }
  DEVMR_HOST_DEVICE static View const& view(View const* v) { return *v; }
};

/// The out-of-line side of out_of_line: member `Body` of the object that `handle` stands for.
template <class View, auto Body, class Handle, class... Args>
DEVMR_HOST_DEVICE DEVMR_NOINLINE auto run_out_of_line(Handle handle, Args... args)
    -> decltype((view_handle<View>::view(handle).*Body)(args...)) {
#if DEVMR_IS_DEVICE_CODE
  unsigned sms = 0;
  asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
  if (sms == 0) {  // never: the cycle of calls that makes ptxas call this with the ABI
    auto const result = run_out_of_line<View, Body, Handle, Args...>(handle, args...);
    asm volatile("" ::"r"(sms));  // not a tail call, which the compiler would make a loop
    return result;
  }
#endif
  return (view_handle<View>::view(handle).*Body)(args...);
}

/// Calls member `Body` of `v` with `args`, out of line and with the ABI (see the top of this
/// file); on the host, a plain call.
template <auto Body, class View, class... Args>
DEVMR_HOST_DEVICE auto out_of_line(View const& v, Args... args) {
  return run_out_of_line<View, Body>(view_handle<View>::of(v), args...);
}

}  // namespace devmr::detail::heap
