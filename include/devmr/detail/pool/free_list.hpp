#pragma once

// A coalescing free list of address ranges: the bookkeeping under pool_resource. Host code only, no
// CUDA: it never touches the memory it describes, so it is tested on plain integers.

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace devmr::detail {

/// Every block a pool hands out starts on and spans a multiple of this many bytes.
inline constexpr std::size_t pool_granule = 256;

/// Rounds value up to a multiple of alignment (a power of two).
constexpr std::uintptr_t align_up(std::uintptr_t value, std::size_t alignment) noexcept {
  return (value + alignment - 1) & ~static_cast<std::uintptr_t>(alignment - 1);
}

/// @brief A free range of addresses inside one arena.
struct free_block {
  std::uintptr_t address;  ///< first byte
  std::size_t size;        ///< bytes, a multiple of pool_granule
  std::uintptr_t arena;    ///< base address of the arena it lies in; blocks never span arenas
};

/**
 * @brief Free ranges indexed by address (to merge neighbours) and by size (best fit).
 *
 * Invariants: ranges do not overlap; two ranges that touch and lie in the same arena are always
 * merged into one; every address and size is a multiple of pool_granule. Not thread-safe: the
 * pool that owns it holds a lock.
 */
class free_list {
 public:
  /// @brief Adds a free range, merging it with free neighbours of the same arena.
  void insert(free_block block) {
    auto next = by_address_.lower_bound(block.address);
    bool const merge_next = next != by_address_.end() && next->second.arena == block.arena &&
                            block.address + block.size == next->first;
    if (next != by_address_.begin()) {
      auto const prev = std::prev(next);
      if (prev->second.arena == block.arena && prev->first + prev->second.size == block.address) {
        // Grow the left neighbour in place (its address, the map's key, stays).
        auto size = prev->second.size + block.size;
        if (merge_next) {
          size += next->second.size;
          erase(next);
        }
        resize(prev, size);
        return;
      }
    }
    if (merge_next) {
      block.size += next->second.size;
      next = erase(next);
    }
    emplace(block, next);
  }

  /**
   * @brief Finds the smallest range that can hold bytes at the given alignment, without taking it.
   * @param bytes a multiple of pool_granule @param alignment a power of two
   */
  [[nodiscard]] std::optional<free_block> find(std::size_t bytes, std::size_t alignment) const {
    auto it = by_size_.lower_bound({bytes, 0});
    if (alignment <= pool_granule) {
      // Every range starts on a granule, so the smallest large-enough range fits.
      if (it == by_size_.end()) {
        return std::nullopt;
      }
      return block_at(it->second);
    }
    // Best fit among the first few candidates; past them, any range of bytes + alignment - granule
    // fits whatever its address, which bounds the search.
    for (int tried = 0; it != by_size_.end() && tried < 16; ++it, ++tried) {
      if (fits(it->second, it->first, bytes, alignment)) {
        return block_at(it->second);
      }
    }
    it = by_size_.lower_bound({bytes + alignment - pool_granule, 0});
    if (it == by_size_.end()) {
      return std::nullopt;
    }
    return block_at(it->second);
  }

  /**
   * @brief Takes bytes at the given alignment out of the best-fitting range: the alignment
   * padding in front and the rest behind stay free.
   * @return the block taken (its address, bytes and arena), or nullopt when no range can hold it
   */
  std::optional<free_block> take(std::size_t bytes, std::size_t alignment) {
    auto const found = find(bytes, alignment);
    if (!found) {
      return std::nullopt;
    }
    return take_from(*found, bytes, alignment);
  }

  /// @brief Takes bytes out of a range that find() returned (the list unchanged since).
  free_block take_from(free_block block, std::size_t bytes, std::size_t alignment) {
    auto it = by_address_.find(block.address);
    auto const start = align_up(block.address, alignment);
    auto const end = start + bytes;
    auto const block_end = block.address + block.size;
    // The range was maximal, so neither piece left over has a free neighbour: no merging.
    if (start > block.address) {
      resize(it, start - block.address);  // the padding keeps the range's node
      if (end < block_end) {
        emplace({end, block_end - end, block.arena}, std::next(it));
      }
    } else if (end < block_end) {
      // The tail takes over the range's node: a new key, at the same place in address order.
      auto const hint = std::next(it);
      auto node = by_address_.extract(it);
      node.key() = end;
      resize(by_address_.insert(hint, std::move(node)), block_end - end);
    } else {
      erase(it);
    }
    return {start, bytes, block.arena};
  }

  /// @brief Removes the range that starts at address and spans exactly size bytes, if present.
  bool remove_exact(std::uintptr_t address, std::size_t size) {
    auto const it = by_address_.find(address);
    if (it == by_address_.end() || it->second.size != size) {
      return false;
    }
    erase(it);
    return true;
  }

  /// @brief Moves every range of other into this list, merging neighbours.
  void absorb(free_list& other) {
    for (auto const& [address, entry] : other.by_address_) {
      insert({address, entry.size, entry.arena});
    }
    other.clear();
  }

  void clear() noexcept {
    by_address_.clear();
    by_size_.clear();
    free_bytes_ = 0;
  }

  [[nodiscard]] bool empty() const noexcept { return by_address_.empty(); }
  /// @return how many separate ranges the list holds
  [[nodiscard]] std::size_t ranges() const noexcept { return by_address_.size(); }
  /// @return the sum of the sizes of all ranges
  [[nodiscard]] std::size_t free_bytes() const noexcept { return free_bytes_; }
  /// @return the size of the largest range (0 when empty)
  [[nodiscard]] std::size_t largest() const noexcept {
    return by_size_.empty() ? 0 : by_size_.rbegin()->first;
  }

  /// @brief Calls f(free_block) for every range, in address order.
  template <class F>
  void for_each(F&& f) const {
    for (auto const& [address, entry] : by_address_) {
      f(free_block{address, entry.size, entry.arena});
    }
  }

 private:
  using size_index = std::set<std::pair<std::size_t, std::uintptr_t>>;  // (size, address)
  struct entry {
    std::size_t size;
    std::uintptr_t arena;
    size_index::iterator by_size;  // this range's node in by_size_: erased without a search
  };
  using address_map = std::map<std::uintptr_t, entry>;

  static bool fits(std::uintptr_t address,
                   std::size_t size,
                   std::size_t bytes,
                   std::size_t alignment) noexcept {
    return align_up(address, alignment) - address + bytes <= size;
  }

  [[nodiscard]] free_block block_at(std::uintptr_t address) const {
    auto const& e = by_address_.at(address);
    return {address, e.size, e.arena};
  }

  void emplace(free_block block, address_map::const_iterator hint) {
    auto const by_size = by_size_.emplace(block.size, block.address).first;
    by_address_.emplace_hint(hint, block.address, entry{block.size, block.arena, by_size});
    free_bytes_ += block.size;
  }

  void resize(address_map::iterator it, std::size_t size) {
    // Reuse the size index node: only its key changes.
    auto node = by_size_.extract(it->second.by_size);
    node.value() = {size, it->first};
    it->second.by_size = by_size_.insert(std::move(node)).position;
    free_bytes_ = free_bytes_ - it->second.size + size;
    it->second.size = size;
  }

  address_map::iterator erase(address_map::iterator it) {
    by_size_.erase(it->second.by_size);
    free_bytes_ -= it->second.size;
    return by_address_.erase(it);
  }

  address_map by_address_;
  size_index by_size_;  // best fit
  std::size_t free_bytes_ = 0;
};

}  // namespace devmr::detail
