#pragma once

// For tests: the supplies of empty slabs that the reuse path's tests give it in place of the
// heap's slab supply (whose own stacks, in slab_supply.hpp, are tuned to its metadata). A
// lock-free stack of slabs (a Treiber stack): a 64-bit head holding the top slab's id and a tag
// that every push and pop changes, so that a pop whose top was popped and pushed again meanwhile
// fails its CAS instead of linking a stale `next`. Slabs link through a 32-bit field of their
// metadata, which the caller's `next(id)` names. An id of no_slab ends the stack.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/atomics.hpp>

#include <cstdint>

namespace devmr::detail::heap {

/// The head of an empty slab stack.
inline constexpr std::uint64_t empty_slab_stack = 0xffffffffu;

/// The stack whose head is `head`; `Next` maps a slab id to its link field (std::uint32_t&).
template <class Next>
struct slab_stack {
  std::uint64_t& head;
  Next next;

  DEVMR_HOST_DEVICE static std::uint32_t top_of(std::uint64_t h) {
    return static_cast<std::uint32_t>(h);
  }
  DEVMR_HOST_DEVICE static std::uint64_t retag(std::uint64_t h, std::uint32_t top) {
    return (((h >> 32) + 1) << 32) | top;
  }

  /// True when the stack looks empty (a load; pushes may come at any time).
  DEVMR_HOST_DEVICE bool looks_empty() const {
    return top_of(atomic(head).load(relaxed)) == 0xffffffffu;
  }

  /// Pushes slab `id`, which the caller holds.
  DEVMR_HOST_DEVICE void push(std::uint32_t id) const {
    auto h = atomic(head);
    std::uint64_t top = h.load(relaxed);
    do {
      atomic(next(id)).store(top_of(top), relaxed);
      // release: the link, and what the pusher did to the slab, happen before the pop's use.
    } while (!h.compare_exchange_weak(top, retag(top, id), release, relaxed));
  }

  /// Pops a slab; 0xffffffff when the stack is empty.
  DEVMR_HOST_DEVICE std::uint32_t pop() const {
    auto h = atomic(head);
    // acquire: pairs with the push's release, so that the link is read as pushed.
    std::uint64_t top = h.load(acquire);
    while (top_of(top) != 0xffffffffu) {
      // Another thread may pop and reuse the top meanwhile: then the link read is stale, but
      // the head's tag has changed and the CAS fails.
      std::uint32_t const below = atomic(next(top_of(top))).load(relaxed);
      if (h.compare_exchange_weak(top, retag(top, below), acquire, acquire)) {
        return top_of(top);
      }
    }
    return 0xffffffffu;
  }
};

template <class Next>
slab_stack(std::uint64_t&, Next) -> slab_stack<Next>;

}  // namespace devmr::detail::heap
