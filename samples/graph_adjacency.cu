// A graph's adjacency lists built inside a kernel from a stream of edges: one thread per edge
// appends the edge's destination to the list of its source vertex. No thread knows how long a list
// will grow, so each list is a chain of chunks allocated from the slab heap as it fills, each chunk
// twice as large as the one before. Threads claim places in a list with one atomic add on the
// vertex's count; the thread that claims the first place of a chunk allocates it and links it,
// and the others wait for the link. The host checks every list against its own (the same
// neighbours, in any order), then the chunks are freed in a kernel and the heap must hold no block.
// The same kernels run a second time on CUDA's device malloc and free; both times are printed.

#include "sample_support.hpp"

#include <devmr/devmr.hpp>

#include <cuda_runtime_api.h>
#include <cuda/atomic>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr unsigned num_vertices = 1u << 16;
constexpr unsigned num_edges = 1u << 20;
constexpr unsigned block_threads = 256;

struct edge {
  unsigned src;
  unsigned dst;
};

/// One piece of a vertex's list: a link to the next piece, then the neighbours. Chunk k of a list
/// takes `chunk_bytes(k)` bytes: 64 B, 128 B, 256 B, ...
struct chunk {
  chunk* next;  ///< written once, by the thread that allocates the next chunk (release)
  __host__ __device__ unsigned* values() { return reinterpret_cast<unsigned*>(this + 1); }
};

__host__ __device__ constexpr std::size_t chunk_bytes(unsigned k) {
  return std::size_t{64} << k;
}
__host__ __device__ constexpr unsigned chunk_capacity(unsigned k) {
  return static_cast<unsigned>((chunk_bytes(k) - sizeof(chunk)) / sizeof(unsigned));
}

/// The chunks a list of `length` values takes.
unsigned chunks_for(unsigned length) {
  unsigned k = 0;
  unsigned start = 0;
  while (start < length) {
    start += chunk_capacity(k);
    ++k;
  }
  return k;
}

/// What a link holds when the chunk it should point to could not be allocated.
__device__ chunk* no_memory() {
  return reinterpret_cast<chunk*>(std::uintptr_t{1});
}

/// The lists: vertex v's first chunk and the number of places claimed in its list.
struct adjacency {
  chunk** heads;
  unsigned* counts;
};

/// Chunks from devmr's slab heap.
struct devmr_chunks {
  devmr::slab_ref<> heap;
  __device__ void* allocate(std::size_t bytes) const { return heap.allocate(bytes); }
  __device__ void deallocate(void* p, std::size_t bytes) const { heap.deallocate(p, bytes); }
};

/// Chunks from CUDA's device malloc (aligned to 16 bytes, as devmr's are).
struct malloc_chunks {
  __device__ void* allocate(std::size_t bytes) const { return malloc(bytes); }
  __device__ void deallocate(void* p, std::size_t) const { free(p); }
};

using link_ref = cuda::atomic_ref<chunk*, cuda::thread_scope_device>;

/// Waits until `link` is set: by the thread that claimed the first place of the chunk it points
/// to. That thread has already made its claim, so it is running, and it sets the link whether or
/// not its allocation succeeds (`no_memory()`), so the wait ends. The waits form no cycle: a
/// thread waits only for the chunks before its place, whose first places were claimed before.
__device__ chunk* wait_for(chunk*& link) {
  unsigned sleep_ns = 32;
  for (;;) {
    chunk* const c = link_ref{link}.load(cuda::std::memory_order_acquire);
    if (c != nullptr) {
      return c;
    }
    __nanosleep(sleep_ns);
    sleep_ns = sleep_ns < 1024 ? 2 * sleep_ns : sleep_ns;
  }
}

/// The place of index `i` of the list that starts at `head`, or nullptr when a chunk on the way
/// could not be allocated. Walks the chain from the first chunk; where `i` is the first place of a
/// chunk, this thread allocates that chunk and links it.
template <class Alloc>
__device__ unsigned* place_of(Alloc const& alloc, chunk*& head, unsigned i) {
  chunk** link = &head;  // where chunk k is linked from: the head, then the chunk before it
  unsigned start = 0;    // the list's index of chunk k's first value
  for (unsigned k = 0;; ++k) {
    chunk* c = nullptr;
    if (i == start) {
      c = static_cast<chunk*>(alloc.allocate(chunk_bytes(k)));
      if (c != nullptr) {
        c->next = nullptr;  // published with the link below (release)
      }
      link_ref{*link}.store(c != nullptr ? c : no_memory(), cuda::std::memory_order_release);
    } else {
      c = wait_for(*link);
    }
    if (c == nullptr || c == no_memory()) {
      return nullptr;
    }
    if (i < start + chunk_capacity(k)) {
      return c->values() + (i - start);
    }
    link = &c->next;
    start += chunk_capacity(k);
  }
}

/// One thread per edge: claims a place in its source's list and writes the destination there.
template <class Alloc>
__global__ void build_lists(
    Alloc alloc, edge const* edges, unsigned n, adjacency lists, unsigned* dropped) {
  unsigned const e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n) {
    return;
  }
  edge const ed = edges[e];
  unsigned const i = atomicAdd(&lists.counts[ed.src], 1u);
  unsigned* const place = place_of(alloc, lists.heads[ed.src], i);
  if (place != nullptr) {
    *place = ed.dst;
  } else {
    atomicAdd(dropped, 1u);  // out of memory: the edge is lost, and the check will say so
  }
}

/// Pays for lazy setup outside the timing: one allocation and its free.
template <class Alloc>
__global__ void warm_up(Alloc alloc) {
  void* const p = alloc.allocate(chunk_bytes(0));
  if (p != nullptr) {
    alloc.deallocate(p, chunk_bytes(0));
  }
}

/// One thread per vertex: copies its list into `out` from `offsets[v]` (compressed rows). Only
/// after a build that dropped no edge: then every place claimed holds a value.
__global__ void gather_lists(adjacency lists, unsigned const* offsets, unsigned* out) {
  unsigned const v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= num_vertices) {
    return;
  }
  unsigned const count = lists.counts[v];
  chunk* c = lists.heads[v];
  unsigned* dst = out + offsets[v];
  for (unsigned k = 0, start = 0; start < count; start += chunk_capacity(k), ++k) {
    unsigned const here = count - start < chunk_capacity(k) ? count - start : chunk_capacity(k);
    for (unsigned j = 0; j < here; ++j) {
      dst[start + j] = c->values()[j];
    }
    c = c->next;
  }
}

/// One thread per vertex: frees the chunks of its list, each with the size it was allocated with.
/// A list ends at a null link, or at `no_memory()` where an allocation failed.
template <class Alloc>
__global__ void free_lists(Alloc alloc, adjacency lists) {
  unsigned const v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= num_vertices) {
    return;
  }
  chunk* c = lists.heads[v];
  for (unsigned k = 0; c != nullptr && c != no_memory(); ++k) {
    chunk* const next = c->next;
    alloc.deallocate(c, chunk_bytes(k));
    c = next;
  }
  lists.heads[v] = nullptr;
  lists.counts[v] = 0;
}

/// A deterministic pseudo-random stream (splitmix64).
struct splitmix64 {
  std::uint64_t state;
  std::uint64_t operator()() {
    std::uint64_t z = state += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

/// Edges with skewed out-degrees: the source is num_vertices * u^3 for u uniform in [0, 1), so low
/// vertex numbers get most edges (vertex 0 about 2.5% of them); destinations are uniform.
std::vector<edge> make_edges() {
  splitmix64 random{42};
  std::vector<edge> edges(num_edges);
  for (edge& e : edges) {
    double const u = static_cast<double>(random() >> 11) * 0x1.0p-53;
    e.src = static_cast<unsigned>(num_vertices * u * u * u);
    e.dst = static_cast<unsigned>(random() % num_vertices);
  }
  return edges;
}

/// The device's resources for one build: the lists and the gathered result.
struct device_graph {
  edge* edges = nullptr;
  adjacency lists{};
  unsigned* offsets = nullptr;
  unsigned* gathered = nullptr;
  unsigned* dropped = nullptr;
};

/// The result of one build, as the host reads it back.
struct build_result {
  float ms = 0.0f;
  unsigned dropped = 0;
  std::vector<unsigned> counts;
  std::vector<unsigned> offsets;
  std::vector<unsigned> neighbours;
};

/// Builds the lists with `alloc` (timed with CUDA events), then gathers them for the host.
template <class Alloc>
build_result build(Alloc alloc, device_graph const& g) {
  unsigned const edge_blocks = (num_edges + block_threads - 1) / block_threads;
  unsigned const vertex_blocks = (num_vertices + block_threads - 1) / block_threads;
  DEVMR_SAMPLE_CHECK(cudaMemset(g.lists.heads, 0, num_vertices * sizeof(chunk*)));
  DEVMR_SAMPLE_CHECK(cudaMemset(g.lists.counts, 0, num_vertices * sizeof(unsigned)));
  DEVMR_SAMPLE_CHECK(cudaMemset(g.dropped, 0, sizeof(unsigned)));
  // Untimed: loading the kernels and setting up the allocator (CUDA's malloc heap) on first use.
  warm_up<<<1, 1>>>(alloc);
  build_lists<<<1, block_threads>>>(alloc, g.edges, 0, g.lists, g.dropped);
  DEVMR_SAMPLE_CHECK(cudaDeviceSynchronize());

  cudaEvent_t start{};
  cudaEvent_t stop{};
  DEVMR_SAMPLE_CHECK(cudaEventCreate(&start));
  DEVMR_SAMPLE_CHECK(cudaEventCreate(&stop));
  DEVMR_SAMPLE_CHECK(cudaEventRecord(start));
  build_lists<<<edge_blocks, block_threads>>>(alloc, g.edges, num_edges, g.lists, g.dropped);
  DEVMR_SAMPLE_CHECK(cudaEventRecord(stop));
  DEVMR_SAMPLE_CHECK(cudaEventSynchronize(stop));
  DEVMR_SAMPLE_CHECK(cudaGetLastError());
  build_result r;
  DEVMR_SAMPLE_CHECK(cudaEventElapsedTime(&r.ms, start, stop));
  DEVMR_SAMPLE_CHECK(cudaEventDestroy(start));
  DEVMR_SAMPLE_CHECK(cudaEventDestroy(stop));

  DEVMR_SAMPLE_CHECK(cudaMemcpy(&r.dropped, g.dropped, sizeof(unsigned), cudaMemcpyDeviceToHost));
  r.counts.resize(num_vertices);
  DEVMR_SAMPLE_CHECK(cudaMemcpy(r.counts.data(), g.lists.counts, num_vertices * sizeof(unsigned),
                                cudaMemcpyDeviceToHost));
  // Where edges were dropped, lists have places that hold nothing: the host gathers no list then,
  // and the check fails.
  r.offsets.assign(num_vertices + 1, 0);
  for (unsigned v = 0; v < num_vertices; ++v) {
    r.offsets[v + 1] = r.offsets[v] + r.counts[v];
  }
  if (r.dropped == 0 && r.offsets[num_vertices] == num_edges) {
    DEVMR_SAMPLE_CHECK(cudaMemcpy(g.offsets, r.offsets.data(), num_vertices * sizeof(unsigned),
                                  cudaMemcpyHostToDevice));
    gather_lists<<<vertex_blocks, block_threads>>>(g.lists, g.offsets, g.gathered);
    DEVMR_SAMPLE_CHECK(cudaDeviceSynchronize());
    r.neighbours.resize(num_edges);
    DEVMR_SAMPLE_CHECK(cudaMemcpy(r.neighbours.data(), g.gathered, num_edges * sizeof(unsigned),
                                  cudaMemcpyDeviceToHost));
  }
  return r;
}

/// Frees every chunk with `alloc`.
template <class Alloc>
void free_all(Alloc alloc, device_graph const& g) {
  unsigned const vertex_blocks = (num_vertices + block_threads - 1) / block_threads;
  free_lists<<<vertex_blocks, block_threads>>>(alloc, g.lists);
  DEVMR_SAMPLE_CHECK(cudaDeviceSynchronize());
}

/// The reference: every vertex's neighbours, sorted (compressed rows, offsets as `offsets`).
struct host_lists {
  std::vector<unsigned> offsets;
  std::vector<unsigned> neighbours;
};

host_lists make_reference(std::vector<edge> const& edges) {
  host_lists ref;
  ref.offsets.assign(num_vertices + 1, 0);
  for (edge const& e : edges) {
    ++ref.offsets[e.src + 1];
  }
  for (unsigned v = 0; v < num_vertices; ++v) {
    ref.offsets[v + 1] += ref.offsets[v];
  }
  ref.neighbours.resize(edges.size());
  std::vector<unsigned> fill(ref.offsets.begin(), ref.offsets.end() - 1);
  for (edge const& e : edges) {
    ref.neighbours[fill[e.src]++] = e.dst;
  }
  for (unsigned v = 0; v < num_vertices; ++v) {
    std::sort(ref.neighbours.begin() + ref.offsets[v], ref.neighbours.begin() + ref.offsets[v + 1]);
  }
  return ref;
}

/// The vertices whose lists differ from the reference as multisets (every list, when the build
/// lost edges and so was not gathered).
unsigned wrong_lists(build_result& r, host_lists const& ref) {
  if (r.neighbours.empty()) {
    return num_vertices;
  }
  unsigned wrong = 0;
  for (unsigned v = 0; v < num_vertices; ++v) {
    auto const first = r.neighbours.begin() + r.offsets[v];
    auto const last = r.neighbours.begin() + r.offsets[v + 1];
    std::sort(first, last);
    bool const same = r.offsets[v + 1] - r.offsets[v] == ref.offsets[v + 1] - ref.offsets[v] &&
                      std::equal(first, last, ref.neighbours.begin() + ref.offsets[v]);
    wrong += same ? 0u : 1u;
  }
  return wrong;
}

}  // namespace

int main() {
  devmr_samples::require_gpu("graph_adjacency");
  // CUDA's malloc heap must be sized before the first kernel launch. 2^20 edges take 7.6 MiB of
  // chunks; the limit leaves ample room for malloc's own bookkeeping.
  DEVMR_SAMPLE_CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, std::size_t{256} << 20));

  std::vector<edge> const edges = make_edges();
  host_lists const ref = make_reference(edges);
  unsigned max_degree = 0;
  unsigned isolated = 0;
  std::size_t expected_chunks = 0;
  for (unsigned v = 0; v < num_vertices; ++v) {
    unsigned const degree = ref.offsets[v + 1] - ref.offsets[v];
    max_degree = std::max(max_degree, degree);
    isolated += degree == 0 ? 1u : 0u;
    expected_chunks += chunks_for(degree);
  }
  std::printf("%u vertices, %u edges: out-degree up to %u, %u vertices with none; %zu chunks\n",
              num_vertices, num_edges, max_degree, isolated, expected_chunks);

  device_graph g;
  DEVMR_SAMPLE_CHECK(cudaMalloc(&g.edges, num_edges * sizeof(edge)));
  DEVMR_SAMPLE_CHECK(cudaMalloc(&g.lists.heads, num_vertices * sizeof(chunk*)));
  DEVMR_SAMPLE_CHECK(cudaMalloc(&g.lists.counts, num_vertices * sizeof(unsigned)));
  DEVMR_SAMPLE_CHECK(cudaMalloc(&g.offsets, num_vertices * sizeof(unsigned)));
  DEVMR_SAMPLE_CHECK(cudaMalloc(&g.gathered, num_edges * sizeof(unsigned)));
  DEVMR_SAMPLE_CHECK(cudaMalloc(&g.dropped, sizeof(unsigned)));
  DEVMR_SAMPLE_CHECK(
      cudaMemcpy(g.edges, edges.data(), num_edges * sizeof(edge), cudaMemcpyHostToDevice));

  bool ok = true;
  float devmr_ms = 0.0f;
  {
    devmr::device_pool pool{devmr::pool_options{.initial_bytes = std::size_t{512} << 20}};
    devmr::slab_heap<> heap{pool, devmr::heap_options{.initial_bytes = std::size_t{256} << 20}};
    build_result r = build(devmr_chunks{heap.ref()}, g);
    devmr::heap_stats const live = heap.stats();
    unsigned const wrong = wrong_lists(r, ref);
    free_all(devmr_chunks{heap.ref()}, g);
    devmr::heap_stats const done = heap.stats();
    devmr_ms = r.ms;
    std::printf(
        "devmr slab heap:    %8.3f ms; %u wrong lists, %u edges dropped; %zu blocks in use after "
        "the build (%llu failed allocations), %zu after the frees\n",
        r.ms, wrong, r.dropped, live.blocks_in_use,
        static_cast<unsigned long long>(live.failed_allocations), done.blocks_in_use);
    ok = ok && wrong == 0 && r.dropped == 0 && live.blocks_in_use == expected_chunks &&
         live.failed_allocations == 0 && done.blocks_in_use == 0;
  }

  build_result r = build(malloc_chunks{}, g);
  unsigned const wrong = wrong_lists(r, ref);
  free_all(malloc_chunks{}, g);
  // CUDA's malloc may fail allocations under this many concurrent requests, with memory to
  // spare: its lost edges are reported, not held against the sample, which checks devmr.
  if (r.dropped == 0) {
    std::printf("CUDA device malloc: %8.3f ms; %u wrong lists\n", r.ms, wrong);
    ok = ok && wrong == 0;
  } else {
    std::printf(
        "CUDA device malloc: %8.3f ms; %u edges dropped (its allocations failed), so its "
        "lists are incomplete\n",
        r.ms, r.dropped);
  }
  if (devmr_ms > 0.0f) {
    std::printf("device malloc took %.1fx devmr's time\n", static_cast<double>(r.ms / devmr_ms));
  }

  DEVMR_SAMPLE_CHECK(cudaFree(g.edges));
  DEVMR_SAMPLE_CHECK(cudaFree(g.lists.heads));
  DEVMR_SAMPLE_CHECK(cudaFree(g.lists.counts));
  DEVMR_SAMPLE_CHECK(cudaFree(g.offsets));
  DEVMR_SAMPLE_CHECK(cudaFree(g.gathered));
  DEVMR_SAMPLE_CHECK(cudaFree(g.dropped));
  std::printf("%s\n", ok ? "graph_adjacency: OK" : "graph_adjacency: FAILED");
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
