#include <devmr/pool_resource.hpp>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>

namespace devmr::detail {
namespace {

void count_up(pool_stats::counter& c, std::int64_t value) noexcept {
  c.current += value;
  c.peak = std::max(c.peak, c.current);
  c.total += value;
}

void count_down(pool_stats::counter& c, std::int64_t value) noexcept {
  c.current -= value;
}

}  // namespace

pool_core::pool_core(std::unique_ptr<arena_source> source,
                     std::unique_ptr<stream_order> order,
                     config const& cfg)
    : source_(std::move(source)), order_(std::move(order)), config_(cfg) {
  if (config_.initial_bytes > 0) {
    auto const bytes = align_up(config_.initial_bytes, pool_granule);
    auto const rounded = align_up(bytes, config_.arena_rounding);
    lock const guard{mutex_};
    if (!try_reserve(rounded) && (rounded == bytes || !try_reserve(bytes))) {
      throw out_of_memory("devmr: pool cannot reserve its initial " +
                          std::to_string(config_.initial_bytes) + " bytes (cap " +
                          std::to_string(config_.maximum_bytes) + ")");
    }
  }
}

pool_core::~pool_core() {
  lock const guard{mutex_};
  if (!live_.empty()) {
    std::fprintf(stderr,
                 "devmr: pool destroyed with %zu blocks (%lld bytes) still allocated; its "
                 "arenas are freed anyway\n",
                 live_.size(), static_cast<long long>(stats_.bytes.current));
  }
  try {
    settle_all();
  } catch (...) {
    // Freeing the arenas below synchronizes anyway; a failing wait has nothing to add.
  }
  for (auto& [stream, entry] : streams_) {
    if (entry.event != nullptr) {
      order_->destroy_event(entry.event);
    }
  }
  for (auto const& [base, bytes] : arenas_) {
    source_->give_back(reinterpret_cast<void*>(base), bytes);
  }
}

void* pool_core::allocate(std::size_t bytes, std::size_t alignment) {
  return allocate_impl(bytes, alignment, nullptr, false);
}

void* pool_core::allocate_async(std::size_t bytes, std::size_t alignment, void* stream) {
  return allocate_impl(bytes, alignment, stream, true);
}

void* pool_core::allocate_impl(std::size_t bytes, std::size_t alignment, void* stream, bool async) {
  validate_alignment(alignment);
  if (bytes == 0) {
    return nullptr;
  }
  if (bytes > std::numeric_limits<std::size_t>::max() / 4 ||
      alignment > std::numeric_limits<std::size_t>::max() / 4) {
    throw out_of_memory("devmr: pool cannot serve " + std::to_string(bytes) + " bytes");
  }
  auto const size = align_up(bytes, pool_granule);
  alignment = std::max(alignment, pool_granule);

  lock const guard{mutex_};
  if (async) {
    // Blocks freed on this very stream are safe for it at once: stream order protects them.
    if (auto const it = streams_.find(stream); it != streams_.end()) {
      if (auto const block = it->second.unsealed.take(size, alignment)) {
        return record_allocation(*block, bytes);
      }
      if (auto const block = it->second.list.take(size, alignment)) {
        return record_allocation(*block, bytes);
      }
    }
  }
  if (auto const block = ready_.take(size, alignment)) {
    return record_allocation(*block, bytes);
  }
  if (auto const block = take_from_streams(size, alignment, stream, async)) {
    return record_allocation(*block, bytes);
  }
  if (grow(size, alignment)) {
    if (auto const block = ready_.take(size, alignment)) {
      return record_allocation(*block, bytes);
    }
  }
  // Last resort: wait for every stream's frees; together (merged) they may hold the block.
  settle_all();
  if (auto const block = ready_.take(size, alignment)) {
    return record_allocation(*block, bytes);
  }
  throw out_of_memory("devmr: pool cannot serve " + std::to_string(bytes) + " bytes at alignment " +
                      std::to_string(alignment) + " (reserved " + std::to_string(reserved_) +
                      ", cap " + std::to_string(config_.maximum_bytes) + ")");
}

std::optional<free_block> pool_core::take_from_streams(std::size_t size,
                                                       std::size_t alignment,
                                                       void* stream,
                                                       bool async) {
  // Lists whose stream has passed its last free are ready for anyone.
  bool merged = false;
  for (auto& [other, entry] : streams_) {
    if ((async && other == stream) || entry.list.empty()) {
      continue;
    }
    if (order_->done(entry.event)) {
      ready_.absorb(entry.list);
      merged = true;
    }
  }
  if (merged) {
    if (auto block = ready_.take(size, alignment)) {
      return block;
    }
  }
  // A list whose work is still pending: make the caller wait for it.
  for (auto& [other, entry] : streams_) {
    if ((async && other == stream) || entry.list.empty() || !entry.list.find(size, alignment)) {
      continue;
    }
    if (!async) {
      order_->host_wait(entry.event);
      ready_.absorb(entry.list);
      return ready_.take(size, alignment);
    }
    auto& mine = streams_[stream];
    if (mine.event == nullptr) {
      mine.event = order_->create_event();
    }
    order_->stream_wait(stream, entry.event);
    // Re-record this stream's event after the wait, so that it covers the blocks it takes over.
    order_->record(mine.event, stream);
    mine.list.absorb(entry.list);
    return mine.list.take(size, alignment);
  }
  return std::nullopt;
}

bool pool_core::try_reserve(std::size_t bytes) {
  if (config_.maximum_bytes != 0 && reserved_ + bytes > config_.maximum_bytes) {
    return false;
  }
  void* arena = nullptr;
  try {
    arena = source_->reserve(bytes);
  } catch (out_of_memory const&) {
    return false;
  }
  auto const base = reinterpret_cast<std::uintptr_t>(arena);
  arenas_.emplace(base, bytes);
  reserved_ += bytes;
  ready_.insert({base, bytes, base});
  return true;
}

bool pool_core::grow(std::size_t size, std::size_t alignment) {
  // Room for the block wherever in the arena the alignment puts it.
  auto const needed = size + (alignment - pool_granule);
  auto const rounded = align_up(needed, config_.arena_rounding);
  auto const chunk =
      align_up(std::max(config_.min_arena_bytes, reserved_ / 2), config_.arena_rounding);
  // Largest first: a growth chunk, then just what this block needs, rounded, then exactly.
  std::size_t const candidates[] = {std::max(rounded, chunk), rounded, needed};
  std::size_t last = 0;
  for (auto const bytes : candidates) {
    if (bytes == last) {
      continue;
    }
    last = bytes;
    if (try_reserve(bytes)) {
      return true;
    }
  }
  return false;
}

void pool_core::settle_all() {
  bool unsealed = false;
  for (auto& [stream, entry] : streams_) {
    if (!entry.list.empty()) {
      order_->host_wait(entry.event);
      ready_.absorb(entry.list);
    }
    unsealed = unsealed || !entry.unsealed.empty();
  }
  if (unsealed) {
    // No event covers these blocks, and their streams may be gone: wait for the whole device.
    order_->device_wait();
    for (auto& [stream, entry] : streams_) {
      ready_.absorb(entry.unsealed);
      entry.unsealed_frees = 0;
    }
  }
}

void pool_core::seal(stream_list& entry, void* stream) {
  if (entry.event == nullptr) {
    entry.event = order_->create_event();
  } else if (!entry.list.empty() && order_->done(entry.event)) {
    // The blocks of the previous seal are done with: hand them to everyone (and let them merge
    // with their neighbours) before the event moves on.
    ready_.absorb(entry.list);
  }
  order_->record(entry.event, stream);
  entry.list.absorb(entry.unsealed);
  entry.unsealed_frees = 0;
}

void* pool_core::record_allocation(free_block const& block, std::size_t requested) {
  live_.emplace(block.address, live_block{block.size, requested, block.arena});
  count_up(stats_.bytes, static_cast<std::int64_t>(requested));
  count_up(stats_.blocks, 1);
  return reinterpret_cast<void*>(block.address);
}

void pool_core::deallocate(void const* p, std::size_t) noexcept {
  if (p == nullptr) {
    return;
  }
  lock const guard{mutex_};
  auto const it = live_.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == live_.end()) {
    std::fprintf(stderr, "devmr: deallocate of %p, which this pool does not hold; ignored\n", p);
    return;
  }
  count_down(stats_.bytes, static_cast<std::int64_t>(it->second.requested));
  count_down(stats_.blocks, 1);
  ready_.insert({it->first, it->second.size, it->second.arena});
  live_.erase(it);
}

void pool_core::deallocate_async(void const* p, std::size_t, void* stream) {
  if (p == nullptr) {
    return;
  }
  lock const guard{mutex_};
  auto const it = live_.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == live_.end()) {
    std::fprintf(stderr, "devmr: deallocate_async of %p, which this pool does not hold; ignored\n",
                 p);
    return;
  }
  auto& entry = streams_[stream];
  auto const size = it->second.size;
  entry.unsealed.insert({it->first, size, it->second.arena});
  ++entry.unsealed_frees;
  count_down(stats_.bytes, static_cast<std::int64_t>(it->second.requested));
  count_down(stats_.blocks, 1);
  live_.erase(it);
  if (size >= config_.seal_block_bytes || entry.unsealed_frees >= config_.seal_count ||
      entry.unsealed.free_bytes() >= config_.seal_bytes) {
    try {
      seal(entry, stream);
    } catch (cuda_error const&) {
      // The blocks stay unsealed: still correct (this stream, or a device-wide wait, reuses
      // them), only later to be shared with other streams.
    }
  }
}

pool_stats pool_core::stats() const {
  lock const guard{mutex_};
  auto result = stats_;
  result.reserved_bytes = reserved_;
  result.arenas = arenas_.size();
  return result;
}

std::size_t pool_core::ready_bytes() const {
  lock const guard{mutex_};
  return ready_.free_bytes();
}

void pool_core::release() {
  lock const guard{mutex_};
  settle_all();
  for (auto it = arenas_.begin(); it != arenas_.end();) {
    if (ready_.remove_exact(it->first, it->second)) {
      source_->give_back(reinterpret_cast<void*>(it->first), it->second);
      reserved_ -= it->second;
      it = arenas_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace devmr::detail
