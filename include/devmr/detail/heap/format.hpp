#pragma once

// Formatting a heap header on the host: the initial state that kernels (or host tests) start from.
// O(1) in the heap's size: slabs are formatted lazily when first taken from an arena's frontier.

#include <devmr/detail/heap/bits.hpp>
#include <devmr/detail/heap/class_slots.hpp>
#include <devmr/detail/heap/layout.hpp>
#include <devmr/detail/heap/slot_width.hpp>

#include <cstdint>
#include <cstring>

namespace devmr::detail::heap {

/// Slabs out of the supply below which a heap is roomy (slot_shape::roomy): all but an eighth
/// of its slabs. While more than that eighth is empty, an install takes an empty slab rather
/// than a listed one with few free blocks (class_slots::take_roomy); past it, the heap reuses
/// its classes' freed blocks first.
inline std::uint32_t roomy_limit_for(std::uint64_t slabs) {
  std::uint64_t const limit = slabs - slabs / 8;
  return limit > 0xffffffffu ? 0xffffffffu : static_cast<std::uint32_t>(limit);
}

/// Slabs that the slots of all classes of a heap of `slabs` slabs may hold together: a quarter.
/// A slot holds one slab of its class at a time, partly handed out: with fewer slots, the slabs
/// that slots hold stay a small part of the heap, so that slabs whose blocks are all free go back
/// to the supply instead of waiting in slots; with more, fewer SMs meet on one slot word.
inline std::uint32_t slot_budget_for(std::uint64_t slabs) {
  std::uint64_t const budget = slabs / 4;
  return budget > 0xffffffffu ? 0xffffffffu : static_cast<std::uint32_t>(budget);
}

/// Slots per class, minus one, for a heap of `slabs` slabs with every class in use: each class's
/// share of the budget, up to max_slots. Where fewer classes are in use, they widen to a
/// larger share (slot_width.hpp).
inline std::uint32_t slot_mask_for(std::uint64_t slabs) {
  return slot_width::share(slot_budget_for(slabs), num_classes, max_slots);
}

/// An empty heap: no arenas, empty stacks and slots, zero counters.
inline void initialize(heap_header& h, bool checked) {
  std::memset(static_cast<void*>(&h), 0, sizeof(h));
  for (auto& head : h.free_runs) {
    head = empty_stack;
  }
  for (auto& head : h.free_slabs) {
    head.value = empty_stack;
  }
  for (auto& line : h.slots) {
    for (auto& word : line.classes) {
      word = vacant_class_slot;
    }
  }
  h.checked = checked ? 1u : 0u;
}

/// Where hint `hint` first looks for empty slabs: spread over the first arena's bitmap, so that
/// SMs do not all start on its first word.
DEVMR_HOST_DEVICE inline std::uint32_t first_cursor(heap_header const& h, unsigned hint) {
  return make_slab_id(
      0, static_cast<std::uint32_t>(empty_bitmap_words(h.arenas[0].slabs) * hint / max_slots));
}

/// Publishes an arena in a header image that no thread is using (the host's copy).
inline void add_arena(heap_header& h, arena_desc const& arena) {
  h.arenas[h.arena_count] = arena;
  h.frontier[h.arena_count] = 0;
  ++h.arena_count;
  if (h.arena_count == 1) {
    for (unsigned hint = 0; hint < max_slots; ++hint) {
      h.empty_cursor[hint] = first_cursor(h, hint);
    }
    // Rows of slabs (run_slabs), decided with the first arena: a heap that gives every class
    // every slot from the start has room for slots that hold rows.
    h.rows = slot_mask_for(total_slabs(h)) + 1 == max_slots ? 1u : 0u;
  }
  h.slot_widths.base = slot_mask_for(total_slabs(h));
  h.slot_widths.budget = slot_budget_for(total_slabs(h));
  h.slot_widths.roomy = roomy_limit_for(total_slabs(h));
  h.slot_widths.widths = slot_width::initial(h.slot_widths.base, num_classes);
}

}  // namespace devmr::detail::heap
