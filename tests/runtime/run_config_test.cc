// The run config: one field list for TOML, JSON and flags; validation; the settings each mode
// implies (Normalized).
#include "atoll/runtime/run_config.h"

#include "atoll/runtime/run_options.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include "testing/scratch.h"

namespace atl::runtime {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  static const std::string dir = testing::ScratchDir("run_config");
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(RunConfig, ModesImplyTheirSettings) {
  RunConfig c;
  const RunConfig dec = Normalized(c);
  EXPECT_EQ(dec.outer_step, syncer::OuterStepRule::kSweep);
  EXPECT_DOUBLE_EQ(*dec.outer_lr, 1.0);
  EXPECT_DOUBLE_EQ(*dec.outer_momentum, 0.0);
  EXPECT_EQ(dec.quorum, 1);
  c.mode = diloco::Mode::kDiloco;
  const RunConfig dil = Normalized(c);
  EXPECT_EQ(dil.outer_step, syncer::OuterStepRule::kRound);
  EXPECT_DOUBLE_EQ(*dil.outer_lr, 0.7);
  EXPECT_DOUBLE_EQ(*dil.outer_momentum, 0.9);
  EXPECT_EQ(dil.quorum, dil.learners);
  EXPECT_FALSE(dil.grace);
  c.mode = diloco::Mode::kDdp;
  const RunConfig ddp = Normalized(c);
  EXPECT_EQ(ddp.fragments, 1);
  EXPECT_EQ(ddp.H, 1);
  EXPECT_EQ(ddp.uplink, diloco::Encoding::kBf16);
  EXPECT_EQ(ddp.compression, diloco::Compression::kNone);
  // A value the user set is kept.
  c.mode = diloco::Mode::kDecoupled;
  c.outer_lr = 0.5;
  EXPECT_DOUBLE_EQ(*Normalized(c).outer_lr, 0.5);
  // The syncer gets the same outer optimizer, set or not, from the one default per mode.
  EXPECT_DOUBLE_EQ(MakeSyncerOptions(c).outer.lr, 0.5);
  EXPECT_DOUBLE_EQ(MakeSyncerOptions(c).outer.momentum, 0.0);
  c.mode = diloco::Mode::kDiloco;
  c.outer_lr.reset();
  EXPECT_DOUBLE_EQ(MakeSyncerOptions(c).outer.lr, diloco::OuterOptimizerOptions{}.lr);
  EXPECT_DOUBLE_EQ(MakeSyncerOptions(c).outer.momentum, diloco::OuterOptimizerOptions{}.momentum);
}

TEST(RunConfig, EveryEnumSettingIsReadAndWrittenByItsSpelling) {
  auto c = FromJson({{"merge", "rda-all"},
                     {"weights", "uniform"},
                     {"outer_step", "running"},
                     {"outer_gradient", "base"},
                     {"plan", "strided"},
                     {"uplink", "int8"},
                     {"downlink", "bf16"},
                     {"compression", "none"},
                     {"precision", "fp32"},
                     {"chaos", {{"mode", "random"}, {"repair_dist", "lognormal"}}}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->merge, diloco::MergeRule::kRdaAll);
  EXPECT_EQ(c->weights, diloco::WeightRule::kUniform);
  EXPECT_EQ(c->outer_step, syncer::OuterStepRule::kRunning);
  EXPECT_EQ(c->outer_gradient, syncer::OuterGradientRule::kBase);
  EXPECT_EQ(c->plan, diloco::PlanStrategy::kStrided);
  EXPECT_EQ(c->uplink, diloco::Encoding::kInt8);
  EXPECT_EQ(c->downlink, diloco::Encoding::kBf16);
  EXPECT_EQ(c->compression, diloco::Compression::kNone);
  EXPECT_EQ(c->precision, model::Precision::kFp32);
  EXPECT_EQ(c->chaos.mode, chaos::ChaosMode::kRandom);
  EXPECT_EQ(c->chaos.random.repair_dist, chaos::RepairDist::kLogNormal);
  const nlohmann::json j = ToJson(*c);
  for (const char* key :
       {"merge", "weights", "outer_step", "outer_gradient", "plan", "uplink", "downlink", "compression", "precision"}) {
    EXPECT_TRUE(j.at(key).is_string()) << key;
  }
  EXPECT_EQ(j.at("merge"), "rda-all");
  EXPECT_EQ(j.at("chaos").at("repair_dist"), "lognormal");
  EXPECT_EQ(ToJson(*FromJson(j)), j);
  // The codecs are the fields as they are, with the block size.
  EXPECT_EQ(UplinkCodec(*c).encoding, diloco::Encoding::kInt8);
  EXPECT_EQ(DownlinkCodec(*c).compression, diloco::Compression::kNone);
  EXPECT_EQ(DownlinkCodec(*c).block_size, c->block);
}

TEST(RunConfig, FlagHelpComesFromTheDefaults) {
  const RunConfig d;
  EXPECT_EQ(HelpOf("fragments").default_text, std::to_string(d.fragments));
  EXPECT_EQ(HelpOf("fragments").spellings, "");
  EXPECT_EQ(HelpOf("merge").default_text, "rda");
  EXPECT_EQ(HelpOf("merge").spellings, "rda | rda-all | mean");
  EXPECT_EQ(HelpOf("mode").default_text, "decoupled");
  EXPECT_EQ(HelpOf("gamma").default_text, "0.5");
  EXPECT_EQ(HelpOf("lr").default_text, "0.003");
  EXPECT_EQ(HelpOf("grace").default_text, "true");
  EXPECT_EQ(HelpOf("embeddings").default_text, "*embed* *wte* *tok_emb*");
  EXPECT_EQ(HelpOf("outer_lr").default_text, "");  // the mode's: DefaultOuterOptimizer
  EXPECT_EQ(HelpOf("out").default_text, "");
  EXPECT_EQ(HelpOf("no_such_key").default_text, "");
}

TEST(RunConfig, JsonRoundTripKeepsEveryField) {
  RunConfig c;
  c.mode = diloco::Mode::kDiloco;
  c.learners = 3;
  c.outer_lr = 0.25;
  c.speeds = {1.0, 0.5, 0.5};
  c.keep_progress = false;
  c.eval_every = 7;
  auto back = FromJson(ToJson(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ToJson(*back), ToJson(c));
  EXPECT_EQ(back->mode, diloco::Mode::kDiloco);
  EXPECT_FALSE(back->outer_momentum.has_value());
}

TEST(RunConfig, BadInputIsRefusedWithTheFieldNamed) {
  EXPECT_NE(FromJson({{"learnrs", 4}}).status().message().find("unknown config key 'learnrs'"), std::string::npos);
  EXPECT_NE(FromJson({{"mode", "async"}}).status().message().find("mode must be"), std::string::npos);
  EXPECT_NE(FromJson({{"steps", "many"}}).status().message().find("'steps': wrong type"), std::string::npos);
  EXPECT_EQ(FromJson({{"outer_step", "later"}}).status().message(),
            "config key 'outer_step': outer_step must be sweep, round or running (got 'later')");
  RunConfig c;
  c.outer_momentum = 1.0;
  EXPECT_EQ(ValidateRunConfig(c).code(), StatusCode::kInvalidArgument);
  c = RunConfig{};
  c.H = 10;  // < P = 24
  EXPECT_NE(ValidateRunConfig(c).message().find("H (10) must be ≥ fragments P (24)"), std::string::npos);
  c = RunConfig{};
  EXPECT_NE(FromJson({{"weights", "equal"}}).status().message().find("weights must be tokens or uniform (got 'equal')"),
            std::string::npos);
  EXPECT_NE(FromJson({{"merge", "rda-some"}}).status().message().find("merge must be rda, rda-all or mean"),
            std::string::npos);
  EXPECT_NE(FromJson({{"uplink", "int3"}}).status().message().find("encoding must be int4, int8, bf16, fp32 or int2"),
            std::string::npos);
  EXPECT_NE(FromJson({{"compression", "gzip"}}).status().message().find("compression must be deflate or none"),
            std::string::npos);
  EXPECT_NE(FromJson({{"plan", "lpt"}}).status().message().find("plan must be balanced or strided"), std::string::npos);
  EXPECT_NE(FromJson({{"outer_gradient", "past"}}).status().message().find("outer_gradient must be current or base"),
            std::string::npos);
  EXPECT_NE(FromJson({{"merge", 3}}).status().message().find("'merge': wrong type"), std::string::npos);
  c.merge = diloco::MergeRule::kRdaAll;
  EXPECT_TRUE(ValidateRunConfig(c).ok());
  c = RunConfig{};
  c.batches = {16, 8};  // 4 learners
  EXPECT_NE(ValidateRunConfig(c).message().find("batches has 2 entries for 4 learners"), std::string::npos);
  c.batches = {16, 8, 0, 8};
  EXPECT_NE(ValidateRunConfig(c).message().find("every batch size"), std::string::npos);
  EXPECT_NE(
      FromJson({{"precision", "fp16"}}).status().message().find("precision must be auto, fp32 or bf16 (got 'fp16')"),
      std::string::npos);
  EXPECT_EQ(FromJson({{"precision", "bf16"}})->precision, model::Precision::kBf16);
  EXPECT_TRUE(ValidateRunConfig(RunConfig{}).ok());
}

TEST(RunConfig, SyncerShardsMustEachOwnAFragmentAndMatchKillSyncerEvents) {
  RunConfig c;
  c.syncer_shards = 24;  // = P
  EXPECT_TRUE(ValidateRunConfig(c).ok());
  c.syncer_shards = 25;
  EXPECT_NE(ValidateRunConfig(c).message().find("syncer_shards (S) must be in [1, fragments P] (S=25, P=24)"),
            std::string::npos)
      << ValidateRunConfig(c);
  c.syncer_shards = 0;
  EXPECT_EQ(ValidateRunConfig(c).code(), StatusCode::kInvalidArgument);
  c.syncer_shards = 2;
  c.mode = diloco::Mode::kDdp;
  EXPECT_NE(ValidateRunConfig(Normalized(c)).message().find("ddp mode runs one syncer"), std::string::npos);
  c = RunConfig{};
  c.syncer_shards = 2;
  chaos::FaultEvent kill;
  kill.kind = chaos::FaultKind::kKillSyncer;
  kill.target = 2;  // shards 0 and 1 only
  c.chaos.mode = chaos::ChaosMode::kEvents;
  c.chaos.events = {kill};
  EXPECT_NE(ValidateRunConfig(c).message().find("a kill_syncer event names syncer shard 2"), std::string::npos)
      << ValidateRunConfig(c);
  c.chaos.events[0].target = 1;
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c);
  auto back = FromJson(ToJson(c));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->syncer_shards, 2);
}

TEST(RunConfig, PerLearnerBatchesAndWeightsComeFromTheRunFile) {
  auto c = LoadRunConfig(WriteTemp("atoll_rc_batches.toml",
                                   "[run]\nlearners = 3\n[model]\nbatch = 16\n[diloco]\nweights = \"uniform\"\n"
                                   "[learners]\nbatches = [24, 8, 8]\n"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->weights, diloco::WeightRule::kUniform);
  EXPECT_EQ(c->BatchOf(0), 24);
  EXPECT_EQ(c->BatchOf(2), 8);
  RunConfig plain;
  EXPECT_EQ(plain.BatchOf(3), plain.batch);  // no list: every learner has --batch
}

TEST(RunConfig, TomlSectionsAndKeysAreChecked) {
  auto ok = LoadRunConfig(WriteTemp("atoll_rc_ok.toml", "[run]\nlearners = 2\n[diloco]\nouter_step = \"round\"\n"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->learners, 2);
  EXPECT_EQ(ok->outer_step, syncer::OuterStepRule::kRound);
  auto wrong_section = LoadRunConfig(WriteTemp("atoll_rc_sec.toml", "[model]\nlearners = 2\n"));
  EXPECT_NE(wrong_section.status().message().find("unknown key 'learners' in [model]"), std::string::npos);
  auto bad_table = LoadRunConfig(WriteTemp("atoll_rc_tab.toml", "[runs]\nlearners = 2\n"));
  EXPECT_NE(bad_table.status().message().find("unknown section [runs]"), std::string::npos);
  auto not_toml = LoadRunConfig(WriteTemp("atoll_rc_bad.toml", "[run\n"));
  EXPECT_NE(not_toml.status().message().find("not valid TOML"), std::string::npos);
}

}  // namespace
}  // namespace atl::runtime

namespace atl::runtime {
namespace {

TEST(RunConfig, LimitsComeFromTheLimitsSectionAndReachTheSyncerAndItsServer) {
  auto c = LoadRunConfig(WriteTemp("atoll_rc_limits.toml",
                                   "[limits]\nmax_learners = 16\nmax_inflight_push_mb = 64\nmax_streams = 8\n"
                                   "max_threads = 32\nmemory_quota_mb = 512\nhandshake_timeout_s = 2.5\n"
                                   "idle_timeout_s = 30\nquarantine_factor = 0\nmax_consecutive_rejects = 3\n"
                                   "ban_seconds = 60\nmax_connections = 100\nmax_pushes_per_learner = 2\n"
                                   "max_polls_per_learner = 3\nmax_heartbeats_per_s = 5\npush_timeout_s = 30\n"
                                   "commit_reserve_mb = 8\nallowed_learners = \"0-3,7\"\n"));
  ASSERT_TRUE(c.ok()) << c.status();
  const syncer::SyncerOptions so = MakeSyncerOptions(*c);
  EXPECT_EQ(so.max_learners, 16);
  EXPECT_EQ(so.quarantine_factor, 0.0);
  EXPECT_EQ(so.max_consecutive_rejects, 3);
  EXPECT_EQ(so.ban_seconds, 60.0);
  const transport::ServerLimits l = MakeServerLimits(*c);
  EXPECT_EQ(l.max_inflight_push_bytes, int64_t{64} << 20);
  EXPECT_EQ(l.max_concurrent_streams, 8);
  EXPECT_EQ(l.max_threads, 32);
  EXPECT_EQ(l.memory_quota_bytes, int64_t{512} << 20);
  EXPECT_EQ(l.handshake_timeout_ms, 2500);
  EXPECT_EQ(l.max_connection_idle_ms, 30'000);
  EXPECT_EQ(l.max_connections, 100);
  EXPECT_EQ(l.max_pushes_per_learner, 2);
  EXPECT_EQ(l.max_polls_per_learner, 3);
  EXPECT_EQ(l.max_heartbeats_per_s, 5.0);
  EXPECT_EQ(l.push_timeout_ms, 30'000);
  EXPECT_EQ(c->commit_reserve_mb, 8.0);
  EXPECT_EQ(c->allowed_learners, "0-3,7");
  // The defaults are the documented ones (docs/security.md).
  const transport::ServerLimits d = MakeServerLimits(RunConfig{});
  const transport::ServerLimits built_in;
  EXPECT_EQ(d.max_inflight_push_bytes, built_in.max_inflight_push_bytes);
  EXPECT_EQ(d.max_concurrent_streams, built_in.max_concurrent_streams);
  EXPECT_EQ(d.max_threads, built_in.max_threads);
  EXPECT_EQ(d.memory_quota_bytes, built_in.memory_quota_bytes);
  EXPECT_EQ(d.handshake_timeout_ms, built_in.handshake_timeout_ms);
  EXPECT_EQ(d.max_connection_idle_ms, built_in.max_connection_idle_ms);
  EXPECT_EQ(d.max_connections, built_in.max_connections);
  EXPECT_EQ(d.max_pushes_per_learner, built_in.max_pushes_per_learner);
  EXPECT_EQ(d.max_polls_per_learner, built_in.max_polls_per_learner);
  EXPECT_EQ(d.max_heartbeats_per_s, built_in.max_heartbeats_per_s);
  EXPECT_EQ(d.push_timeout_ms, built_in.push_timeout_ms);
}

TEST(RunConfig, LimitsOutOfRangeAreRefused) {
  auto refused = [](auto set) {
    RunConfig c;
    set(c);
    return ValidateRunConfig(c);
  };
  EXPECT_NE(refused([](RunConfig& c) { c.max_learners = 2; }).message().find("max_learners"), std::string::npos);
  EXPECT_NE(refused([](RunConfig& c) { c.max_inflight_push_mb = 0; }).message().find("max_inflight_push_mb"),
            std::string::npos);
  EXPECT_NE(refused([](RunConfig& c) { c.max_threads = 1; }).message().find("max_threads"), std::string::npos);
  EXPECT_NE(refused([](RunConfig& c) { c.handshake_timeout_s = 0; }).message().find("handshake_timeout_s"),
            std::string::npos);
  EXPECT_NE(refused([](RunConfig& c) { c.quarantine_factor = 1.5; }).message().find("quarantine_factor"),
            std::string::npos);
  EXPECT_NE(refused([](RunConfig& c) { c.ban_seconds = -1; }).message().find("ban_seconds"), std::string::npos);
  EXPECT_NE(refused([](RunConfig& c) { c.max_connections = 4; }).message().find("max_connections"), std::string::npos);
  EXPECT_NE(refused([](RunConfig& c) { c.max_polls_per_learner = 0; }).message().find("max_polls_per_learner"),
            std::string::npos);
  EXPECT_NE(refused([](RunConfig& c) { c.push_timeout_s = 0; }).message().find("push_timeout_s"), std::string::npos);
  EXPECT_NE(refused([](RunConfig& c) { c.commit_reserve_mb = -1; }).message().find("commit_reserve_mb"),
            std::string::npos);
  EXPECT_NE(refused([](RunConfig& c) { c.allowed_learners = "3-1"; }).message().find("allowed_learners"),
            std::string::npos);
  EXPECT_NE(LoadRunConfig(WriteTemp("atoll_rc_limits_bad.toml", "[limits]\nmax_learner = 5\n"))
                .status()
                .message()
                .find("max_learner"),
            std::string::npos);
}

}  // namespace
}  // namespace atl::runtime
