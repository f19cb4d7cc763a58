#pragma once

// The heap's supply of slabs: where a slab comes from when a slot needs one or a large block
// needs a run, and where it goes when its blocks are all free.
//  - Fresh slabs: each arena hands out its slabs in order from a frontier, formatted as they are
//    taken, so that setup does not grow with the heap.
//  - Single free slabs: Treiber stacks in shards (an SM uses its own first); slabs whose blocks
//    were all freed are only marked, by a bit of their arena's bitmap of empty slabs (with a
//    summary of one bit per bitmap word), and a search takes a whole word of marks at once,
//    keeping one slab and pushing the others on its own shard.
//  - Runs of slabs for large blocks: stacks by floor(log2(length)), split for shorter requests;
//    when no run is long enough, the search gathers one from marks in a row in the bitmaps, after
//    marking every run and slab resting on a stack there too, so that free slabs merge again.
// Memory taken off a stack or a bitmap and not yet put back is counted in flight, so that a search
// that misses it looks again instead of reporting the heap out of memory.

#include <devmr/detail/config.hpp>
#include <devmr/detail/heap/atomics.hpp>
#include <devmr/detail/heap/bits.hpp>
#include <devmr/detail/heap/heap_view.hpp>
#include <devmr/detail/heap/layout.hpp>
#include <devmr/detail/heap/out_of_line.hpp>

#include <cuda/std/bit>

#include <cstddef>
#include <cstdint>

namespace devmr::detail::heap {

/// What a give of `n` slabs adds to its arena's word of slabs out of the supply
/// (slab_supply::out_count): n less in the low half, n more in the high half.
DEVMR_HOST_DEVICE constexpr std::uint64_t out_word_back(std::uint64_t n) {
  return (n << 32) - n;
}

/// The slab supply of one heap (see the top of this file).
class slab_supply : public heap_view {
 public:
  using heap_view::heap_view;

  /// Marks the run at `id` (a freed large block) free and puts it on its stack: its slabs are
  /// back in the supply (out_count).
  DEVMR_HOST_DEVICE void retire(std::uint32_t id, unsigned) const {
    atomic(meta(id).state).store(make_state(tag_free, 0), relaxed);
    std::uint32_t const length = atomic(meta(id).length).load(relaxed);
    count_given(arena_of(id), length);
    push_run(id, length);
  }

  /// One slab from anywhere but the fresh slabs, for a caller that found this hint's shard
  /// empty: marked slabs near this hint's cursor, then anywhere, the shards (in groups of
  /// shard_scan_width, from the hint's own group on), a piece of a longer run; no_slab if none.
  DEVMR_HOST_DEVICE std::uint32_t take_far(unsigned hint) const {
    std::uint32_t id = take_empty(hint, false);
    if (id == no_slab) {
      id = take_empty(hint, true);
    }
    constexpr unsigned groups = slab_shards / shard_scan_width;
    for (unsigned g = 0; id == no_slab && g < groups; ++g) {
      id = pop_any_shard((hint / shard_scan_width + g) % groups * shard_scan_width);
    }
    for (unsigned c = 1; id == no_slab && c < run_classes; ++c) {
      id = pop_run(c, 1, hint);
    }
    if (id != no_slab) {
      settle(id);
    }
    return id;
  }

  /// Orders the last life of slab `id`, taken off a stack or a bitmap, before its next use: an
  /// acquire of the `remaining` count that whoever gave the slab back left (zero). A slab of
  /// small blocks was given back by the thread that emptied it, which acquired every free of
  /// its blocks (slab_avail::settle) and marked it with a release; a large run by the free of
  /// its block (a release). It writes the zero back. Slabs that nobody gave back (runs, fresh
  /// slabs) read any count, harmlessly.
  DEVMR_HOST_DEVICE void settle(std::uint32_t id) const { settle(meta(id)); }
  /// The same, for the slab whose metadata is `m`.
  DEVMR_HOST_DEVICE static void settle(slab_meta& m) { atomic(m.remaining).exchange(0, acquire); }

  /// One slab from this hint's shard or the fresh ones; no_slab when neither has one.
  DEVMR_HOST_DEVICE std::uint32_t take_near(unsigned hint) const {
    std::uint64_t& shard = shard_head(hint);
    return take_near(hint, shard, atomic(shard).load(relaxed));
  }

  /// The same, where the caller loaded the shard's head `top` already.
  DEVMR_HOST_DEVICE std::uint32_t take_near(unsigned hint,
                                            std::uint64_t& shard,
                                            std::uint64_t top) const {
    slab_meta* m = nullptr;
    std::uint32_t const id = pop(shard, top, m);
    if (id == no_slab) {
      return take_fresh(1, hint);  // never handed out: no frees to order before its use
    }
    settle(*m);  // with the address the pop read before its acquires emptied the SM's L1
    return id;
  }

  /// Takes a run of `slabs` contiguous slabs and returns the id of its first, or no_slab. The run
  /// is the caller's to format. A run being split (or a word of marks being taken) is off its
  /// stack for a moment: a search that found nothing while one was (or whose remainder came back
  /// meanwhile) looks again, a bounded number of times, so that memory in flight is not reported
  /// as missing. The first search takes no snapshot of the returns (an acquire load that would
  /// hold back every load after it, a round trip on every take): only once it has found nothing
  /// do the careful searches begin. Slabs given back while it looked (the count of slabs back)
  /// may lie where it had looked already: it looks again then too. A slow path: its callers call
  /// it out of line (out_of_line.hpp).
  DEVMR_HOST_DEVICE std::uint32_t take_run(std::uint32_t slabs, unsigned hint) const {
    if (std::uint32_t const id = out_of_line<&slab_supply::search_run>(*this, slabs, hint);
        id != no_slab) {
      return id;
    }
    for (unsigned attempt = 0;; ++attempt) {
      std::uint64_t const returned = atomic(h_->runs_returned.value).load(acquire);
      std::uint32_t const back = slabs_back();
      std::uint32_t const id = out_of_line<&slab_supply::search_run>(*this, slabs, hint);
      if (id != no_slab || attempt == 128) {
        return id;
      }
      // acquire: pairs with the release in pop_run, so a retry sees the remainder pushed back.
      // Slabs given back meanwhile may lie where the search had looked already: it looks again.
      if (atomic(h_->runs_in_flight.value).load(acquire) == 0 &&
          atomic(h_->runs_returned.value).load(acquire) == returned && slabs_back() == back) {
        return no_slab;
      }
      pause_briefly();
    }
  }

  /// One search for a run of `slabs` slabs (see take_run).
  DEVMR_HOST_DEVICE std::uint32_t search_run(std::uint32_t slabs, unsigned hint) const {
    if (slabs == 1) {
      std::uint32_t const id = take_near(hint);
      return id != no_slab ? id : out_of_line<&slab_supply::take_far>(*this, hint);
    }
    unsigned const fits = ceil_log2(slabs);  // every run on this stack is long enough
    std::uint32_t id = pop_run(fits, slabs, hint);
    if (id == no_slab) {
      id = take_fresh(slabs, hint);
    }
    for (unsigned c = fits + 1; id == no_slab && c < run_classes; ++c) {
      id = pop_run(c, slabs, hint);
    }
    if (id == no_slab && fits > 1) {  // runs on the stack below may still be long enough
      id = pop_run(fits - 1, slabs, hint);
    }
    return id;
  }

  /// `slabs` (2 to 64) empty slabs in a row, for an install whose slot hands out the blocks of
  /// all of them (layout.hpp, run_slabs): from the marks of the bitmap word under this hint's
  /// cursor, or of the first word with marks from there on (moving the cursor there), else from
  /// a free run on the stack of runs as long or longer (a large block's, freed), else from the
  /// fresh slabs. Returns the first slab's id, with `slabs` from bit 56 (a row), or no_slab
  /// when none of these has a row: the caller takes one slab as it would otherwise. A row taken
  /// from the marks leaves the other marks of its word where they are. A slow path: called out
  /// of line.
  DEVMR_HOST_DEVICE std::uint64_t take_row(std::uint32_t slabs, unsigned hint) const {
    std::uint32_t const arenas = read_only(h_->arena_count);
    std::uint32_t at = atomic(h_->empty_cursor[hint % max_slots]).load(relaxed);
    std::uint32_t id = no_slab;
    for (unsigned look = 0; look < 2 && id == no_slab; ++look) {
      if (look == 1) {
        at = find_marked_word(hint);
        if (at == no_slab) {
          break;
        }
        atomic(h_->empty_cursor[hint % max_slots]).store(at, relaxed);
      }
      std::uint32_t const a = arena_of(at) < arenas ? arena_of(at) : 0;
      std::uint32_t const w = index_of(at) < bitmap_words(a) ? index_of(at) : 0;
      id = take_row_in(a, w, slabs);
    }
    if (id == no_slab) {
      id = pop_run(ceil_log2(slabs), slabs, hint);
    }
    if (id == no_slab) {
      id = take_fresh(slabs, hint);
    }
    return id == no_slab ? no_slab : id | (std::uint64_t{slabs} << 56);
  }

  /// The bits of `marks` that stand for its first `slabs` marks in a row (0 when there are none).
  DEVMR_HOST_DEVICE static std::uint64_t first_row(std::uint64_t marks, std::uint32_t slabs) {
    std::uint64_t starts = marks;  // bit i: marks i to i + slabs - 1 all set
    for (std::uint32_t s = 1; s < slabs; ++s) {
      starts &= marks >> s;
    }
    std::uint64_t const ones = slabs == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << slabs) - 1;
    return starts == 0 ? 0 : ones << cuda::std::countr_zero(starts);
  }

  /// Takes the first `slabs` marks in a row of word `w` of arena `a`'s bitmap of empty slabs,
  /// clearing only those; no_slab when the word has no such row.
  DEVMR_HOST_DEVICE std::uint32_t take_row_in(std::uint32_t a,
                                              std::uint32_t w,
                                              std::uint32_t slabs) const {
    auto word = atomic(empty_word(a, w));
    std::uint64_t marks = word.load(relaxed);
    for (std::uint64_t row = first_row(marks, slabs); row != 0; row = first_row(marks, slabs)) {
      // acq_rel: pairs with the release in mark (the frees of every block happened before).
      if (word.compare_exchange_weak(marks, marks & ~row, acq_rel, relaxed)) {
        return make_slab_id(a, w * 64 + static_cast<std::uint32_t>(cuda::std::countr_zero(row)));
      }
    }
    return no_slab;
  }

  /// Sets `marks` in the bitmap word whose first slab is `row` (nothing for no_slab).
  DEVMR_HOST_DEVICE void flush_marks(std::uint32_t row, std::uint64_t marks) const {
    if (row != no_slab) {
      mark(arena_of(row), index_of(row) / 64, marks);
    }
  }

  /// Takes the first `slabs` marks in a row in any arena's bitmap; no_slab when there are none.
  /// The summaries skip bare stretches of 64 words.
  DEVMR_HOST_DEVICE std::uint32_t find_marked_run(std::uint32_t slabs) const {
    std::uint32_t const arenas = read_only(h_->arena_count);
    DEVMR_ROLLED for (std::uint32_t a = 0; a < arenas; ++a) {
      auto const words = static_cast<std::uint32_t>(bitmap_words(a));
      std::uint32_t start = 0;  // the row of marks seen last: its first slab and its length
      std::uint32_t length = 0;
      DEVMR_ROLLED for (std::uint32_t w = 0; w < words; ++w) {
        if (w % 64 == 0 && atomic(empty_word(a, words + w / 64)).load(relaxed) == 0) {
          length = 0;
          w += 63;  // 64 bare words
          continue;
        }
        std::uint64_t const marks = atomic(empty_word(a, w)).load(relaxed);
        DEVMR_ROLLED for (unsigned b = 0; b < 64;) {
          std::uint64_t const rest = marks >> b;
          if ((rest & 1) == 0) {
            length = 0;
            b += rest == 0 ? 64 - b : static_cast<unsigned>(cuda::std::countr_zero(rest));
            continue;
          }
          auto const ones = static_cast<unsigned>(cuda::std::countr_one(rest));
          if (length == 0) {
            start = w * 64 + b;
          }
          length += ones;
          b += ones;
          if (length >= slabs) {
            if (take_marked_run(make_slab_id(a, start), slabs)) {
              return make_slab_id(a, start);
            }
            length = 0;  // taken by others meanwhile: look on
          }
        }
      }
    }
    return no_slab;
  }

  /// Clears the marks of slabs [id, id + slabs) if they are all set, word by word; puts back the
  /// ones it cleared when one is gone. Counted in flight meanwhile (see take_run).
  DEVMR_HOST_DEVICE bool take_marked_run(std::uint32_t id, std::uint32_t slabs) const {
    std::uint32_t const first = index_of(id);
    std::uint32_t const end = first + slabs;
    begin_in_flight();
    std::uint32_t w = first / 64;
    bool taken = true;
    DEVMR_ROLLED for (; w * 64 < end && taken; ++w) {
      std::uint64_t const mask = marks_between(w, first, end);
      auto word = atomic(empty_word(arena_of(id), w));
      std::uint64_t seen = word.load(relaxed);
      // acq_rel: pairs with the release of the marks, as take_word's exchange does.
      while ((seen & mask) == mask && !word.compare_exchange_weak(seen, seen & ~mask, acq_rel)) {
      }
      taken = (seen & mask) == mask;
    }
    if (!taken) {  // words [first / 64, w - 1) were cleared: put their marks back
      DEVMR_ROLLED for (std::uint32_t u = first / 64; u + 1 < w; ++u) {
        mark(arena_of(id), u, marks_between(u, first, end));
      }
    }
    end_in_flight(!taken);
    if (taken) {
      // As settle does for one slab, with one fence: each slab's count is cleared by an atomic
      // AND, which reads the zero that the frees of a slab emptied by small blocks left, and
      // the fence acquires them.
      DEVMR_ROLLED for (std::uint32_t i = 0; i < slabs; ++i) {
        clear_count(meta(id + i).remaining);
      }
      cuda::atomic_thread_fence(acquire, cuda::thread_scope_device);
      DEVMR_ROLLED for (std::uint32_t i = 1; i < slabs; ++i) {
        atomic(meta(id + i).state).store(make_state(tag_body, 0), relaxed);
      }
    }
    return taken;
  }

  /// The bits of bitmap word `w` that stand for slabs [first, end).
  DEVMR_HOST_DEVICE static std::uint64_t marks_between(std::uint32_t w,
                                                       std::uint32_t first,
                                                       std::uint32_t end) {
    std::uint32_t const low = first > w * 64 ? first - w * 64 : 0;
    std::uint32_t const high = end < w * 64 + 64 ? end - w * 64 : 64;
    std::uint64_t const below_high =
        high == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << high) - 1;
    return below_high & ~((std::uint64_t{1} << low) - 1);
  }

  /// Marks in the bitmaps every free run and slab resting on a stack, and the fresh slabs of every
  /// arena (the frontiers move to the ends); true when there was one. Counted in flight meanwhile.
  DEVMR_HOST_DEVICE bool mark_all_free() const {
    begin_in_flight();
    bool moved = false;
    // The stacks of runs, whose heads know their length, then the shards of single slabs (some
    // of them body slabs of former runs, whose length fields mean nothing).
    DEVMR_ROLLED for (unsigned i = 1; i < run_classes + slab_shards; ++i) {
      bool const runs = i < run_classes;
      std::uint64_t& word = runs ? h_->free_runs[i] : shard_head(i - run_classes);
      if (static_cast<std::uint32_t>(atomic(word).load(relaxed)) == no_slab) {
        continue;
      }
      DEVMR_ROLLED for (std::uint32_t id = pop(word); id != no_slab; id = pop(word)) {
        mark_slabs(id, runs ? atomic(meta(id).length).load(relaxed) : 1);
        moved = true;
      }
    }
    std::uint32_t const arenas = read_only(h_->arena_count);
    DEVMR_ROLLED for (std::uint32_t a = 0; a < arenas; ++a) {
      auto const size = static_cast<std::uint32_t>(read_only(h_->arenas[a].slabs));
      if (atomic(h_->frontier[a]).load(relaxed) >= size) {
        continue;
      }
      std::uint64_t const first = atomic(h_->frontier[a]).exchange(size, relaxed);
      if (first < size) {
        // Not formatted since the heap began (or was reset): a body slab's state is neutral for
        // whoever takes it, and for the statistics, which now scan them.
        std::uint32_t const id = make_slab_id(a, static_cast<std::uint32_t>(first));
        auto const slabs = static_cast<std::uint32_t>(size - first);
        make_body(id);
        mark_body(id, slabs);
        mark_slabs(id, slabs);
        moved = true;
      }
    }
    end_in_flight(moved);
    return moved;
  }

  /// Marks slabs [id, id + slabs) empty.
  DEVMR_HOST_DEVICE void mark_slabs(std::uint32_t id, std::uint32_t slabs) const {
    std::uint32_t const first = index_of(id);
    DEVMR_ROLLED for (std::uint32_t w = first / 64; w * 64 < first + slabs; ++w) {
      mark(arena_of(id), w, marks_between(w, first, first + slabs));
    }
  }

  /// Pops a run from stack `cls` and cuts `slabs` slabs off it (the rest goes back), or puts it
  /// back if it is too short. Counted in flight meanwhile.
  DEVMR_HOST_DEVICE std::uint32_t pop_run(unsigned cls, std::uint32_t slabs, unsigned hint) const {
    if (static_cast<std::uint32_t>(atomic(h_->free_runs[cls]).load(relaxed)) == no_slab) {
      return no_slab;  // cheap look first: most stacks are empty most of the time
    }
    begin_in_flight();
    std::uint32_t id = pop(h_->free_runs[cls]);
    bool pushed_back = false;
    if (id != no_slab) {
      std::uint32_t const length = atomic(meta(id).length).load(relaxed);
      if (length < slabs) {
        push(id, hint);
        id = no_slab;
        pushed_back = true;
      } else if (length > slabs) {
        split(id, slabs, hint);
        pushed_back = true;
      }
    }
    end_in_flight(pushed_back);
    return id;
  }

  /// Counts free memory as off every stack and bitmap for a moment (a run being split, a bitmap
  /// word or a row of marks being taken, stacks being moved into the bitmaps): a search that
  /// finds nothing meanwhile looks again (see take_run).
  DEVMR_HOST_DEVICE void begin_in_flight() const {
    // acq_rel: a searcher that sees the memory gone (the release of its taking) sees the count.
    atomic(h_->runs_in_flight.value).fetch_add(1, acq_rel);
  }

  /// Ends what begin_in_flight began; `returned`: some of that memory is back where searches look.
  DEVMR_HOST_DEVICE void end_in_flight(bool returned) const {
    if (returned) {
      // release: the memory is back before a searcher sees this count move.
      atomic(h_->runs_returned.value).fetch_add(1, release);
    }
    // release: the memory is back before a searcher sees the count drop.
    atomic(h_->runs_in_flight.value).fetch_sub(1, release);
  }

  /// Splits the free run at `id` (popped, so ours) into its first `slabs` slabs, which it
  /// returns, and a remainder that goes back on the stacks. A long remainder goes back in up to
  /// four pieces (halving, in multiples of `slabs`, so that requests like this one can use every
  /// slab), so that threads splitting at the same time soon find runs of their own instead of
  /// queuing for the one long run.
  DEVMR_HOST_DEVICE std::uint32_t split(std::uint32_t id,
                                        std::uint32_t slabs,
                                        unsigned hint) const {
    std::uint32_t rest = atomic(meta(id).length).load(relaxed) - slabs;
    std::uint32_t at = id + slabs;  // runs never cross arenas: same arena bits
    for (unsigned piece = 0; rest != 0; ++piece) {
      std::uint32_t const half = rest / 2 / slabs * slabs;
      std::uint32_t const length = piece < 3 && half >= slabs ? half : rest;
      make_free_head(at, length);
      push(at, hint);
      at += length;
      rest -= length;
    }
    return id;
  }

  /// Takes slabs marked empty: from the bitmap word under this hint's cursor (moving the cursor
  /// on when it is bare), or, when `everywhere`, from the first word that the summaries mark and
  /// that has marks, in any arena (moving the cursor there).
  DEVMR_HOST_DEVICE std::uint32_t take_empty(unsigned hint, bool everywhere) const {
    std::uint32_t const arenas = read_only(h_->arena_count);
    std::uint32_t at = atomic(h_->empty_cursor[hint % max_slots]).load(relaxed);
    if (everywhere) {
      at = find_marked_word(hint);
      if (at == no_slab) {
        return no_slab;
      }
    }
    std::uint32_t const a = arena_of(at) < arenas ? arena_of(at) : 0;
    std::uint32_t const w = index_of(at) < bitmap_words(a) ? index_of(at) : 0;
    std::uint32_t const id = take_word(a, w, hint);
    // Bare (or taken by others meanwhile): the next probe looks further on. Found anywhere: the
    // next probe looks there again.
    atomic(h_->empty_cursor[hint % max_slots])
        .store(make_slab_id(a, id == no_slab ? w + 1 : w), relaxed);
    return id;
  }

  /// The first bitmap word, in any arena, that its summary marks and that has marks, as a
  /// (arena, word) pair packed like a slab id; no_slab when there is none. Each hint starts at
  /// its own summary word. Clears the summary bits of the bare words it looks at.
  DEVMR_HOST_DEVICE std::uint32_t find_marked_word(unsigned hint) const {
    std::uint32_t const arenas = read_only(h_->arena_count);
    for (std::uint32_t a = 0; a < arenas; ++a) {
      auto const words = static_cast<std::uint32_t>(bitmap_words(a));
      std::uint32_t const summaries = (words + 63) / 64;
      for (std::uint32_t n = 0; n < summaries; ++n) {
        std::uint32_t const w = (hint + n) % summaries * 64;  // SMs start apart
        auto summary = atomic(empty_word(a, words + w / 64));
        for (std::uint64_t marked = summary.load(relaxed); marked != 0; marked &= marked - 1) {
          std::uint32_t const word = w + static_cast<std::uint32_t>(cuda::std::countr_zero(marked));
          // acquire: a search that sees the word emptied by an exchange also sees the in-flight
          // count the taker raised before it (see take_word).
          if (atomic(empty_word(a, word)).load(acquire) != 0) {
            return make_slab_id(a, word);
          }
          // A bare word: clear its summary bit, then look again, since a slab marked meanwhile
          // may have found the summary bit still set. acquire: pairs with the release in
          // mark, so that the second look sees the mark of any such slab.
          std::uint64_t const bit = std::uint64_t{1} << (word % 64);
          summary.fetch_and(~bit, acquire);
          if (atomic(empty_word(a, word)).load(acquire) != 0) {
            summary.fetch_or(bit, relaxed);
            return make_slab_id(a, word);
          }
        }
      }
    }
    return no_slab;
  }

  /// Word `w` of arena `a`'s bitmap of empty slabs (of its summary, from bitmap_words(a) on).
  DEVMR_HOST_DEVICE std::uint64_t& empty_word(std::uint32_t a, std::uint64_t w) const {
    return read_only(h_->arenas[a].empty_bits)[empty_word_index(w)];
  }

  /// Arena `a`'s word of slabs out of the supply (see heap_slabs::roomy) and given back (see
  /// take_run), in the header: no load of the arena table before its atomics. The low half counts
  /// the slabs out: a take adds their number. The high half counts the slabs given back, modulo
  /// 2^32: a give adds out_word_back(n), which takes n from the low half and, by the carry that
  /// this leaves (the low half holds at least n), adds n to the high one: one atomic, as before.
  DEVMR_HOST_DEVICE std::uint64_t& out_count(std::uint32_t a) const {
    return h_->slabs_out[a].value;
  }
  /// `n` more slabs of arena `a` out of the supply (the low half of its word).
  DEVMR_HOST_DEVICE void count_taken(std::uint32_t a, std::uint64_t n) const {
    atomic(out_count(a)).fetch_add(n, relaxed);
  }
  /// `n` slabs of arena `a` given back to the supply: out_word_back(n), one addition.
  DEVMR_HOST_DEVICE void count_given(std::uint32_t a, std::uint64_t n) const {
    atomic(out_count(a)).fetch_add(out_word_back(n), relaxed);
  }
  /// Slabs of arena `a` out of the supply now: a hint.
  DEVMR_HOST_DEVICE std::uint32_t slabs_out(std::uint32_t a) const {
    return static_cast<std::uint32_t>(atomic(out_count(a)).load(relaxed));
  }
  /// Slabs given back to the supply so far over every arena published, modulo 2^32: a change,
  /// not an amount, is what a search reads in it.
  DEVMR_HOST_DEVICE std::uint32_t slabs_back() const {
    std::uint32_t back = 0;
    std::uint32_t const arenas = read_only(h_->arena_count);
    for (std::uint32_t a = 0; a < arenas; ++a) {
      back += static_cast<std::uint32_t>(atomic(out_count(a)).load(relaxed) >> 32);
    }
    return back;
  }

  /// Words of arena `a`'s bitmap of empty slabs (its summary follows them).
  DEVMR_HOST_DEVICE std::uint64_t bitmap_words(std::uint32_t a) const {
    return empty_bitmap_words(read_only(h_->arenas[a].slabs));
  }

  /// Takes every slab marked in word `w` of arena `a` at once: returns one and pushes the others
  /// on this hint's stack of single slabs (no_slab when the word is bare). Counted in flight
  /// meanwhile, as a run being split is: a search that finds the word bare and the stacks empty
  /// before the push looks again (see take_run).
  DEVMR_HOST_DEVICE std::uint32_t take_word(std::uint32_t a, std::uint32_t w, unsigned hint) const {
    auto word = atomic(empty_word(a, w));
    // acquire: a search that sees the word emptied by an exchange also sees the in-flight count
    // the taker raised before it.
    if (word.load(acquire) == 0) {
      return no_slab;
    }
    begin_in_flight();
    // acq_rel: pairs with the release in mark (the frees of every block happened before), and
    // with the acquire above.
    std::uint64_t marks = word.exchange(0, acq_rel);
    std::uint32_t const base = make_slab_id(a, w * 64);
    std::uint32_t id = no_slab;     // the slab this search keeps
    std::uint32_t first = no_slab;  // the others, linked first to last
    std::uint32_t last = no_slab;
    for (; marks != 0; marks &= marks - 1) {
      std::uint32_t const slab = base + static_cast<std::uint32_t>(cuda::std::countr_zero(marks));
      if (id == no_slab) {
        id = slab;
      } else if (first == no_slab) {
        first = slab;
      } else {
        atomic(meta(last).next).store(slab, relaxed);
      }
      last = slab;
    }
    if (first != no_slab) {
      push_chain(shard_head(hint), first, last);
    }
    end_in_flight(first != no_slab);
    return id;
  }

  /// Marks small slab `id`, whose blocks are all free, in its arena's bitmap; the first mark of
  /// a bare word also marks the word in the summary (a word with marks always has its summary
  /// bit set, or a search that cleared it sets it again), so that the summary words, which
  /// stand for 4096 slabs each, do not take one atomic per emptied slab.
  /// No release: the subtraction that left zero is the only write it would order, and whoever
  /// takes the mark orders that one itself (see settle); a release here was a second
  /// device-scope fence in the free of every slab's last block.
  DEVMR_HOST_DEVICE void mark_empty(std::uint32_t id) const {
    mark(arena_of(id), index_of(id) / 64, std::uint64_t{1} << (index_of(id) % 64), relaxed);
  }

  /// Sets `marks` in word `w` of arena `a`'s bitmap (and the word's summary bit, if it was bare).
  /// `order`: release, so that whoever takes the mark sees the slabs' metadata as the caller
  /// left them (relaxed only from mark_empty, whose slabs settle orders).
  DEVMR_HOST_DEVICE void mark(std::uint32_t a,
                              std::uint64_t w,
                              std::uint64_t marks,
                              cuda::std::memory_order order = release) const {
    mark_in(read_only(h_->arenas[a].empty_bits), bitmap_words(a), w, marks, order);
  }

  /// mark, in the bitmap of empty slabs at `empty` (arena_desc::empty_bits) of `words` words.
  DEVMR_HOST_DEVICE static void mark_in(std::uint64_t* empty,
                                        std::uint64_t words,
                                        std::uint64_t w,
                                        std::uint64_t marks,
                                        cuda::std::memory_order order = release) {
    if (atomic(empty[empty_word_index(w)]).fetch_or(marks, order) == 0) {
      // release: whoever sees the summary bit sees the mark.
      atomic(empty[empty_word_index(words + w / 64)])
          .fetch_or(std::uint64_t{1} << (w % 64), release);
    }
  }

  /// Takes `slabs` slabs that were never handed out from the first arena that has them.
  DEVMR_HOST_DEVICE std::uint32_t take_fresh(std::uint32_t slabs, unsigned hint) const {
    std::uint32_t const arenas = read_only(h_->arena_count);
    // Arena 0 is tried without waiting for the count (every heap has it, and an entry not
    // published yet holds no slab): the reads of the table, emptied from L1 by the caller's
    // acquires, then overlap the frontier's addition instead of preceding it.
    for (std::uint32_t a = 0; a == 0 || a < arenas; ++a) {
      std::uint64_t const size = read_only(h_->arenas[a].slabs);
      auto frontier = atomic(h_->frontier[a]);
      // A single slab is tried without a look first (one round trip less on every install):
      // past the end, the frontier only grows.
      if (slabs > 1 && frontier.load(relaxed) + slabs > size) {
        continue;
      }
      std::uint64_t const first = frontier.fetch_add(slabs, relaxed);
      if (first + slabs <= size) {
        std::uint32_t const id = make_slab_id(a, static_cast<std::uint32_t>(first));
        mark_body(id, slabs);
        return id;
      }
      if (first < size) {  // we overshot the end: the slabs before it become a free run
        std::uint32_t const id = make_slab_id(a, static_cast<std::uint32_t>(first));
        auto const rest = static_cast<std::uint32_t>(size - first);
        mark_body(id, rest);
        make_free_head(id, rest);
        push(id, hint);
      }
    }
    return no_slab;
  }

  /// Marks the slabs after the first of a fresh run as its body (for statistics scans).
  DEVMR_HOST_DEVICE void mark_body(std::uint32_t id, std::uint32_t slabs) const {
    for (std::uint32_t i = 1; i < slabs; ++i) {
      make_body(id + i);
    }
  }

  /// Makes slab `id` a body slab, with its count zero: a search that takes it settles its count
  /// (settle, take_marked_run), and an atomic must not read memory that was never written (it
  /// means nothing there, but compute-sanitizer's initcheck reports it).
  DEVMR_HOST_DEVICE void make_body(std::uint32_t id) const {
    slab_meta& m = meta(id);
    atomic(m.state).store(make_state(tag_body, 0), relaxed);
    atomic(m.remaining).store(0, relaxed);
  }

  /// Makes slab `id` the head of a free run of `slabs` slabs (its count zero, as make_body's).
  DEVMR_HOST_DEVICE void make_free_head(std::uint32_t id, std::uint32_t slabs) const {
    slab_meta& m = meta(id);
    atomic(m.length).store(slabs, relaxed);
    atomic(m.state).store(make_state(tag_free, 0), relaxed);
    atomic(m.remaining).store(0, relaxed);
  }

  /// The stack of single free slabs that `hint` (an SM, a thread) uses first.
  DEVMR_HOST_DEVICE std::uint64_t& shard_head(unsigned hint) const {
    return h_->free_slabs[hint % slab_shards].value;
  }

  /// Pushes the free run at `id` on the stack of its length (Treiber stack, ABA-tagged head).
  /// Single slabs go to a shard chosen by their id, not by the pushing SM: an SM's warps that
  /// recycle slabs at the same moment then meet on different words.
  DEVMR_HOST_DEVICE void push(std::uint32_t id, unsigned) const {
    push_run(id, atomic(meta(id).length).load(relaxed));
  }

  /// The same, where the caller read the run's length already.
  DEVMR_HOST_DEVICE void push_run(std::uint32_t id, std::uint32_t length) const {
    push_chain(length == 1 ? shard_head(index_of(id)) : h_->free_runs[floor_log2(length)], id, id);
  }

  /// Pushes the runs `first` ... `last` (linked through their `next` fields) on the stack with
  /// head `word` at once.
  DEVMR_HOST_DEVICE void push_chain(std::uint64_t& word,
                                    std::uint32_t first,
                                    std::uint32_t last) const {
    auto head = atomic(word);
    std::uint64_t top = head.load(relaxed);
    std::uint64_t next;
    do {
      atomic(meta(last).next).store(static_cast<std::uint32_t>(top), relaxed);
      next = (((top >> 32) + 1) << 32) | first;
      // release: the runs' metadata (and the frees that emptied them) are visible to poppers.
    } while (!head.compare_exchange_weak(top, next, release, relaxed));
  }

  /// Looks at the `shard_scan_width` shards from `first` (a multiple of it) at once (independent
  /// loads from one base address) and pops from the first that is not empty.
  DEVMR_HOST_DEVICE std::uint32_t pop_any_shard(unsigned first) const {
    padded_word* const group = &h_->free_slabs[first % slab_shards];
    // Only the ids of the heads are kept (a register each): the pop loads its head again.
    std::uint32_t tops[shard_scan_width];
    for (unsigned i = 0; i < shard_scan_width; ++i) {
      tops[i] = static_cast<std::uint32_t>(atomic(group[i].value).load(relaxed));
    }
    for (unsigned i = 0; i < shard_scan_width; ++i) {
      if (tops[i] != no_slab) {
        std::uint32_t const id = pop(group[i].value);
        if (id != no_slab) {
          return id;
        }
      }
    }
    return no_slab;
  }

  /// Pops a free run from the stack with head `word`, or no_slab.
  DEVMR_HOST_DEVICE std::uint32_t pop(std::uint64_t& word) const {
    return pop(word, atomic(word).load(relaxed));
  }

  /// The same, from `top`, a value of the head that the caller loaded.
  DEVMR_HOST_DEVICE std::uint32_t pop(std::uint64_t& word, std::uint64_t top) const {
    slab_meta* m = nullptr;
    return pop(word, top, m);
  }

  /// The same, setting `m` to the metadata of the slab popped.
  DEVMR_HOST_DEVICE std::uint32_t pop(std::uint64_t& word, std::uint64_t top, slab_meta*& m) const {
    auto head = atomic(word);
    // An empty stack (as every stack of a fresh heap is) needs no acquire, which would empty the
    // SM's L1 cache and make the loads after it round trips.
    if (static_cast<std::uint32_t>(top) == no_slab) {
      return no_slab;
    }
    // The top slab's metadata address is read from the arena table before the fence, which
    // empties the SM's L1: after it, that read would be a round trip before the look at `next`.
    m = &meta(static_cast<std::uint32_t>(top));
    // acquire: pairs with the push's release, so the run's metadata is read as pushed.
    cuda::atomic_thread_fence(acquire, cuda::thread_scope_device);
    while (static_cast<std::uint32_t>(top) != no_slab) {
      auto const id = static_cast<std::uint32_t>(top);
      // Another thread may pop and reuse `id` meanwhile: then `next` is garbage, but the tag in
      // the head has changed and the CAS fails.
      std::uint32_t const next = atomic(m->next).load(relaxed);
      // acq_rel: a searcher that sees this pop also sees what the popper did before it.
      if (head.compare_exchange_weak(top, (((top >> 32) + 1) << 32) | next, acq_rel, acquire)) {
        return id;
      }
      if (static_cast<std::uint32_t>(top) != no_slab) {
        m = &meta(static_cast<std::uint32_t>(top));
      }
    }
    return no_slab;
  }
};

}  // namespace devmr::detail::heap
