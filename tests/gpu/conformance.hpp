#pragma once

// The conformance suite every devmr resource must pass (RMM style: one set of tests, instantiated
// once per resource). A resource joins through a factory:
//
//   struct my_factory {
//     using resource_type = ...;                      // the resource under test
//     static constexpr char const* name = "...";
//     static constexpr bool host_accessible = ...;    // memory readable by host code
//     my_factory();                                   // builds the resource (and its upstreams)
//     resource_type& resource();                      // the resource under test
//   };
//
// and a test file instantiates the suite for a list of factories:
//
//   using my_factories = std::tuple<my_factory, other_factory>;
//   DEVMR_RESOURCE_CONFORMANCE_SUITE(my_factories)
//
// The suite uses the CCCL 3.0 spellings (allocate/deallocate, allocate_async/deallocate_async for
// resources that model cuda::mr::async_resource) and goes through cuda::mr::resource_ref too.
// Compile with nvcc: it launches kernels to write and verify blocks.

// First: defines what CCCL 3.0 needs to declare cuda::mr.
#include <devmr/detail/config.hpp>
#include <devmr/errors.hpp>

#include <catch2/catch.hpp>
#include <cuda/memory_resource>
#include <cuda/stream_ref>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace devmr::test {

/// @brief One block the suite allocated: where, how big, and the tag written into it.
struct tagged_block {
  std::uint32_t* words;
  std::size_t word_count;
  std::uint32_t tag;
};

/// Writes each block's tag into every word of the block: one thread block per block.
static __global__ void conformance_write_tags(tagged_block const* blocks, std::size_t count) {
  for (std::size_t b = blockIdx.x; b < count; b += gridDim.x) {
    auto const block = blocks[b];
    for (std::size_t i = threadIdx.x; i < block.word_count; i += blockDim.x) {
      block.words[i] = block.tag;
    }
  }
}

/// Counts the words that do not hold their block's tag (an overlap, or memory that is not there).
static __global__ void conformance_count_mismatches(tagged_block const* blocks,
                                                    std::size_t count,
                                                    unsigned long long* mismatches) {
  for (std::size_t b = blockIdx.x; b < count; b += gridDim.x) {
    auto const block = blocks[b];
    for (std::size_t i = threadIdx.x; i < block.word_count; i += blockDim.x) {
      if (block.words[i] != block.tag) {
        atomicAdd(mismatches, 1ULL);
      }
    }
  }
}

/// Checks a CUDA call in a test.
#define DEVMR_TEST_CUDA(call) REQUIRE((call) == cudaSuccess)

/// @brief Launches kernels on stream: writes every block's tag (when write is set), then counts
/// the words that do not hold their tag.
/// @return the number of words that did not hold their tag
inline unsigned long long tag_blocks(std::vector<tagged_block> const& blocks,
                                     bool write,
                                     cudaStream_t stream) {
  tagged_block* d_blocks = nullptr;
  unsigned long long* d_mismatches = nullptr;
  auto const bytes = blocks.size() * sizeof(tagged_block);
  DEVMR_TEST_CUDA(cudaMalloc(&d_blocks, std::max<std::size_t>(bytes, 1)));
  DEVMR_TEST_CUDA(cudaMalloc(&d_mismatches, sizeof(unsigned long long)));
  DEVMR_TEST_CUDA(cudaMemsetAsync(d_mismatches, 0, sizeof(unsigned long long), stream));
  DEVMR_TEST_CUDA(cudaMemcpyAsync(d_blocks, blocks.data(), bytes, cudaMemcpyHostToDevice, stream));
  auto const grid = static_cast<unsigned>(std::min<std::size_t>(blocks.size(), 4096));
  if (grid > 0) {
    if (write) {
      conformance_write_tags<<<grid, 256, 0, stream>>>(d_blocks, blocks.size());
    }
    conformance_count_mismatches<<<grid, 256, 0, stream>>>(d_blocks, blocks.size(), d_mismatches);
  }
  DEVMR_TEST_CUDA(cudaGetLastError());
  unsigned long long mismatches = 0;
  DEVMR_TEST_CUDA(cudaMemcpyAsync(&mismatches, d_mismatches, sizeof mismatches,
                                  cudaMemcpyDeviceToHost, stream));
  DEVMR_TEST_CUDA(cudaStreamSynchronize(stream));
  DEVMR_TEST_CUDA(cudaFree(d_blocks));
  DEVMR_TEST_CUDA(cudaFree(d_mismatches));
  return mismatches;
}

/// @brief Writes every block's tag from a kernel, then counts mismatches from another kernel:
/// nonzero when live blocks overlap.
inline unsigned long long write_and_verify(std::vector<tagged_block> const& blocks,
                                           cudaStream_t stream = nullptr) {
  return tag_blocks(blocks, true, stream);
}

/// @brief Counts the words that no longer hold their tag (blocks written before).
inline unsigned long long verify(std::vector<tagged_block> const& blocks,
                                 cudaStream_t stream = nullptr) {
  return tag_blocks(blocks, false, stream);
}

/// Sizes and alignments every resource must serve.
inline constexpr std::size_t conformance_sizes[] = {1, 16, 100, 256, 1000, 4096, 65536, 1 << 20};
inline constexpr std::size_t conformance_alignments[] = {1, 8, 16, 64, 256, 1024, 4096};

inline bool is_aligned(void const* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

}  // namespace devmr::test

/// Instantiates the conformance suite for every factory in the std::tuple FactoryList.
#define DEVMR_RESOURCE_CONFORMANCE_SUITE(FactoryList)                                              \
  TEMPLATE_LIST_TEST_CASE("conformance: properties and concepts", "[conformance]", FactoryList) {  \
    using resource_type = typename TestType::resource_type;                                        \
    static_assert(cuda::mr::resource<resource_type>);                                              \
    static_assert(cuda::mr::resource_with<resource_type, cuda::mr::device_accessible>);            \
    static_assert(cuda::mr::resource_with<resource_type, cuda::mr::host_accessible> ==             \
                  TestType::host_accessible);                                                      \
    SUCCEED(TestType::name);                                                                       \
  }                                                                                                \
                                                                                                   \
  TEMPLATE_LIST_TEST_CASE("conformance: round trips at every size and alignment", "[conformance]", \
                          FactoryList) {                                                           \
    TestType factory;                                                                              \
    auto& resource = factory.resource();                                                           \
    for (auto const bytes : ::devmr::test::conformance_sizes) {                                    \
      for (auto const alignment : ::devmr::test::conformance_alignments) {                         \
        CAPTURE(TestType::name, bytes, alignment);                                                 \
        void* p = resource.allocate(bytes, alignment);                                             \
        REQUIRE(p != nullptr);                                                                     \
        CHECK(::devmr::test::is_aligned(p, std::max<std::size_t>(alignment, 16)));                 \
        resource.deallocate(p, bytes, alignment);                                                  \
      }                                                                                            \
    }                                                                                              \
    CHECK_THROWS_AS(resource.allocate(64, 3), std::invalid_argument);                              \
    CHECK(resource.allocate(0, 16) == nullptr);                                                    \
    resource.deallocate(nullptr, 0, 16);                                                           \
  }                                                                                                \
                                                                                                   \
  TEMPLATE_LIST_TEST_CASE("conformance: live blocks never overlap", "[conformance]",               \
                          FactoryList) {                                                           \
    TestType factory;                                                                              \
    auto& resource = factory.resource();                                                           \
    std::vector<::devmr::test::tagged_block> blocks;                                               \
    std::vector<std::pair<void*, std::size_t>> allocations;                                        \
    std::uint32_t tag = 1;                                                                         \
    for (int round = 0; round < 4; ++round) {                                                      \
      for (auto const bytes : ::devmr::test::conformance_sizes) {                                  \
        auto const size = std::max<std::size_t>(bytes, 4);                                         \
        void* p = resource.allocate(size, 16);                                                     \
        allocations.emplace_back(p, size);                                                         \
        blocks.push_back({static_cast<std::uint32_t*>(p), size / 4, tag++});                       \
      }                                                                                            \
    }                                                                                              \
    CHECK(::devmr::test::write_and_verify(blocks) == 0);                                           \
    /* Free every other block and allocate again: reused memory must not overlap either. */        \
    std::vector<::devmr::test::tagged_block> kept;                                                 \
    std::vector<std::pair<void*, std::size_t>> kept_allocations;                                   \
    for (std::size_t i = 0; i < allocations.size(); ++i) {                                         \
      if (i % 2 == 0) {                                                                            \
        resource.deallocate(allocations[i].first, allocations[i].second, 16);                      \
      } else {                                                                                     \
        kept.push_back(blocks[i]);                                                                 \
        kept_allocations.push_back(allocations[i]);                                                \
      }                                                                                            \
    }                                                                                              \
    for (auto const bytes : ::devmr::test::conformance_sizes) {                                    \
      auto const size = std::max<std::size_t>(bytes, 4);                                           \
      void* p = resource.allocate(size, 16);                                                       \
      kept_allocations.emplace_back(p, size);                                                      \
      kept.push_back({static_cast<std::uint32_t*>(p), size / 4, tag++});                           \
    }                                                                                              \
    CHECK(::devmr::test::write_and_verify(kept) == 0);                                             \
    for (auto const& [p, size] : kept_allocations) {                                               \
      resource.deallocate(p, size, 16);                                                            \
    }                                                                                              \
  }                                                                                                \
                                                                                                   \
  TEMPLATE_LIST_TEST_CASE("conformance: host access matches host_accessible", "[conformance]",     \
                          FactoryList) {                                                           \
    TestType factory;                                                                              \
    auto& resource = factory.resource();                                                           \
    constexpr std::size_t words = 1 << 16;                                                         \
    auto* p = static_cast<std::uint32_t*>(resource.allocate(words * 4, 256));                      \
    ::devmr::test::tagged_block const block{p, words, 0xfeedbeefu};                                \
    CHECK(::devmr::test::write_and_verify({block}) == 0);                                          \
    if constexpr (TestType::host_accessible) {                                                     \
      CHECK(std::all_of(p, p + words, [](std::uint32_t w) { return w == 0xfeedbeefu; }));          \
    }                                                                                              \
    resource.deallocate(p, words * 4, 256);                                                        \
  }                                                                                                \
                                                                                                   \
  TEMPLATE_LIST_TEST_CASE("conformance: equality is identity", "[conformance]", FactoryList) {     \
    TestType first;                                                                                \
    TestType second;                                                                               \
    CHECK(first.resource() == first.resource());                                                   \
    CHECK_FALSE(first.resource() != first.resource());                                             \
    CHECK(first.resource() != second.resource());                                                  \
  }                                                                                                \
                                                                                                   \
  TEMPLATE_LIST_TEST_CASE("conformance: works through cuda::mr::resource_ref", "[conformance]",    \
                          FactoryList) {                                                           \
    TestType factory;                                                                              \
    cuda::mr::resource_ref<cuda::mr::device_accessible> ref{factory.resource()};                   \
    cuda::mr::resource_ref<cuda::mr::device_accessible> same{factory.resource()};                  \
    CHECK(ref == same);                                                                            \
    void* p = ref.allocate(4096, 512);                                                             \
    REQUIRE(p != nullptr);                                                                         \
    CHECK(::devmr::test::is_aligned(p, 512));                                                      \
    CHECK(::devmr::test::write_and_verify({{static_cast<std::uint32_t*>(p), 1024, 7}}) == 0);      \
    ref.deallocate(p, 4096, 512);                                                                  \
    if constexpr (cuda::mr::async_resource<typename TestType::resource_type>) {                    \
      cuda::mr::async_resource_ref<cuda::mr::device_accessible> async_ref{factory.resource()};     \
      cudaStream_t stream = nullptr;                                                               \
      DEVMR_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));                  \
      void* q = async_ref.allocate_async(1 << 20, 256, cuda::stream_ref{stream});                  \
      REQUIRE(q != nullptr);                                                                       \
      CHECK(::devmr::test::write_and_verify({{static_cast<std::uint32_t*>(q), 1 << 18, 9}},        \
                                            stream) == 0);                                         \
      async_ref.deallocate_async(q, 1 << 20, 256, cuda::stream_ref{stream});                       \
      DEVMR_TEST_CUDA(cudaStreamSynchronize(stream));                                              \
      DEVMR_TEST_CUDA(cudaStreamDestroy(stream));                                                  \
    }                                                                                              \
  }
