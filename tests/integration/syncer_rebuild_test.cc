// A syncer whose machine is lost (SIGKILL, its state folder deleted) rebuilt from the learners with
// `atoll syncer --rebuild` (docs/decisions/021), as separate processes of the real binary on
// 127.0.0.1; and the flag's refusals.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/checksum.h"
#include "atoll/core/child_process.h"
#include "atoll/core/file.h"
#include "testing/hand_run.h"
#include "testing/run_files.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using testing::FragmentsWithARound;
using testing::HandRun;
using testing::Held;
using testing::HeldCopy;
using testing::MetricLines;
using testing::RunFlags;

constexpr int kFragments = 4;  // RunFlags: -P 4

std::vector<ChildProcess> StartLearners(const HandRun& r, int steps) {
  std::vector<ChildProcess> learners;
  for (int id = 0; id < 2; ++id) {
    std::vector<std::string> argv = {ATOLL_BIN,          "learner",  "--id",
                                     std::to_string(id), "--syncer", "127.0.0.1:" + std::to_string(r.port)};
    for (const auto& f : RunFlags(r.data, r.out, steps)) argv.push_back(f);
    auto l = ChildProcess::Start(argv, r.dir + "/learner-" + std::to_string(id) + ".log");
    EXPECT_TRUE(l.ok()) << l.status();
    if (l.ok()) learners.push_back(std::move(*l));
  }
  return learners;
}

TEST(SyncerRebuild, ALostSyncerIsRebuiltFromTheLearnersNewestCopies) {
  HandRun r;
  r.dir = testing::ScratchDir("syncer_rebuild");
  r.data = testing::PrepareSmallData(r.dir);
  r.out = r.dir + "/run";
  const int steps = 100000;  // the learners train throughout; the syncer's SIGTERM ends them
  r.StartSyncer(steps, {});
  std::vector<ChildProcess> learners = StartLearners(r, steps);
  ASSERT_EQ(learners.size(), 2u);
  const std::string metrics = r.out + "/metrics-syncer.jsonl";
  // Every fragment has rounds, and every learner holds a copy of each beyond Θ⁰.
  auto every_copy_moved = [&] {
    for (int m = 0; m < 2; ++m) {
      for (int p = 0; p < kFragments; ++p) {
        if (HeldCopy(r.out + "/learner-" + std::to_string(m) + "-state", p).version < 1) return false;
      }
    }
    return FragmentsWithARound(metrics) == kFragments;
  };
  ASSERT_TRUE(testing::AwaitFor(every_copy_moved, 240, std::chrono::milliseconds(100))) << r.Log();
  // The syncer's machine is lost: the process and its state folder.
  r.syncer.Signal(SIGKILL);
  r.syncer.WaitOrKill(30);
  fs::remove_all(r.out + "/state");
  std::this_thread::sleep_for(std::chrono::seconds(1));  // any pull in flight has failed by now
  std::map<int, Held> newest;
  for (int m = 0; m < 2; ++m) {
    for (int p = 0; p < kFragments; ++p) {
      const Held h = HeldCopy(r.out + "/learner-" + std::to_string(m) + "-state", p);
      if (h.version > newest[p].version) newest[p] = h;
    }
  }
  const size_t lines_before = MetricLines(metrics).size();
  const int port = r.port;
  fs::remove(r.dir + "/syncer.port");  // StartSyncer waits for the new syncer's port files
  fs::remove(r.dir + "/syncer.http-port");
  r.StartSyncer(steps, {"--rebuild", "--rebuild-wait", "30", "--listen", "127.0.0.1:" + std::to_string(port)});
  ASSERT_EQ(r.port, port);
  // Every fragment some learner held beyond Θ⁰ is adopted at the newest version, Θ_p bit for bit.
  std::map<int, nlohmann::json> adopted;
  auto all_adopted = [&] {
    const auto lines = MetricLines(metrics);
    for (size_t i = lines_before; i < lines.size(); ++i) {
      if (lines[i].value("reason", "") == "adopted") adopted[lines[i]["fragment"].get<int>()] = lines[i];
    }
    for (const auto& [p, h] : newest) {
      if (h.version > 0 && adopted.count(p) == 0) return false;
    }
    return true;
  };
  ASSERT_TRUE(testing::AwaitFor(all_adopted, 120, std::chrono::milliseconds(100))) << r.Log();
  for (const auto& [p, h] : newest) {
    ASSERT_GT(h.version, 0) << "fragment " << p << ": no learner held a round of it";
    EXPECT_EQ(adopted[p]["version"].get<int64_t>(), h.version) << "fragment " << p;
    EXPECT_EQ(adopted[p]["theta_checksum"].get<std::string>(), ChecksumHex(h.checksum)) << "fragment " << p;
  }
  // The status document says what was adopted and what was reset.
  httplib::Client cli("127.0.0.1", r.http_port);
  auto status = cli.Get("/api/status", {{"Authorization", "Bearer hand-token"}});
  ASSERT_TRUE(status);
  ASSERT_EQ(status->status, 200);
  const nlohmann::json rebuilt = nlohmann::json::parse(status->body)["rebuilt"];
  ASSERT_TRUE(rebuilt.is_object()) << status->body;
  EXPECT_GE(rebuilt["adopted"].size(), static_cast<size_t>(kFragments)) << rebuilt.dump();
  EXPECT_TRUE(rebuilt["momentum_reset"].get<bool>());
  EXPECT_TRUE(rebuilt["learner_table_reset"].get<bool>());
  // Rounds continue after the wait, and no learner exited meanwhile.
  const size_t adopted_at = MetricLines(metrics).size();
  auto a_round_after = [&] {
    const auto lines = MetricLines(metrics);
    for (size_t i = adopted_at; i < lines.size(); ++i) {
      if (lines[i].value("kind", "") == "round" && lines[i].value("reason", "") != "adopted") return true;
    }
    return false;
  };
  EXPECT_TRUE(testing::AwaitFor(a_round_after, 120, std::chrono::milliseconds(100))) << r.Log();
  for (auto& l : learners) EXPECT_TRUE(l.running()) << "a learner exited during the rebuild";
  const std::string log = r.Log();
  EXPECT_NE(log.find("rebuild: adopted fragment"), std::string::npos) << log;
  // The end: SIGTERM finishes the syncer, whose finish flag ends the learners.
  r.syncer.Signal(SIGTERM);
  EXPECT_EQ(r.syncer.WaitOrKill(120), 0) << r.Log();
  for (auto& l : learners) EXPECT_EQ(l.WaitOrKill(120), 0);
  fs::remove_all(r.dir);
}

TEST(SyncerRebuild, RebuildOverACommittedStateIsRefusedAndBadWaitsToo) {
  HandRun r;
  r.dir = testing::ScratchDir("syncer_rebuild_refused");
  r.data = testing::PrepareSmallData(r.dir);
  r.out = r.dir + "/run";
  std::vector<std::string> flags = {"syncer"};
  for (const auto& f : RunFlags(r.data, r.out, 8)) flags.push_back(f);
  std::string common;
  for (const auto& f : flags) common += f + " ";
  for (const char* wait : {"0", "-1", "nan", "7200"}) {
    auto bad = testing::RunAtoll(common + "--rebuild --rebuild-wait " + wait, 60);
    EXPECT_EQ(bad.exit_code, 2) << wait << ": " << bad.output;
    EXPECT_NE(bad.output.find("--rebuild-wait"), std::string::npos) << bad.output;
  }
  EXPECT_FALSE(fs::exists(r.out + "/state")) << "a refused start wrote no state";
  // A committed state (this syncer's first start writes one), then --rebuild over it.
  r.StartSyncer(8, {});
  r.syncer.Signal(SIGKILL);
  r.syncer.WaitOrKill(30);
  ASSERT_TRUE(fs::exists(r.out + "/state/meta.json"));
  const auto before = fs::last_write_time(r.out + "/state/meta.json");
  auto refused = testing::RunAtoll(common + "--rebuild", 120);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--rebuild is for a syncer whose state was lost"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("discard"), std::string::npos) << refused.output;
  EXPECT_EQ(fs::last_write_time(r.out + "/state/meta.json"), before);
  fs::remove_all(r.dir);
}

}  // namespace
}  // namespace atl
