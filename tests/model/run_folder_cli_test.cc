// The model is usable after `atoll run`: a real (tiny) run of a syncer and two learner processes
// on 127.0.0.1 (port 0), then, through the same binary, `atoll sample` and `atoll eval` on its
// run folder, `atoll export` from its durable state, `atoll train --resume` from it, and the bad
// inputs of those commands. Also checks that the run's report formats numbers for people.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <sstream>

#include "atoll/core/file.h"
#include "atoll/model/safetensors.h"
#include "testing/atoll_binary.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

// The last line of a command's output that parses as a JSON object.
nlohmann::json LastJsonLine(const std::string& output) {
  std::istringstream in(output);
  nlohmann::json found;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) found = j;
  }
  return found;
}

// One tiny run, shared by the stages below (each test of a gtest binary runs in its own process
// under ctest, so the stages are functions of one test rather than tests of a fixture).
struct RunFolder {
  std::string dir;
  testing::CommandResult run;
  std::string Run() const { return dir + "/run"; }
  double RunEvalLoss() const { return testing::ReadJson(Run() + "/summary.json").value("eval_loss", -1.0); }
};

void CheckReport(const RunFolder& f) {
  EXPECT_TRUE(fs::exists(f.Run() + "/global.safetensors"));
  auto html = ReadFile(f.Run() + "/report.html");
  ASSERT_TRUE(html.ok()) << f.run.output;
  EXPECT_NE(html->find("Loss vs tokens"), std::string::npos);
  EXPECT_NE(f.run.output.find("status page: http://127.0.0.1:"), std::string::npos) << f.run.output;
  EXPECT_TRUE(std::regex_search(f.run.output, std::regex("tokens trained [0-9]{1,3}(,[0-9]{3})*  merged")))
      << f.run.output;
  EXPECT_FALSE(std::regex_search(f.run.output, std::regex("computed [0-9]+\\.[0-9]"))) << f.run.output;
}

void CheckSampleAndEval(const RunFolder& f) {
  auto s = testing::RunAtoll("sample --checkpoint " + f.Run() + " --prompt 'The ' --tokens 16", 120);
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_NE(s.output.find("The "), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("16 new tokens"), std::string::npos) << s.output;

  auto human = testing::RunAtoll("eval --checkpoint " + f.Run(), 120);
  ASSERT_EQ(human.exit_code, 0) << human.output;
  EXPECT_NE(human.output.find("eval loss "), std::string::npos) << human.output;
  EXPECT_NE(human.output.find("perplexity "), std::string::npos) << human.output;
  EXPECT_NE(human.output.find("atoll run folder"), std::string::npos) << human.output;

  auto machine = testing::RunAtoll("eval --checkpoint " + f.Run() + " --json", 120);
  ASSERT_EQ(machine.exit_code, 0) << machine.output;
  auto j = LastJsonLine(machine.output);
  ASSERT_TRUE(j.is_object()) << machine.output;
  EXPECT_EQ(j["kind"], "atoll run");
  EXPECT_EQ(j["batches"], 2) << "the run's --eval-batches";
  EXPECT_EQ(j["eval_tokens"], 2 * 4 * 32);
  // The same weights on the same validation windows as the syncer's final evaluation.
  EXPECT_NEAR(j["eval_loss"].get<double>(), f.RunEvalLoss(), 1e-6);
}

void CheckExport(const RunFolder& f) {
  const std::string out = f.Run() + "/exported.safetensors";
  auto e = testing::RunAtoll("export --config " + f.Run() + " --out " + out, 120);
  ASSERT_EQ(e.exit_code, 0) << e.output;
  auto exported = model::ReadSafetensors(out);
  auto global = model::ReadSafetensors(f.Run() + "/global.safetensors");
  ASSERT_TRUE(exported.ok() && global.ok());
  ASSERT_EQ(exported->tensors.size(), global->tensors.size());
  for (size_t i = 0; i < global->tensors.size(); ++i) {
    EXPECT_EQ(exported->tensors[i].name, global->tensors[i].name);
    EXPECT_EQ(exported->values[i], global->values[i])
        << global->tensors[i].name << ": every round the syncer merged was committed before it was published";
  }
  auto ev = testing::RunAtoll("eval --checkpoint " + out + " --json", 120);
  ASSERT_EQ(ev.exit_code, 0) << ev.output;
  EXPECT_NEAR(LastJsonLine(ev.output)["eval_loss"].get<double>(), f.RunEvalLoss(), 1e-6);

  auto again = testing::RunAtoll("export --config " + f.Run() + " --out " + out, 60);
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.output.find("--force"), std::string::npos) << again.output;
}

void CheckTrainResume(const RunFolder& f) {
  const std::string out = f.dir + "/continued";
  auto t = testing::RunAtoll(
      "train --resume " + f.Run() + " --out " + out + " --steps 2 --batch 4 --eval-every 0 --eval-batches 2", 120);
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("moments start fresh"), std::string::npos) << t.output;
  auto s = testing::ReadJson(out + "/summary.json");
  EXPECT_EQ(s["steps_this_run"], 2);
  EXPECT_NEAR(s["eval_loss_start"].get<double>(), f.RunEvalLoss(), 1e-6)
      << "the model (preset, seq), data and weights came from the run folder";
}

void CheckBadInput(const RunFolder& f) {
  auto missing = testing::RunAtoll("eval --checkpoint " + f.dir + "/nothing", 60);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("no model at"), std::string::npos) << missing.output;

  auto nostate = testing::RunAtoll(
      "export --config " + f.Run() + " --state " + f.dir + "/nostate --out " + f.dir + "/x.safetensors", 60);
  EXPECT_NE(nostate.exit_code, 0);
  EXPECT_NE(nostate.output.find("no committed syncer state"), std::string::npos) << nostate.output;

  // A run folder without global.safetensors: sampling says how to export one.
  const std::string copy = f.dir + "/unfinished";
  fs::copy(f.Run(), copy, fs::copy_options::recursive);
  fs::remove(copy + "/global.safetensors");
  auto unfinished = testing::RunAtoll("sample --checkpoint " + copy, 60);
  EXPECT_NE(unfinished.exit_code, 0);
  EXPECT_NE(unfinished.output.find("atoll export"), std::string::npos) << unfinished.output;

  // A corrupted global.safetensors.
  auto bytes = ReadFile(f.Run() + "/global.safetensors");
  ASSERT_TRUE(bytes.ok());
  std::string bad = *bytes;
  bad[bad.size() - 64] ^= 0x04;
  ASSERT_TRUE(WriteFileAtomic(copy + "/global.safetensors", bad).ok());
  auto corrupt = testing::RunAtoll("eval --checkpoint " + copy, 60);
  EXPECT_NE(corrupt.exit_code, 0);
  EXPECT_NE(corrupt.output.find("corrupted"), std::string::npos) << corrupt.output;
}

TEST(ModelRunFolder, SampleEvalExportAndResumeAfterAtollRun) {
  RunFolder f;
  f.dir = testing::ScratchDir("model_run_folder");
  const std::string data = testing::PrepareSmallData(f.dir);
  f.run = testing::RunAtoll("run --data " + data + " --out " + f.Run() +
                                " -M 2 --steps 16 --seq 32 --batch 4 -P 4 -H 4 --tau 1 "
                                "--eval-batches 2 --eval-every 0 --no-live",
                            240);
  ASSERT_EQ(f.run.exit_code, 0) << f.run.output;
  {
    SCOPED_TRACE("report");
    CheckReport(f);
  }
  {
    SCOPED_TRACE("sample and eval");
    CheckSampleAndEval(f);
  }
  {
    SCOPED_TRACE("export");
    CheckExport(f);
  }
  {
    SCOPED_TRACE("train --resume");
    CheckTrainResume(f);
  }
  {
    SCOPED_TRACE("bad input");
    CheckBadInput(f);
  }
  fs::remove_all(f.dir);
}

}  // namespace
}  // namespace atl
