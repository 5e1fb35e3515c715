// `atoll export` (runtime/export.h): a syncer's durable state written by DurableState, exported
// to safetensors and read back (values, then `atoll eval`'s path through model_source.h); every
// bad input with its message. Also the closing report of `atoll run` formats numbers for people.
#include <gtest/gtest.h>

#include <filesystem>

#include "atoll/core/file.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/model/data.h"
#include "atoll/model/model_source.h"
#include "atoll/model/safetensors.h"
#include "atoll/runtime/export.h"
#include "atoll/runtime/run_options.h"
#include "atoll/syncer/durable_state.h"
#include "report.h"
#include "testing/data.h"
#include "testing/scratch.h"

namespace atl::runtime {
namespace {

namespace fs = std::filesystem;

const std::string& DataDir() { return testing::TinyByteData("export", 40000); }

RunConfig SmallRun(const std::string& run_id) {
  RunConfig c;
  c.learners = 2;
  c.steps = 8;
  c.preset = "tiny";
  c.seq = 32;
  c.batch = 4;
  c.fragments = 4;
  c.H = 4;
  c.tau = 1;
  c.data = DataDir();
  c.run_id = run_id;
  return c;
}

// A run folder with config.json and the durable state of a syncer whose Θ is the initial model
// plus 0.5 everywhere, fragment 1 at version 3 (three committed rounds).
struct FakeRun {
  std::string dir;
  std::vector<std::vector<float>> expected;  // per tensor
};

FakeRun WriteRunWithState(const std::string& dir, const RunConfig& c) {
  FakeRun run{dir, {}};
  EXPECT_TRUE(MakeDirs(dir).ok());
  EXPECT_TRUE(WriteFileAtomic(dir + "/config.json", ToJson(c).dump(2)).ok());
  auto topts = MakeTrainerOptions(c, 0);
  EXPECT_TRUE(topts.ok()) << topts.status();
  auto trainer = model::Trainer::Create(*topts);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  model::Trainer& t = **trainer;
  auto plan = MakePlan(c, t.tensors());
  EXPECT_TRUE(plan.ok());
  std::vector<std::span<float>> params;
  for (int i = 0; i < static_cast<int>(t.tensors().size()); ++i) {
    auto p = t.Parameter(i);
    for (float& v : p) v += 0.5f;  // Θ ≠ the initial weights the export starts from
    run.expected.emplace_back(p.begin(), p.end());
    params.push_back(p);
  }
  std::vector<std::vector<float>> theta;
  for (const auto& f : plan->fragments) {
    theta.emplace_back(static_cast<size_t>(f.numel));
    exchange::GatherFragment(f, params, theta.back());
  }
  auto core = syncer::SyncerCore::Create(MakeSyncerOptions(c), *plan, theta);
  EXPECT_TRUE(core.ok()) << core.status();
  auto snap = core->SnapshotFragment(1);
  snap.version = 3;
  EXPECT_TRUE(core->RestoreFragment(1, snap).ok());
  EXPECT_TRUE(syncer::DurableState(dir + "/state").SaveAll(*core).ok());
  return run;
}

TEST(RuntimeExport, WritesTheCommittedGlobalModelAsSafetensors) {
  const std::string dir = testing::ScratchDir("export_ok");
  FakeRun run = WriteRunWithState(dir + "/run", SmallRun("run-a"));
  ExportOptions o;
  o.config = run.dir;  // the run folder: config.json and state/ inside
  o.out = run.dir + "/global.safetensors";
  auto r = ExportState(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state, run.dir + "/state");
  EXPECT_EQ(r->run_id, "run-a");
  EXPECT_EQ(r->rounds, 3);
  EXPECT_EQ(r->versions, (std::vector<int64_t>{0, 3, 0, 0}));

  auto file = model::ReadSafetensors(o.out);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata.value("run_id", ""), "run-a");
  ASSERT_EQ(file->tensors.size(), run.expected.size());
  for (size_t i = 0; i < run.expected.size(); ++i) {
    EXPECT_EQ(file->values[i], run.expected[i]) << file->tensors[i].name;
  }

  // The exported file is what `atoll eval` / `atoll sample` read from the run folder.
  auto src = model::ResolveModelSource(run.dir);
  ASSERT_TRUE(src.ok()) << src.status();
  model::EvalOptions eo;
  eo.checkpoint = run.dir;
  eo.batches = 1;
  auto ev = model::EvaluateSource(eo);
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_GT(ev->stats.loss, 0);

  // An explicit --config file and --state folder, and --force over an existing file.
  o.config = run.dir + "/config.json";
  o.state = run.dir + "/state";
  auto again = ExportState(o);
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find("--force"), std::string::npos);
  o.force = true;
  EXPECT_TRUE(ExportState(o).ok());
}

// `atoll export --state RUN/state`: the config beside the state, the model into the run folder.
TEST(RuntimeExport, StateFolderAloneIsEnough) {
  const std::string dir = testing::ScratchDir("export_state_only");
  FakeRun run = WriteRunWithState(dir + "/run", SmallRun("run-s"));
  ExportOptions o;
  o.state = run.dir + "/state";
  auto r = ExportState(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->out, run.dir + "/global.safetensors");
  EXPECT_EQ(r->rounds, 3);
  auto file = model::ReadSafetensors(r->out);
  ASSERT_TRUE(file.ok()) << file.status();
  for (size_t i = 0; i < run.expected.size(); ++i) EXPECT_EQ(file->values[i], run.expected[i]);
  // Again without --force: refused, the file unchanged.
  EXPECT_EQ(ExportState(o).status().code(), StatusCode::kAlreadyExists);
}

TEST(RuntimeExport, BadInputGetsAClearError) {
  const std::string dir = testing::ScratchDir("export_bad");
  FakeRun run = WriteRunWithState(dir + "/run", SmallRun("run-a"));
  ExportOptions o;
  auto st = ExportState(o).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << "neither --state nor --config";
  EXPECT_NE(st.message().find("--state"), std::string::npos) << st;

  o.state = dir + "/elsewhere/state";  // no config.json beside it
  st = ExportState(o).status();
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("no run config beside the state folder"), std::string::npos) << st;
  o.state.clear();

  o.out = dir + "/out.safetensors";
  o.config = dir + "/missing";
  st = ExportState(o).status();
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("no run config"), std::string::npos) << st;

  o.config = run.dir;
  o.state = dir + "/nostate";
  st = ExportState(o).status();
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("no committed syncer state"), std::string::npos) << st;

  // The state of another run: run B's config with run A's state.
  fs::create_directories(dir + "/b");
  ASSERT_TRUE(WriteFileAtomic(dir + "/b/config.json", ToJson(SmallRun("run-b")).dump()).ok());
  o.config = dir + "/b/config.json";
  o.state = run.dir + "/state";
  st = ExportState(o).status();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("run_id"), std::string::npos) << st;

  // Another model (preset) under the same run id.
  RunConfig small = SmallRun("run-a");
  small.preset = "small";
  ASSERT_TRUE(WriteFileAtomic(dir + "/b/config.json", ToJson(small).dump()).ok());
  st = ExportState(o).status();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;

  // A corrupted fragment file.
  const std::string frag = run.dir + "/state/fragment-002.bin";
  auto bytes = ReadFile(frag);
  ASSERT_TRUE(bytes.ok());
  std::string bad = *bytes;
  bad[bad.size() - 5] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomic(frag, bad).ok());
  o.config = run.dir;
  o.state.clear();
  st = ExportState(o).status();
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("fragment-002.bin is corrupted"), std::string::npos) << st;
  EXPECT_FALSE(fs::exists(o.out)) << "nothing written on error";

  // A config that is not valid JSON.
  ASSERT_TRUE(WriteFileAtomic(dir + "/b/config.json", "{ not json").ok());
  o.config = dir + "/b/config.json";
  EXPECT_EQ(ExportState(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(RuntimeReport, FormatsNumbersForPeople) {
  nlohmann::json s = {{"mode", "decoupled"},
                      {"learners", 1},
                      {"fragments", 4},
                      {"rounds", 12},
                      {"wall_seconds", 30.0},
                      {"eval_loss", nullptr},
                      {"tokens_trained", 1773568.0000000019},
                      {"tokens_merged", 1234567.4},
                      {"tokens_per_second", 59118.93},
                      {"bytes_up", 1.0e6},
                      {"bytes_down", 2.0e6},
                      {"dp_equivalent_bytes", 9.0e6}};
  s["per_learner"] = nlohmann::json::array({{{"learner", 0},
                                             {"tokens_computed", 1773568.0000000019},
                                             {"tokens_merged", 1234567.4},
                                             {"tokens_lost", 538999.6},
                                             {"restart_to_first_contribution_s", {4.47105884552, nullptr}}},
                                            {{"learner", 1},
                                             {"restart_to_first_contribution_s", {5.29}},
                                             {"restart_startup_s",
                                              {{{"load", 4.188},
                                                {"data", 0.0},
                                                {"model", 0.166},
                                                {"connect", 0.046},
                                                {"join", 0.157},
                                                {"first_step", 0.386},
                                                {"first_push", 0.345},
                                                {"total", 5.289}}}}}});
  const std::string r = FormatReport(s);
  EXPECT_NE(r.find("tokens trained 1,773,568  merged into the global model 1,234,567  "
                   "(59,119 tokens/s"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("computed 1,773,568 merged 1,234,567 lost 539,000 tokens"), std::string::npos) << r;
  EXPECT_NE(r.find("rejoin→contribution 4.5 s, none"), std::string::npos) << r;
  // Where a restart's time went: the process load (libtorch), then join, first step, first push.
  EXPECT_NE(r.find("rejoin→contribution 5.3 s (process load 4.2 s, then join 0.16 s, first step 0.39 s, "
                   "first push 0.34 s)"),
            std::string::npos)
      << r;
  EXPECT_EQ(r.find("1773568."), std::string::npos) << r;
  EXPECT_EQ(r.find("[4.47"), std::string::npos) << r;
}

}  // namespace
}  // namespace atl::runtime
