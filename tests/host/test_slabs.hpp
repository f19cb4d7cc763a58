#pragma once

// For host tests of the reuse path (class_lists, class_slots): a set of small slabs in host
// memory, with their counts, bitmaps, lists and a stack of empty slabs, and the Slabs policy
// over them.

#include "../slab_stack.hpp"

#include <devmr/detail/heap/atomics.hpp>
#include <devmr/detail/heap/block_bitmap.hpp>
#include <devmr/detail/heap/slab_set.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace devmr_test {

using namespace devmr::detail::heap;

/// Slabs of 16 KiB in host memory: class c holds blocks of 16 << c bytes, 1024 >> c of them.
struct test_slab_memory {
  static constexpr unsigned slab_shift = 14;
  static constexpr std::uint32_t max_blocks = 1024;
  /// Classes whose lists the memory holds: each has a list of slabs to reuse and one of slabs
  /// closed below the listing threshold.
  static constexpr unsigned list_classes = 4;

  explicit test_slab_memory(std::uint32_t count)
      : slabs{count},
        data{static_cast<std::byte*>(std::aligned_alloc(4096, std::size_t{count} << slab_shift))},
        avail(count, 0xa5a5a5a5u),
        next(count, 0),
        cls(count, 0xffu),
        bits(std::size_t{count} * bitmap_words_for(max_blocks), 0xa5a5a5a5u),
        owner(std::size_t{count} * max_blocks),
        listed(std::size_t{2 * list_classes} * (slab_set_words(count) + 64), 0) {
    for (std::uint32_t id = count; id-- > 0;) {
      empty().push(id);
    }
  }
  ~test_slab_memory() { std::free(data); }
  test_slab_memory(test_slab_memory const&) = delete;
  test_slab_memory& operator=(test_slab_memory const&) = delete;

  struct link {
    std::vector<std::uint32_t>* next;
    std::uint32_t& operator()(std::uint32_t id) const { return (*next)[id]; }
  };
  slab_stack<link> empty() { return {empty_head, link{&next}}; }

  std::uint32_t slabs;
  std::byte* data;
  std::vector<std::uint32_t> avail;
  std::vector<std::uint32_t> next;
  std::vector<std::uint32_t> cls;
  std::vector<std::uint32_t> bits;
  std::vector<std::atomic<std::uint32_t>> owner;  // 0: nobody
  std::vector<std::uint32_t> listed;              // sets of slabs: per class (and part of the heap)
  std::uint64_t empty_head = empty_slab_stack;
  std::atomic<std::uint64_t> empties{0};
  std::uint64_t in_flight = 0;       // slabs that installs hold
  std::uint64_t moves = 0;           // slabs put on a list or back among the empty ones
  bool roomy = false;                // what Slabs::roomy says: false, unless a test sets it
  std::atomic<std::int64_t> out{0};  // slabs formatted for a class and not emptied since
};

/// The Slabs policy of class_slots and class_lists over test_slab_memory, with its own stack of
/// empty slabs.
struct test_slabs {
  test_slab_memory* m;

  std::uint32_t dense(std::uint32_t id) const { return id; }  // index into test_slab_memory
  std::uint32_t id_of(std::uint32_t dense) const { return dense; }

  std::uint32_t blocks(unsigned c) const { return test_slab_memory::max_blocks >> c; }
  std::uint32_t& avail(std::uint32_t id) const { return m->avail[id]; }
  std::uint32_t* bits(std::uint32_t id) const {
    return &m->bits[std::size_t{id} * bitmap_words_for(test_slab_memory::max_blocks)];
  }
  std::uint32_t list_parts() const { return 1; }
  slab_set listed(unsigned c, std::uint32_t) const {
    return {&m->listed[c * slab_set_words(m->slabs)], bitmap_words_for(m->slabs)};
  }
  slab_set below(unsigned c, std::uint32_t part) const {
    return listed(test_slab_memory::list_classes + c, part);
  }
  std::uint32_t member(std::uint32_t id) const { return id; }
  std::uint32_t part_of(std::uint32_t) const { return 0; }
  std::uint32_t slab_of(std::uint32_t, std::uint32_t member) const { return member; }
  void format(std::uint32_t id, unsigned c) const { atomic(m->cls[id]).store(c, relaxed); }
  bool roomy() const { return m->roomy; }
  void count_out(std::uint32_t) const { m->out.fetch_add(1, std::memory_order_relaxed); }
  bool bump_fresh() const { return true; }
  std::uint64_t& in_flight() const { return m->in_flight; }
  std::uint64_t& moves() const { return m->moves; }
  std::uint32_t take_empty(unsigned) const { return m->empty().pop(); }
  void give_empty(std::uint32_t id, unsigned) const {
    atomic(m->cls[id]).store(0xffu, relaxed);
    m->empties.fetch_add(1, std::memory_order_relaxed);
    m->out.fetch_sub(1, std::memory_order_relaxed);
    m->empty().push(id);
  }
};

}  // namespace devmr_test
