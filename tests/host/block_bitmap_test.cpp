// The block bitmap of a slab (block_bitmap.hpp) and the bit picks it uses (bits.hpp), driven from
// std::threads on host memory: each freed block is handed out once.

#include "tsan.hpp"

#include <devmr/detail/heap/bits.hpp>
#include <devmr/detail/heap/block_bitmap.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

namespace {

using namespace devmr::detail::heap;
using devmr_test::under_tsan;

TEST_CASE("lowest_bits picks the n lowest set bits", "[reuse][bitmap]") {
  CHECK(lowest_bits(0b1011'0110u, 0) == 0u);
  CHECK(lowest_bits(0b1011'0110u, 1) == 0b10u);
  CHECK(lowest_bits(0b1011'0110u, 3) == 0b1'0110u);
  CHECK(lowest_bits(0b1011'0110u, 5) == 0b1011'0110u);
  CHECK(lowest_bits(0b1011'0110u, 32) == 0b1011'0110u);
  CHECK(lowest_bits(~0u, 31) == 0x7fff'ffffu);
}

TEST_CASE("set_bit_index finds every set bit by its number", "[reuse][bitmap]") {
  // Against a plain walk over the bits, on words of every density.
  std::uint32_t x = 0x9e3779b9u;
  for (int trial = 0; trial < 2000; ++trial) {
    x = x * 1664525u + 1013904223u;
    std::uint32_t const word = trial % 3 == 0 ? x : (trial % 3 == 1 ? x & (x >> 7) : x | (x << 5));
    unsigned n = 0;
    for (std::uint32_t bit = 0; bit < 32; ++bit) {
      if ((word >> bit) & 1u) {
        REQUIRE(set_bit_index(word, n) == bit);
        ++n;
      }
    }
  }
  CHECK(set_bit_index(~0u, 31) == 31u);
  CHECK(set_bit_index(0x8000'0000u, 0) == 31u);
}

TEST_CASE("nth_set_bit picks a set bit, each as often for spread picks", "[reuse][bitmap]") {
  // Every pick is a set bit, and the picks of 0 .. 2^12 - 1 (the narrowest range a caller
  // passes: a seed's top 12 bits) share the set bits out evenly, within two picks of an equal
  // share.
  for (std::uint32_t const x :
       {0b1011'0110u, 0x8000'0001u, 0xffff'ffffu, 0x0000'0100u, 0x1248'8421u}) {
    CAPTURE(x);
    std::vector<unsigned> hits(32, 0);
    for (std::uint32_t k = 0; k < 4096; ++k) {
      std::uint32_t const b = nth_set_bit(x, k);
      REQUIRE(b < 32u);
      REQUIRE((x >> b & 1u) != 0);
      ++hits[b];
    }
    unsigned const n = popcount32(x);
    for (unsigned b = 0; b < 32; ++b) {
      if ((x >> b & 1u) != 0) {
        CHECK(hits[b] + 2 >= 4096 / n);
        CHECK(hits[b] <= 4096 / n + 2);
      }
    }
  }
  CHECK(nth_set_bit(0x8000'0000u, 12345) == 31u);
}

TEST_CASE("a block bitmap hands out each freed block once", "[reuse][bitmap]") {
  for (bool const whole : {false, true}) {
    CAPTURE(whole);
    std::vector<std::uint32_t> words(4, 0xdeadbeefu);
    block_bitmap const bm{words.data(), 4};
    bm.clear();
    CHECK(bm.take_some(0, 5, whole) == 0u);
    bm.give_range(3, 70);  // words 0 (bits 3..31), 1 (all), 2 (bits 0..5)
    CHECK(words[0] == 0xffff'fff8u);
    CHECK(words[1] == ~0u);
    CHECK(words[2] == 0x3fu);
    CHECK(words[3] == 0u);
    std::vector<std::uint32_t> got;
    bm.take(2, 67, whole, [&](std::uint32_t w, std::uint32_t bits) {
      for (; bits != 0; bits &= bits - 1) {
        got.push_back(w * 32 + lowest_bit_index(bits));
      }
    });
    REQUIRE(got.size() == 67);
    std::sort(got.begin(), got.end());
    for (std::uint32_t i = 0; i < 67; ++i) {
      CHECK(got[i] == 3 + i);
    }
    CHECK(words[0] == 0u);
    CHECK(words[1] == 0u);
    CHECK(words[2] == 0u);
    bm.give_block(100);
    CHECK(words[3] == (1u << 4));
  }
}

TEST_CASE("a whole-word take keeps the lowest bits it needs and gives the others back",
          "[reuse][bitmap]") {
  std::vector<std::uint32_t> words(2, 0);
  block_bitmap const bm{words.data(), 2};
  words[1] = 0b1011'0110u;
  CHECK(bm.take_whole(1, 2) == 0b110u);
  CHECK(words[1] == 0b1011'0000u);
  CHECK(bm.take_whole(1, 32) == 0b1011'0000u);
  CHECK(words[1] == 0u);
  CHECK(bm.take_whole(1, 3) == 0u);
  CHECK(bm.take_whole(0, 1) == 0u);
}

TEST_CASE("threads taking bitmap words whole and giving blocks back never share a block",
          "[reuse][bitmap]") {
  // Every block has an owner flag: a thread that took a block must find it unowned; it keeps it
  // a while, then gives it back. Takes and gives race on the same few words.
  constexpr std::uint32_t word_count = 4;
  constexpr std::uint32_t blocks = word_count * bitmap_word_bits;
  std::vector<std::uint32_t> words(word_count, 0);
  block_bitmap const bm{words.data(), word_count};
  bm.give_range(0, blocks);
  std::vector<std::atomic<int>> owner(blocks);
  std::atomic<int> shared{0};
  std::atomic<long> taken{0};
  unsigned const threads = 8;
  int const rounds = under_tsan ? 2000 : 20000;
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937 rng{t + 1};
      std::vector<std::uint32_t> held;
      for (int r = 0; r < rounds; ++r) {
        std::uint32_t const w = rng() % word_count;
        std::uint32_t bits = bm.take_whole(w, 1 + rng() % 6);
        for (; bits != 0; bits &= bits - 1) {
          std::uint32_t const b = w * bitmap_word_bits + lowest_bit_index(bits);
          if (owner[b].exchange(1) != 0) {
            shared.fetch_add(1);
          }
          held.push_back(b);
          taken.fetch_add(1);
        }
        while (held.size() > 8 || (!held.empty() && rng() % 2 == 0)) {
          std::uint32_t const b = held.back();
          held.pop_back();
          owner[b].store(0);
          bm.give_block(b);
        }
      }
      for (std::uint32_t const b : held) {
        owner[b].store(0);
        bm.give_block(b);
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  CHECK(shared.load() == 0);
  CHECK(taken.load() > rounds);
  for (std::uint32_t w = 0; w < word_count; ++w) {
    CHECK(words[w] == ~0u);  // every block back
  }
}

}  // namespace
