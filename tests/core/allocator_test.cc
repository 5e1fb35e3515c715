// KeepFreedMemory against glibc's allocator itself. Not built with sanitizers: their allocators
// replace glibc's malloc, so mallopt and mallinfo2 do not apply there (tests/core/CMakeLists.txt).
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "atoll/core/platform.h"

namespace atl {
namespace {

TEST(Platform, FreedMemoryStaysInTheProcess) {
  ASSERT_TRUE(KeepFreedMemory()) << "MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ in the environment win over "
                                    "KeepFreedMemory; run this test without them";
  // A 64 MiB block (above glibc's default mmap threshold) freed: it stays in the heap as free
  // space for the next step instead of going back to the kernel.
  const size_t big = size_t{64} << 20;
  const size_t free_before = ::mallinfo2().fordblks;
  void* p = std::malloc(big);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, big);
  std::free(p);
  EXPECT_GE(::mallinfo2().fordblks, free_before + big - (size_t{1} << 20));
}

TEST(Platform, AThreadsLargeFreedBlocksStayInTheProcessWithOneHeap) {
  ASSERT_TRUE(OneHeapForAllThreads()) << "MALLOC_ARENA_MAX in the environment wins; run this test without it";
  KeepFreedMemory();
  // A thread of its own (like the syncer's live evaluation) freeing a block larger than a thread
  // arena's 64 MiB heap: with one heap it stays as free space; with an arena of its own it would
  // be an mmap unmapped on free, faulted in anew by the next evaluation.
  const size_t big = size_t{96} << 20;
  size_t free_after = 0;
  std::thread t([&] {
    void* p = std::malloc(big);
    if (p == nullptr) return;
    std::memset(p, 1, big);
    std::free(p);
    free_after = ::mallinfo2().fordblks;
  });
  t.join();
  EXPECT_GE(free_after, big - (size_t{1} << 20));  // the whole block is free space in the heap
}

}  // namespace
}  // namespace atl
