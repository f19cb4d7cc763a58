// A size class's slot word (slot_word.hpp): its fields at their limits, and what each value says
// to a claim, an install and a waiter.

#include <devmr/detail/heap/slot_word.hpp>

#include <catch2/catch.hpp>

#include <cstdint>

namespace {

using namespace devmr::detail::heap;

TEST_CASE("a slot word keeps its slab, promise, freshness and claims apart", "[slots][word]") {
  std::uint32_t const last_slab = installing_first - 1;
  std::uint32_t const ids[] = {0, 1, 12345, last_slab, installing_first, installing_last, empty_id};
  std::uint32_t const promises[] = {0, 1, 256, 65536, 8 * 4096, (slot_field_mask >> 1)};
  std::uint32_t const claims[] = {0, 1, 31, 65536 + 32, slot_field_mask};
  for (std::uint32_t id : ids) {
    for (std::uint32_t promised : promises) {
      for (bool fresh : {false, true}) {
        for (std::uint32_t claimed : claims) {
          std::uint64_t const w = make_class_slot(id, promised, fresh, claimed);
          CHECK(slot_id(w) == id);
          CHECK(slot_promised(w) == promised);
          CHECK(slot_is_fresh(w) == fresh);
          CHECK(slot_claimed(w) == claimed);
        }
      }
    }
  }
  // A claim's addition moves the claimed count alone, up to the most a waiting slot sees: the
  // promise of a row of 4 KiB blocks, passed by a warp.
  std::uint64_t const w = make_class_slot(77, 8 * 256, true, 8 * 256 - 3);
  std::uint64_t const added = w + 32;
  CHECK(slot_id(added) == 77);
  CHECK(slot_promised(added) == 8 * 256);
  CHECK(slot_is_fresh(added));
  CHECK(slot_claimed(added) == 8 * 256 + 29);
}

TEST_CASE("a slot word tells a claim whether its fresh blocks are all there", "[slots][word]") {
  std::uint64_t const fresh = make_class_slot(5, 64, true, 40);
  CHECK(slot_serves_fresh(fresh, 1));
  CHECK(slot_serves_fresh(fresh, 24));  // the promise's last block
  CHECK_FALSE(slot_serves_fresh(fresh, 25));
  CHECK_FALSE(slot_serves_fresh(make_class_slot(5, 64, false, 40), 1));  // from the bitmap
  CHECK_FALSE(slot_serves_fresh(vacant_class_slot, 1));
  CHECK_FALSE(slot_serves_fresh(make_class_slot(installing_last, 0, false, 3), 1));
}

TEST_CASE("a slot word says when its slot installs, has room or keeps a waiter waiting",
          "[slots][word]") {
  std::uint32_t const slab = 9;
  std::uint64_t const room = make_class_slot(slab, 64, true, 63);
  std::uint64_t const exact = make_class_slot(slab, 64, true, 64);
  std::uint64_t const past = make_class_slot(slab, 64, true, 70);
  std::uint64_t const installing = make_class_slot(installing_last, 0, false, 1);
  std::uint64_t const lost = make_class_slot(installing_last, 0, false, 0);

  // No slab: vacant only with nothing claimed since (the next claim installs); an installer's
  // word, with its own claim counted, is not.
  struct expected {
    std::uint64_t w;
    bool room, used_up, just_used_up, vacant;
  };
  expected const table[] = {
      {room, true, false, false, false},               // claims go on
      {exact, false, true, true, false},               // the claim that used it up installs
      {past, false, true, false, false},               // its claims wait for that install
      {vacant_class_slot, false, false, false, true},  // the next claim installs
      {installing, false, false, false, false},        // its claims wait for the installer
      {lost, false, false, false, true},               // an installer gave up: vacant
  };
  for (expected const& e : table) {
    INFO("slot id " << slot_id(e.w) << ", promised " << slot_promised(e.w) << ", claimed "
                    << slot_claimed(e.w));
    CHECK(slot_has_room(e.w) == e.room);
    CHECK(slot_used_up(e.w) == e.used_up);
    CHECK(slot_just_used_up(e.w) == e.just_used_up);
    CHECK(slot_is_vacant(e.w) == e.vacant);
  }

  // A waiter saw slab `slab` used up past its promise, or an installer's id: it waits while the
  // word still says so, and stops once anything else is there.
  CHECK(slot_still_waiting(past, slab));
  CHECK(slot_still_waiting(make_class_slot(slab, 64, true, 90), slab));
  CHECK_FALSE(slot_still_waiting(exact, slab));  // its claim installs, not a waiter's
  CHECK_FALSE(slot_still_waiting(make_class_slot(slab + 1, 64, true, 70), slab));
  CHECK(slot_still_waiting(installing, installing_last));
  CHECK(slot_still_waiting(make_class_slot(installing_last, 0, false, 5), installing_last));
  CHECK_FALSE(slot_still_waiting(make_class_slot(next_installer(installing_last), 0, false, 1),
                                 installing_last));
  CHECK_FALSE(slot_still_waiting(make_class_slot(slab, 64, true, 0), installing_last));
}

TEST_CASE("a row's claimed blocks fall to its slabs in order", "[slots][word]") {
  std::uint32_t const per_slab = 256;
  std::uint32_t const row = 8;
  for (std::uint32_t claimed = 0; claimed <= row * per_slab + 32; claimed += 7) {
    std::uint32_t sum = 0;
    for (std::uint32_t i = 0; i < row; ++i) {
      std::uint32_t const mine = row_slab_claimed(claimed, i, per_slab);
      CHECK(mine <= per_slab);
      // Slabs before the one the claims reached are used up, those after it untouched.
      if ((i + 1) * per_slab <= claimed) {
        CHECK(mine == per_slab);
      } else if (i * per_slab >= claimed) {
        CHECK(mine == 0);
      }
      sum += mine;
    }
    CHECK(sum == (claimed < row * per_slab ? claimed : row * per_slab));
  }
}

TEST_CASE("an SM's even and odd warps claim through two slots of a class", "[slots][word]") {
  for (unsigned sm = 0; sm < max_slots / 2; ++sm) {
    CHECK(claim_hint(sm, 0) == sm);
    CHECK(claim_hint(sm, 6) == sm);
    CHECK(claim_hint(sm, 1) == sm + max_slots / 2);
    CHECK(claim_hint(sm, 63) == sm + max_slots / 2);
    CHECK(claim_hint(sm, 1) < max_slots);
  }
}

}  // namespace
