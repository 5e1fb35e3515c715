// A syncer and three learner processes train a real (small) GPT over gRPC on loopback.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "atoll/model/safetensors.h"
#include "testing/atoll_binary.h"

namespace atl {
namespace {

// Small and fast: seq 64, batch 8, P = H = 8, 48 steps per learner.
const char* kSmallRun = "-M 3 --steps 48 --seq 64 --batch 8 -P 8 -H 8 --tau 1 --eval-batches 4 --no-live";

TEST(RuntimeIntegration, SyncerAndThreeLearnersTrainTogether) {
  const std::string dir = testing::ScratchDir("rt_integration");
  const std::string data = testing::PrepareSmallData(dir);
  // --eval-every 8: the run closes only ~50 rounds, and a snapshot offered near the end may be
  // dropped when the evaluator stops (global_eval.h), so the default 48 could leave no point.
  auto r = testing::RunAtoll(
      std::string("run --data ") + data + " --out " + dir + "/run " + kSmallRun + " --eval-every 8", 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto s = testing::ReadJson(dir + "/run/summary.json");
  ASSERT_FALSE(s.is_discarded()) << r.output;
  EXPECT_EQ(s["mode"], "decoupled");
  EXPECT_EQ(s["learners"], 3);
  // Per-learner credentials (docs/security.md): secrets readable by the owner only.
  namespace fs = std::filesystem;
  const auto rw = fs::perms::owner_read | fs::perms::owner_write;
  EXPECT_EQ(fs::status(dir + "/run/secrets").permissions() & fs::perms::all, fs::perms::owner_all);
  for (const char* f : {"/run/secrets/run.secret", "/run/secrets/learner-2.token", "/run/config.json"}) {
    EXPECT_EQ(fs::status(dir + f).permissions() & fs::perms::all, rw) << f;
  }
  EXPECT_GT(s["rounds"].get<int>(), 24);
  // The global model learned.
  ASSERT_TRUE(s["eval_loss"].is_number()) << s.dump(2);
  EXPECT_LT(s["eval_loss"].get<double>(), s["eval_loss_start"].get<double>() - 0.5);
  ASSERT_EQ(s["per_learner"].size(), 3u);
  for (const auto& l : s["per_learner"]) {
    EXPECT_EQ(l["steps"].get<int>(), 48) << l.dump();
    EXPECT_GT(l["rounds_joined"].get<int>(), 0) << "learner " << l["learner"] << " never contributed";
    EXPECT_GT(l["tokens_merged"].get<double>(), 0);
    // Every copy a learner pulled matched the syncer's bits (checksummed on every pull).
    EXPECT_EQ(l["checksum_mismatches"].get<int>(), 0);
    EXPECT_GT(l["bytes_up"].get<double>(), 0);
  }
  EXPECT_LT(s["bytes_up"].get<double>() + s["bytes_down"].get<double>(), s["dp_equivalent_bytes"].get<double>());
  // The global model was written and reads back with its checksum.
  auto ck = model::ReadSafetensors(dir + "/run/global.safetensors");
  ASSERT_TRUE(ck.ok()) << ck.status();
  int64_t n = 0;
  for (const auto& t : ck->tensors) n += t.numel;
  EXPECT_EQ(static_cast<double>(n), s["params"].get<double>());
  // metrics.jsonl holds syncer rounds and learner steps, in time order.
  std::ifstream in(dir + "/run/metrics.jsonl");
  int rounds = 0, steps = 0, global_evals = 0;
  double last_t = 0;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    EXPECT_GE(j["t"].get<double>(), last_t);
    last_t = j["t"].get<double>();
    if (j["source"] == "syncer" && j.value("kind", "") == "round") ++rounds;
    if (j["source"] == "syncer" && j.value("kind", "") == "global_eval") ++global_evals;
    if (j["source"] == "learner" && !j.contains("kind")) ++steps;
  }
  EXPECT_EQ(rounds, s["rounds"].get<int>());
  EXPECT_EQ(steps, 3 * 48);
  // The global model was evaluated during the run (every 8 rounds here), not only at the end.
  EXPECT_GT(global_evals, 0);
  EXPECT_EQ(s["global_eval_curve"].size(), static_cast<size_t>(global_evals));
  std::filesystem::remove_all(dir);
}

TEST(RuntimeIntegration, SynchronousDilocoModeRunsToTheEnd) {
  const std::string dir = testing::ScratchDir("rt_diloco");
  const std::string data = testing::PrepareSmallData(dir);
  auto r =
      testing::RunAtoll(std::string("run --mode diloco --data ") + data + " --out " + dir + "/run " + kSmallRun, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto s = testing::ReadJson(dir + "/run/summary.json");
  EXPECT_EQ(s["mode"], "diloco");
  // 48 steps / H = 8 → 6 barriers × 8 fragments, every round with all 3 learners.
  EXPECT_EQ(s["rounds"].get<int>(), 6 * 8);
  for (const auto& l : s["per_learner"]) EXPECT_EQ(l["rounds_joined"].get<int>(), 6 * 8);
  EXPECT_LT(s["eval_loss"].get<double>(), s["eval_loss_start"].get<double>());
  std::filesystem::remove_all(dir);
}

TEST(RuntimeIntegration, DdpModeIsAParameterServerOnTheSameWire) {
  const std::string dir = testing::ScratchDir("rt_ddp");
  const std::string data = testing::PrepareSmallData(dir);
  auto r = testing::RunAtoll(std::string("run --mode ddp --data ") + data + " --out " + dir + "/run " +
                                 "-M 2 --steps 20 --seq 64 --batch 8 --eval-batches 4 --no-live",
                             300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto s = testing::ReadJson(dir + "/run/summary.json");
  EXPECT_EQ(s["mode"], "ddp");
  EXPECT_EQ(s["fragments"], 1);
  EXPECT_EQ(s["uplink"], "bf16");
  // One all-reduced step per round, every learner in every round, nothing lost.
  EXPECT_EQ(s["rounds"].get<int>(), 20);
  for (const auto& l : s["per_learner"]) {
    EXPECT_EQ(l["rounds_joined"].get<int>(), 20);
    EXPECT_EQ(l["tokens_lost"].get<double>(), 0.0);
    // bf16 gradient up every step: 2 bytes per parameter.
    EXPECT_NEAR(l["payload_bytes_up"].get<double>(), 20 * 2 * s["params"].get<double>(), 1.0);
  }
  EXPECT_LT(s["eval_loss"].get<double>(), s["eval_loss_start"].get<double>() - 0.5);
  std::filesystem::remove_all(dir);
}

TEST(RuntimeIntegration, BadInputIsRefusedWithAClearMessage) {
  auto r = testing::RunAtoll("run -M 2 --quorum 3 --no-live", 30);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("quorum K must be in [1, learners]"), std::string::npos) << r.output;
  r = testing::RunAtoll("run --mode bogus", 30);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("mode must be decoupled, diloco or ddp"), std::string::npos) << r.output;
  const std::string dir = testing::ScratchDir("rt_badcfg");
  std::ofstream(dir + "/bad.toml") << "[diloco]\nfragmnets = 4\n";
  r = testing::RunAtoll("run -c " + dir + "/bad.toml", 30);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("unknown key 'fragmnets'"), std::string::npos) << r.output;
  // A learner pointed at nothing with a wrong id is refused before it trains.
  r = testing::RunAtoll("learner --id 7 -M 2 --syncer 127.0.0.1:1", 30);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--id 7 out of range"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

// `atoll init` writes a preset's model spec; a run that names it (--spec) trains that model from
// those weights and evaluates it, and the global model has the spec's tensors. Bad inputs: init
// over an existing file without --force, a spec that does not exist.
TEST(RuntimeIntegration, ARunOfAModelSpecWrittenByInitTrains) {
  const std::string dir = testing::ScratchDir("rt_spec");
  const std::string data = testing::PrepareSmallData(dir);
  const std::string spec = dir + "/model.safetensors";
  auto r = testing::RunAtoll("init --data " + data + " --seq 64 --out " + spec, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote " + spec), std::string::npos) << r.output;
  auto written = model::ReadSafetensors(spec);
  ASSERT_TRUE(written.ok()) << written.status();
  r = testing::RunAtoll("init --data " + data + " --seq 64 --out " + spec, 60);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("exists (--force overwrites it)"), std::string::npos) << r.output;

  r = testing::RunAtoll("run --data " + data + " --spec " + spec + " --out " + dir + "/run " + kSmallRun, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto s = testing::ReadJson(dir + "/run/summary.json");
  ASSERT_TRUE(s["eval_loss"].is_number()) << s.dump(2);
  EXPECT_LT(s["eval_loss"].get<double>(), s["eval_loss_start"].get<double>());
  auto global = model::ReadSafetensors(dir + "/run/global.safetensors");
  ASSERT_TRUE(global.ok()) << global.status();
  ASSERT_EQ(global->tensors.size(), written->tensors.size());
  for (size_t i = 0; i < global->tensors.size(); ++i) {
    EXPECT_EQ(global->tensors[i].name, written->tensors[i].name);
    EXPECT_EQ(global->tensors[i].shape, written->tensors[i].shape);
  }

  r = testing::RunAtoll(
      "run --data " + data + " --spec " + dir + "/missing.safetensors --out " + dir + "/run2 " + kSmallRun, 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("missing.safetensors"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atl
