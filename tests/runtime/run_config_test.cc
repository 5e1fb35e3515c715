// The run config: one field list for TOML, JSON and flags; validation; the settings each mode
// implies (Normalized).
#include "atoll/runtime/run_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace atl::runtime {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(RunConfig, ModesImplyTheirSettings) {
  RunConfig c;
  const RunConfig dec = Normalized(c);
  EXPECT_EQ(dec.outer_step, "sweep");
  EXPECT_DOUBLE_EQ(*dec.outer_lr, 1.0);
  EXPECT_DOUBLE_EQ(*dec.outer_momentum, 0.0);
  EXPECT_EQ(dec.quorum, 1);
  c.mode = diloco::Mode::kDiloco;
  const RunConfig dil = Normalized(c);
  EXPECT_EQ(dil.outer_step, "round");
  EXPECT_DOUBLE_EQ(*dil.outer_lr, 0.7);
  EXPECT_DOUBLE_EQ(*dil.outer_momentum, 0.9);
  EXPECT_EQ(dil.quorum, dil.learners);
  EXPECT_FALSE(dil.grace);
  c.mode = diloco::Mode::kDdp;
  const RunConfig ddp = Normalized(c);
  EXPECT_EQ(ddp.fragments, 1);
  EXPECT_EQ(ddp.H, 1);
  EXPECT_EQ(ddp.uplink, "bf16");
  // A value the user set is kept.
  c.mode = diloco::Mode::kDecoupled;
  c.outer_lr = 0.5;
  EXPECT_DOUBLE_EQ(*Normalized(c).outer_lr, 0.5);
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
  RunConfig c;
  c.outer_step = "later";
  EXPECT_NE(ValidateRunConfig(c).message().find("outer_step"), std::string::npos);
  c = RunConfig{};
  c.outer_momentum = 1.0;
  EXPECT_EQ(ValidateRunConfig(c).code(), StatusCode::kInvalidArgument);
  c = RunConfig{};
  c.H = 10;  // < P = 24
  EXPECT_NE(ValidateRunConfig(c).message().find("H (10) must be ≥ fragments P (24)"), std::string::npos);
  EXPECT_TRUE(ValidateRunConfig(RunConfig{}).ok());
}

TEST(RunConfig, TomlSectionsAndKeysAreChecked) {
  auto ok = LoadRunConfig(WriteTemp("atoll_rc_ok.toml", "[run]\nlearners = 2\n[diloco]\nouter_step = \"round\"\n"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->learners, 2);
  EXPECT_EQ(ok->outer_step, "round");
  auto wrong_section = LoadRunConfig(WriteTemp("atoll_rc_sec.toml", "[model]\nlearners = 2\n"));
  EXPECT_NE(wrong_section.status().message().find("unknown key 'learners' in [model]"), std::string::npos);
  auto bad_table = LoadRunConfig(WriteTemp("atoll_rc_tab.toml", "[runs]\nlearners = 2\n"));
  EXPECT_NE(bad_table.status().message().find("unknown section [runs]"), std::string::npos);
  auto not_toml = LoadRunConfig(WriteTemp("atoll_rc_bad.toml", "[run\n"));
  EXPECT_NE(not_toml.status().message().find("not valid TOML"), std::string::npos);
}

}  // namespace
}  // namespace atl::runtime
