// The multi-machine path on one machine: a syncer and two learners started by hand (separate
// processes of the real binary on 127.0.0.1, port 0), as the README describes. The syncer writes
// its model every few rounds, serves its HTTP status endpoint, and on SIGTERM (or by itself once
// every learner is done) closes the rounds in flight and leaves a usable model: sampled from,
// evaluated, and exported again from its state.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "atoll/core/child_process.h"
#include "atoll/core/file.h"
#include "atoll/model/safetensors.h"
#include "testing/hand_run.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using testing::HandRun;
using testing::RunFlags;

void CheckHttpWhileServing(const HandRun& r) {
  httplib::Client cli("127.0.0.1", r.http_port);
  auto health = cli.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(cli.Get("/api/status")->status, 401) << "the syncer has a token: so does its HTTP endpoint";
  auto status = cli.Get("/api/status", {{"Authorization", "Bearer hand-token"}});
  ASSERT_TRUE(status);
  ASSERT_EQ(status->status, 200);
  auto s = nlohmann::json::parse(status->body);
  EXPECT_EQ(s["learners"].size(), 2u);
  EXPECT_GT(s["tokens_trained"].get<double>(), 0);
  EXPECT_GE(s["uptime_s"].get<double>(), 0);
  auto history = cli.Get("/api/history?token=hand-token");
  ASSERT_TRUE(history);
  EXPECT_EQ(history->status, 200);
  EXPECT_TRUE(nlohmann::json::parse(history->body)["points"].is_array());
  auto metrics = cli.Get("/metrics?token=hand-token");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("atoll_tokens_trained_total{learner=\"1\"}"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("atoll_round_contributors_count"), std::string::npos);
}

void CheckUsableModel(const HandRun& r) {
  auto summary = testing::ReadJson(r.out + "/syncer-summary.json");
  ASSERT_TRUE(summary.is_object()) << r.Log();
  EXPECT_EQ(summary["final"], true);
  ASSERT_TRUE(summary["eval_loss"].is_number()) << summary.dump(2);
  EXPECT_LT(summary["eval_loss"].get<double>(), summary["eval_loss_start"].get<double>())
      << r.Log() << testing::TextOf(r.dir + "/learner-0.log") << testing::TextOf(r.dir + "/learner-1.log");
  auto sample = testing::RunAtoll("sample --checkpoint " + r.out + " --prompt 'The ' --tokens 8", 120);
  ASSERT_EQ(sample.exit_code, 0) << sample.output;
  EXPECT_NE(sample.output.find("8 new tokens"), std::string::npos) << sample.output;
  auto eval = testing::RunAtoll("eval --checkpoint " + r.out + " --json", 120);
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  // `atoll export --state` alone: the config beside the state, the same Θ as the final model.
  auto exported = testing::RunAtoll("export --state " + r.out + "/state --out " + r.dir + "/exported.safetensors", 120);
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  auto a = model::ReadSafetensors(r.dir + "/exported.safetensors");
  auto b = model::ReadSafetensors(r.out + "/global.safetensors");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->values, b->values) << "every merged round was committed before the model was written";
}

TEST(SyncerByHand, SigtermLeavesAUsableModel) {
  HandRun r;
  r.dir = testing::ScratchDir("syncer_by_hand");
  r.data = testing::PrepareSmallData(r.dir);
  r.out = r.dir + "/run";
  ASSERT_NO_FATAL_FAILURE(r.StartSyncer(16, {"--checkpoint-every", "4"}));
  EXPECT_EQ(r.RunLearners(16), (std::vector<int>{0, 0}));
  ASSERT_TRUE(r.syncer.running()) << "without --finish-when-done the syncer keeps serving\n" << r.Log();
  {
    SCOPED_TRACE("http");
    CheckHttpWhileServing(r);
  }
  // The periodic checkpoint (every 4 rounds) is already there, before any finish.
  auto periodic = testing::ReadJson(r.out + "/syncer-summary.json");
  ASSERT_TRUE(periodic.is_object()) << r.Log();
  EXPECT_EQ(periodic["final"], false);
  EXPECT_GE(periodic["rounds"].get<int64_t>(), 4);
  EXPECT_TRUE(fs::exists(r.out + "/global.safetensors"));
  EXPECT_TRUE(fs::exists(r.out + "/config.json")) << "the folder is a model source";
  // The status page's URL with its token, for the owner only (the log has it without).
  const auto owner_rw = fs::perms::owner_read | fs::perms::owner_write;
  EXPECT_EQ(testing::TextOf(r.out + "/status-url"),
            "http://127.0.0.1:" + std::to_string(r.http_port) + "/?token=hand-token\n");
  EXPECT_EQ(fs::status(r.out + "/status-url").permissions() & fs::perms::all, owner_rw);
  EXPECT_EQ(fs::status(r.out + "/config.json").permissions() & fs::perms::all, owner_rw);
  EXPECT_EQ(r.Log().find("hand-token"), std::string::npos) << "no token in the log";

  r.syncer.Signal(SIGTERM);
  EXPECT_EQ(r.syncer.WaitOrKill(120), 0) << r.Log();
  EXPECT_NE(r.Log().find("syncer: stopped (signal)"), std::string::npos) << r.Log();
  {
    SCOPED_TRACE("usable model");
    CheckUsableModel(r);
  }
  fs::remove_all(r.dir);
}

// The shape above under `atoll simulate` at two learner timings where its global model once ended
// worse than its initial one (eval 7.52 and 7.20 against 5.49, deterministically): the sweep's
// RDA across rounds extrapolated Θ past the last learner, and the run, shorter than its warm-up,
// ended at its peak learning rate (decisions/007, eighth-session amendment). Simulated time: the
// outcome does not depend on this machine's load, which is why the test above failed only sometimes.
TEST(SyncerByHand, ItsShapeEndsBelowTheInitialLossAtTimingsThatOnceBrokeIt) {
  const std::string dir = testing::ScratchDir("syncer_by_hand_sim");
  const std::string data = testing::PrepareSmallData(dir);
  for (const char* step_time : {"0.3", "1.7"}) {
    SCOPED_TRACE(std::string("--step-time ") + step_time);
    std::string cmd = "simulate";
    for (const auto& f : RunFlags(data, dir + "/sim", 16)) cmd += " " + f;
    cmd += std::string(" --seed 0 --spread 0.3 --jitter 0.05 --step-time ") + step_time;
    auto r = testing::RunAtoll(cmd, 120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto summary = testing::ReadJson(dir + "/sim/summary.json");
    ASSERT_TRUE(summary.is_object()) << r.output;
    EXPECT_LT(summary["eval_loss"].get<double>(), summary["eval_loss_start"].get<double>()) << r.output;
    fs::remove_all(dir + "/sim");
  }
  fs::remove_all(dir);
}

TEST(SyncerByHand, FinishWhenDoneEndsByItself) {
  HandRun r;
  r.dir = testing::ScratchDir("syncer_by_hand_done");
  r.data = testing::PrepareSmallData(r.dir);
  r.out = r.dir + "/run";
  ASSERT_NO_FATAL_FAILURE(r.StartSyncer(8, {"--finish-when-done", "--checkpoint-every", "0"}));
  EXPECT_EQ(r.RunLearners(8), (std::vector<int>{0, 0}));
  EXPECT_EQ(r.syncer.WaitOrKill(120), 0) << r.Log();
  EXPECT_NE(r.Log().find("syncer: stopped (every learner done)"), std::string::npos) << r.Log();
  auto summary = testing::ReadJson(r.out + "/syncer-summary.json");
  EXPECT_EQ(summary["final"], true) << r.Log();
  EXPECT_TRUE(summary["eval_loss"].is_number());
  auto sample = testing::RunAtoll("sample --checkpoint " + r.out + " --prompt 'A' --tokens 4", 120);
  EXPECT_EQ(sample.exit_code, 0) << sample.output;
  fs::remove_all(r.dir);
}

TEST(SyncerByHand, BadHttpAddressIsRefused) {
  const std::string dir = testing::ScratchDir("syncer_bad_http");
  auto r = testing::RunAtoll("syncer --http nonsense --out " + dir + "/run --data " + dir + "/none", 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("not host:port"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace atl
