// Multi-rank learner units (`atoll learner --ranks R`, src/runtime/learner_unit.cc): real
// processes of the atoll binary on 127.0.0.1 (gRPC port 0; the ranks' gloo connections on
// loopback ports the kernel picks), bounded in time.
//   - Two ranks of batch b train like `atoll train --replicas 2` with batch b (the same data
//     slices; synchronous DiLoCo with an identity outer step, so timing plays no part): the same
//     global eval loss up to float rounding, and the ranks hold bit-identical parameters.
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
#include "testing/atoll_binary.h"
#include "testing/await.h"

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
    testing::AwaitFor([&] { return !syncer.running() || fs::exists(dir + "/syncer.port"); }, 240.0,
                      std::chrono::milliseconds(100));
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
  return {"--data",
          r.data,
          "--out",
          r.out,
          "-M",
          std::to_string(learners),
          "--steps",
          std::to_string(steps),
          "--seq",
          "32",
          "--batch",
          std::to_string(batch),
          "--seed",
          std::to_string(seed),
          "-P",
          "4",
          "-H",
          "4",
          "--tau",
          "1",
          "--eval-batches",
          "2",
          "--eval-every",
          "0",
          "--token",
          "unit-token",
          "--mode",
          mode};
}

// The unit's arithmetic against `atoll train --replicas 2`: two ranks of batch b read the same
// two data slices as two replicas of batch b in one process (slice = learner × ranks + rank, as
// replica r of learner 0 reads slice r), start from the same seed's weights and follow the same
// schedule; the ranks all-reduce their gradients where the replicas accumulate theirs. Synchronous
// DiLoCo with an outer step that is the identity (outer lr 1, momentum 0, fp32 both ways, one
// fragment) makes the global model the learner's own model after each round, so the final
// global eval loss must be the one-process run's up to float rounding. fp32 arithmetic: the
// claim is about the data and the averaging, not about bf16 rounding. Both evaluate the same 16
// validation windows (eval batches × batch).
constexpr int kUnitSteps = 20;

std::vector<std::string> CommonTrainFlags(const std::string& data, int batch) {
  return {"--data",         data, "--steps",     std::to_string(kUnitSteps),
          "--seq",          "32", "--batch",     std::to_string(batch),
          "--seed",         "0",  "--lr",        "3e-3",
          "--warmup",       "4",  "--precision", "fp32",
          "--eval-batches", "4"};
}

double EvalLossOfTwoRankUnit(const std::string& dir, const std::string& data) {
  UnitRun r;
  r.dir = dir;
  r.data = data;
  r.out = dir + "/run";
  fs::create_directories(dir);
  auto flags = CommonTrainFlags(data, 4);
  flags.insert(flags.end(), {"--out",
                             r.out,
                             "-M",
                             "1",
                             "-P",
                             "1",
                             "-H",
                             "4",
                             "--outer-lr",
                             "1",
                             "--outer-momentum",
                             "0",
                             "--uplink",
                             "fp32",
                             "--downlink",
                             "fp32",
                             "--eval-every",
                             "0",
                             "--token",
                             "unit-token",
                             "--mode",
                             "diloco"});
  r.StartSyncer(flags);
  if (r.target.empty()) return NAN;
  auto lflags = flags;
  lflags.insert(lflags.end(), {"--ranks", "2"});
  ChildProcess learner = r.StartLearner(0, lflags, "learner.log");
  EXPECT_EQ(learner.WaitOrKill(240), 0) << testing::TextOf(dir + "/learner.log");
  EXPECT_EQ(r.syncer.WaitOrKill(120), 0) << testing::TextOf(dir + "/syncer.log");
  EXPECT_EQ(testing::TextOf(r.out + "/unit-0/rank-1.checksum", "missing 1"),
            testing::TextOf(r.out + "/unit-0/rank-0.checksum", "missing 0"))
      << "rank 1 does not hold rank 0's parameters";
  auto summary = testing::ReadJson(r.out + "/syncer-summary.json");
  EXPECT_TRUE(summary.is_object() && summary["eval_loss"].is_number()) << testing::TextOf(dir + "/syncer.log");
  return summary.is_object() && summary["eval_loss"].is_number() ? summary["eval_loss"].get<double>() : NAN;
}

double EvalLossOfTwoReplicas(const std::string& dir, const std::string& data) {
  std::string cmd = "train --replicas 2 --eval-every 0 --out " + dir + "/train";
  for (const auto& f : CommonTrainFlags(data, 4)) cmd += " " + f;
  auto r = testing::RunAtoll(cmd, 240);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto summary = testing::ReadJson(dir + "/train/summary.json");
  EXPECT_TRUE(summary.is_object() && summary["eval_loss"].is_number()) << r.output;
  return summary.is_object() && summary["eval_loss"].is_number() ? summary["eval_loss"].get<double>() : NAN;
}

TEST(LearnerUnit, TwoRanksTrainLikeTwoReplicasInOneProcess) {
  const std::string dir = testing::ScratchDir("learner_unit_match");
  const std::string data = testing::PrepareSmallData(dir);
  const double two_ranks = EvalLossOfTwoRankUnit(dir + "/a", data);
  const double replicas = EvalLossOfTwoReplicas(dir + "/b", data);
  std::printf("eval loss after %d steps: 2 ranks x batch 4 %.5f, 2 replicas x batch 4 in one process %.5f\n",
              kUnitSteps, two_ranks, replicas);
  EXPECT_LT(std::abs(two_ranks - replicas), 2e-3) << "2 ranks: " << two_ranks << ", 2 replicas: " << replicas;
  fs::remove_all(dir);
}

TEST(LearnerUnit, KilledRankRestartsOnlyItsUnit) {
  UnitRun r;
  r.dir = testing::ScratchDir("learner_unit_kill");
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
  testing::AwaitFor(
      [&] {
        std::istringstream lines(testing::TextOf(metrics));
        int n = 0;
        for (std::string line; std::getline(lines, line);) ++n;
        return n >= 15 || !unit.running();
      },
      240.0, std::chrono::milliseconds(100));
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
  const std::string dir = testing::ScratchDir("learner_unit_bad");
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
