// A syncer sharded two ways, started by hand as on separate machines (docs/deployment.md): two
// `atoll syncer --shard i/2` processes on 127.0.0.1 (port 0, each its own --out and state) and two
// learners given both addresses. One shard is SIGKILLed mid-run: the other shard's fragments
// keep advancing while it is down; restarted on its port from its durable state, it resumes at
// (at least) every version it had committed and goes on; the learners finish; `atoll export`
// combines the two states into the global model. And the refusals: bad --shard, and learners
// whose --syncer list does not match the shards.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "atoll/core/child_process.h"
#include "atoll/core/file.h"
#include "atoll/model/safetensors.h"
#include "testing/atoll_binary.h"
#include "testing/await.h"

namespace atl {
namespace {

constexpr int kSteps = 300;

std::vector<std::string> RunFlags(const std::string& data, const std::string& out) {
  return {"--data", data, "--out",          out, "-M",           "2", "--steps", std::to_string(kSteps),
          "--seq",  "32", "--batch",        "4", "-P",           "4", "-H",      "4",
          "--tau",  "1",  "--eval-batches", "2", "--eval-every", "0", "--token", "shard-token"};
}

std::vector<nlohmann::json> Jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(j);  // the last line may be half-written
  }
  return out;
}

// Waits (bounded) until `done()` holds; false when the bound passed first.
bool Await(const std::function<bool()>& done, double seconds) {
  return testing::AwaitFor(done, seconds, std::chrono::milliseconds(100));
}

struct ShardedRun {
  std::string dir, data;
  ChildProcess shard[2];
  int port[2] = {0, 0};

  std::string Out(int i) const { return dir + "/shard-" + std::to_string(i); }
  std::string Log(int i) const { return testing::TextOf(Out(i) + ".log", "(no log)"); }
  std::string Address(int i) const { return "127.0.0.1:" + std::to_string(port[i]); }

  // Starts shard i of 2 (on `listen`: port 0 the first time, its old port on a restart).
  void StartShard(int i, const std::string& listen) {
    const std::string port_file = Out(i) + ".port";
    std::remove(port_file.c_str());
    std::vector<std::string> argv = {ATOLL_BIN, "syncer",      "--shard", std::to_string(i) + "/2", "--listen",
                                     listen,    "--port-file", port_file, "--finish-when-done"};
    for (const auto& f : RunFlags(data, Out(i))) argv.push_back(f);
    auto s = ChildProcess::Start(argv, Out(i) + ".log");
    ASSERT_TRUE(s.ok()) << s.status();
    shard[i] = std::move(*s);
    ASSERT_TRUE(Await([&] { return FileExists(port_file) || !shard[i].running(); }, 240)) << Log(i);
    auto text = ReadFile(port_file);
    ASSERT_TRUE(text.ok() && !text->empty()) << Log(i);
    port[i] = std::stoi(*text);
  }

  // Learner `id` with the given --syncer list and a chaos control file (its speed).
  StatusOr<ChildProcess> StartLearner(int id, const std::string& syncers) {
    std::vector<std::string> argv = {
        ATOLL_BIN,  "learner", "--id",           std::to_string(id),
        "--syncer", syncers,   "--control-file", dir + "/control-" + std::to_string(id) + ".json"};
    for (const auto& f : RunFlags(data, dir + "/learners")) argv.push_back(f);
    return ChildProcess::Start(argv, dir + "/learner-" + std::to_string(id) + ".log");
  }

  void SetSpeed(double speed) {
    for (int id = 0; id < 2; ++id) {
      ASSERT_TRUE(
          WriteFileAtomic(dir + "/control-" + std::to_string(id) + ".json", nlohmann::json({{"speed", speed}}).dump())
              .ok());
    }
  }

  // Committed rounds in shard i's metrics: fragment → newest version (only lines before the
  // first "resumed" when `before_resume`).
  std::map<int, int64_t> Committed(int i, bool before_resume = false) const {
    std::map<int, int64_t> v;
    for (const auto& l : Jsonl(Out(i) + "/metrics-syncer.jsonl")) {
      if (before_resume && l.value("kind", "") == "resumed") break;
      if (l.value("kind", "") == "round") v[l["fragment"].get<int>()] = l["version"].get<int64_t>();
    }
    return v;
  }
  int Rounds(int i) const {
    int n = 0;
    for (const auto& l : Jsonl(Out(i) + "/metrics-syncer.jsonl")) n += l.value("kind", "") == "round" ? 1 : 0;
    return n;
  }
};

TEST(ShardedSyncer, KilledShardStallsOnlyItsFragmentsAndResumesFromItsCommits) {
  ShardedRun r;
  r.dir = testing::ScratchDir("sharded");
  r.data = testing::PrepareSmallData(r.dir);
  r.StartShard(0, "127.0.0.1:0");
  r.StartShard(1, "127.0.0.1:0");
  ASSERT_GT(r.port[0], 0);
  ASSERT_GT(r.port[1], 0);
  r.SetSpeed(0.2);  // slower steps while the shard is killed; full speed once it is back
  std::vector<ChildProcess> learners;
  for (int id = 0; id < 2; ++id) {
    auto l = r.StartLearner(id, r.Address(0) + "," + r.Address(1));
    ASSERT_TRUE(l.ok()) << l.status();
    learners.push_back(std::move(*l));
  }
  // Shard 1 commits a few rounds of its fragments (1 and 3), then is killed.
  ASSERT_TRUE(Await([&] { return r.Rounds(1) >= 4; }, 240)) << r.Log(1);
  r.shard[1].Signal(SIGKILL);
  r.shard[1].WaitOrKill(10);
  const std::map<int, int64_t> committed = r.Committed(1);
  const int shard0_at_kill = r.Rounds(0), shard1_at_kill = r.Rounds(1);
  // While it is down the fragments of shard 0 (0 and 2) keep advancing.
  EXPECT_TRUE(Await([&] { return r.Rounds(0) >= shard0_at_kill + 4; }, 180))
      << "shard 0 stalled while shard 1 was down:\n"
      << r.Log(0);
  EXPECT_EQ(r.Committed(1), committed) << "a dead shard commits nothing";
  // Restarted on its port, it resumes from its durable state and goes on. (The learners are
  // stopped meanwhile, so that however long the restart takes they still have steps to train.)
  for (auto& l : learners) l.Signal(SIGSTOP);
  r.StartShard(1, r.Address(1));
  for (auto& l : learners) l.Signal(SIGCONT);
  ASSERT_TRUE(Await([&] { return r.Rounds(1) >= shard1_at_kill + 2; }, 180)) << r.Log(1);
  r.SetSpeed(1.0);
  for (auto& l : learners) EXPECT_EQ(l.WaitOrKill(300), 0) << testing::TextOf(r.dir + "/learner-0.log");
  EXPECT_EQ(r.shard[0].WaitOrKill(120), 0) << r.Log(0);
  EXPECT_EQ(r.shard[1].WaitOrKill(120), 0) << r.Log(1);

  bool resumed = false;
  for (const auto& l : Jsonl(r.Out(1) + "/metrics-syncer.jsonl")) {
    if (l.value("kind", "") != "resumed") continue;
    resumed = true;
    for (const auto& [p, v] : committed) {
      EXPECT_EQ(p % 2, 1) << "shard 1 owns the odd fragments";
      EXPECT_GE(l["versions"][p].get<int64_t>(), v) << "fragment " << p << ": a committed round was lost";
    }
    EXPECT_EQ(l["versions"][0].get<int64_t>(), 0) << "shard 1 never moves shard 0's fragments";
  }
  ASSERT_TRUE(resumed) << r.Log(1);
  const auto final1 = r.Committed(1);
  for (const auto& [p, v] : committed) EXPECT_GT(final1.at(p), v) << "fragment " << p << " went on after the restart";
  for (const auto& [p, v] : r.Committed(0)) EXPECT_EQ(p % 2, 0) << "shard 0 owns the even fragments";

  // The global model: every fragment from the shard that owns it.
  auto exported = testing::RunAtoll(
      "export --state " + r.Out(0) + "/state," + r.Out(1) + "/state --out " + r.dir + "/global.safetensors", 120);
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const auto final0 = r.Committed(0);
  const std::string versions =
      nlohmann::json(std::vector<int64_t>{final0.at(0), final1.at(1), final0.at(2), final1.at(3)}).dump();
  EXPECT_NE(exported.output.find("fragment versions " + versions), std::string::npos) << exported.output;
  EXPECT_TRUE(model::ReadSafetensors(r.dir + "/global.safetensors").ok());
  // The shards' states swapped: refused (each state knows its shard).
  auto swapped = testing::RunAtoll("export --state " + r.Out(1) + "/state," + r.Out(0) + "/state --out " + r.dir +
                                       "/swapped.safetensors --config " + r.Out(0) + "/config.json",
                                   120);
  EXPECT_NE(swapped.exit_code, 0);
  EXPECT_NE(swapped.output.find("belongs to another shard"), std::string::npos) << swapped.output;
  EXPECT_FALSE(FileExists(r.dir + "/swapped.safetensors"));
  std::filesystem::remove_all(r.dir);
}

TEST(ShardedSyncer, BadShardFlagIsRefused) {
  for (const auto& [flag, why] : std::vector<std::pair<std::string, std::string>>{
           {"2/2", "below the shard count"}, {"x", "no '/'"}, {"1/", "count is not a number"}}) {
    auto r = testing::RunAtoll("syncer --shard " + flag + " --out /nonexistent-atoll-dir --steps 1", 60);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(why), std::string::npos) << r.output;
  }
}

TEST(ShardedSyncer, LearnerWithMismatchedShardListIsRefused) {
  ShardedRun r;
  r.dir = testing::ScratchDir("sharded_bad");
  r.data = testing::PrepareSmallData(r.dir);
  r.StartShard(0, "127.0.0.1:0");
  r.StartShard(1, "127.0.0.1:0");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {r.Address(0), "shard count mismatch"},                        // one address for two shards
      {r.Address(1) + "," + r.Address(0), "shard order mismatch"}};  // not in shard order
  for (const auto& [syncers, why] : cases) {
    auto l = r.StartLearner(0, syncers);
    ASSERT_TRUE(l.ok());
    EXPECT_NE(l->WaitOrKill(120), 0);
    const std::string log = testing::TextOf(r.dir + "/learner-0.log");
    EXPECT_NE(log.find(why), std::string::npos) << log;
  }
  for (auto& s : r.shard) {
    s.Signal(SIGTERM);
    EXPECT_EQ(s.WaitOrKill(120), 0);
  }
  std::filesystem::remove_all(r.dir);
}

}  // namespace
}  // namespace atl
