#pragma once

// A view of one heap's header: its arena table, each slab's metadata and memory, and which slab
// a pointer lies in. What every mechanism of the heap's core reads first.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/atomics.hpp>
#include <devmr/detail/heap/layout.hpp>

#include <cuda/std/bit>

#include <cstddef>
#include <cstdint>

namespace devmr::detail::heap {

/// Sets `word`, a count in the heap's metadata, to zero by an atomic AND; the caller's acquire
/// fence follows. On the device a relaxed `red` on global memory, where the metadata lies, whose
/// result nobody waits for (the generic atomic of atomic_ref makes a gather of the whole 24 GiB
/// heap, one count per slab, 6.45 ms instead of 5.67 on the H200). On the host the AND
/// acquires itself: ThreadSanitizer, which the host tests run under, does not see fences.
DEVMR_HOST_DEVICE inline void clear_count(std::uint32_t& word) {
#if DEVMR_IS_DEVICE_CODE
  asm volatile("red.relaxed.gpu.global.and.b32 [%0], 0;"
               :
               : "l"(__cvta_generic_to_global(&word))
               : "memory");
#else
  atomic(word).fetch_and(0, acquire);
#endif
}

/// Reads a word of the arena table. Kernels see the table as read-only (the host changes it only
/// between launches), so device code reads it through the non-coherent cache.
template <class T>
DEVMR_HOST_DEVICE T read_only(T const& word) {
#if DEVMR_IS_DEVICE_CODE
  static_assert(sizeof(T) == 8 || sizeof(T) == 4);
  if constexpr (sizeof(T) == 8) {
    return cuda::std::bit_cast<T>(__ldg(reinterpret_cast<unsigned long long const*>(&word)));
  } else {
    return cuda::std::bit_cast<T>(__ldg(reinterpret_cast<unsigned int const*>(&word)));
  }
#else
  return word;
#endif
}

/// A view of one heap's header.
class heap_view {
 public:
  DEVMR_HOST_DEVICE explicit heap_view(heap_header* header) : h_{header} {}

  DEVMR_HOST_DEVICE heap_header* header() const { return h_; }

  /// What the fast paths need of one arena's table entry.
  struct arena_view {
    std::byte* base;
    slab_meta* meta;
    std::uint64_t slabs;

    /// True when `p` lies in this arena; `off`: its offset from the arena's base.
    DEVMR_HOST_DEVICE bool holds(void const* p, std::uintptr_t& off) const {
      off = reinterpret_cast<std::uintptr_t>(p) - reinterpret_cast<std::uintptr_t>(base);
      return off < (slabs << slab_shift);
    }
  };

  /// Reads arena `a`'s entry. The fast paths read arena 0's (where most slabs live) ahead, before
  /// their first atomic, so that the loads overlap it instead of following it: an acquire
  /// invalidates the SM's L1, and a load after one is a round trip to L2.
  DEVMR_HOST_DEVICE arena_view arena(std::uint32_t a) const {
    arena_desc const& d = h_->arenas[a];
    return {read_only(d.base), read_only(d.meta), read_only(d.slabs)};
  }

  DEVMR_HOST_DEVICE slab_meta& meta(std::uint32_t id, arena_view const& first) const {
    slab_meta* const metas =
        arena_of(id) == 0 ? first.meta : read_only(h_->arenas[arena_of(id)].meta);
    return metas[index_of(id)];
  }
  DEVMR_HOST_DEVICE std::byte* data(std::uint32_t id, arena_view const& first) const {
    std::byte* const base =
        arena_of(id) == 0 ? first.base : read_only(h_->arenas[arena_of(id)].base);
    return base + (std::size_t{index_of(id)} << slab_shift);
  }
  DEVMR_HOST_DEVICE slab_meta& meta(std::uint32_t id) const {
    return read_only(h_->arenas[arena_of(id)].meta)[index_of(id)];
  }
  DEVMR_HOST_DEVICE std::byte* data(std::uint32_t id) const {
    return read_only(h_->arenas[arena_of(id)].base) + (std::size_t{index_of(id)} << slab_shift);
  }
  /// The first word of slab `id`'s block bitmap (block_words_per_slab words).
  DEVMR_HOST_DEVICE std::uint32_t* block_bits(std::uint32_t id) const {
    return read_only(h_->arenas[arena_of(id)].block_bits) +
           std::size_t{index_of(id)} * block_words_per_slab;
  }

  /// Finds the slab that holds `p`: its id and the offset of `p` in it. False when no arena of
  /// this heap holds `p`. `first` is arena 0's entry, read ahead; every heap has arena 0 (a
  /// header's unpublished entries are zero and hold nothing), so it is looked at before the count.
  DEVMR_HOST_DEVICE bool locate(void const* p,
                                arena_view const& first,
                                std::uint32_t& id,
                                std::size_t& offset) const {
    arena_view arena = first;
    for (std::uint32_t a = 0;;) {
      std::uintptr_t off = 0;
      if (arena.holds(p, off)) {
        id = make_slab_id(a, static_cast<std::uint32_t>(off >> slab_shift));
        offset = off & (slab_bytes - 1);
        return true;
      }
      if (++a >= read_only(h_->arena_count)) {  // read here: most blocks lie in arena 0
        return false;
      }
      arena = this->arena(a);
    }
  }
  DEVMR_HOST_DEVICE bool locate(void const* p, std::uint32_t& id, std::size_t& offset) const {
    return locate(p, arena(0), id, offset);
  }

 protected:
  heap_header* h_;
};

}  // namespace devmr::detail::heap
