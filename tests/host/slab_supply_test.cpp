// The heap's slab supply on its own, over host memory: fresh slabs from the arenas' frontiers,
// stacks of free slabs and runs, bitmaps of empty slabs, and the gathering of free slabs into
// long runs. No slab is handed out twice: every slab taken is owned through a table.

#include "supply_fixture.hpp"

#include <devmr/detail/heap/slab_supply.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace {

using namespace devmr::detail::heap;
using devmr_test::supply_fixture;

TEST_CASE("fresh slabs come from each arena's frontier in order, runs in one arena", "[supply]") {
  supply_fixture f{{8, 16}};
  slab_supply const s = f.supply();
  CHECK(s.take_fresh(3, 0) == make_slab_id(0, 0));
  CHECK(s.take_fresh(1, 0) == make_slab_id(0, 3));
  // Five do not fit in arena 0 (4 left): a run never spans arenas, it comes from arena 1.
  CHECK(s.take_fresh(5, 0) == make_slab_id(1, 0));
  CHECK(s.take_fresh(11, 0) == make_slab_id(1, 5));
  // Single slabs still find arena 0's last four, then none.
  for (std::uint32_t i = 4; i < 8; ++i) {
    CHECK(s.take_fresh(1, 0) == make_slab_id(0, i));
  }
  CHECK(s.take_fresh(1, 0) == no_slab);
}

TEST_CASE("a search takes a whole word of empty marks: one slab, the others on its shard",
          "[supply]") {
  supply_fixture f{{256}};
  slab_supply const s = f.supply();
  REQUIRE(s.take_fresh(256, 0) == make_slab_id(0, 0));  // every slab out
  for (std::uint32_t i : {3u, 5u, 9u, 70u}) {
    f.give_back(make_slab_id(0, i));
  }
  std::vector<std::uint32_t> got;
  for (std::uint32_t id = s.take_near(7); id != no_slab; id = s.take_near(7)) {
    got.push_back(id);
  }
  // The shard of hint 7 was empty and the frontier spent: take_near finds nothing...
  CHECK(got.empty());
  // ...and the far search takes word 0's three marks: one for the caller, two on shard 7.
  std::uint32_t const first = s.take_far(7);
  CHECK(first == make_slab_id(0, 3));
  CHECK(s.take_near(7) != no_slab);
  CHECK(s.take_near(7) != no_slab);
  CHECK(s.take_near(7) == no_slab);
  CHECK(s.take_far(7) == make_slab_id(0, 70));  // the next word, found through the summary
  CHECK(s.take_far(7) == no_slab);
}

TEST_CASE("free slabs in a row merge into a run; a longer run is split", "[supply]") {
  supply_fixture f{{64}};
  slab_supply const s = f.supply();
  REQUIRE(s.take_fresh(64, 0) == make_slab_id(0, 0));
  for (std::uint32_t i = 10; i < 20; ++i) {
    f.give_back(make_slab_id(0, i));
  }
  CHECK(s.find_marked_run(11) == no_slab);
  std::uint32_t const run = s.find_marked_run(6);
  CHECK(run == make_slab_id(0, 10));
  // The run goes back whole, as a large block's free returns it, and serves a shorter request
  // by splitting: the rest goes back on its stack.
  atomic(s.meta(run).length).store(6, relaxed);
  s.retire(run, 0);
  CHECK(s.search_run(4, 0) == run);
  CHECK(s.search_run(2, 0) == run + 4);
  CHECK(s.search_run(2, 0) == no_slab);
}

TEST_CASE("a run on the stack below a request's serves it only if long enough", "[supply]") {
  supply_fixture f{{64}};
  slab_supply const s = f.supply();
  REQUIRE(s.take_fresh(64, 0) == make_slab_id(0, 0));  // no fresh slab left
  std::uint32_t const run = make_slab_id(0, 8);
  atomic(s.meta(run).length).store(5, relaxed);
  s.retire(run, 0);                      // on the stack of runs of 4 to 7 slabs
  CHECK(s.search_run(6, 0) == no_slab);  // too short: back on its stack
  CHECK(s.search_run(5, 0) == run);      // none on the stack of 8 to 15: this one fits
  CHECK(s.search_run(5, 0) == no_slab);
}

TEST_CASE("a marked run is a row of marks with no gap; a failed take puts its marks back",
          "[supply]") {
  supply_fixture f{{128}};
  slab_supply const s = f.supply();
  REQUIRE(s.take_fresh(128, 0) == make_slab_id(0, 0));
  for (std::uint32_t i : {0u, 1u, 2u, 4u, 5u, 6u, 7u, 8u, 9u}) {
    f.give_back(make_slab_id(0, i));
  }
  CHECK(s.find_marked_run(7) == no_slab);
  CHECK(s.find_marked_run(6) == make_slab_id(0, 4));
  // Slabs 60 to 69 but 66, across two words of marks: a take of all ten clears word 0's four
  // marks, finds slab 66 unmarked in word 1, and puts the four back.
  for (std::uint32_t i = 60; i < 70; ++i) {
    if (i != 66) {
      f.give_back(make_slab_id(0, i));
    }
  }
  CHECK_FALSE(s.take_marked_run(make_slab_id(0, 60), 10));
  CHECK(s.find_marked_run(6) == make_slab_id(0, 60));
  CHECK(s.find_marked_run(3) == make_slab_id(0, 0));
  CHECK(s.find_marked_run(3) == make_slab_id(0, 67));
  CHECK(s.find_marked_run(1) == no_slab);
}

TEST_CASE("threads returning and taking the slabs of one word of marks leave every mark in sight",
          "[supply][threads]") {
  // A search takes a word's marks at once (take_word), so the word goes bare often while other
  // threads mark it again: a search that clears the summary bit of a bare word must look at the
  // word again, or a mark made meanwhile stays where no search through the summary finds it.
  supply_fixture f{{64}};
  slab_supply const s = f.supply();
  REQUIRE(s.take_fresh(64, 0) == make_slab_id(0, 0));
  for (std::uint32_t i = 0; i < 64; ++i) {
    f.give_back(make_slab_id(0, i));
  }
  std::vector<std::atomic<int>> owner(64);
  std::atomic<int> twice{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200000; ++i) {
        // As take_far searches, less its probe at the hint's cursor, which would find a mark
        // whose word lost its summary bit: the search through the summary alone.
        auto const hint = static_cast<unsigned>(t);
        std::uint32_t id = s.take_near(hint);
        if (std::uint32_t const at = id == no_slab ? s.find_marked_word(hint) : no_slab;
            at != no_slab) {
          id = s.take_word(arena_of(at), index_of(at), hint);
        }
        if (id == no_slab) {
          continue;
        }
        if (owner[index_of(id)].exchange(t + 1) != 0) {
          ++twice;
        }
        owner[index_of(id)].store(0);
        f.give_back(id);
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  CHECK(twice == 0);
  s.mark_all_free();  // the slabs on the shards, marked too
  CHECK(s.find_marked_run(64) == make_slab_id(0, 0));
}

/// What threads that take slabs and give them back saw.
struct sharing {
  int twice;  ///< slabs taken while another thread held them
  int none;   ///< takes that found no slab
};

/// Eight threads, `rounds` steps each: two steps in three take a slab with `take(thread)` while
/// the thread holds fewer than `most`, the others give the last one back with `give(id)`; a
/// thread gives back what it holds at its end. `index(id)` numbers the slabs below `slabs`.
template <class Take, class Give, class Index>
sharing take_and_give(
    int rounds, std::size_t most, std::size_t slabs, Take take, Give give, Index index) {
  std::vector<std::atomic<int>> owner(slabs);
  std::atomic<int> twice{0};
  std::atomic<int> none{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::uint32_t> held;
      for (int i = 0; i < rounds; ++i) {
        if (held.size() < most && i % 3 != 2) {
          std::uint32_t const id = take(static_cast<unsigned>(t));
          if (id == no_slab) {
            ++none;
            continue;
          }
          if (owner[index(id)].exchange(t + 1) != 0) {
            ++twice;
          }
          held.push_back(id);
        } else if (!held.empty()) {
          owner[index(held.back())].store(0);
          give(held.back());
          held.pop_back();
        }
      }
      for (std::uint32_t id : held) {
        owner[index(id)].store(0);
        give(id);
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  return {twice.load(), none.load()};
}

TEST_CASE("threads popping and pushing one stack never take a slab twice", "[supply][threads]") {
  // Every thread pops and pushes one stack word, so that pops often lose their CAS and retry
  // from the head another thread left: a retry must read the next link of the slab now on top.
  supply_fixture f{{256}};
  slab_supply const s = f.supply();
  std::uint64_t stack = empty_stack;
  for (std::uint32_t i = 0; i < 256; ++i) {
    s.push_chain(stack, make_slab_id(0, i), make_slab_id(0, i));
  }
  sharing const seen_by_threads = take_and_give(
      100000, 4, 256, [&](unsigned) { return s.pop(stack); },
      [&](std::uint32_t id) { s.push_chain(stack, id, id); },
      [](std::uint32_t id) { return index_of(id); });
  CHECK(seen_by_threads.twice == 0);
  // Every slab is on the stack once.
  std::vector<int> seen(256);
  std::uint32_t popped = 0;
  for (std::uint32_t id = s.pop(stack); id != no_slab && popped <= 256; id = s.pop(stack)) {
    ++seen[index_of(id)];
    ++popped;
  }
  CHECK(popped == 256);
  CHECK(std::count(seen.begin(), seen.end(), 1) == 256);
}

// A give of n slabs is one addition to its arena's word: n fewer out (the low half), n more given
// back so far (the high half).
static_assert(std::uint64_t{5} + out_word_back(2) == (std::uint64_t{2} << 32 | 3));
static_assert((std::uint64_t{7} << 32 | 4) + out_word_back(4) == std::uint64_t{11} << 32);

TEST_CASE("threads taking and returning single slabs never share one", "[supply][threads]") {
  supply_fixture f{{512, 512}};
  slab_supply const s = f.supply();
  sharing const seen = take_and_give(
      20000, 64, 2 * 512, [&](unsigned t) { return devmr_test::take_one(s, f.header(), t); },
      [&](std::uint32_t id) { f.give_back_counted(id); },
      [](std::uint32_t id) { return arena_of(id) * 512 + index_of(id); });
  CHECK(seen.twice == 0);
  CHECK(seen.none == 0);  // 8 x 64 held at most: 1024 slabs always leave some
  // Every slab is back: marked with those on stacks and the fresh ones, they gather into one
  // run per arena.
  s.mark_all_free();
  CHECK(s.find_marked_run(512) != no_slab);
  CHECK(s.find_marked_run(512) != no_slab);
  CHECK(s.find_marked_run(1) == no_slab);
}

}  // namespace
