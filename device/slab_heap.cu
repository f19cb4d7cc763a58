// slab_heap's host side and the library's own heap kernels: formatting, host-initiated
// allocations and frees, reset, statistics scans.

#include <devmr/detail/device_guard.hpp>
#include <devmr/detail/heap/device_ops.cuh>
#include <devmr/detail/heap/format.hpp>
#include <devmr/detail/nvtx.hpp>
#include <devmr/errors.hpp>
#include <devmr/slab_heap.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace devmr {
namespace detail::heap {
namespace {

constexpr std::size_t default_initial_bytes = std::size_t{64} << 20;

/// Per-class totals a statistics scan adds up.
struct scan_totals {
  unsigned long long blocks[num_classes];
  unsigned long long slabs[num_classes];
  unsigned long long large_blocks;
  unsigned long long large_slabs;
  unsigned long long held_slabs;  ///< slabs of small blocks with at least one in use
};

__global__ void allocate_kernel(heap_header* h,
                                std::size_t bytes,
                                std::size_t alignment,
                                void** result) {
  *result = device_allocate(h, bytes, alignment);
}

__global__ void free_kernel(heap_header* h, void const* p, std::size_t size) {
  device_deallocate(h, p, size);
}

__global__ void free_bulk_kernel(heap_header* h, void* const* blocks, std::size_t count) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    device_deallocate(h, blocks[i], 0);  // sizes unknown: the slabs' tags tell
  }
}

/// Forgets every block: frontiers back to the start, stacks, slots, lists of slabs to reuse and
/// empty-slab bitmaps cleared. Slab metadata stays as it is: a slab is formatted again when it is
/// next taken.
__global__ void reset_kernel(heap_header* h) {
  unsigned const t = threadIdx.x;
  for (unsigned a = t; a < max_arenas; a += blockDim.x) {
    h->frontier[a] = 0;
    h->slabs_out[a].value = 0;
  }
  for (unsigned c = t; c < run_classes; c += blockDim.x) {
    h->free_runs[c] = empty_stack;
  }
  for (unsigned c = t; c < slab_shards; c += blockDim.x) {
    h->free_slabs[c].value = empty_stack;
  }
  if (t == 0) {
    h->runs_in_flight.value = 0;
  }
  for (unsigned s = t; s < num_classes * max_slots; s += blockDim.x) {
    h->slots[s / num_classes].classes[s % num_classes] = vacant_class_slot;
  }
  if (t == 0) {
    h->slot_widths.widths = slot_width::initial(h->slot_widths.base, num_classes);  // none in use
  }
  for (unsigned s = t; s < max_slots; s += blockDim.x) {
    h->empty_cursor[s] = first_cursor(*h, s);
  }
  for (std::uint32_t a = 0; a < h->arena_count; ++a) {
    std::uint64_t const words = empty_words(h->arenas[a].slabs);
    for (std::uint64_t w = t; w < words; w += blockDim.x) {
      h->arenas[a].empty_bits[w] = 0;
    }
    std::uint64_t const lists = class_list_words(static_cast<std::uint32_t>(h->arenas[a].slabs));
    for (std::uint64_t w = t; w < lists; w += blockDim.x) {
      h->arenas[a].listed[w] = 0;
    }
  }
}

/// Adds up the blocks in use of every slab handed out so far (heads only: body slabs of runs and
/// free runs count nothing).
__global__ void stats_kernel(heap_header* h, scan_totals* totals) {
  std::size_t const stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::uint32_t a = 0; a < h->arena_count; ++a) {
    std::uint64_t const end = min(h->frontier[a], h->arenas[a].slabs);
    for (std::size_t s = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; s < end; s += stride) {
      slab_meta const& m = h->arenas[a].meta[s];
      unsigned cls = 0;
      std::uint32_t in_use = 0;
      slab_use const use =
          slab_usage(*h, make_slab_id(a, static_cast<std::uint32_t>(s)), m, cls, in_use);
      if (use == slab_use::small) {
        atomicAdd(&totals->blocks[cls], static_cast<unsigned long long>(in_use));
        atomicAdd(&totals->slabs[cls], 1ull);
        if (in_use != 0) {
          atomicAdd(&totals->held_slabs, 1ull);
        }
      } else if (use == slab_use::large) {
        atomicAdd(&totals->large_blocks, 1ull);
        atomicAdd(&totals->large_slabs, static_cast<unsigned long long>(m.length));
      }
    }
  }
}

/// What host code needs to know of a live heap from its header pointer alone (slab_ref's host
/// path): its device and its arenas.
struct registered_heap {
  int device;
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
};

std::mutex registry_mutex;
std::unordered_map<heap_header const*, registered_heap>& registry() {
  static std::unordered_map<heap_header const*, registered_heap> heaps;
  return heaps;
}

int device_of(heap_header const* h) {
  std::lock_guard lock{registry_mutex};
  auto const it = registry().find(h);
  if (it == registry().end()) {
    throw std::invalid_argument("devmr: slab_ref refers to no live slab_heap");
  }
  return it->second.device;
}

/// A pinned word per host thread that a host-initiated allocation kernel writes its result to.
class host_mailbox {
 public:
  host_mailbox() { DEVMR_CUDA_TRY(cudaMallocHost(&slot_, sizeof(void*))); }
  ~host_mailbox() { cudaFreeHost(slot_); }
  host_mailbox(host_mailbox const&) = delete;
  host_mailbox& operator=(host_mailbox const&) = delete;
  void** slot() const { return slot_; }

 private:
  void** slot_ = nullptr;
};

}  // namespace

void* host_allocate(heap_header* h, std::size_t bytes, std::size_t alignment) {
  DEVMR_FUNC_RANGE();
  validate_alignment(alignment);
  if (alignment > slab_bytes) {
    throw std::invalid_argument("devmr: slab heaps align blocks to at most 1 MiB, not " +
                                std::to_string(alignment));
  }
  if (bytes == 0) {
    return nullptr;
  }
  ::devmr::detail::device_guard const guard{device_of(h)};
  thread_local host_mailbox mailbox;
  *mailbox.slot() = nullptr;
  allocate_kernel<<<1, 1, 0, cudaStreamPerThread>>>(h, bytes, alignment, mailbox.slot());
  DEVMR_CUDA_TRY(cudaPeekAtLastError());
  DEVMR_CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread));
  void* p = *mailbox.slot();
  if (p == nullptr) {
    throw out_of_memory("devmr: slab heap cannot serve " + std::to_string(bytes) + " bytes");
  }
  return p;
}

void host_deallocate(heap_header* h, void const* p, std::size_t size) {
  DEVMR_FUNC_RANGE();
  if (p == nullptr) {
    return;
  }
  ::devmr::detail::device_guard const guard{device_of(h)};
  free_kernel<<<1, 1, 0, cudaStreamPerThread>>>(h, p, size);
  DEVMR_CUDA_TRY(cudaPeekAtLastError());
  DEVMR_CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread));
}

bool host_owns(heap_header const* h, void const* p) noexcept {
  std::lock_guard lock{registry_mutex};
  auto const it = registry().find(h);
  if (it == registry().end()) {
    return false;
  }
  auto const address = reinterpret_cast<std::uintptr_t>(p);
  return std::any_of(it->second.ranges.begin(), it->second.ranges.end(),
                     [&](auto const& r) { return address >= r.first && address < r.second; });
}

}  // namespace detail::heap

// ---- slab_heap --------------------------------------------------------------------------------

namespace hp = detail::heap;

template <memory_kind Kind>
slab_heap<Kind>::slab_heap(pool_resource<Kind>& upstream, heap_options options)
    : upstream_{&upstream}, options_{options}, image_{std::make_unique<hp::heap_header>()} {
  DEVMR_FUNC_RANGE();
  if (options_.initial_bytes == 0) {
    options_.initial_bytes = hp::default_initial_bytes;
    if (options_.maximum_bytes != 0 && options_.maximum_bytes < options_.initial_bytes) {
      options_.initial_bytes = options_.maximum_bytes;
    }
  }
  if (options_.maximum_bytes != 0 && options_.initial_bytes > options_.maximum_bytes) {
    throw std::invalid_argument("devmr: heap_options::initial_bytes exceeds maximum_bytes");
  }
  device_ = upstream.device();
  if (device_ < 0) {
    DEVMR_CUDA_TRY(cudaGetDevice(&device_));
  }
  hp::initialize(*image_, options_.checked);
  header_ = static_cast<hp::heap_header*>(upstream_->allocate(sizeof(hp::heap_header), 256));
  try {
    add_arena(options_.initial_bytes);
    detail::device_guard const guard{device_};
    DEVMR_CUDA_TRY(cudaMemcpy(header_, image_.get(), sizeof(hp::heap_header), cudaMemcpyDefault));
  } catch (...) {
    destroy();
    throw;
  }
  std::lock_guard lock{hp::registry_mutex};
  hp::registry()[header_] = {device_, {}};
  for (auto const& a : arenas_) {
    auto const base = reinterpret_cast<std::uintptr_t>(a.data);
    hp::registry()[header_].ranges.emplace_back(base, base + a.data_bytes);
  }
}

template <memory_kind Kind>
void slab_heap<Kind>::add_arena(std::size_t bytes) {
  if (image_->arena_count == hp::max_arenas) {
    throw out_of_memory("devmr: slab heap holds 64 arenas already; grow in larger steps");
  }
  std::size_t const slabs = std::max<std::size_t>(1, (bytes + hp::slab_bytes - 1) / hp::slab_bytes);
  if (slabs > hp::max_slabs_per_arena) {
    throw out_of_memory("devmr: one arena of a slab heap holds at most " +
                        std::to_string(hp::max_slabs_per_arena) + " slabs of 1 MiB");
  }
  if (options_.maximum_bytes != 0 && capacity() + slabs * hp::slab_bytes > options_.maximum_bytes) {
    throw out_of_memory("devmr: growing the heap by " + std::to_string(slabs * hp::slab_bytes) +
                        " bytes would pass heap_options::maximum_bytes");
  }
  // The data, and the metadata in one allocation (meta_layout_for), whose bitmap of empty slabs
  // and lists of slabs to reuse must start out clear.
  hp::meta_layout const layout = hp::meta_layout_for(slabs);
  arena_memory a{nullptr, slabs * hp::slab_bytes, nullptr, layout.bytes};
  try {
    a.data = upstream_->allocate(a.data_bytes, hp::slab_bytes);
    a.meta = upstream_->allocate(a.meta_bytes, 256);
    // On the legacy stream: the synchronous header copies that publish the arena follow it.
    detail::device_guard const guard{device_};
    DEVMR_CUDA_TRY(
        cudaMemset(static_cast<std::byte*>(a.meta) + layout.empty, 0, layout.bytes - layout.empty));
  } catch (...) {
    if (a.meta != nullptr) {
      upstream_->deallocate(a.meta, a.meta_bytes, 256);
    }
    if (a.data != nullptr) {
      upstream_->deallocate(a.data, a.data_bytes, hp::slab_bytes);
    }
    throw;
  }
  hp::add_arena(*image_, hp::arena_at(static_cast<std::byte*>(a.data),
                                      static_cast<std::byte*>(a.meta), slabs));
  arenas_.push_back(a);
}

template <memory_kind Kind>
void slab_heap<Kind>::grow(std::size_t bytes) {
  DEVMR_FUNC_RANGE();
  if (bytes == 0) {
    return;
  }
  add_arena(bytes);
  std::uint32_t const index = image_->arena_count - 1;
  detail::device_guard const guard{device_};
  // The arena and its frontier first, the count that publishes them last.
  DEVMR_CUDA_TRY(cudaMemcpy(&header_->arenas[index], &image_->arenas[index], sizeof(hp::arena_desc),
                            cudaMemcpyDefault));
  DEVMR_CUDA_TRY(cudaMemcpy(&header_->frontier[index], &image_->frontier[index],
                            sizeof(std::uint64_t), cudaMemcpyDefault));
  // The slots' share of every class and their budget (adjacent); the widths that kernels set
  // stay, and widen to the new share as installs reuse slabs (slot_width.hpp), unless the heap
  // now gives every class all its slots: then every class takes all of them in the word too, as
  // claims that read it expect of a heap whose widths are fixed (the word first).
  static_assert(
      offsetof(hp::slot_shape, budget) == offsetof(hp::slot_shape, base) + sizeof(std::uint32_t) &&
      offsetof(hp::slot_shape, roomy) == offsetof(hp::slot_shape, budget) + sizeof(std::uint32_t));
  if (hp::slot_width::fixed_for(image_->slot_widths, hp::max_slots)) {
    DEVMR_CUDA_TRY(cudaMemcpy(&header_->slot_widths.widths, &image_->slot_widths.widths,
                              sizeof(std::uint64_t), cudaMemcpyDefault));
  }
  DEVMR_CUDA_TRY(cudaMemcpy(&header_->slot_widths.base, &image_->slot_widths.base,
                            3 * sizeof(std::uint32_t), cudaMemcpyDefault));
  DEVMR_CUDA_TRY(cudaMemcpy(&header_->arena_count, &image_->arena_count, sizeof(std::uint32_t),
                            cudaMemcpyDefault));
  std::lock_guard lock{hp::registry_mutex};
  auto const base = reinterpret_cast<std::uintptr_t>(arenas_.back().data);
  hp::registry()[header_].ranges.emplace_back(base, base + arenas_.back().data_bytes);
}

template <memory_kind Kind>
void slab_heap<Kind>::reset(cuda::stream_ref stream) {
  DEVMR_FUNC_RANGE();
  detail::device_guard const guard{device_};
  hp::reset_kernel<<<1, 256, 0, stream.get()>>>(header_);
  DEVMR_CUDA_TRY(cudaPeekAtLastError());
}

template <memory_kind Kind>
void slab_heap<Kind>::deallocate_async(void const* p,
                                       std::size_t bytes,
                                       std::size_t alignment,
                                       cuda::stream_ref stream) {
  DEVMR_FUNC_RANGE();
  if (p == nullptr) {
    return;
  }
  detail::device_guard const guard{device_};
  std::size_t const size = bytes == 0 ? 0 : std::max(bytes, alignment);
  hp::free_kernel<<<1, 1, 0, stream.get()>>>(header_, p, size);
  DEVMR_CUDA_TRY(cudaPeekAtLastError());
}

template <memory_kind Kind>
void slab_heap<Kind>::deallocate_bulk(cuda::std::span<void* const> blocks,
                                      cuda::stream_ref stream) {
  DEVMR_FUNC_RANGE();
  if (blocks.empty()) {
    return;
  }
  detail::device_guard const guard{device_};
  unsigned const threads = 256;
  auto const grid =
      static_cast<unsigned>(std::min<std::size_t>((blocks.size() + threads - 1) / threads, 65535));
  hp::free_bulk_kernel<<<grid, threads, 0, stream.get()>>>(header_, blocks.data(), blocks.size());
  DEVMR_CUDA_TRY(cudaPeekAtLastError());
}

template <memory_kind Kind>
heap_stats slab_heap<Kind>::stats(cuda::stream_ref stream) const {
  DEVMR_FUNC_RANGE();
  detail::device_guard const guard{device_};
  heap_stats result;
  hp::scan_totals totals{};
  void* scratch = upstream_->allocate(sizeof(hp::scan_totals), 256);
  hp::heap_counters counters{};
  try {
    DEVMR_CUDA_TRY(cudaMemsetAsync(scratch, 0, sizeof(hp::scan_totals), stream.get()));
    hp::stats_kernel<<<264, 256, 0, stream.get()>>>(header_,
                                                    static_cast<hp::scan_totals*>(scratch));
    DEVMR_CUDA_TRY(cudaPeekAtLastError());
    DEVMR_CUDA_TRY(
        cudaMemcpyAsync(&totals, scratch, sizeof(totals), cudaMemcpyDefault, stream.get()));
    DEVMR_CUDA_TRY(cudaMemcpyAsync(&counters, &header_->counters, sizeof(counters),
                                   cudaMemcpyDefault, stream.get()));
    DEVMR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
  } catch (...) {
    upstream_->deallocate(scratch, sizeof(hp::scan_totals), 256);
    throw;
  }
  upstream_->deallocate(scratch, sizeof(hp::scan_totals), 256);
  for (std::size_t c = 0; c < heap_stats::num_size_classes; ++c) {
    auto& cls = result.classes[c];
    cls.block_bytes = hp::class_bytes(static_cast<unsigned>(c));
    cls.blocks_in_use = totals.blocks[c];
    cls.slabs = totals.slabs[c];
    result.blocks_in_use += cls.blocks_in_use;
    result.bytes_in_use += cls.blocks_in_use * cls.block_bytes;
  }
  result.large_blocks_in_use = totals.large_blocks;
  result.large_bytes_in_use = totals.large_slabs * hp::slab_bytes;
  result.blocks_in_use += result.large_blocks_in_use;
  result.bytes_in_use += result.large_bytes_in_use;
  std::size_t const held_slabs = totals.held_slabs + totals.large_slabs;
  result.held_bytes = held_slabs * hp::slab_bytes;
  result.capacity_bytes = capacity();
  result.free_slabs = result.capacity_bytes / hp::slab_bytes - held_slabs;
  result.arenas = arenas_.size();
  result.failed_allocations = counters.failed_allocations;
  result.bad_alignments = counters.bad_alignments;
  result.invalid_frees = counters.invalid_frees;
  result.double_frees = counters.double_frees;
  return result;
}

template <memory_kind Kind>
void slab_heap<Kind>::check(cuda::stream_ref stream) const {
  DEVMR_FUNC_RANGE();
  detail::device_guard const guard{device_};
  hp::heap_counters counters{};
  DEVMR_CUDA_TRY(cudaMemcpyAsync(&counters, &header_->counters, sizeof(counters), cudaMemcpyDefault,
                                 stream.get()));
  DEVMR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
  if (counters.invalid_frees == 0 && counters.double_frees == 0) {
    return;
  }
  // Clear what was reported (two adjacent counters), so the next check reports new misuse only.
  DEVMR_CUDA_TRY(cudaMemsetAsync(&header_->counters.invalid_frees, 0, 2 * sizeof(std::uint64_t),
                                 stream.get()));
  DEVMR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
  throw heap_error("devmr: kernels recorded " + std::to_string(counters.invalid_frees) +
                   " invalid frees and " + std::to_string(counters.double_frees) + " double frees" +
                   (options_.checked ? "" : " (unchecked heap: double frees go unseen)"));
}

template <memory_kind Kind>
std::size_t slab_heap<Kind>::capacity() const noexcept {
  std::size_t total = 0;
  for (auto const& a : arenas_) {
    total += a.data_bytes;
  }
  return total;
}

template <memory_kind Kind>
void slab_heap<Kind>::destroy() noexcept {
  if (upstream_ == nullptr) {
    return;
  }
  {
    std::lock_guard lock{hp::registry_mutex};
    hp::registry().erase(header_);
  }
  for (auto const& a : arenas_) {
    upstream_->deallocate(a.meta, a.meta_bytes, 256);
    upstream_->deallocate(a.data, a.data_bytes, hp::slab_bytes);
  }
  arenas_.clear();
  if (header_ != nullptr) {
    upstream_->deallocate(header_, sizeof(hp::heap_header), 256);
  }
  header_ = nullptr;
  upstream_ = nullptr;
}

template <memory_kind Kind>
slab_heap<Kind>::~slab_heap() {
  if (upstream_ != nullptr && header_ != nullptr) {
    try {
      detail::device_guard const guard{device_};
      DEVMR_CUDA_TRY(cudaDeviceSynchronize());
      heap_stats const s = stats();
      if (s.blocks_in_use != 0) {
        std::fprintf(stderr,
                     "devmr: slab_heap destroyed with %zu blocks (%zu bytes) still allocated\n",
                     s.blocks_in_use, s.bytes_in_use);
      }
    } catch (std::exception const& e) {
      std::fprintf(stderr, "devmr: slab_heap could not count its blocks at destruction: %s\n",
                   e.what());
    }
  }
  destroy();
}

template <memory_kind Kind>
slab_heap<Kind>::slab_heap(slab_heap&& other) noexcept
    : upstream_{std::exchange(other.upstream_, nullptr)},
      options_{other.options_},
      device_{other.device_},
      header_{std::exchange(other.header_, nullptr)},
      image_{std::move(other.image_)},
      arenas_{std::move(other.arenas_)} {}

template <memory_kind Kind>
slab_heap<Kind>& slab_heap<Kind>::operator=(slab_heap&& other) noexcept {
  if (this != &other) {
    this->~slab_heap();
    new (this) slab_heap{std::move(other)};
  }
  return *this;
}

template class slab_heap<memory_kind::device>;
template class slab_heap<memory_kind::managed>;
template class slab_heap<memory_kind::pinned>;

}  // namespace devmr
