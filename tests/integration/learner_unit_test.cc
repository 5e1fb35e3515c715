// Multi-rank learner units (`atoll learner --ranks R`, src/runtime/learner_unit.cc): real
// processes of the atoll binary on 127.0.0.1 (gRPC port 0; the ranks' gloo connections on
// loopback ports the kernel picks), bounded in time.
//   - Two ranks of batch b train like one rank of batch 2b (synchronous DiLoCo, so timing plays
//     no part): the same global eval loss within the noise of changing the seed, and the ranks
//     hold bit-identical parameters at the end.
//   - SIGKILL of one rank restarts only its unit: it rejoins, the other learner never does, every
//     process ends cleanly and the global model improves.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include "atoll/core/child_process.h"
#include "atoll/core/file.h"
#include "cluster_fixture.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

struct UnitRun {
  std::string dir, data, out;
  ChildProcess syncer;
  std::string target;

  // A syncer for `learners` learners that finishes by itself once they are done.
  void StartSyncer(const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {ATOLL_BIN, "syncer", "--port-file", dir + "/syncer.port", "--finish-when-done"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto s = ChildProcess::Start(argv, dir + "/syncer.log");
    ASSERT_TRUE(s.ok()) << s.status();
    syncer = std::move(*s);
    for (int i = 0; i < 2400 && syncer.running() && !fs::exists(dir + "/syncer.port"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    auto port = ReadFile(dir + "/syncer.port");
    ASSERT_TRUE(port.ok()) << testing::TextOf(dir + "/syncer.log");
    target = "127.0.0.1:" + *port;
    while (!target.empty() && std::isspace(static_cast<unsigned char>(target.back()))) target.pop_back();
  }

  ChildProcess StartLearner(int id, const std::vector<std::string>& flags, const std::string& log) {
    std::vector<std::string> argv = {ATOLL_BIN, "learner", "--id", std::to_string(id), "--syncer", target};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto l = ChildProcess::Start(argv, dir + "/" + log);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? std::move(*l) : ChildProcess();
  }
};

std::vector<std::string> Flags(const UnitRun& r, int learners, int steps, int batch, int seed,
                               const std::string& mode = "decoupled") {
  return {"--data", r.data, "--out", r.out, "-M", std::to_string(learners), "--steps", std::to_string(steps),
          "--seq", "32", "--batch", std::to_string(batch), "--seed", std::to_string(seed), "-P", "4", "-H", "4",
          "--tau", "1", "--eval-batches", "2", "--eval-every", "0", "--token", "unit-token", "--mode", mode};
}

// One syncer and one learner (`ranks` processes of `batch` each); the final global eval loss.
// Synchronous DiLoCo (a barrier every H steps), so that the result does not depend on how fast
// the machine runs the steps relative to the exchange (decoupled mode's merges land when they
// arrive): what differs between the runs is then the data each step sees and the arithmetic.
double EvalLossOfOneLearner(const std::string& dir, const std::string& data, int ranks, int batch, int seed) {
  UnitRun r;
  r.dir = dir;
  r.data = data;
  r.out = dir + "/run";
  fs::create_directories(dir);
  const auto flags = Flags(r, 1, 20, batch, seed, "diloco");
  r.StartSyncer(flags);
  if (r.target.empty()) return NAN;
  auto lflags = flags;
  lflags.insert(lflags.end(), {"--ranks", std::to_string(ranks)});
  ChildProcess learner = r.StartLearner(0, lflags, "learner.log");
  EXPECT_EQ(learner.WaitOrKill(240), 0) << testing::TextOf(dir + "/learner.log");
  EXPECT_EQ(r.syncer.WaitOrKill(120), 0) << testing::TextOf(dir + "/syncer.log");
  if (ranks > 1) {
    const std::string rank0 = testing::TextOf(r.out + "/unit-0/rank-0.checksum", "missing 0");
    for (int k = 1; k < ranks; ++k) {
      EXPECT_EQ(testing::TextOf(r.out + "/unit-0/rank-" + std::to_string(k) + ".checksum", "missing"), rank0)
          << "rank " << k << " does not hold rank 0's parameters";
    }
  }
  auto summary = testing::ReadJson(r.out + "/syncer-summary.json");
  EXPECT_TRUE(summary.is_object() && summary["eval_loss"].is_number()) << testing::TextOf(dir + "/syncer.log");
  return summary.is_object() && summary["eval_loss"].is_number() ? summary["eval_loss"].get<double>() : NAN;
}

TEST(LearnerUnit, TwoRanksMatchOneRankWithTwiceTheBatch) {
  const std::string dir = testing::TempDir("learner_unit_match");
  const std::string data = testing::PrepareSmallData(dir);
  const double two_ranks = EvalLossOfOneLearner(dir + "/a", data, 2, 4, 0);
  const double one_rank = EvalLossOfOneLearner(dir + "/b", data, 1, 8, 0);
  const double other_seed = EvalLossOfOneLearner(dir + "/c", data, 1, 8, 1);  // the noise: another seed
  const double noise = std::abs(one_rank - other_seed);
  std::printf("eval loss: 2 ranks x batch 4 %.4f, 1 rank x batch 8 %.4f (seed 1: %.4f)\n", two_ranks, one_rank,
              other_seed);
  EXPECT_LT(std::abs(two_ranks - one_rank), 2 * noise + 0.05)
      << "2 ranks: " << two_ranks << ", 1 rank: " << one_rank << ", seed noise " << noise;
  fs::remove_all(dir);
}

TEST(LearnerUnit, KilledRankRestartsOnlyItsUnit) {
  UnitRun r;
  r.dir = testing::TempDir("learner_unit_kill");
  r.data = testing::PrepareSmallData(r.dir);
  r.out = r.dir + "/run";
  const auto flags = Flags(r, 2, 80, 4, 0);
  ASSERT_NO_FATAL_FAILURE(r.StartSyncer(flags));
  auto uflags = flags;
  uflags.insert(uflags.end(), {"--ranks", "2"});
  ChildProcess unit = r.StartLearner(0, uflags, "unit.log");
  ChildProcess other = r.StartLearner(1, flags, "learner-1.log");
  // Once the unit trains (15 steps reported), SIGKILL its rank 1.
  const std::string metrics = r.out + "/metrics-learner-0.jsonl";
  for (int i = 0; i < 2400 && unit.running(); ++i) {
    std::istringstream lines(testing::TextOf(metrics));
    int n = 0;
    for (std::string line; std::getline(lines, line);) ++n;
    if (n >= 15) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::istringstream pids(testing::TextOf(r.out + "/unit-0/pids"));
  int rank = -1;
  pid_t pid = -1;
  while (pids >> rank >> pid && rank != 1) {
  }
  ASSERT_EQ(rank, 1) << testing::TextOf(r.dir + "/unit.log");
  ASSERT_EQ(::kill(pid, SIGKILL), 0);

  EXPECT_EQ(unit.WaitOrKill(240), 0) << testing::TextOf(r.dir + "/unit.log");
  EXPECT_EQ(other.WaitOrKill(240), 0) << testing::TextOf(r.dir + "/learner-1.log");
  EXPECT_EQ(r.syncer.WaitOrKill(120), 0) << testing::TextOf(r.dir + "/syncer.log");
  const std::string unit_log = testing::TextOf(r.dir + "/unit.log");
  EXPECT_NE(unit_log.find("rank 1 killed by signal 9; restarting the unit"), std::string::npos) << unit_log;
  EXPECT_EQ(testing::TextOf(r.dir + "/learner-1.log").find("rejoin"), std::string::npos);
  auto table = testing::ReadJson(r.out + "/state/learners.json");
  ASSERT_TRUE(table.is_object()) << testing::TextOf(r.dir + "/syncer.log");
  std::map<int, nlohmann::json> rows;
  for (const auto& row : table["learners"]) rows[row["id"].get<int>()] = row;
  ASSERT_EQ(rows.size(), 2u) << table.dump(2);
  EXPECT_EQ(rows[0]["joins"], 2) << "the unit rejoined once, after its restart";
  EXPECT_EQ(rows[1]["joins"], 1) << "the other learner never restarted";
  EXPECT_GT(rows[1]["rounds_joined"].get<int64_t>(), 0);
  EXPECT_EQ(testing::TextOf(r.out + "/unit-0/rank-1.checksum", "missing 1"),
            testing::TextOf(r.out + "/unit-0/rank-0.checksum", "missing 0"));
  auto summary = testing::ReadJson(r.out + "/syncer-summary.json");
  ASSERT_TRUE(summary.is_object());
  EXPECT_LT(summary["eval_loss"].get<double>(), summary["eval_loss_start"].get<double>());
  fs::remove_all(r.dir);
}

TEST(LearnerUnit, BadRanksAreRefused) {
  const std::string dir = testing::TempDir("learner_unit_bad");
  auto zero = testing::RunAtoll("learner --id 0 --syncer 127.0.0.1:1 --ranks 0 --out " + dir, 60);
  EXPECT_EQ(zero.exit_code, 2) << zero.output;
  EXPECT_NE(zero.output.find("--ranks 0"), std::string::npos) << zero.output;
  auto ddp = testing::RunAtoll("learner --id 0 --syncer 127.0.0.1:1 --ranks 2 --mode ddp --out " + dir, 60);
  EXPECT_EQ(ddp.exit_code, 2) << ddp.output;
  EXPECT_NE(ddp.output.find("--ranks needs decoupled or diloco mode"), std::string::npos) << ddp.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace atl
