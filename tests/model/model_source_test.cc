// Model sources (model_source.h): the three folder layouts that hold a trained model, loading
// their weights, evaluating them, sampling and resuming from an `atoll run` folder, and every bad
// input with its message. The `atoll run` folder here is laid out the way the runtime writes it
// (config.json with the flat run keys, global.safetensors with the run id in its metadata); the
// real one, written by `atoll run` itself, is tested in run_folder_cli_test.cc.
#include <gtest/gtest.h>

#include <filesystem>

#include "atoll/core/file.h"
#include "atoll/model/data.h"
#include "atoll/model/model_source.h"
#include "atoll/model/run.h"
#include "atoll/model/safetensors.h"
#include "atoll/model/trainer.h"
#include "testing/data.h"
#include "testing/scratch.h"

namespace atl::model {
namespace {

namespace fs = std::filesystem;

std::string PrepareByteData(const std::string& dir, uint64_t seed) {
  EXPECT_TRUE(MakeDirs(dir).ok());
  DataOptions o;
  o.out_dir = dir + "/data";
  o.tokenizer = TokenizerKind::kByte;
  o.inputs = {testing::WriteText(dir, "corpus.txt", testing::TinyCorpus(40000, seed))};
  auto m = PrepareData(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return o.out_dir;
}

// One data folder shared by the tests of this binary.
const std::string& DataDir() {
  static const std::string dir = PrepareByteData(testing::ScratchDir("source"), 1);
  return dir;
}

TrainerOptions RunTrainerOptions() {  // what a learner of the fake run below trains
  TrainerOptions o;
  auto config = PresetConfig("tiny", 256);
  EXPECT_TRUE(config.ok());
  o.model = *config;
  o.model.seq_len = 32;
  o.data_dir = DataDir();
  o.batch_size = 4;
  o.seed = 5;
  return o;
}

std::unique_ptr<Trainer> MakeTrainer(const TrainerOptions& o) {
  auto t = Trainer::Create(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : nullptr;
}

// An `atoll run` folder as the runtime leaves it: config.json + global.safetensors holding the
// parameters of `trained` (a few steps away from the initial weights).
std::string WriteClusterRun(const std::string& dir, Trainer& trained, const std::string& run_id) {
  nlohmann::json config = {{"mode", "decoupled"}, {"learners", 2},     {"steps", 4},       {"seed", 5},
                           {"data", DataDir()},   {"run_id", run_id},  {"preset", "tiny"}, {"batch", 4},
                           {"seq", 32},           {"eval_batches", 2}, {"fragments", 4},   {"H", 4}};
  EXPECT_TRUE(MakeDirs(dir).ok());
  EXPECT_TRUE(WriteFileAtomic(dir + "/config.json", config.dump(2)).ok());
  std::vector<std::span<const float>> views;
  for (int i = 0; i < static_cast<int>(trained.tensors().size()); ++i) {
    views.push_back(trained.Parameter(i));
  }
  EXPECT_TRUE(
      WriteSafetensors(dir + "/global.safetensors", trained.tensors(), views, {{"run_id", run_id}, {"rounds", "8"}})
          .ok());
  return dir;
}

struct Fixture {
  std::string dir;
  std::unique_ptr<Trainer> trained;
  std::string run;
};

Fixture MakeFixture(const std::string& name) {
  Fixture f;
  f.dir = testing::ScratchDir(name);
  f.trained = MakeTrainer(RunTrainerOptions());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(f.trained->Step().ok());
  f.run = WriteClusterRun(f.dir + "/run", *f.trained, "run-a");
  return f;
}

bool SameParameters(Trainer& a, Trainer& b) {
  for (int i = 0; i < static_cast<int>(a.tensors().size()); ++i) {
    auto pa = a.Parameter(i), pb = b.Parameter(i);
    if (!std::equal(pa.begin(), pa.end(), pb.begin(), pb.end())) return false;
  }
  return true;
}

TEST(ModelSource, RecognisesAnAtollRunFolderAndLoadsItsGlobalModel) {
  Fixture f = MakeFixture("cluster");
  auto src = ResolveModelSource(f.run);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ(src->kind, ModelSourceKind::kClusterRun);
  EXPECT_EQ(src->model.preset, "tiny");
  EXPECT_EQ(src->model.vocab_size, 256) << "from the data folder's manifest";
  EXPECT_EQ(src->model.seq_len, 32);
  EXPECT_EQ(src->data_dir, DataDir());
  EXPECT_EQ(src->batch_size, 4);
  EXPECT_EQ(src->eval_batches, 2);
  EXPECT_EQ(src->weights_file, f.run + "/global.safetensors");
  EXPECT_NE(src->Describe().find("atoll run folder"), std::string::npos) << src->Describe();

  auto fresh = MakeTrainer(RunTrainerOptions());
  ASSERT_FALSE(SameParameters(*fresh, *f.trained));
  Status st = LoadSourceWeights(*src, *fresh);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(SameParameters(*fresh, *f.trained));
  EXPECT_EQ(fresh->step(), 0) << "weights only";

  // A .safetensors file inside the run folder (what `atoll export` writes) works as well.
  fs::copy_file(f.run + "/global.safetensors", f.run + "/exported.safetensors");
  auto file = ResolveModelSource(f.run + "/exported.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->weights_file, f.run + "/exported.safetensors");
}

TEST(ModelSource, EvaluatesAnyLayoutWithTheTrainersValidationWindows) {
  Fixture f = MakeFixture("eval");
  EvalOptions o;
  o.checkpoint = f.run;
  auto r = EvaluateSource(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->batches, 2) << "the run's eval_batches";
  EXPECT_EQ(r->batch_size, 4) << "the run's batch";
  auto expected = f.trained->Evaluate(2);
  ASSERT_TRUE(expected.ok());
  EXPECT_DOUBLE_EQ(r->stats.loss, expected->loss);
  EXPECT_EQ(r->stats.tokens, 2 * 4 * 32);
  EXPECT_EQ(r->params, f.trained->num_params());

  // An `atoll train` checkpoint and its run folder evaluate the same way.
  ASSERT_TRUE(f.trained->SaveCheckpoint(f.dir + "/train/checkpoints/step_000003").ok());
  for (const std::string& path : {f.dir + "/train", f.dir + "/train/checkpoints/step_000003"}) {
    o.checkpoint = path;
    o.batches = 3;
    auto c = EvaluateSource(o);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->source.step, 3);
    auto e3 = f.trained->Evaluate(3);
    ASSERT_TRUE(e3.ok());
    EXPECT_DOUBLE_EQ(c->stats.loss, e3->loss) << path;
  }
}

TEST(ModelSource, SamplesAndResumesFromAnAtollRunFolder) {
  Fixture f = MakeFixture("resume");
  SampleOptions so;
  so.checkpoint = f.run;
  so.prompt = "the king";
  so.max_new_tokens = 12;
  auto sample = Sample(so);
  ASSERT_TRUE(sample.ok()) << sample.status();
  EXPECT_EQ(sample->completion.size(), 12u) << "byte tokenizer: one byte per token";

  TrainRunOptions r;
  r.trainer = RunTrainerOptions();
  r.steps = 2;
  r.eval_every = 0;
  r.eval_batches = 2;
  r.resume = f.run;
  r.out_dir = f.dir + "/continued";
  std::vector<std::string> lines;
  r.log = [&lines](const std::string& line) { lines.push_back(line); };
  auto res = RunTraining(r);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->summary["steps_this_run"], 2) << "weights only: the step count starts at 0";
  auto expected = f.trained->Evaluate(2);
  ASSERT_TRUE(expected.ok());
  EXPECT_DOUBLE_EQ(res->summary["eval_loss_start"].get<double>(), expected->loss)
      << "training starts from the global model's weights";
  bool said_fresh = false;
  for (const auto& line : lines) said_fresh |= line.find("moments start fresh") != std::string::npos;
  EXPECT_TRUE(said_fresh) << "the output says that the AdamW moments start fresh";
}

TEST(ModelSource, BadFoldersGetAClearError) {
  Fixture f = MakeFixture("bad");
  auto missing = ResolveModelSource(f.dir + "/nothing");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no such folder"), std::string::npos);

  auto empty = ResolveModelSource(f.dir);  // a folder, but no layout of a model
  EXPECT_EQ(empty.status().code(), StatusCode::kNotFound);
  EXPECT_NE(empty.status().message().find("atoll run"), std::string::npos) << empty.status();

  // Missing config.json beside global.safetensors.
  fs::copy(f.run, f.dir + "/noconfig");
  fs::remove(f.dir + "/noconfig/config.json");
  auto noconfig = ResolveModelSource(f.dir + "/noconfig");
  EXPECT_EQ(noconfig.status().code(), StatusCode::kNotFound);
  EXPECT_NE(noconfig.status().message().find("no config.json"), std::string::npos);

  // A config.json that is not a run config.
  fs::copy(f.run, f.dir + "/foreign");
  ASSERT_TRUE(WriteFileAtomic(f.dir + "/foreign/config.json", "{\"model\": {}}").ok());
  EXPECT_EQ(ResolveModelSource(f.dir + "/foreign").status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteFileAtomic(f.dir + "/foreign/config.json", "not json").ok());
  EXPECT_EQ(ResolveModelSource(f.dir + "/foreign").status().code(), StatusCode::kDataLoss);

  // The run did not finish: state/ but no global.safetensors → how to export one.
  fs::copy(f.run, f.dir + "/unfinished");
  fs::remove(f.dir + "/unfinished/global.safetensors");
  fs::create_directories(f.dir + "/unfinished/state");
  ASSERT_TRUE(WriteFileAtomic(f.dir + "/unfinished/state/meta.json", "{}").ok());
  auto unfinished = ResolveModelSource(f.dir + "/unfinished");
  EXPECT_EQ(unfinished.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(unfinished.status().message().find("atoll export"), std::string::npos);

  // The data folder the run trained on is gone: say so, and how to point at it.
  fs::copy(f.run, f.dir + "/moved");
  auto cfg = nlohmann::json::parse(*ReadFile(f.run + "/config.json"));
  cfg["data"] = f.dir + "/gone";
  ASSERT_TRUE(WriteFileAtomic(f.dir + "/moved/config.json", cfg.dump()).ok());
  auto moved = ResolveModelSource(f.dir + "/moved");
  EXPECT_EQ(moved.status().code(), StatusCode::kNotFound);
  EXPECT_NE(moved.status().message().find("--data"), std::string::npos) << moved.status();
  EXPECT_TRUE(ResolveModelSource(f.dir + "/moved", DataDir()).ok()) << "--data points at it";
}

TEST(ModelSource, BadWeightsAreRejectedWithoutChangingTheModel) {
  Fixture f = MakeFixture("badweights");
  auto target = MakeTrainer(RunTrainerOptions());
  std::vector<float> before(target->Parameter(1).begin(), target->Parameter(1).end());
  auto unchanged = [&] { return std::equal(before.begin(), before.end(), target->Parameter(1).begin()); };

  // Corrupted global.safetensors (one flipped bit in the data).
  fs::copy(f.run, f.dir + "/corrupt");
  auto bytes = ReadFile(f.run + "/global.safetensors");
  ASSERT_TRUE(bytes.ok());
  std::string bad = *bytes;
  bad[bad.size() - 100] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomic(f.dir + "/corrupt/global.safetensors", bad).ok());
  auto src = ResolveModelSource(f.dir + "/corrupt");
  ASSERT_TRUE(src.ok()) << src.status();
  Status st = LoadSourceWeights(*src, *target);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("corrupted"), std::string::npos) << st;
  // Truncated.
  ASSERT_TRUE(WriteFileAtomic(f.dir + "/corrupt/global.safetensors", bytes->substr(0, 1000)).ok());
  EXPECT_EQ(LoadSourceWeights(*src, *target).code(), StatusCode::kDataLoss);
  EXPECT_TRUE(unchanged());

  // The weights of another run beside this run's config.
  auto other = MakeTrainer(RunTrainerOptions());
  WriteClusterRun(f.dir + "/other", *other, "run-b");
  fs::copy_file(f.dir + "/other/global.safetensors", f.dir + "/corrupt/global.safetensors",
                fs::copy_options::overwrite_existing);
  st = LoadSourceWeights(*src, *target);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("run-b"), std::string::npos) << st;

  // Another model shape (the config says small, the weights are tiny).
  fs::copy(f.run, f.dir + "/small");
  auto cfg = nlohmann::json::parse(*ReadFile(f.run + "/config.json"));
  cfg["preset"] = "small";
  ASSERT_TRUE(WriteFileAtomic(f.dir + "/small/config.json", cfg.dump()).ok());
  EvalOptions eo;
  eo.checkpoint = f.dir + "/small";
  auto shaped = EvaluateSource(eo);
  EXPECT_EQ(shaped.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(shaped.status().message().find("in the file but"), std::string::npos) << shaped.status();
  EXPECT_TRUE(unchanged());
}

TEST(ModelSource, EvaluationOnDataOfAnotherTokenizerIsRefused) {
  Fixture f = MakeFixture("tokenizer");
  const std::string bpe_dir = f.dir + "/bpe";
  DataOptions o;
  o.out_dir = bpe_dir;
  o.tokenizer = TokenizerKind::kBpe;
  o.vocab_size = 350;
  o.inputs = {testing::WriteText(f.dir, "bpe.txt", testing::TinyCorpus(40000, 2))};
  ASSERT_TRUE(PrepareData(o).ok());
  EvalOptions eo;
  eo.checkpoint = f.run;
  eo.data_dir = bpe_dir;
  auto r = EvaluateSource(eo);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("another tokenizer"), std::string::npos) << r.status();

  // Another byte-level folder is the same tokenizer: allowed.
  eo.data_dir = PrepareByteData(f.dir + "/other_bytes", 3);
  eo.batches = 1;
  auto ok = EvaluateSource(eo);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->data_dir, eo.data_dir);
}

}  // namespace
}  // namespace atl::model
