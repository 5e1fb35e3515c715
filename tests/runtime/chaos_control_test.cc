// The typed chaos control file between `atoll run` (writer) and a learner (reader), the learner's
// --syncer list, and the owner-only files of a run.
#include "chaos_control.h"
#include "learner_links.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <fstream>

#include "atoll/core/file.h"
#include "testing/scratch.h"

namespace atl::runtime {
namespace {

TEST(ChaosControl, WhatTheClusterWritesTheLearnerReadsOnceItChanged) {
  const std::string path = testing::ScratchDir("chaos_control") + "/learner-0.json";
  ChaosControl seen;
  ChaosControlReader reader(path);
  EXPECT_FALSE(reader.Poll(seen)) << "no file yet: nothing changes";
  const ChaosControl slow{0.25, true, 8.0};
  ASSERT_TRUE(WriteChaosControl(path, slow).ok());
  ASSERT_TRUE(reader.Poll(seen));
  EXPECT_EQ(seen, slow);
  EXPECT_FALSE(reader.Poll(seen)) << "unchanged since the last poll";
  // An empty object is "no fault": every field at its default.
  EXPECT_EQ(ChaosControlFromJson(nlohmann::json::object()), ChaosControl{});
  EXPECT_EQ(ChaosControlFromJson(ToJson(slow)), slow);
}

TEST(ChaosControl, AFileThatIsNotAControlChangesNothing) {
  const std::string path = testing::ScratchDir("chaos_control_bad") + "/learner-1.json";
  ChaosControl seen{0.5, false, 0};
  ChaosControlReader reader(path);
  std::ofstream(path) << "{ not json";
  EXPECT_FALSE(reader.Poll(seen));
  EXPECT_EQ(seen.speed, 0.5);
  std::ofstream(path) << R"({"speed": "fast"})";
  const timespec times[2] = {{1000, 0}, {1000, 0}};  // a modification time of its own
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_FALSE(reader.Poll(seen));
  EXPECT_EQ(seen.speed, 0.5);
}

TEST(SyncerLinks, TheSyncerListIsOneAddressPerShardInOrder) {
  auto one = SyncerAddresses("127.0.0.1:5000", 4);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, std::vector<std::string>{"127.0.0.1:5000"});
  auto two = SyncerAddresses("a:1,b:2", 4);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_NE(SyncerAddresses("a:1,,b:2", 4).status().message().find("an empty address"), std::string::npos);
  EXPECT_NE(SyncerAddresses("a:1,b:2,c:3", 2).status().message().find("3 syncer shards, the run has only 2 fragments"),
            std::string::npos);
}

TEST(OwnerOnlyFiles, ASecretIsReadableByItsOwnerOnly) {
  const std::string path = testing::ScratchDir("owner_only") + "/run.secret";
  ASSERT_TRUE(WriteFileOwnerOnly(path, "s3cret").ok());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(*ReadFile(path), "s3cret");
  EXPECT_FALSE(WriteFileOwnerOnly(testing::ScratchDir("owner_only") + "/missing/dir/x", "y").ok());
}

}  // namespace
}  // namespace atl::runtime
