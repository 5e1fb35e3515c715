#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "atoll/core/checksum.h"
#include "atoll/core/file.h"
#include "testing/scratch.h"

namespace atl {
namespace {

TEST(Checksum, StreamingEqualsOneShotAndDetectsFlips) {
  std::string data(10000, 'a');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + 7);
  uint64_t whole = Checksum64(data);
  Hasher h;
  h.Update(data.data(), 123);
  h.Update(data.data() + 123, data.size() - 123);
  EXPECT_EQ(h.Digest(), whole);
  for (size_t pos : {size_t{0}, size_t{5000}, data.size() - 1}) {
    std::string flipped = data;
    flipped[pos] ^= 0x01;
    EXPECT_NE(Checksum64(flipped), whole) << "flip at " << pos;
  }
  EXPECT_EQ(ChecksumHex(0xabcULL), "0000000000000abc");
}

TEST(File, AtomicWriteReplacesAndLeavesNoTemp) {
  const std::filesystem::path dir = testing::ScratchDir("file_test");
  std::string path = (dir / "state.bin").string();
  ASSERT_TRUE(WriteFileAtomic(path, std::string_view("first")).ok());
  ASSERT_TRUE(WriteFileAtomic(path, std::string_view("second version")).ok());
  auto read = ReadFile(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, "second version");
  int entries = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);  // no temp files left behind
  auto missing = ReadFile((dir / "nope").string());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  // Writing into a folder that does not exist fails cleanly.
  EXPECT_FALSE(WriteFileAtomic((dir / "no" / "such" / "f").string(), std::string_view("x")).ok());
  // Without fsync (caches): the same replace-by-rename, nothing left behind.
  const std::string cache = "cache bytes";
  ASSERT_TRUE(
      WriteFileAtomic(path, std::as_bytes(std::span<const char>(cache.data(), cache.size())), Durability::kNoSync)
          .ok());
  EXPECT_EQ(*ReadFile(path), cache);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atl

namespace atl {
namespace {

TEST(File, ListFilesRecursiveIsSortedAndReportsMissingFolders) {
  const std::filesystem::path dir = testing::ScratchDir("list_test");
  ASSERT_TRUE(MakeDirs((dir / "b" / "c").string()).ok());
  for (const char* f : {"z.txt", "b/c/y.txt", "a.txt"})
    ASSERT_TRUE(WriteFileAtomic((dir / f).string(), std::string_view("x")).ok());
  auto files = ListFilesRecursive(dir.string());
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 3u);
  EXPECT_EQ((*files)[0], (dir / "a.txt").string());
  EXPECT_EQ((*files)[1], (dir / "b/c/y.txt").string());
  EXPECT_EQ((*files)[2], (dir / "z.txt").string());
  EXPECT_EQ(ListFilesRecursive((dir / "missing").string()).status().code(), StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atl
