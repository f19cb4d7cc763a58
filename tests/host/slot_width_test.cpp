// The width of the class slots (slot_width.hpp): each class's share of the slots' budget of
// slabs, widened by installs that reuse slabs and narrowed by classes that come into use, from
// many std::threads at once.

#include <devmr/detail/heap/slot_width.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

namespace {

using namespace devmr::detail::heap;

bool is_mask(std::uint32_t m) {
  return ((m + 1) & m) == 0;
}

TEST_CASE("a class's share of the slots is the largest power of two that fits", "[width]") {
  CHECK(slot_width::share(128, 1, 256) == 127);
  CHECK(slot_width::share(128, 2, 256) == 63);
  CHECK(slot_width::share(128, 3, 256) == 31);    // 42 slots fit: 32
  CHECK(slot_width::share(128, 9, 256) == 7);     // 14 fit: 8
  CHECK(slot_width::share(1024, 1, 256) == 255);  // one per SM at most
  CHECK(slot_width::share(1024, 9, 256) == 63);
  CHECK(slot_width::share(5, 9, 256) == 0);  // always one slot
  CHECK(slot_width::share(0, 1, 256) == 0);
  CHECK(slot_width::share(128, 0, 256) == 127);  // no class in use yet: as for one
  CHECK(slot_width::share(128, 1, 8) == 7);
}

TEST_CASE("a class widens up to the share of the classes in use", "[width]") {
  slot_shape shape{slot_width::initial(7, 9), 7, 128, 0};
  slot_width const width{&shape, 256};
  for (unsigned c = 0; c < 9; ++c) {
    CHECK(width.mask(c) == 7);
  }
  width.use(3);
  CHECK(width.mask(3) == 7);  // below one class's share: stays
  CHECK(slot_width::classes_of(shape.widths) == 1u << 3);
  width.widen(3);
  CHECK(width.mask(3) == 15);
  CHECK(width.mask(4) == 7);  // the other classes keep theirs
  width.widen(3);
  width.widen(3);
  width.widen(3);
  CHECK(width.mask(3) == 127);
  width.widen(3);
  CHECK(width.mask(3) == 127);  // the share of one class of 128 slabs

  width.use(3);
  CHECK(width.mask(3) == 127);  // a class already in use changes nothing
  width.use(5);
  CHECK(width.mask(3) == 63);  // two classes: half each
  CHECK(width.mask(5) == 7);   // a class starts at the share of all
  CHECK(slot_width::classes_of(shape.widths) == ((1u << 3) | (1u << 5)));
  width.widen(3);
  CHECK(width.mask(3) == 63);
  width.widen(5);
  CHECK(width.mask(5) == 15);
  for (unsigned c = 0; c < 9; ++c) {
    width.use(c);
  }
  for (unsigned c = 0; c < 9; ++c) {
    CHECK(width.mask(c) == 7);
  }
  width.widen(3);
  CHECK(width.mask(3) == 7);
}

TEST_CASE("a class in use that takes an empty slab widens where the caller asks", "[width]") {
  slot_shape shape{slot_width::initial(7, 9), 7, 128, 0};
  slot_width const width{&shape, 256};
  CHECK(width.use(3, width.look(), true) == 0);  // joins, and keeps the width
  CHECK(width.mask(3) == 7);
  CHECK(slot_width::classes_of(shape.widths) == 1u << 3);
  width.use(3, width.look());  // a class in use, not asked to grow: nothing changes
  CHECK(width.mask(3) == 7);
  for (std::uint32_t const mask : {15u, 31u, 63u, 127u, 127u}) {
    CHECK(width.use(3, width.look(), true) == 0);  // one step a take, up to one class's share
    CHECK(width.mask(3) == mask);
  }
  // A second class joins (asked to grow or not) and narrows the first to their share.
  std::uint64_t const was = width.use(5, width.look(), true);
  CHECK(slot_width::mask_of(was, 3) == 127);
  CHECK(width.mask(3) == 63);
  CHECK(width.mask(5) == 7);
  CHECK(width.use(5, width.look(), true) == 0);
  CHECK(width.mask(5) == 15);
  // Fixed widths: nothing to do.
  slot_width const fixed{nullptr, 8};
  CHECK(fixed.use(3, fixed.look(), true) == 0);
  CHECK(fixed.mask(3) == 7);
}

TEST_CASE("the classes of blocks past 32 KiB keep the base width", "[width]") {
  // A heap of every class: the word holds the widths of the first twelve, four bits each; the
  // others have no bits there, and their masks never pass the base, whatever the word holds.
  std::uint64_t const start = slot_width::initial(7, num_classes);
  CHECK(slot_width::classes_of(start) == 0u);  // no class in use yet
  for (unsigned c = 0; c < slot_width::max_classes; ++c) {
    CHECK(slot_width::log2_of(start, c) == 3u);
  }
  slot_shape shape{start, 7, 1024, 0};
  slot_width const width{&shape, max_slots};
  for (unsigned c = slot_width::max_classes; c < num_classes; ++c) {
    width.use(c);
    CHECK((slot_width::classes_of(shape.widths) & (1u << c)) != 0);
    width.widen(c);
    width.widen(c);
    CHECK(width.mask(c) == 7);
  }
  // Every class of the word in use and widened as far as it goes: the others stay at the base.
  shape.widths = ~std::uint64_t{0};
  for (unsigned c = slot_width::max_classes; c < num_classes; ++c) {
    CHECK(width.mask(c) == 7);
  }
}

TEST_CASE("a class narrows back to the base width", "[width]") {
  slot_shape shape{slot_width::initial(7, 9), 7, 128, 0};
  slot_width const width{&shape, 256};
  width.use(2);
  width.widen(2);
  width.widen(2);
  width.widen(4);  // a class not in use widens too, to the share of those that are
  CHECK(width.mask(2) == 31);
  CHECK(width.mask(4) == 15);
  width.narrow(2);
  CHECK(width.mask(2) == 7);
  CHECK(width.mask(4) == 15);  // the others keep theirs
  width.narrow(2);
  CHECK(width.mask(2) == 7);  // never below the base
  CHECK(slot_width::classes_of(shape.widths) == 1u << 2);
}

TEST_CASE("a width with no state word, or at its limit with every class in use, is fixed",
          "[width]") {
  slot_width const width{nullptr, 16};
  CHECK(width.mask(2) == 15);
  width.use(2);
  width.widen(2);
  CHECK(width.mask(2) == 15);
  // A heap large enough for the most slots of every class: its word gives every class all its
  // slots, and no width changes (a class that comes into use gains its bit, once).
  slot_shape shape{slot_width::initial(255, 9), 255, 4096, 0};
  CHECK(slot_width::fixed_for(shape, 256));
  slot_width const large{&shape, 256};
  CHECK(large.mask(2) == 255);
  large.use(2);
  large.widen(2);
  large.narrow(2);
  large.use(7);
  CHECK(shape.widths == (slot_width::initial(255, 9) | (1u << 2) | (1u << 7)));
  for (unsigned c = 0; c < 9; ++c) {
    CHECK(large.mask(c) == 255);
  }
  // A caller that knows the widths fixed reads no word: whatever it holds, every slot is in use.
  shape.widths = slot_width::initial(3, 9);
  CHECK(slot_width{&shape, 256, true}.mask(2) == 255);
  CHECK(slot_width{&shape, 256}.mask(2) == 3);
  slot_shape narrow{slot_width::initial(7, 9), 7, 32, 0};
  CHECK_FALSE(slot_width::fixed_for(narrow, 256));
}

TEST_CASE("threads widening and narrowing at once keep each class within the classes' share",
          "[width]") {
  constexpr std::uint32_t budget = 128;
  constexpr unsigned classes = 9;
  constexpr std::uint32_t base = 7;  // the share of nine classes
  slot_shape shape{slot_width::initial(base, classes), base, budget, 0};
  slot_width const width{&shape, 256};
  std::atomic<unsigned> bad{0};
  std::atomic<unsigned> widest{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng{t};
      for (unsigned i = 0; i < 20000; ++i) {
        // Classes come into use slowly (a class in a thousand calls), while most calls widen.
        unsigned const c = rng() % classes;
        if (rng() % 1000 == 0) {
          width.use(c);
        } else {
          width.widen(c);
        }
        std::uint64_t const seen = atomic(shape.widths).load(relaxed);
        std::uint32_t const fair =
            slot_width::share(budget, popcount32(slot_width::classes_of(seen)), 256);
        for (unsigned k = 0; k < classes; ++k) {
          std::uint32_t const mask = slot_width::mask_of(seen, k);
          if (!is_mask(mask) || mask < base || mask > fair) {
            bad.fetch_add(1, std::memory_order_relaxed);
          }
          unsigned w = widest.load(std::memory_order_relaxed);
          while (mask > w && !widest.compare_exchange_weak(w, mask)) {
          }
        }
      }
      for (unsigned k = 0; k < classes; ++k) {
        width.use(k);
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  CHECK(bad.load() == 0);
  CHECK(widest.load() > base);  // they did widen while few classes were in use
  CHECK(slot_width::classes_of(shape.widths) == (1u << classes) - 1);
  for (unsigned k = 0; k < classes; ++k) {
    CHECK(width.mask(k) == base);  // every class in use: each has the share of nine
  }
}

}  // namespace

TEST_CASE("an update from widths read before changes them once, and not after another change",
          "[width]") {
  slot_shape shape{slot_width::initial(7, 9), 7, 128, 0};
  slot_width const width{&shape, 256};
  width.use(3);
  // Two updates from one read: the first widens, the second finds the word changed and leaves it.
  slot_width::snapshot const seen = width.look();
  CHECK_FALSE(seen.fixed);
  CHECK(seen.budget == 128);
  width.widen(3, seen);
  CHECK(width.mask(3) == 15);
  width.widen(3, seen);
  CHECK(width.mask(3) == 15);
  // A class that comes into use from a read made before a widening still narrows every class to
  // the share of two: its CAS fails, and it tries again from the word as it is.
  slot_width::snapshot const before = width.look();
  width.widen(3);
  width.widen(3);
  CHECK(width.mask(3) == 63);
  width.use(5, before);
  CHECK(slot_width::classes_of(shape.widths) == ((1u << 3) | (1u << 5)));
  CHECK(width.mask(3) == 63);  // the share of two classes of 128 slabs: 64 slots
  width.widen(3, before);      // stale: nothing
  CHECK(width.mask(3) == 63);
  // Fixed widths that the caller does not know so: the read loads the word (and no base), and
  // the updates from it change no width. Known fixed, or no word: the read says so, loading
  // nothing.
  slot_shape large{slot_width::initial(255, 9), 255, 4096, 0};
  slot_width const fixed{&large, 256};
  CHECK_FALSE(fixed.look().fixed);
  fixed.use(2, fixed.look());
  fixed.widen(2, fixed.look());
  CHECK(large.widths == (slot_width::initial(255, 9) | (1u << 2)));
  CHECK(fixed.mask(2) == 255);
  CHECK(slot_width{&large, 256, true}.look().fixed);
  CHECK(slot_width{nullptr, 16}.look().fixed);
}
