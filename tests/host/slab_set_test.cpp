// A set of slabs with its summaries (slab_set.hpp), a size class's list of slabs to reuse, driven
// from std::threads on host memory: no member lost, none taken twice.

#include "tsan.hpp"

#include <devmr/detail/heap/slab_set.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace {

using namespace devmr::detail::heap;
using devmr_test::under_tsan;

/// Clear words for a slab_set of `members` members, and the set over them. Not copied: a copy's
/// set would still point at the original's words.
struct set_words {
  explicit set_words(std::uint32_t members)
      : words(slab_set_words(members), 0), set{words.data(), bitmap_words_for(members)} {}
  set_words(set_words const&) = delete;
  set_words& operator=(set_words const&) = delete;
  std::vector<std::uint32_t> words;
  slab_set set;
};

TEST_CASE("a slab set hands each member out once and finds them through its summary",
          "[reuse][set]") {
  std::uint32_t const members = 5000;
  set_words mem{members};
  slab_set const& set = mem.set;
  CHECK(set.take(0) == no_member);
  for (std::uint32_t m : {7u, 4999u, 1024u, 1025u, 3000u}) {
    set.insert(m);
  }
  CHECK(set.erase(3000));
  CHECK_FALSE(set.erase(3000));
  std::vector<std::uint32_t> got;
  for (std::uint32_t m = set.take(3); m != no_member; m = set.take(3)) {
    got.push_back(m);
  }
  std::sort(got.begin(), got.end());
  CHECK(got == std::vector<std::uint32_t>{7, 1024, 1025, 4999});
  // Bare words lost their summary bits on the way, and bare summary words their top bits: a
  // search of an empty set is one load.
  for (std::uint32_t s = 0; s < set.summaries(); ++s) {
    CHECK(set.summary(s) == 0u);
  }
  CHECK(set.top(0) == 0u);
  // A member whose top bit is clear is not looked for (the bits lead the way down).
  set.insert(12);
  set.insert(12);  // a member already
  CHECK(set.top(0) == 1u);
  set.top(0) = 0;
  CHECK(set.take(0) == no_member);
  set.top(0) = 1;
  CHECK(set.take(0) == 12u);
  CHECK(set.top(0) == 0u);
}

TEST_CASE("a slab set's find leaves members in it and spreads over them", "[reuse][set]") {
  std::uint32_t const members = 100000;
  set_words mem{members};
  slab_set const& set = mem.set;
  CHECK(set.find(12345) == no_member);
  std::vector<std::uint32_t> const in{3, 40, 41, 70, 4100, 65000, 99999};
  for (std::uint32_t m : in) {
    set.insert(m);
  }
  std::set<std::uint32_t> found;
  for (std::uint32_t seed = 0; seed < 4096; ++seed) {
    std::uint32_t const m = set.find(spread_seed(seed));
    REQUIRE(std::find(in.begin(), in.end(), m) != in.end());
    found.insert(m);
  }
  CHECK(found.size() == in.size());  // every member, from one place or another
  for (std::uint32_t m : in) {       // and none taken
    CHECK(set.erase(m));
  }
  CHECK(set.find(7) == no_member);
}

TEST_CASE("a slab set's find tells an empty set from marks left on bare words", "[reuse][set]") {
  std::uint32_t const members = 100000;
  set_words mem{members};
  slab_set const& set = mem.set;
  set.insert(4100);
  set.insert(70000);
  // Bare words whose marks stay (as a member taken off by a racing search may leave them): find
  // reports them, so that the caller takes, which clears them.
  mem.words[4100 / bitmap_word_bits] = 0;
  mem.words[70000 / bitmap_word_bits] = 0;
  CHECK(set.find(12345) == stale_member);
  CHECK(set.take(0) == no_member);
  CHECK(set.find(12345) == no_member);
  // A member beside a stale mark is found, from any seed.
  set.insert(70001);
  mem.words[70001 / bitmap_word_bits] = 0;
  set.insert(99999);
  for (std::uint32_t seed = 0; seed < 64; ++seed) {
    CHECK(set.find(spread_seed(seed)) == 99999);
  }
  CHECK(set.take(0) == 99999);
  CHECK(set.find(5) == no_member);
}

TEST_CASE("a slab set of one summary word reads no top word", "[reuse][set]") {
  std::uint32_t const members = 1024;  // 32 words: one summary word, one top word
  set_words mem{members};
  slab_set const& set = mem.set;
  REQUIRE(set.summaries() == 1u);
  set.insert(5);
  set.insert(700);
  // The top bit is kept as in any set, but not read: the summary word alone leads the way down,
  // so a top word that says nothing hides no member from a find or a take.
  CHECK(set.top(0) == 1u);
  set.top(0) = 0;
  for (std::uint32_t seed = 0; seed < 64; ++seed) {
    std::uint32_t const m = set.find(spread_seed(seed));
    CHECK((m == 5u || m == 700u));
  }
  CHECK(set.take(0) == 5u);
  CHECK(set.take(0) == 700u);
  CHECK(set.take(0) == no_member);
  CHECK(set.find(3) == no_member);
  CHECK(set.summary(0) == 0u);
}

TEST_CASE("a slab set's guessing find takes a member of the word it guesses, else the summary's",
          "[reuse][set]") {
  std::uint32_t const members = 1024;  // 32 words, one summary word
  set_words mem{members};
  slab_set const& set = mem.set;
  CHECK(set.find_guessing(spread_seed(1)) == no_member);
  // One member: found from every seed, through the summary where the guess is another word.
  set.insert(700);
  for (std::uint32_t seed = 0; seed < 256; ++seed) {
    CHECK(set.find_guessing(spread_seed(seed)) == 700u);
  }
  // A member in every word: the guess alone finds them, spread over all the words.
  for (std::uint32_t w = 0; w < 32; ++w) {
    set.insert(w * bitmap_word_bits + 3);
  }
  set.erase(700);
  std::set<std::uint32_t> found;
  for (std::uint32_t seed = 0; seed < 4096; ++seed) {
    std::uint32_t const m = set.find_guessing(spread_seed(seed));
    REQUIRE(m % bitmap_word_bits == 3u);
    found.insert(m);
  }
  CHECK(found.size() == 32u);
  // The summary marks words, but none holds a member (their members taken by racing searches):
  // stale, as for find, unless the guess finds a member the summary does not mark.
  std::fill(mem.words.begin(), mem.words.begin() + 32, 0u);
  CHECK(set.summary(0) == ~0u);
  CHECK(set.find_guessing(spread_seed(9)) == stale_member);
  set.summary(0) = 0;
  mem.words[17] = 1u << 6;  // a member whose word is not marked yet (its insert is half done)
  std::uint32_t guessed = 0;
  for (std::uint32_t seed = 0; seed < 4096; ++seed) {
    std::uint32_t const m = set.find_guessing(spread_seed(seed));
    REQUIRE((m == no_member || m == 17 * bitmap_word_bits + 6));
    guessed += m != no_member ? 1 : 0;
  }
  CHECK(guessed > 0u);  // about one seed in 32
  CHECK(guessed < 512u);
  // A set with top words is looked at as find does.
  std::uint32_t const large = 100000;
  set_words more{large};
  slab_set const& wide = more.set;
  wide.insert(65000);
  CHECK(wide.find_guessing(spread_seed(3)) == 65000u);
  more.words[65000 / bitmap_word_bits] = 0;
  CHECK(wide.find_guessing(spread_seed(3)) == stale_member);
}

TEST_CASE("a large slab set finds members past its first top word, from any start",
          "[reuse][set]") {
  std::uint32_t const members = 200000;  // 6250 words, 196 summary words, 7 top words
  set_words mem{members};
  slab_set const& set = mem.set;
  REQUIRE(slab_set_words(members) == 6250 + 196 + 7);
  for (std::uint32_t start : {0u, 5u, 100u, 195u, 1000u}) {
    CAPTURE(start);
    CHECK(set.take(start) == no_member);
    set.insert(3);
    set.insert(199999);
    set.insert(70000);
    std::vector<std::uint32_t> got;
    for (std::uint32_t m = set.take(start); m != no_member; m = set.take(start)) {
      got.push_back(m);
    }
    std::sort(got.begin(), got.end());
    CHECK(got == std::vector<std::uint32_t>{3, 70000, 199999});
    for (std::uint32_t t = 0; t < 7; ++t) {
      CHECK(set.top(t) == 0u);
    }
  }
}

TEST_CASE("threads adding and taking slabs of a set lose none and take none twice",
          "[reuse][set][threads]") {
  // Four summary words, and one (whose top word no search reads).
  std::uint32_t const members = GENERATE(4096u, 1024u);
  CAPTURE(members);
  set_words mem{members};
  slab_set const& set = mem.set;
  std::vector<std::atomic<int>> held(members);
  for (std::uint32_t m = 0; m < members; m += 2) {
    set.insert(m);
    held[m] = 0;
  }
  std::atomic<int> twice{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng{t};
      for (int i = 0; i < (under_tsan ? 5000 : 50000); ++i) {
        std::uint32_t const m = set.take(rng() % 4);
        if (m == no_member) {
          continue;
        }
        if (held[m].fetch_add(1) != 0) {
          ++twice;
        }
        held[m].fetch_sub(1);
        set.insert(m);  // back, as a slab listed again
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  CHECK(twice == 0);
  std::uint32_t count = 0;
  while (set.take(0) != no_member) {
    ++count;
  }
  CHECK(count == members / 2);
  CHECK(set.top(0) == 0u);
}

TEST_CASE("threads taking and adding members of a few words leave every member in sight",
          "[reuse][set][threads]") {
  // Two members a word in two words: a take that leaves a word bare clears its summary bit
  // while other threads add members back to that word, whose adds found the bit still set and
  // set none. The clear must look at the word again, or such a member stays in the set where no
  // search finds it. Sets of four summary words and of one.
  std::uint32_t const members = GENERATE(4096u, 1024u);
  CAPTURE(members);
  set_words mem{members};
  slab_set const& set = mem.set;
  std::vector<std::uint32_t> const in{0, 1, 32, 33};
  for (std::uint32_t m : in) {
    set.insert(m);
  }
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < (under_tsan ? 20000 : 200000); ++i) {
        if (std::uint32_t const m = set.take(t % 2); m != no_member) {
          set.insert(m);
        }
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  std::vector<std::uint32_t> got;
  for (std::uint32_t m = set.take(0); m != no_member; m = set.take(0)) {
    got.push_back(m);
  }
  std::sort(got.begin(), got.end());
  CHECK(got == in);
}

}  // namespace
