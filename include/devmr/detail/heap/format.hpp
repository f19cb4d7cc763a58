#pragma once

// Formatting a heap header on the host: the initial state that kernels (or host tests) start from.
// O(1) in the heap's size: slabs are formatted lazily when first taken from an arena's frontier.

#include <devmr/detail/heap/bits.hpp>
#include <devmr/detail/heap/layout.hpp>

#include <cstdint>
#include <cstring>

namespace devmr::detail::heap {

/// Slots per group for a heap of `slabs` slabs: one per SM where the heap can give every slot of
/// every group a slab (2 GiB and up cover the largest GPUs' SMs), fewer on smaller heaps, so that
/// the slots' current slabs never hold the whole heap. Fewer slots are slower: SMs that share one
/// queue on its word and wait for each other's installs (at 2^16 threads, 4 KiB blocks on 4 GiB
/// ran at 0.49x of the floor with 64 slots, 0.71x with one per SM, on an H200). Priming fills at
/// most half of the heap (heap_core::prime_count).
inline std::uint32_t slot_mask_for(std::uint64_t slabs) {
  std::uint64_t const per_group = slabs / num_groups;
  std::uint64_t const slots = per_group < 1 ? 1 : (per_group > max_slots ? max_slots : per_group);
  return (std::uint32_t{1} << floor_log2(slots)) - 1;
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
  for (unsigned g = 0; g < num_groups; ++g) {
    for (unsigned slot = 0; slot < max_slots; ++slot) {
      slot_word_of(h, g, slot) = empty_slot;
      spare_word_of(h, g, slot) = no_slab;
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
  }
  h.slot_mask = slot_mask_for(heap_slabs(h));
}

}  // namespace devmr::detail::heap
