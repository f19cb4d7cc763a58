// A slab's free count (slab_avail.hpp): where its count puts the slab (in its slot, listed,
// closed below the listing threshold, emptied), and that each event goes to exactly one thread.

#include <devmr/detail/heap/slab_avail.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

using namespace devmr::detail::heap;

/// A slab of 64 blocks of class 2 (listing threshold 8) whose count is `word`, opened fresh: its
/// blocks go out in order.
slab_avail fresh_slab(std::uint32_t& word) {
  slab_avail const avail{word, 64, 2};
  avail.open_fresh();
  return avail;
}

TEST_CASE("a slab's count lists it once past the threshold and empties it once all is free",
          "[reuse][avail]") {
  std::uint32_t word = 0;
  slab_avail const avail = fresh_slab(word);
  CHECK(avail.free(20) == avail_event::none);  // open: its slot closes it
  CHECK(avail.close(0) == avail_event::listed);
  CHECK((word & avail_listed) != 0);
  // The free of its last block asks for it to be taken off its list and taken; a slot that took
  // it off the list first opens it, and the free finds it taken.
  CHECK(avail.free(44) == avail_event::full_listed);
  CHECK(avail.open_listed() == 48);  // three quarters promised, a quarter still counted
  CHECK(word == (avail_open | 2u << avail_class_shift | 16u));
  // The free's take starts from the value its addition left, and finds the slot's instead.
  CHECK_FALSE(avail.take_full(avail.filled()));
  CHECK(word == (avail_open | 2u << avail_class_shift | 16u));
  // The slot's claims take the 48; it closes with 16 counted: listed again.
  CHECK(avail.close(0) == avail_event::listed);
  CHECK(avail.open_listed() == 12);             // 4 stay counted; 60 blocks out
  CHECK(avail.close(0) == avail_event::below);  // 4, below the threshold: waits for frees
  CHECK(avail.free(3) == avail_event::none);    // 7
  CHECK(avail.free(1) == avail_event::listed);  // 8: this free lists it
  CHECK(avail.free(1) == avail_event::none);    // 9, listed
  CHECK(avail.free(55) == avail_event::full_listed);
  CHECK(avail.take_full(avail.filled()));  // no slot came first: the free takes it
  CHECK(avail.open_listed() == 0);         // and a slot that finds it on the list later does not
  CHECK(word == (avail_open | avail_no_class));
  // Another class's slot never opens it, whatever its list says.
  avail.open_fresh();
  CHECK(avail.close(10) == avail_event::listed);
  slab_avail const other{word, 64, 3};
  CHECK(other.open_listed() == 0);
  CHECK(avail.free(54) == avail_event::full_listed);
  // A take of another class (a thread that filled the slab in an earlier life of it) leaves it;
  // the take of its class takes it, once.
  CHECK_FALSE(other.take_full(other.filled()));
  CHECK(avail.take_full(avail.filled()));
  CHECK_FALSE(avail.take_full(avail.filled()));
  CHECK(word == (avail_open | avail_no_class));
}

TEST_CASE("a free that filled a listed slab takes it only while it is of its class",
          "[reuse][avail]") {
  std::uint32_t word = 0;
  slab_avail const avail = fresh_slab(word);  // class 2, 64 blocks
  CHECK(avail.close(0) == avail_event::below);
  CHECK(avail.free(8) == avail_event::listed);
  // This free fills the slab; before its take, a slot opens the slab, its claims take every
  // block, and the slab leaves the class once they are all freed (another thread empties it).
  CHECK(avail.free(56) == avail_event::full_listed);
  CHECK(avail.open_listed() == 48);
  CHECK(avail.free(48) == avail_event::none);
  CHECK(avail.close(0) == avail_event::emptied);
  // Formatted for a class of smaller blocks, the slab is closed with as many blocks free as the
  // first class had in all, the rest in use: the late take must leave it.
  slab_avail const smaller{word, 128, 1};
  smaller.open_fresh();
  CHECK(smaller.close(64) == avail_event::listed);
  std::uint32_t const before = word;
  CHECK_FALSE(avail.take_full(avail.filled()));
  CHECK_FALSE(avail.take_full(avail.peek()));
  CHECK(word == before);
}

TEST_CASE("a free whose count moved on acts on it only while the slab is of its class",
          "[reuse][avail]") {
  std::uint32_t word = 0;
  slab_avail const avail = fresh_slab(word);  // class 2, 64 blocks
  CHECK(avail.close(0) == avail_event::below);
  // A free's addition fills the slab; before its CAS takes the slab, an install short of slabs
  // opens it (every block), its claims take the blocks and free them, and the slot's close
  // empties it.
  std::uint32_t const now = word += 64;
  CHECK(avail.open_below() == 64);
  CHECK(avail.free(64) == avail_event::none);
  CHECK(avail.close(0) == avail_event::emptied);
  // Formatted for another class and closed there with some blocks in use, the slab must be
  // left as it is by the late free, which would take its count for its own class's.
  std::uint32_t blocks = 0;
  unsigned cls = 0;
  std::uint32_t unused = 0;
  avail_event closed = avail_event::below;
  SECTION("as many free as the first class has in all, below the other's threshold") {
    blocks = 1024, cls = 0, unused = 64;  // would be emptied
  }
  SECTION("fewer free than that, past the first class's threshold, below the other's") {
    blocks = 1024, cls = 0, unused = 40;  // would be listed
  }
  SECTION("as many free as the first class has in all, listed in the other class") {
    blocks = 128, cls = 1, unused = 64, closed = avail_event::listed;  // would be taken off
  }
  slab_avail const other{word, blocks, cls};
  other.open_fresh();
  CHECK(other.close(unused) == closed);
  std::uint32_t const before = word;
  CHECK(avail.settle(now) == avail_event::none);
  CHECK(word == before);
}

TEST_CASE("a slab opened from a count read before opens on the count as it is now",
          "[reuse][avail]") {
  std::uint32_t word = 0;
  slab_avail const avail = fresh_slab(word);
  CHECK(avail.close(16) == avail_event::listed);
  std::uint32_t const seen = avail.peek();
  REQUIRE((seen & avail_count_mask) == 16u);
  // Frees since the look: the promise is three quarters of the count now, not of the one seen.
  CHECK(avail.free(4) == avail_event::none);
  CHECK(avail.open_listed(seen) == 15);  // 20 - 20 / 4
  CHECK(word == (avail_open | 2u << avail_class_shift | 5u));
  // Opened meanwhile by another slot: the value seen opens nothing.
  CHECK(avail.close(5) == avail_event::listed);
  std::uint32_t const before = avail.peek();
  CHECK(avail.open_listed() == 8);
  CHECK(avail.open_listed(before) == 0);
  CHECK(word == (avail_open | 2u << avail_class_shift | 2u));
}

TEST_CASE("every block of a listed slab freed while a slot holds it waits for the slot's close",
          "[reuse][avail]") {
  std::uint32_t word = 0;
  slab_avail const avail = fresh_slab(word);
  CHECK(avail.free(20) == avail_event::none);
  CHECK(avail.close(0) == avail_event::listed);
  // The free of its last block finds it listed; before that free takes it, a slot opens it.
  CHECK(avail.free(44) == avail_event::full_listed);
  CHECK(avail.open_listed() == 48);
  // The slot's claims take their 48 blocks and free them all while the slot holds the slab:
  // every block is free, but the slab is the slot's, which closes it.
  CHECK(avail.free(48) == avail_event::none);
  CHECK(word == (avail_open | 2u << avail_class_shift | 64u));
  CHECK_FALSE(avail.take_full(avail.filled()));
  CHECK_FALSE(avail.take_full(avail.peek()));
  CHECK(word == (avail_open | 2u << avail_class_shift | 64u));
  CHECK(avail.close(0) == avail_event::emptied);
  CHECK(word == (avail_open | avail_no_class));
}

TEST_CASE("a slab closed below the threshold opens for a class short of slabs, every block",
          "[reuse][avail]") {
  std::uint32_t word = 0;
  slab_avail const avail{word, 64, 2};  // threshold 8
  avail.open_fresh();
  CHECK(avail.close(0) == avail_event::below);  // every block out: on the list all the same
  CHECK(avail.closed_full());
  CHECK(avail.open_below() == 0);  // nothing to promise yet
  CHECK(avail.free(5) == avail_event::none);
  CHECK_FALSE(avail.closed_full());
  slab_avail const other{word, 64, 3};
  CHECK(other.open_below() == 0);  // another class's slot never opens it
  CHECK(avail.open_below() == 5);  // all 5 promised, none kept
  CHECK(word == (avail_open | 2u << avail_class_shift));
  CHECK(avail.open_below() == 0);  // open: no second slot takes it
  CHECK(avail.close(2) == avail_event::below);
  CHECK(avail.free(6) == avail_event::listed);  // 8: listed, for the slots' installs
  CHECK(avail.open_below() == 0);
  CHECK_FALSE(avail.closed_full());
  CHECK(avail.free(56) == avail_event::full_listed);
}

TEST_CASE("a claim takes blocks straight from a slab closed below the threshold, keeping none",
          "[reuse][avail]") {
  std::uint32_t word = 0;
  slab_avail const avail{word, 64, 2};  // threshold 8
  avail.open_fresh();
  CHECK(avail.claim_direct(1, false) == direct_claim::gone);  // a slot holds it
  CHECK(avail.close(5) == avail_event::below);
  CHECK(avail.claim_direct(1, true) == direct_claim::gone);      // not listed
  CHECK(avail.claim_direct(6, false) == direct_claim::refused);  // short
  CHECK(avail.claim_direct(5, false) == direct_claim::taken);    // every free block: keeps none
  CHECK(avail.closed_full());
  CHECK(avail.claim_direct(1, false) == direct_claim::refused);
  CHECK(avail.free(7) == avail_event::none);  // 7: still below
  slab_avail const other{word, 64, 3};
  CHECK(other.claim_direct(1, false) == direct_claim::gone);  // another class's claim
  CHECK(avail.free(1) == avail_event::listed);                // 8: listed
  CHECK(avail.claim_direct(1, false) == direct_claim::gone);  // no longer below
  CHECK(avail.claim_direct(3, true) == direct_claim::taken);  // 5 left, more than the 4 kept
  CHECK((word & avail_count_mask) == 5u);
}

TEST_CASE("a claim takes blocks straight from a listed slab, all or none, keeping some",
          "[reuse][avail]") {
  std::uint32_t word = 0;
  slab_avail const avail{word, 64, 2};  // threshold 8, keeps 4 for its next opening
  static_assert(direct_keep(64) == 4);
  avail.open_fresh();
  CHECK(avail.claim_direct(1, true) == direct_claim::gone);  // a slot holds it
  CHECK(avail.close(20) == avail_event::listed);
  CHECK(avail.claim_direct(10, true) == direct_claim::taken);
  CHECK((word & avail_count_mask) == 10u);
  CHECK((word & avail_listed) != 0);                            // still listed
  CHECK(avail.claim_direct(6, true) == direct_claim::refused);  // would leave no more than 4
  CHECK((word & avail_count_mask) == 10u);
  CHECK(avail.claim_direct(5, true) == direct_claim::taken);
  CHECK((word & avail_count_mask) == 5u);
  slab_avail const other{word, 64, 3};
  CHECK(avail.free(40) == avail_event::none);                // 45
  CHECK(other.claim_direct(1, true) == direct_claim::gone);  // another class's claim
  CHECK(avail.open_listed() == 34);                          // a slot opens it: 45 - 45 / 4
  CHECK(avail.claim_direct(1, true) == direct_claim::gone);
  CHECK(avail.close(34) == avail_event::listed);  // the slot gave its promise back: 45
  CHECK(avail.free(19) == avail_event::full_listed);
  // Every block free: the free that made it so takes it.
  CHECK(avail.claim_direct(1, true) == direct_claim::refused);
  CHECK(avail.take_full(avail.peek()));
}

TEST_CASE("frees racing past the threshold list the slab exactly once", "[reuse][avail]") {
  for (int round = 0; round < 200; ++round) {
    std::uint32_t word = 0;
    slab_avail const avail{word, 4096, 0};
    avail.open_fresh();
    CHECK(avail.close(0) == avail_event::below);
    std::atomic<int> listed{0};
    std::atomic<int> emptied{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 1024; ++i) {
          avail_event const e = avail.free(1);
          listed += e == avail_event::listed;
          emptied += e == avail_event::emptied;
        }
      });
    }
    for (auto& t : threads) {
      t.join();
    }
    REQUIRE(listed == 1);
    REQUIRE(emptied == 0);
    REQUIRE((word & avail_count_mask) == 4096);
  }
}

}  // namespace
