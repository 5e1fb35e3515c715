// The Trainer through its torch-free interface: learning, determinism, parameter views,
// checkpoints (bit-exact resume, corruption), the data-parallel baseline, runs and sampling.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <filesystem>
#include <fstream>

#include "atoll/core/file.h"
#include "atoll/model/data.h"
#include "atoll/model/run.h"
#include "atoll/model/trainer.h"
#include "testing/data.h"
#include "testing/scratch.h"

namespace atl::model {
namespace {

namespace fs = std::filesystem;

// One prepared byte-level data folder shared by the tests of this binary.
const std::string& DataDir() { return testing::TinyByteData("trainer", 60000); }

TrainerOptions TinyOptions() {
  TrainerOptions o;
  o.model.preset = "test";
  o.model.vocab_size = 256;
  o.model.d_model = 32;
  o.model.n_layers = 2;
  o.model.n_heads = 2;
  o.model.d_ff = 64;
  o.model.seq_len = 32;
  o.optim.lr = 1e-2;
  o.optim.warmup_steps = 5;
  o.optim.total_steps = 60;
  o.data_dir = DataDir();
  o.batch_size = 8;
  o.seed = 3;
  return o;
}

std::unique_ptr<Trainer> Make(const TrainerOptions& o) {
  auto t = Trainer::Create(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : nullptr;
}

TEST(ModelConfig, PresetsAndParameterCounts) {
  auto tiny = PresetConfig("tiny", 4096);
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(ParameterCount(*tiny), 1315968);  // 4096·128 + 4·(2·128 + 4·128² + 3·128·344) + 128
  auto small = PresetConfig("small", 4096);
  auto base = PresetConfig("base", 4096);
  ASSERT_TRUE(small.ok() && base.ok());
  EXPECT_NEAR(ParameterCount(*small) / 1e6, 5.0, 0.3);
  EXPECT_NEAR(ParameterCount(*base) / 1e6, 20.0, 1.0);
  EXPECT_EQ(PresetConfig("huge", 4096).status().code(), StatusCode::kInvalidArgument);
  ModelConfig bad = *tiny;
  bad.n_heads = 3;
  EXPECT_EQ(ValidateModelConfig(bad).code(), StatusCode::kInvalidArgument);
  bad = *tiny;
  bad.vocab_size = 70000;
  EXPECT_EQ(ValidateModelConfig(bad).code(), StatusCode::kInvalidArgument);
}

TEST(ModelConfig, LearningRateSchedule) {
  OptimizerConfig o;
  o.lr = 1.0;
  o.min_lr_frac = 0.1;
  o.warmup_steps = 10;
  o.total_steps = 110;
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(o, 0), 0.1);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(o, 9), 1.0);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(o, 10), 1.0);
  EXPECT_NEAR(ScheduledLearningRate(o, 60), 0.55, 1e-12);  // halfway down the cosine
  EXPECT_NEAR(ScheduledLearningRate(o, 110), 0.1, 1e-12);
  EXPECT_NEAR(ScheduledLearningRate(o, 500), 0.1, 1e-12);
}

TEST(ModelConfig, AWarmUpLongerThanHalfTheRunIsCutToHalfSoTheRunStillDecays) {
  OptimizerConfig o;
  o.lr = 1.0;
  o.min_lr_frac = 0.1;
  o.warmup_steps = 20;
  o.total_steps = 16;  // a short run with the default warm-up of atoll run
  EXPECT_EQ(EffectiveWarmupSteps(o), 8);
  EXPECT_EQ(
      WarmupCutNote(o),
      "a warm-up of 20 steps is more than half of the 16 steps: the learning rate warms up over 8 steps, then decays");
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(o, 0), 1.0 / 8);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate(o, 7), 1.0);
  EXPECT_NEAR(ScheduledLearningRate(o, 12), 0.55, 1e-12);  // halfway down the cosine
  EXPECT_NEAR(ScheduledLearningRate(o, 15), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 7 / 8)), 1e-12);
  EXPECT_NEAR(ScheduledLearningRate(o, 16), 0.1, 1e-12);  // the run ends at the floor, not the peak
  o.total_steps = 100;
  EXPECT_EQ(EffectiveWarmupSteps(o), 20) << "a warm-up up to half the run is kept as asked";
  EXPECT_EQ(WarmupCutNote(o), "");
  o.total_steps = 0;
  EXPECT_EQ(EffectiveWarmupSteps(o), 20) << "no horizon: nothing to cut against";
}

TEST(ModelTrainer, ExposesNamedFlatTensorsThatAliasTheModel) {
  auto t = Make(TinyOptions());
  ASSERT_TRUE(t);
  const auto& specs = t->tensors();
  ASSERT_EQ(specs.size(), 1u + 2 * 6 + 1);
  EXPECT_EQ(specs[0].name, "tok_emb.weight");
  EXPECT_TRUE(specs[0].is_embedding);
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{256, 32}));
  int64_t total = 0, embeddings = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(specs[i].numel, diloco::NumelOf(specs[i].shape));
    EXPECT_EQ(t->Parameter(static_cast<int>(i)).size(), static_cast<size_t>(specs[i].numel));
    total += specs[i].numel;
    embeddings += specs[i].is_embedding;
  }
  EXPECT_EQ(embeddings, 1) << "the tied embedding appears once";
  EXPECT_EQ(total, t->num_params());
  EXPECT_EQ(total, ParameterCount(TinyOptions().model));
  EXPECT_EQ(specs.back().name, "final_norm.weight");

  // Writing through the span changes what the model computes.
  auto before = t->Evaluate(2);
  ASSERT_TRUE(before.ok());
  for (float& v : t->Parameter(0)) v = 0;
  auto after = t->Evaluate(2);
  ASSERT_TRUE(after.ok());
  EXPECT_NEAR(after->loss, std::log(256.0), 1e-4) << "zero embeddings → uniform logits";
  EXPECT_NE(before->loss, after->loss);
}

TEST(ModelTrainer, LossFallsWithinBoundedSteps) {
  auto t = Make(TinyOptions());
  ASSERT_TRUE(t);
  auto start = t->Evaluate(4);
  ASSERT_TRUE(start.ok());
  EXPECT_NEAR(start->loss, std::log(256.0), 0.5) << "starts near uniform";
  for (int i = 0; i < 60; ++i) {
    auto st = t->Step();
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->step, i + 1);
    EXPECT_EQ(st->tokens, 8 * 32);
    EXPECT_TRUE(std::isfinite(st->loss) && st->grad_norm > 0);
  }
  auto end = t->Evaluate(4);
  ASSERT_TRUE(end.ok());
  EXPECT_LT(end->loss, start->loss - 2.0) << start->loss << " → " << end->loss;
  EXPECT_NEAR(end->perplexity, std::exp(end->loss), 1e-9);
  EXPECT_EQ(t->tokens_trained(), 60 * 8 * 32);
  auto again = t->Evaluate(4);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->loss, end->loss) << "fixed validation batches";
}

TEST(ModelTrainer, SameSeedSameRunDifferentSeedDifferentRun) {
  auto a = Make(TinyOptions());
  auto b = Make(TinyOptions());
  auto o = TinyOptions();
  o.seed = 4;
  auto c = Make(o);
  ASSERT_TRUE(a && b && c);
  for (int i = 0; i < 3; ++i) {
    auto sa = a->Step(), sb = b->Step(), sc = c->Step();
    ASSERT_TRUE(sa.ok() && sb.ok() && sc.ok());
    EXPECT_EQ(sa->loss, sb->loss);
    EXPECT_NE(sa->loss, sc->loss);
  }
  for (size_t i = 0; i < a->tensors().size(); ++i) {
    auto pa = a->Parameter(static_cast<int>(i)), pb = b->Parameter(static_cast<int>(i));
    ASSERT_TRUE(std::equal(pa.begin(), pa.end(), pb.begin())) << a->tensors()[i].name;
  }
}

TEST(ModelTrainer, CheckpointResumeIsBitExact) {
  auto dir = testing::ScratchDir("ckpt");
  auto a = Make(TinyOptions());
  ASSERT_TRUE(a);
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(a->Step().ok());
  ASSERT_TRUE(a->SaveCheckpoint(dir + "/c").ok());
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "checkpoint.json"}) {
    EXPECT_TRUE(fs::exists(dir + "/c/" + f)) << f;
  }

  auto b = Make(TinyOptions());
  ASSERT_TRUE(b);
  Status st = b->LoadCheckpoint(dir + "/c");
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(b->step(), 7);
  EXPECT_EQ(b->tokens_trained(), a->tokens_trained());
  for (int i = 0; i < 3; ++i) {
    auto sa = a->Step(), sb = b->Step();
    ASSERT_TRUE(sa.ok() && sb.ok());
    EXPECT_EQ(sa->loss, sb->loss) << "step " << sa->step;  // bit-identical
    EXPECT_EQ(sa->lr, sb->lr);
  }
  for (size_t i = 0; i < a->tensors().size(); ++i) {
    auto pa = a->Parameter(static_cast<int>(i)), pb = b->Parameter(static_cast<int>(i));
    ASSERT_TRUE(std::equal(pa.begin(), pa.end(), pb.begin())) << a->tensors()[i].name;
  }
}

TEST(ModelTrainer, CorruptedOrMismatchedCheckpointIsRejectedWithoutChangingState) {
  auto dir = testing::ScratchDir("ckpt_bad");
  auto a = Make(TinyOptions());
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->Step().ok());
  ASSERT_TRUE(a->SaveCheckpoint(dir + "/c").ok());

  auto bytes = ReadFile(dir + "/c/model.safetensors");
  ASSERT_TRUE(bytes.ok());
  std::string bad = *bytes;
  bad[bad.size() - 100] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomic(dir + "/c/model.safetensors", bad).ok());

  auto b = Make(TinyOptions());
  ASSERT_TRUE(b);
  std::vector<float> before(b->Parameter(1).begin(), b->Parameter(1).end());
  Status st = b->LoadCheckpoint(dir + "/c");
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("corrupted"), std::string::npos) << st;
  EXPECT_EQ(b->step(), 0);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), b->Parameter(1).begin()));

  ASSERT_TRUE(WriteFileAtomic(dir + "/c/model.safetensors", *bytes).ok());
  ASSERT_TRUE(b->LoadCheckpoint(dir + "/c").ok()) << "restored file loads again";

  auto o = TinyOptions();
  o.model.d_model = 64;
  auto other = Make(o);
  ASSERT_TRUE(other);
  EXPECT_EQ(other->LoadCheckpoint(dir + "/c").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(other->LoadCheckpoint(dir + "/none").code(), StatusCode::kNotFound);
}

TEST(ModelTrainer, ResetOptimizerStateRestartsTheMoments) {
  auto a = Make(TinyOptions());
  auto b = Make(TinyOptions());
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Step().ok());
  a->ResetOptimizerState();
  // After a reset the first update again has magnitude ≈ lr per element (bias-corrected Adam).
  auto before = std::vector<float>(a->Parameter(2).begin(), a->Parameter(2).end());
  auto st = a->Step();
  ASSERT_TRUE(st.ok());
  double max_delta = 0;
  auto after = a->Parameter(2);
  for (size_t i = 0; i < before.size(); ++i) {
    max_delta = std::max(max_delta, std::abs(static_cast<double>(after[i] - before[i])));
  }
  EXPECT_NEAR(max_delta, st->lr, st->lr * 0.1);
}

TEST(ModelTrainer, DataParallelReplicasAverageMoreSequencesPerStep) {
  auto o = TinyOptions();
  o.replicas = 3;
  auto t = Make(o);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->tokens_per_step(), 3 * 8 * 32);
  auto start = t->Evaluate(4);
  ASSERT_TRUE(start.ok());
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(t->Step().ok());
  auto end = t->Evaluate(4);
  ASSERT_TRUE(end.ok());
  EXPECT_LT(end->loss, start->loss - 1.5);
  EXPECT_EQ(t->tokens_trained(), 30 * 3 * 8 * 32);

  // One replica reading all M shards' worth per step is not what DP means; with M replicas each
  // reads its own shard, so learner 0 of 1 with 3 replicas differs from a single learner.
  auto single = Make(TinyOptions());
  ASSERT_TRUE(single);
  auto a = single->Step();
  auto t2 = Make(o);
  ASSERT_TRUE(t2);
  auto b = t2->Step();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->loss, b->loss);
}

TEST(ModelTrainer, BadOptionsAreRejected) {
  auto o = TinyOptions();
  o.batch_size = 0;
  EXPECT_EQ(Trainer::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = TinyOptions();
  o.learner_id = 2;
  o.num_learners = 2;
  EXPECT_EQ(Trainer::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = TinyOptions();
  o.model.vocab_size = 100;  // smaller than the data's 256
  EXPECT_EQ(Trainer::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = TinyOptions();
  o.data_dir = "/nonexistent/data";
  EXPECT_EQ(Trainer::Create(o).status().code(), StatusCode::kNotFound);
}

TEST(ModelTrainer, PrecisionIsResolvedAndABadOneIsRefused) {
  auto o = TinyOptions();
  const auto bad = ParsePrecision("fp16");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "precision must be auto, fp32 or bf16 (got 'fp16')");
  o.precision = Precision::kAuto;
  auto t = Make(o);
  ASSERT_TRUE(t);
  const Precision resolved = ResolvePrecision(Precision::kAuto);
  EXPECT_EQ(t->precision(), resolved);
  EXPECT_TRUE(resolved == Precision::kFp32 || resolved == Precision::kBf16);
  o.precision = Precision::kFp32;
  EXPECT_EQ(Make(o)->precision(), Precision::kFp32);
}

// bf16 autocast: the same model and batches, matrix products in bf16. The first losses agree
// with fp32 to bf16 precision, training learns as well, evaluation is fp32 (the initial eval is
// identical), and the weights stay fp32 (the parameter views keep working).
TEST(ModelTrainer, Bf16TrainsLikeFp32AndEvaluatesInFp32) {
  auto o32 = TinyOptions();
  o32.precision = Precision::kFp32;
  auto o16 = o32;
  o16.precision = Precision::kBf16;
  auto a = Make(o32), b = Make(o16);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b->precision(), Precision::kBf16);
  auto ea = a->Evaluate(4), eb = b->Evaluate(4);
  ASSERT_TRUE(ea.ok() && eb.ok());
  EXPECT_EQ(ea->loss, eb->loss);  // evaluation is fp32 for both
  double first_a = 0, first_b = 0, last_a = 0, last_b = 0;
  for (int s = 0; s < 60; ++s) {
    auto sa = a->Step(), sb = b->Step();
    ASSERT_TRUE(sa.ok() && sb.ok()) << sa.status() << sb.status();
    if (s == 0) first_a = sa->loss, first_b = sb->loss;
    last_a = sa->loss, last_b = sb->loss;
  }
  EXPECT_NEAR(first_a, first_b, 0.02 * first_a);
  EXPECT_LT(last_b, first_b - 1.0);
  EXPECT_NEAR(last_a, last_b, 0.1 * last_a);
  auto fa = a->Evaluate(4), fb = b->Evaluate(4);
  ASSERT_TRUE(fa.ok() && fb.ok());
  EXPECT_NEAR(fa->loss, fb->loss, 0.1 * fa->loss);
  for (float v : b->Parameter(0)) ASSERT_TRUE(std::isfinite(v));
}

TEST(ModelRun, WritesMetricsSummaryAndCheckpointsThenResumesAndSamples) {
  auto dir = testing::ScratchDir("run");
  TrainRunOptions r;
  r.trainer = TinyOptions();
  r.trainer.optim.total_steps = 0;  // = steps
  r.steps = 12;
  r.eval_every = 5;
  r.eval_batches = 2;
  r.checkpoint_every = 4;
  r.out_dir = dir + "/run";
  auto res = RunTraining(r);
  ASSERT_TRUE(res.ok()) << res.status();
  const auto& s = res->summary;
  for (const char* k :
       {"mode", "learners", "tokens_trained", "eval_loss", "wall_seconds", "tokens_per_second", "params"}) {
    EXPECT_TRUE(s.contains(k)) << k;
  }
  EXPECT_EQ(s["mode"], "single");
  EXPECT_EQ(s["tokens_trained"], 12 * 8 * 32);
  EXPECT_LT(s["eval_loss"].get<double>(), s["eval_loss_start"].get<double>());
  EXPECT_TRUE(fs::exists(r.out_dir + "/summary.json"));
  EXPECT_TRUE(fs::exists(r.out_dir + "/checkpoints/step_000004/checkpoint.json"));
  EXPECT_TRUE(fs::exists(r.out_dir + "/checkpoints/step_000012/checkpoint.json"));

  std::ifstream in(r.out_dir + "/metrics.jsonl");
  int train_lines = 0, eval_lines = 0;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") {
      ++train_lines;
      for (const char* k : {"step", "tokens", "loss", "lr", "tokens_per_second"}) {
        EXPECT_TRUE(j.contains(k)) << k;
      }
    } else {
      ++eval_lines;
    }
  }
  EXPECT_EQ(train_lines, 12);
  EXPECT_EQ(eval_lines, 4);  // start, 5, 10, end

  auto latest = ResolveCheckpointDir(r.out_dir);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(fs::path(*latest).filename(), "step_000012");

  // Resume the run from step 4 to 12 in a new folder: the same final train loss.
  TrainRunOptions r2 = r;
  r2.resume = r.out_dir + "/checkpoints/step_000004";
  r2.out_dir = dir + "/run2";
  auto res2 = RunTraining(r2);
  ASSERT_TRUE(res2.ok()) << res2.status();
  EXPECT_EQ(res2->summary["train_loss"], s["train_loss"]);
  EXPECT_EQ(res2->summary["steps_this_run"], 8);

  SampleOptions so;
  so.checkpoint = r.out_dir;
  so.prompt = "the king";
  so.max_new_tokens = 40;
  auto sample = Sample(so);
  ASSERT_TRUE(sample.ok()) << sample.status();
  EXPECT_EQ(sample->new_tokens, 40);
  EXPECT_EQ(sample->completion.size(), 40u) << "byte tokenizer: one byte per token";
  auto same = Sample(so);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->completion, sample->completion) << "seeded sampling";
  so.checkpoint = dir + "/nothing";
  EXPECT_EQ(Sample(so).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace atl::model

namespace atl::model {
namespace {

TEST(ModelTrainer, RestartAtStartStepReadsTheNextBatchesAndContinuesTheSchedule) {
  // A: the same initial weights; consume 5 batches without changing the parameters.
  auto a = Make(TinyOptions());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(a->ComputeGradients().ok());
  auto la = a->ComputeGradients();
  ASSERT_TRUE(la.ok());
  // B: a restarted learner at step 5 sees exactly the batch A sees next.
  auto o = TinyOptions();
  o.start_step = 5;
  auto b = Make(o);
  EXPECT_EQ(b->step(), 5);
  auto lb = b->ComputeGradients();
  ASSERT_TRUE(lb.ok());
  EXPECT_EQ(la->loss, lb->loss);
  auto applied = b->ApplyGradients(*lb);
  ASSERT_TRUE(applied.ok());
  EXPECT_EQ(applied->step, 6);
  EXPECT_DOUBLE_EQ(applied->lr, ScheduledLearningRate(o.optim, 5));
  // ApplyGradients needs gradients first.
  EXPECT_EQ(b->ApplyGradients(*lb).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace atl::model
