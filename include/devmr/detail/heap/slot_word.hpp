#pragma once

// The word of a size class's slot (class_slots.hpp): which slab the slot hands out, how many of
// its blocks the slot promised when it took the slab, whether they go out in order (a fresh slab,
// or a row of them) or from the slab's bitmap, and how many claims took. A claim adds the blocks
// it wants to the whole word, and the value its addition replaced says what it got; an install
// exchanges the word. What each value of it means, for the claims, the installs and the tests.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/layout.hpp>

#include <cstdint>

namespace devmr::detail::heap {

/// A class slot word: slab id (bits 40-63) | fresh (bit 39) | blocks promised (bits 20-38) |
/// blocks claimed (bits 0-19). Ids that name no slab (empty_id and the installing ids of
/// layout.hpp) say that the slot has no slab to claim from; with nothing claimed such a slot is
/// vacant, and the claim whose addition finds it so installs. A claim that finds the promise
/// used up adds once and then waits by loads, so that the claimed count passes the promise by
/// at most 32 blocks a warp: 20 bits hold 65536 blocks and every warp of the largest GPUs.
inline constexpr std::uint64_t slot_fresh = std::uint64_t{1} << 39;
inline constexpr std::uint32_t slot_field_mask = (std::uint32_t{1} << 20) - 1;

DEVMR_HOST_DEVICE constexpr std::uint64_t make_class_slot(std::uint32_t id,
                                                          std::uint32_t promised,
                                                          bool fresh,
                                                          std::uint32_t claimed) {
  return (std::uint64_t{id} << 40) | (fresh ? slot_fresh : 0) | (std::uint64_t{promised} << 20) |
         claimed;
}
DEVMR_HOST_DEVICE constexpr std::uint32_t slot_claimed(std::uint64_t w) {
  return static_cast<std::uint32_t>(w) & slot_field_mask;
}
DEVMR_HOST_DEVICE constexpr std::uint32_t slot_promised(std::uint64_t w) {
  return static_cast<std::uint32_t>(w >> 20) & (slot_field_mask >> 1);
}
DEVMR_HOST_DEVICE constexpr bool slot_is_fresh(std::uint64_t w) {
  return (w & slot_fresh) != 0;
}
/// Of the blocks of a row of slabs (class_slots::open_row), which its slot hands out in order,
/// `claimed` claimed: those of slab `index` of the row (`per_slab` blocks each).
DEVMR_HOST_DEVICE constexpr std::uint32_t row_slab_claimed(std::uint32_t claimed,
                                                           std::uint32_t index,
                                                           std::uint32_t per_slab) {
  std::uint32_t const before = index * per_slab;
  std::uint32_t const left = claimed > before ? claimed - before : 0;
  return left < per_slab ? left : per_slab;
}
/// Whether a claim of `want` blocks whose addition replaced slot value `w` got them all from a
/// fresh slab: then they are blocks slot_claimed(w), slot_claimed(w) + 1, ... of slab
/// slot_id(w), as class_slots::claim_from returns them, and the claim needs nothing more. (A
/// slot value with no slab promises nothing and is never fresh: no look at the id.)
DEVMR_HOST_DEVICE constexpr bool slot_serves_fresh(std::uint64_t w, std::uint32_t want) {
  return slot_is_fresh(w) && slot_claimed(w) + want <= slot_promised(w);
}
/// A slot with no slab and no claim since it lost its last: the next claim installs.
DEVMR_HOST_DEVICE constexpr bool slot_is_vacant(std::uint64_t w) {
  return !is_slab(slot_id(w)) && slot_claimed(w) == 0;
}
/// A slot whose slab a claim used up exactly, wanting no more: the next claim installs.
DEVMR_HOST_DEVICE constexpr bool slot_just_used_up(std::uint64_t w) {
  return is_slab(slot_id(w)) && slot_claimed(w) == slot_promised(w);
}
/// A slot whose slab its claims used up, or past its promise.
DEVMR_HOST_DEVICE constexpr bool slot_used_up(std::uint64_t w) {
  return is_slab(slot_id(w)) && slot_claimed(w) >= slot_promised(w);
}
/// A slot whose slab has blocks promised and not claimed.
DEVMR_HOST_DEVICE constexpr bool slot_has_room(std::uint64_t w) {
  return is_slab(slot_id(w)) && slot_claimed(w) < slot_promised(w);
}
/// True while slot value `w` still stands for what a waiter saw, slot id `id`: the same
/// installer, or slab `id` used up past its promise (so that some claim installs the next).
DEVMR_HOST_DEVICE constexpr bool slot_still_waiting(std::uint64_t w, std::uint32_t id) {
  return slot_id(w) == id && (!is_slab(id) || slot_claimed(w) > slot_promised(w));
}
inline constexpr std::uint64_t vacant_class_slot = make_class_slot(empty_id, 0, false, 0);
// A slot value with no slab (vacant, or an installer's: take_over) promises nothing and is not
// fresh (slot_serves_fresh).
static_assert(!slot_is_fresh(vacant_class_slot) && slot_promised(vacant_class_slot) == 0);

/// The hint whose slot a warp's claims use (class_slots::slot_of): `sm`, its SM's number, for
/// the even warps of the SM (`warp`: its place among the warps resident there) and max_slots / 2
/// further on for the odd ones. A class whose width takes in every slot (on a large heap every
/// class's does, see slot_width) meets an SM's claims on two slot words, which install their
/// slabs side by side: a claim waits for half as many installs. A narrower class masks both
/// hints to the same slot.
DEVMR_HOST_DEVICE constexpr unsigned claim_hint(unsigned sm, unsigned warp) {
  return sm + (warp & 1u) * (max_slots / 2);
}

}  // namespace devmr::detail::heap
