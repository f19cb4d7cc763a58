// A heap header over host memory with arenas of metadata only, for host tests of the slab
// supply and of what is built on it (the supply never touches a slab's memory).
#pragma once

#include <devmr/detail/heap/atomics.hpp>
#include <devmr/detail/heap/format.hpp>
#include <devmr/detail/heap/slab_supply.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace devmr_test {

using namespace devmr::detail::heap;

/// A header with arenas of metadata only (the supply never touches a slab's memory).
class supply_fixture {
 public:
  explicit supply_fixture(std::vector<std::uint64_t> const& arena_slabs)
      : header_{std::make_unique<heap_header>()} {
    initialize(*header_, false);
    for (std::uint64_t slabs : arena_slabs) {
      // Addresses only: slab memory is never read or written by the supply.
      auto* base = reinterpret_cast<std::byte*>(std::uintptr_t{1} << 40 << header_->arena_count);
      auto* meta = static_cast<slab_meta*>(
          std::aligned_alloc(alignof(slab_meta), slabs * sizeof(slab_meta)));
      std::memset(static_cast<void*>(meta), 0xa5, slabs * sizeof(slab_meta));
      auto* empty = static_cast<std::uint64_t*>(
          std::aligned_alloc(64, empty_words(slabs) * sizeof(std::uint64_t)));
      std::memset(empty, 0, empty_words(slabs) * sizeof(std::uint64_t));
      add_arena(*header_, arena_desc{base, meta, nullptr, nullptr, empty, slabs});
      memory_.push_back(meta);
      memory_.push_back(empty);
    }
  }
  ~supply_fixture() {
    for (void* p : memory_) {
      std::free(p);
    }
  }
  supply_fixture(supply_fixture const&) = delete;
  supply_fixture& operator=(supply_fixture const&) = delete;

  slab_supply supply() const { return slab_supply{header_.get()}; }
  heap_header& header() const { return *header_; }

  /// Returns single slab `id`, whose blocks were all freed: marked in its arena's bitmap.
  void give_back(std::uint32_t id) const {
    atomic(supply().meta(id).remaining).store(0, relaxed);
    supply().mark_empty(id);
  }
  /// give_back for a slab that take_one counted out: counted back too, as heap_slabs::give_empty
  /// does, so that a search that found nothing meanwhile looks again.
  void give_back_counted(std::uint32_t id) const {
    give_back(id);
    supply().count_given(arena_of(id), 1);
  }

 private:
  std::unique_ptr<heap_header> header_;
  std::vector<void*> memory_;
};

/// One slab from `supply`, as the heap's take_run takes one: a search, and while memory is in
/// flight (a word of marks or a run being moved by another thread), or came back meanwhile (a run's
/// remainder, or slabs given back), another search; no_slab only when a search found none with
/// nothing in flight and nothing back since it began. Up to 1000 searches, where take_run makes
/// 128: the tests run more threads than cores, and a thread in flight may wait for one. The slab
/// taken is counted out of the supply, as the heap counts a slab it formats (give_back_counted).
inline std::uint32_t take_one(slab_supply const& supply, heap_header& h, unsigned hint) {
  for (unsigned attempt = 0;; ++attempt) {
    std::uint64_t const returned = atomic(h.runs_returned.value).load(acquire);
    std::uint32_t const back = supply.slabs_back();
    std::uint32_t const id = supply.search_run(1, hint);
    if (id != no_slab) {
      supply.count_taken(arena_of(id), 1);  // as count_out does
      return id;
    }
    if (attempt == 1000) {
      return no_slab;
    }
    if (atomic(h.runs_in_flight.value).load(acquire) == 0 &&
        atomic(h.runs_returned.value).load(acquire) == returned && supply.slabs_back() == back) {
      return no_slab;
    }
    pause_briefly();
  }
}

}  // namespace devmr_test
