#pragma once

// The memory layout of a slab heap: constants, the header that kernels see, per-slab metadata and
// the encodings of the words that are updated atomically. Everything here is plain data, shared
// by host code (formatting, tests over host memory) and device code.

#include <devmr/detail/config.hpp>

#include <cstddef>
#include <cstdint>

namespace devmr::detail::heap {

/// A slab is the unit the heap hands out: 1 MiB, aligned to its size within its arena. Large
/// enough that a slab of 4 KiB blocks serves 8 warps between replacements.
inline constexpr unsigned slab_shift = 20;
inline constexpr std::size_t slab_bytes = std::size_t{1} << slab_shift;

/// Small blocks come in size classes: powers of two from 16 B to half a slab.
inline constexpr unsigned min_block_shift = 4;
inline constexpr unsigned max_small_shift = slab_shift - 1;
inline constexpr unsigned num_classes = max_small_shift - min_block_shift + 1;
inline constexpr std::size_t max_small_bytes = std::size_t{1} << max_small_shift;

/// Two neighbouring classes share slabs: group g holds the blocks of class 2g (its small class)
/// from the slab's start upwards and those of class 2g + 1 (its large class, twice the size) from
/// the slab's end downwards, until the two fronts meet. A warp that frees blocks of every size
/// from 16 B to 4 KiB then frees into five slabs, not nine: one atomic per slab (2^22 threads
/// freeing mixed sizes: 0.43x of the floor with slabs of one class, 0.53x with slabs of two;
/// bench/RESULTS.md).
inline constexpr unsigned num_groups = num_classes / 2;
static_assert(num_classes % 2 == 0);

DEVMR_HOST_DEVICE constexpr unsigned group_of(unsigned cls) {
  return cls / 2;
}
DEVMR_HOST_DEVICE constexpr bool is_large_class(unsigned cls) {
  return (cls & 1u) != 0;
}
/// log2 of the size of group `g`'s small blocks: the unit its slabs are counted in.
DEVMR_HOST_DEVICE constexpr unsigned unit_shift(unsigned g) {
  return 2 * g + min_block_shift;
}
/// Units (small blocks) in a slab of group `g`; a large block takes two.
DEVMR_HOST_DEVICE constexpr std::uint32_t group_units(unsigned g) {
  return static_cast<std::uint32_t>(slab_bytes >> unit_shift(g));
}

/// Units per slab of the smallest group. A checked heap's bitmap of a slab has a bit for each
/// small block, then one for each large block: half as many.
inline constexpr std::size_t max_blocks_per_slab = slab_bytes >> min_block_shift;
inline constexpr std::size_t check_words_per_slab = max_blocks_per_slab * 3 / 2 / 64;

/// A heap holds at most this many arenas (grow in larger steps past that).
inline constexpr unsigned max_arenas = 64;
/// Current-slab slots per size class; a warp uses the slot of its SM (masked).
inline constexpr unsigned max_slots = 256;
/// Free runs of slabs are kept in stacks by floor(log2(length)); single free slabs in
/// `slab_shards` stacks, so that SMs do not meet on one word. A small slab whose blocks were all
/// freed is only marked, by a bit of its arena's bitmap (see arena_desc::empty_bits): the free
/// that empties it costs one more atomic (its result says whether to set the summary bit too),
/// and no other thread waits for it. A search for a slab takes a whole word of marks at once,
/// keeps one slab and pushes the others on its own stack. A search for a run that no stack can
/// serve marks every free run and slab there too, and looks for marks in a row: that is how free
/// slabs merge into long runs.
inline constexpr unsigned run_classes = 32;
inline constexpr unsigned slab_shards = 128;
/// Shards looked at together when a thread's own shard is empty.
inline constexpr unsigned shard_scan_width = 8;
static_assert(slab_shards % shard_scan_width == 0);

/// A slab id names a slab by arena and index: arena in bits 18-23, index in the low 18 bits, so
/// that a slot word (see make_slot) holds an id in 24 bits.
inline constexpr unsigned arena_id_shift = 18;
inline constexpr std::uint32_t slab_index_mask = (std::uint32_t{1} << arena_id_shift) - 1;
inline constexpr std::uint32_t no_slab = 0xffffffffu;

DEVMR_HOST_DEVICE constexpr std::uint32_t make_slab_id(std::uint32_t arena, std::uint32_t index) {
  return (arena << arena_id_shift) | index;
}
DEVMR_HOST_DEVICE constexpr std::uint32_t arena_of(std::uint32_t id) {
  return id >> arena_id_shift;
}
DEVMR_HOST_DEVICE constexpr std::uint32_t index_of(std::uint32_t id) {
  return id & slab_index_mask;
}

/// What a slab's state word says it is. Values below num_groups are groups of small blocks.
enum slab_tag : std::uint32_t {
  tag_large = 0x80,  ///< first slab of a run that holds one large block
  tag_free = 0x81,   ///< first slab of a free run (on a stack, or being split)
  tag_body = 0x82,   ///< any later slab of a run; its head says what the run is
};

/// The state word of a slab: tag (bits 56-63) | fields (low 41 bits). While a slot of its group
/// counts a small slab's claims the fields are `open_state | slot` (and pending frees, see
/// pending_field); once its claims end they are the blocks it handed out, as a slot word counts
/// them (make_fronts). Other slabs hold 0.
DEVMR_HOST_DEVICE constexpr std::uint64_t make_state(std::uint32_t tag, std::uint64_t fields) {
  return (std::uint64_t{tag & 0xffu} << 56) | fields;
}
DEVMR_HOST_DEVICE constexpr std::uint32_t state_tag(std::uint64_t s) {
  return static_cast<std::uint32_t>(s >> 56);
}
DEVMR_HOST_DEVICE constexpr std::uint64_t state_fields(std::uint64_t s) {
  return s & ((std::uint64_t{1} << 56) - 1);
}
/// Marks the fields of a small slab's state while a slot holds it (open_slot): the blocks it
/// handed out are in the slot's counts.
inline constexpr std::uint64_t open_state = std::uint64_t{1} << 40;
/// An open state's fields also hold the frees left pending while the slab's claims end
/// (pending_top): one more than the unit at which the last such block starts (0: none), in bits
/// 8-25; each pending block holds the next one's in its first 4 bytes. The claim or the close
/// that ends the claims frees them (see heap_core::free_pending).
inline constexpr unsigned pending_shift = 8;
inline constexpr std::uint64_t pending_field = std::uint64_t{0x3ffff} << pending_shift;
static_assert(max_slots <= (1u << pending_shift) && max_blocks_per_slab < 0x3ffff);

/// A current-slab slot of a group: slab id (bits 40-63) | large blocks claimed (bits 20-39) |
/// small blocks claimed (bits 0-19). A claim adds the blocks it wants of each class to the whole
/// word, one atomic: the value it gets back names the slab and the first blocks that are its own,
/// small ones from the slab's start, large ones from its end (none once the two fronts meet:
/// `units` at or past the group's units). Ids that name no slab (empty_id and the installing ids
/// below) say that the slot has no slab to claim from. With both counts zero the slot is vacant:
/// the claim whose addition finds the zeros installs the next slab, with no other atomic to elect
/// it; the claims behind it find counts above zero and wait for it. Whoever replaces such a value
/// discards the counts. A slab whose fronts meet exactly elects the same way: the claim that
/// took its last blocks got all it wanted and installed nothing, and the claim that finds that
/// value installs. A claim that finds the fronts met adds once and then waits by loads, so that
/// a count grows past the units by at most 32 blocks a warp: 20 bits hold 65536 units and every
/// warp of the largest GPUs.
inline constexpr unsigned slot_count_bits = 20;
inline constexpr std::uint32_t slot_count_mask = (std::uint32_t{1} << slot_count_bits) - 1;
inline constexpr unsigned slot_id_shift = 2 * slot_count_bits;
/// The id of a slot with no slab.
inline constexpr std::uint32_t empty_id = (std::uint32_t{1} << (64 - slot_id_shift)) - 1;
/// Ids from `installing_first` to `installing_last` tell one installation from the next, so that
/// the claims waiting for one see it end. A waiter that waited too long takes the installation
/// over by swapping in the next id (they count down), and the others wait for it in turn: a
/// stalled installer costs one slab more, not one per waiting warp. An installer that finds no
/// slab leaves the slot vacant under the next id, and the waiters claim again.
inline constexpr std::uint32_t installing_last = empty_id - 1;
inline constexpr std::uint32_t installing_first = empty_id - ((std::uint32_t{1} << 14) - 1);

/// Slabs an arena may have (240 GiB): every slab id stays below the installing ids.
inline constexpr std::uint64_t max_slabs_per_arena =
    (std::uint64_t{1} << arena_id_shift) - (std::uint64_t{1} << 14);
static_assert(((max_arenas - 1) << arena_id_shift | (max_slabs_per_arena - 1)) < installing_first);

/// The counts of a slot word (or of a closed slab's state): `small` | `large` << 20.
DEVMR_HOST_DEVICE constexpr std::uint64_t make_fronts(std::uint32_t small, std::uint32_t large) {
  return std::uint64_t{small} | (std::uint64_t{large} << slot_count_bits);
}
DEVMR_HOST_DEVICE constexpr std::uint64_t make_slot(std::uint32_t id,
                                                    std::uint32_t small,
                                                    std::uint32_t large = 0) {
  return (std::uint64_t{id} << slot_id_shift) | make_fronts(small, large);
}
DEVMR_HOST_DEVICE constexpr std::uint32_t slot_id(std::uint64_t w) {
  return static_cast<std::uint32_t>(w >> slot_id_shift);
}
/// Small blocks counted (in a slot word, or a closed slab's state).
DEVMR_HOST_DEVICE constexpr std::uint32_t small_count(std::uint64_t w) {
  return static_cast<std::uint32_t>(w) & slot_count_mask;
}
/// Large blocks counted.
DEVMR_HOST_DEVICE constexpr std::uint32_t large_count(std::uint64_t w) {
  return static_cast<std::uint32_t>(w >> slot_count_bits) & slot_count_mask;
}
/// Units counted: a large block takes two.
DEVMR_HOST_DEVICE constexpr std::uint32_t unit_count(std::uint64_t w) {
  return small_count(w) + 2 * large_count(w);
}
/// True when a slot's id names a slab.
DEVMR_HOST_DEVICE constexpr bool is_slab(std::uint32_t id) {
  return id < installing_first;
}
/// True when slot value `w` is vacant: no slab, and no claim since (see make_fronts).
DEVMR_HOST_DEVICE constexpr bool is_vacant(std::uint64_t w) {
  return !is_slab(slot_id(w)) && unit_count(w) == 0;
}
/// The installing id that takes over from `id` (an installing id, a used-up slab, or empty).
DEVMR_HOST_DEVICE constexpr std::uint32_t next_installer(std::uint32_t id) {
  return id > installing_first && id <= installing_last ? id - 1 : installing_last;
}
inline constexpr std::uint64_t empty_slot = make_slot(empty_id, 0);

/// The slot that a small slab's open state (open_state | pending | slot) names.
DEVMR_HOST_DEVICE constexpr unsigned open_slot(std::uint64_t fields) {
  return static_cast<unsigned>(fields) & ((1u << pending_shift) - 1);
}
/// The pending frees of a small slab's open state (or of the whole state word): one more than
/// the unit of the last, or 0.
DEVMR_HOST_DEVICE constexpr std::uint32_t pending_top(std::uint64_t fields) {
  return static_cast<std::uint32_t>((fields & pending_field) >> pending_shift);
}
/// The fronts of slab `id` of group `g` from `w`, a value of the slot its open state names: true,
/// and `fronts` set, while the slot still names the slab and its fronts have not met (the counts
/// are then exact); false while its claims are ending or once they ended.
DEVMR_HOST_DEVICE constexpr bool open_fronts(std::uint64_t w,
                                             std::uint32_t id,
                                             unsigned g,
                                             std::uint64_t& fronts) {
  if (slot_id(w) != id || unit_count(w) >= group_units(g)) {
    return false;
  }
  fronts = make_fronts(small_count(w), large_count(w));
  return true;
}

/// A stack head: ABA tag (32 bits) | slab id of the top run (32 bits; no_slab when empty).
inline constexpr std::uint64_t empty_stack = no_slab;

/// A slab's `remaining` count: the units not freed (nor given back) in its low 17 bits, and
/// minus the large blocks freed, modulo 2^15, in its high 15 bits (for statistics), so that one
/// 32-bit atomic frees a warp's blocks of both classes of a slab (a 64-bit one cost single-size
/// frees about a tenth of the floor on the H200).
inline constexpr unsigned remaining_unit_bits = 17;
inline constexpr std::uint32_t remaining_unit_mask = (std::uint32_t{1} << remaining_unit_bits) - 1;
static_assert(max_blocks_per_slab <= remaining_unit_mask);

/// What freeing `small` small and `large` large blocks of a group's slab subtracts from its
/// `remaining`.
DEVMR_HOST_DEVICE constexpr std::uint32_t freed_blocks(std::uint32_t small, std::uint32_t large) {
  return small + 2 * large + (large << remaining_unit_bits);
}
/// The units of a `remaining` count.
DEVMR_HOST_DEVICE constexpr std::uint32_t remaining_units(std::uint32_t r) {
  return r & remaining_unit_mask;
}
/// The large blocks freed since a slab was formatted, modulo 2^15, from its `remaining` count.
DEVMR_HOST_DEVICE constexpr std::uint32_t large_freed(std::uint32_t r) {
  return (0u - (r >> remaining_unit_bits)) & (remaining_unit_mask >> 2);
}

/// The `remaining` count of a large run while its one block is out: units that no group's slab
/// has. The free that gives the block back (one unit) leaves large_run_left, and returns the run
/// to a stack without reading the slab's state.
inline constexpr std::uint32_t large_run_count = remaining_unit_mask;
inline constexpr std::uint32_t large_run_left = large_run_count - 1;

/// Metadata of one slab, kept apart from the slab's memory. One 128-byte line per slab (0.012% of
/// the slab): frees of neighbouring slabs, which a warp's blocks often are, then do not queue on
/// one line at the L2 (measured on the H200: free rows at 2^22 threads +0.02x to +0.04x of the
/// floor against 32-byte entries).
struct alignas(128) slab_meta {
  std::uint64_t state;      ///< see make_state; updated atomically
  std::uint32_t remaining;  ///< units not freed nor given back, and large blocks freed (see
                            ///< freed_blocks; the group's units at format; large_run_count for a
                            ///< large run)
  std::uint32_t next;       ///< the run below this one on its free stack
  std::uint32_t length;     ///< run length in slabs (heads of runs only; small slabs leave it)
  std::uint32_t unused[27];
};
static_assert(sizeof(slab_meta) == 128);

/// Words of an arena's bitmap of empty slabs: one bit per slab.
DEVMR_HOST_DEVICE constexpr std::uint64_t empty_bitmap_words(std::uint64_t slabs) {
  return (slabs + 63) / 64;
}
/// The words of the bitmaps of empty slabs lie one to a 128-byte line. A kernel that frees every
/// block empties neighbouring slabs at about the same time, and the L2 queues atomics on one line:
/// with 16 words to a line, 2^22 threads freeing 4 KiB blocks (16384 slabs emptied, on 16 lines)
/// ran at 0.31x of the floor, against 0.39x with one word to a line, on the H200. The bitmaps
/// take 2 bytes per slab of 1 MiB.
inline constexpr std::uint64_t empty_word_stride = 128 / sizeof(std::uint64_t);
/// Where word `w` of an arena's bitmap of empty slabs lies in `arena_desc::empty_bits`; the words
/// of the summary follow those of the bitmap.
DEVMR_HOST_DEVICE constexpr std::uint64_t empty_word_index(std::uint64_t w) {
  return w * empty_word_stride;
}
/// Words an arena keeps for its empty slabs: the bitmap, then a summary of it with one bit per
/// bitmap word (set when the word may have marks), so that a search skips 4096 slabs a load;
/// each word alone in its line (see empty_word_stride).
DEVMR_HOST_DEVICE constexpr std::uint64_t empty_words(std::uint64_t slabs) {
  return empty_word_index(empty_bitmap_words(slabs) + (empty_bitmap_words(slabs) + 63) / 64);
}

/// One arena: a slab-aligned range of memory taken from the pool, with its metadata. Written by
/// the host before the arena is published through heap_header::arena_count; never changed after.
struct arena_desc {
  std::byte* base;            ///< first slab
  slab_meta* meta;            ///< one per slab
  std::uint64_t* check_bits;  ///< check_words_per_slab words per slab on checked heaps, else null
  std::uint64_t* empty_bits;  ///< empty_words(slabs) words: a bit is set while the small slab it
                              ///< stands for has had every block freed and waits to be taken;
                              ///< the summary follows the bitmap
  std::uint64_t slabs;        ///< number of slabs
};

/// Misuse and failure counters, written with relaxed atomics off the fast path.
struct heap_counters {
  std::uint64_t failed_allocations;  ///< allocations that returned nullptr for lack of memory
  std::uint64_t bad_alignments;      ///< alignments that are not a power of two (or > a slab)
  std::uint64_t invalid_frees;       ///< pointers that no block of this heap starts at
  std::uint64_t double_frees;        ///< blocks freed when already free (checked heaps)
};

/// A word alone in its 128-byte line: heads that many SMs update at once.
struct alignas(128) padded_word {
  std::uint64_t value;
};

/// The slot words of one slot, one per group, alone in their line.
struct alignas(128) slot_line {
  std::uint64_t groups[num_groups];
};

/// Everything kernels need, in device-accessible memory; a slab_ref points at it.
struct heap_header {
  arena_desc arenas[max_arenas];
  std::uint64_t frontier[max_arenas];  ///< slabs of each arena handed out at least once
  std::uint32_t arena_count;           ///< arenas[0, arena_count) are published
  std::uint32_t slot_mask;             ///< slots in use per group, minus one (a power of two)
  std::uint32_t checked;               ///< nonzero: validate every free, keep block bitmaps
  std::uint32_t unused;
  std::uint64_t free_runs[run_classes];  ///< runs of >= 2 slabs: Treiber stack heads ([0] unused)
  padded_word free_slabs[slab_shards];   ///< single slabs: Treiber stack heads, by SM
  padded_word runs_in_flight;  ///< runs popped to be split (or bitmap words taken) whose other
                               ///< slabs are not on a stack yet
  padded_word runs_returned;   ///< such slabs pushed so far (a failed search retries if this
                               ///< moved while it looked)
  padded_word idle_slots;      ///< nonzero while slots may hold slabs that no claim took a
                               ///< block from (priming sets it; a full reclaim scan that finds
                               ///< none clears it)
  heap_counters counters;
  /// Where each hint (SM) looks first in the empty-slab bitmaps: arena and word, packed as a
  /// slab id is. Only a hint: any value is safe.
  std::uint32_t empty_cursor[max_slots];
  /// Current-slab slots (see make_slot), by slot, then group: the words that one SM's claims add
  /// to share a line, which no other SM's claims touch (see slot_word_of).
  slot_line slots[max_slots];
  /// Spare slabs, by slot, then group: one per slot and group at most, formatted for the slot
  /// by prime, which the slot's next install takes instead of searching for a slab and
  /// formatting it (no_slab: none; see heap_core::add_spare). Not in the slots' lines: there
  /// the install's exchange waited behind the polls of the claims waiting for it (2^16
  /// threads, 4 KiB blocks: 0.765 of the floor beside the slot words, 0.788 here).
  std::uint32_t spares[max_slots][num_groups];
};

/// Slabs in the published arenas of `h`.
DEVMR_HOST_DEVICE inline std::uint64_t heap_slabs(heap_header const& h) {
  std::uint64_t slabs = 0;
  for (std::uint32_t a = 0; a < h.arena_count; ++a) {
    slabs += h.arenas[a].slabs;
  }
  return slabs;
}

/// The slot word of group `g` in slot `slot`.
DEVMR_HOST_DEVICE inline std::uint64_t& slot_word_of(heap_header& h, unsigned g, unsigned slot) {
  return h.slots[slot].groups[g];
}
DEVMR_HOST_DEVICE inline std::uint64_t slot_word_of(heap_header const& h,
                                                    unsigned g,
                                                    unsigned slot) {
  return h.slots[slot].groups[g];
}

/// The spare slab of group `g` in slot `slot` (see heap_header::spares).
DEVMR_HOST_DEVICE inline std::uint32_t& spare_word_of(heap_header& h, unsigned g, unsigned slot) {
  return h.spares[slot][g];
}

/// Blocks of class `cls` that a slab holds when it holds no other class.
DEVMR_HOST_DEVICE constexpr std::uint32_t class_capacity(unsigned cls) {
  return static_cast<std::uint32_t>(slab_bytes >> (cls + min_block_shift));
}
/// Block size of class `cls`.
DEVMR_HOST_DEVICE constexpr std::size_t class_bytes(unsigned cls) {
  return std::size_t{1} << (cls + min_block_shift);
}

}  // namespace devmr::detail::heap
