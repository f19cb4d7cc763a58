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

/// Blocks of the smallest class in a slab: the most any slab holds, and the bits of the largest
/// block bitmap.
inline constexpr std::size_t max_blocks_per_slab = slab_bytes >> min_block_shift;

/// On a heap large enough that every class has every slot from the start (slot_width: fixed
/// widths), an install of a class of 64 B blocks or larger that takes empty slabs on a roomy
/// heap takes up to `run_slabs` of them in a row, and its slot hands out the blocks of all of
/// them in order, as the blocks of one slab: a slot of 4 KiB blocks then serves 64 warps between
/// installs instead of 8. Each slab of the row keeps its own count and bitmap, so that frees do
/// not know of rows, and a row that the supply cannot give is one slab.
inline constexpr std::uint32_t run_slabs = 8;
inline constexpr unsigned first_run_class = 2;  // 64 B blocks

/// A heap holds at most this many arenas (grow in larger steps past that).
inline constexpr unsigned max_arenas = 64;
/// Current-slab slots per size class; a warp uses its SM's, or a second one for the SM's odd
/// warps (class_slots.hpp: claim_hint), masked by its class's width.
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
/// that a slot word holds an id in 24 bits.
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

/// What a slab's state word says it is. Values below num_classes are the size class of a slab of
/// small blocks, which it keeps until its blocks are all free (and after, while it waits in the
/// supply: its free count then says it holds no class, see slab_avail).
enum slab_tag : std::uint32_t {
  tag_large = 0x80,  ///< first slab of a run that holds one large block
  tag_free = 0x81,   ///< first slab of a free run (on a stack, or being split)
  tag_body = 0x82,   ///< any later slab of a run; its head says what the run is
};

/// The state word of a slab: tag (bits 56-63) | fields (zero: room for later use).
DEVMR_HOST_DEVICE constexpr std::uint64_t make_state(std::uint32_t tag, std::uint64_t fields) {
  return (std::uint64_t{tag & 0xffu} << 56) | fields;
}
DEVMR_HOST_DEVICE constexpr std::uint32_t state_tag(std::uint64_t s) {
  return static_cast<std::uint32_t>(s >> 56);
}

/// A slot word (see class_slots.hpp) names its slab in bits 40-63. Ids that name no slab say
/// that the slot has none to hand out: empty_id, or an installing id.
inline constexpr unsigned slot_id_shift = 40;
/// The id of a slot with no slab.
inline constexpr std::uint32_t empty_id = (std::uint32_t{1} << (64 - slot_id_shift)) - 1;
/// Ids from `installing_first` to `installing_last` tell one installation from the next, so that
/// the claims waiting for one see it end. A waiter that waited too long takes the installation
/// over by swapping in the next id (they count down), and the others wait for it in turn: a
/// stalled installer costs one slab more, not one per waiting warp.
inline constexpr std::uint32_t installing_last = empty_id - 1;
inline constexpr std::uint32_t installing_first = empty_id - ((std::uint32_t{1} << 14) - 1);

/// Slabs an arena may have (240 GiB): every slab id stays below the installing ids.
inline constexpr std::uint64_t max_slabs_per_arena =
    (std::uint64_t{1} << arena_id_shift) - (std::uint64_t{1} << 14);
static_assert(((max_arenas - 1) << arena_id_shift | (max_slabs_per_arena - 1)) < installing_first);

DEVMR_HOST_DEVICE constexpr std::uint32_t slot_id(std::uint64_t w) {
  return static_cast<std::uint32_t>(w >> slot_id_shift);
}
/// True when a slot's id names a slab.
DEVMR_HOST_DEVICE constexpr bool is_slab(std::uint32_t id) {
  return id < installing_first;
}
/// The installing id that takes over from `id` (an installing id, a used-up slab, or empty).
DEVMR_HOST_DEVICE constexpr std::uint32_t next_installer(std::uint32_t id) {
  return id > installing_first && id <= installing_last ? id - 1 : installing_last;
}

/// A stack head: ABA tag (32 bits) | slab id of the top run (32 bits; no_slab when empty).
inline constexpr std::uint64_t empty_stack = no_slab;

/// A large run's `remaining` count while its one block is out. The free that gives the block
/// back leaves large_run_left, and returns the run to a stack; a checked free that finds
/// anything else reports a double free.
inline constexpr std::uint32_t large_run_count = 0x1ffffu;
inline constexpr std::uint32_t large_run_left = large_run_count - 1;

/// Metadata of one slab, kept apart from the slab's memory. One 128-byte line per slab (0.012% of
/// the slab): frees of neighbouring slabs, which a warp's blocks often are, then do not queue on
/// one line at the L2.
struct alignas(128) slab_meta {
  std::uint64_t state;      ///< see make_state; the tag says what the slab holds
  std::uint32_t remaining;  ///< a large run's count (large_run_count while its block is out);
                            ///< zero for a slab in the supply, which a search exchanges to
                            ///< acquire the frees of its last life (slab_supply::settle)
  std::uint32_t next;       ///< the run below this one on its free stack
  std::uint32_t length;     ///< run length in slabs (heads of runs only; small slabs leave it)
  std::uint32_t avail;      ///< a slab of small blocks: its free count, class and place (see
                            ///< slab_avail)
  std::uint32_t unused[26];
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

/// 32-bit words of one slab's block bitmap: room for the smallest class (8 KiB a slab, 0.8%).
inline constexpr std::size_t block_words_per_slab = max_blocks_per_slab / 32;

/// One arena: a slab-aligned range of memory taken from the pool, with its metadata. Written by
/// the host before the arena is published through heap_header::arena_count; never changed after.
struct arena_desc {
  std::byte* base;            ///< first slab
  slab_meta* meta;            ///< one per slab
  std::uint32_t* block_bits;  ///< block_words_per_slab words per slab: its free blocks (see
                              ///< block_bitmap.hpp)
  std::uint32_t* listed;      ///< 2 num_classes lists of slab_set_words(slabs) words, which
                              ///< start out clear: the slabs of each class with blocks to reuse,
                              ///< then those closed below the listing threshold (heap_slabs)
  std::uint64_t* empty_bits;  ///< empty_words(slabs) words: a bit is set while the slab it
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

/// The widths of the class slots (slot_width.hpp), alone in their line: a word that claims
/// change now and then, and the two figures of the heap's size that the host sets.
struct alignas(128) slot_shape {
  std::uint64_t widths;  ///< the classes that took an empty slab, and the slots each uses
  std::uint32_t base;    ///< slots of each class with every class in use, minus one
  std::uint32_t budget;  ///< slabs that the slots of all classes together may hold
  std::uint32_t roomy;   ///< while fewer slabs than this are out of the supply (see
                         ///< slab_supply::out_count), installs take empty slabs first
};

/// The slot words of one slot, one per class, alone in their line: the words that one SM's claims
/// add to, which no other SM's claims touch.
struct alignas(128) slot_line {
  std::uint64_t classes[num_classes];
};
static_assert(sizeof(slot_line) == 128);

/// Everything kernels need, in device-accessible memory; a slab_ref points at it.
struct heap_header {
  arena_desc arenas[max_arenas];
  std::uint64_t frontier[max_arenas];    ///< slabs of each arena handed out at least once
  std::uint32_t arena_count;             ///< arenas[0, arena_count) are published
  std::uint32_t checked;                 ///< nonzero: validate every free
  std::uint32_t rows;                    ///< nonzero: installs take rows of slabs (run_slabs)
  std::uint64_t free_runs[run_classes];  ///< runs of >= 2 slabs: Treiber stack heads ([0] unused)
  padded_word free_slabs[slab_shards];   ///< single slabs: Treiber stack heads, by SM
  padded_word runs_in_flight;   ///< runs popped to be split (or bitmap words taken) whose other
                                ///< slabs are not on a stack yet
  padded_word runs_returned;    ///< such slabs pushed so far (a failed search retries if this
                                ///< moved while it looked)
  padded_word slabs_in_flight;  ///< slabs that installs took and have not yet put in their
                                ///< slots (a failed search retries while there are some)
  padded_word slab_moves;       ///< slabs that closes put on a list or back in the supply so
                                ///< far (a failed search retries if this moved while it looked)
  /// Slabs of each arena out of the supply (formatted for a class, or in a large run) in the low
  /// half: while fewer than slot_shape::roomy are, installs take empty slabs first. Slabs given
  /// back so far in the high half (modulo 2^32), so that a search that found nothing sees that
  /// slabs came back while it looked (slab_supply::out_count, take_run).
  padded_word slabs_out[max_arenas];
  slot_shape slot_widths;  ///< the slots that each class uses
  heap_counters counters;
  /// Where each hint (SM) looks first in the empty-slab bitmaps: arena and word, packed as a
  /// slab id is. Only a hint: any value is safe.
  std::uint32_t empty_cursor[max_slots];
  /// The slots of the size classes (see class_slots.hpp), slot-major.
  slot_line slots[max_slots];
};

/// Slabs in the published arenas of `h`.
DEVMR_HOST_DEVICE inline std::uint64_t total_slabs(heap_header const& h) {
  std::uint64_t slabs = 0;
  for (std::uint32_t a = 0; a < h.arena_count; ++a) {
    slabs += h.arenas[a].slabs;
  }
  return slabs;
}

/// Blocks of class `cls` in a slab.
DEVMR_HOST_DEVICE constexpr std::uint32_t class_capacity(unsigned cls) {
  return static_cast<std::uint32_t>(slab_bytes >> (cls + min_block_shift));
}
/// Block size of class `cls`.
DEVMR_HOST_DEVICE constexpr std::size_t class_bytes(unsigned cls) {
  return std::size_t{1} << (cls + min_block_shift);
}

}  // namespace devmr::detail::heap
