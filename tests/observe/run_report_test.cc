// report.html from hand-written run folders: every figure is present and well-formed SVG, the
// numbers are formatted for people, faults are marked, and bad folders get clear errors.
#include "atoll/observe/run_report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "atoll/core/file.h"
#include "testing/scratch.h"

namespace atl::observe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Scratch(const std::string& name) { return testing::ScratchDir("report_" + name); }

void WriteLines(const std::string& path, const std::vector<json>& lines, const std::string& tail = "") {
  std::ofstream out(path);
  for (const auto& l : lines) out << l.dump() << "\n";
  out << tail;
}

// A minimal XML well-formedness check: tags nest and close, attribute quotes pair up, every `&`
// starts an entity. Returns "" or what is wrong.
std::string XmlProblem(const std::string& xml) {
  std::vector<std::string> open;
  for (size_t i = 0; i < xml.size();) {
    if (xml[i] == '&') {
      const size_t semi = xml.find(';', i);
      if (semi == std::string::npos || semi - i > 8) return "bare & at " + std::to_string(i);
      i = semi + 1;
      continue;
    }
    if (xml[i] != '<') {
      ++i;
      continue;
    }
    size_t end = i + 1;
    bool quoted = false;
    while (end < xml.size() && (quoted || xml[end] != '>')) quoted ^= xml[end++] == '"';
    if (end >= xml.size()) return "unterminated tag at " + std::to_string(i);
    const std::string tag = xml.substr(i + 1, end - i - 1);
    const std::string name = tag.substr(tag[0] == '/' ? 1 : 0, tag.find_first_of(" \n/", 1) - (tag[0] == '/' ? 1 : 0));
    if (tag[0] == '/') {
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes " + (open.empty() ? "nothing" : open.back());
      open.pop_back();
    } else if (tag.back() != '/' && tag[0] != '?' && tag[0] != '!') {
      open.push_back(name);
    }
    i = end + 1;
  }
  return open.empty() ? "" : "<" + open.back() + "> never closed";
}

std::vector<std::string> Svgs(const std::string& html) {
  std::vector<std::string> out;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) {
    const size_t end = html.find("</svg>", at);
    if (end == std::string::npos) break;
    out.push_back(html.substr(at, end + 6 - at));
  }
  return out;
}

// Two learners, learner 1 killed and restarted (its counters start again), four rounds.
std::string ClusterFolder() {
  const std::string dir = Scratch("cluster");
  const double t0 = 1000;
  std::vector<json> syncer = {{{"t", t0}, {"kind", "global_eval"}, {"tokens_merged", 0}, {"eval_loss", 5.5}}};
  for (int r = 0; r < 4; ++r) {
    syncer.push_back({{"t", t0 + 1 + r},
                      {"kind", "round"},
                      {"contributors", r % 2 ? json{0, 1} : json{0}},
                      {"grace_s", 0.25 * r},
                      {"tokens_merged", 256.0}});
  }
  syncer.push_back({{"t", t0 + 4.5}, {"kind", "global_eval"}, {"tokens_merged", 1024}, {"eval_loss", 4.0}});
  WriteLines(dir + "/metrics-syncer.jsonl", syncer, "{\"t\": 10");  // a line cut by a kill
  for (int id = 0; id < 2; ++id) {
    std::vector<json> steps;
    for (int s = 1; s <= 6; ++s) {
      const bool restarted = id == 1 && s > 3;
      steps.push_back({{"t", t0 + s},
                       {"source", "learner"},
                       {"step", s},
                       {"tokens", 128 * s},
                       {"step_tokens", 128},
                       {"loss", 6.0 - 0.2 * s},
                       {"wire_bytes_up", restarted ? 10 * (s - 3) : 100 * s},
                       {"wire_bytes_down", 0}});
    }
    steps.push_back({{"t", t0 + 2}, {"kind", "contributed"}});
    WriteLines(dir + "/metrics-learner-" + std::to_string(id) + ".jsonl", steps);
  }
  WriteLines(dir + "/faults.jsonl", {{{"t", t0 + 3.5}, {"kind", "kill"}, {"learner", 1}, {"note", "SIGKILL"}}});
  json summary = {{"mode", "decoupled"},
                  {"learners", 2},
                  {"rounds", 4},
                  {"wall_seconds", 6.04},
                  {"eval_loss_start", 5.5},
                  {"eval_loss", 3.9},
                  {"tokens_trained", 1773568.0000000019},
                  {"tokens_merged", 1024.0},
                  {"goodput", 0.8123},
                  {"uptime", 1.0},
                  {"bytes_up", 1.5e6},
                  {"bytes_down", 2.5e6},
                  {"dp_equivalent_bytes", 4.0e7},
                  {"params", 1000},
                  {"faults", json::array({{}})}};
  EXPECT_TRUE(WriteFileAtomic(dir + "/summary.json", summary.dump()).ok());
  return dir;
}

TEST(ObserveReport, ClusterRunFolderRendersEveryFigure) {
  const std::string dir = ClusterFolder();
  auto r = WriteRunReport(dir);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->path, dir + "/report.html");
  EXPECT_EQ(r->kind, "atoll run");
  EXPECT_EQ(r->figures, 3);
  const std::string html = *ReadFile(r->path);
  const auto svgs = Svgs(html);
  ASSERT_EQ(svgs.size(), 3u);
  for (const auto& svg : svgs) EXPECT_EQ(XmlProblem(svg), "") << svg.substr(0, 400);
  for (const char* title :
       {"Loss vs tokens", "Loss vs time", "Tokens trained vs merged", "Bytes on the wire vs data-parallel",
        "Contributors per round", "Grace window per round", "learner 0 (train)", "learner 1 (train)",
        "global model (eval)", "data-parallel, same steps (bf16)"}) {
    EXPECT_NE(html.find(title), std::string::npos) << title;
  }
  EXPECT_NE(html.find(">kill 1</text>"), std::string::npos) << "the fault is marked on the time axes";
  // Numbers for people.
  EXPECT_NE(html.find("<td>1,773,568</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>4.0 MB</td>"), std::string::npos);
  EXPECT_NE(html.find("40.0 MB (10.0x more)"), std::string::npos);
  EXPECT_NE(html.find("<td>0.812</td>"), std::string::npos);
  EXPECT_EQ(html.find("1773568.0"), std::string::npos);
  EXPECT_NE(html.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_EQ(html.find("<?xml"), std::string::npos) << "inline SVG carries no XML declaration";
  fs::remove_all(dir);
}

TEST(ObserveReport, TrainRunFolderAndHandStartedSyncerFolder) {
  const std::string dir = Scratch("train");
  std::vector<json> lines = {{{"kind", "eval"}, {"step", 0}, {"tokens", 0}, {"eval_loss", 5.6}}};
  for (int s = 1; s <= 5; ++s) {
    lines.push_back(
        {{"kind", "train"}, {"step", s}, {"tokens", 512 * s}, {"loss", 5.0 - 0.1 * s}, {"elapsed", 0.5 * s}});
  }
  lines.push_back({{"kind", "eval"}, {"step", 5}, {"tokens", 2560}, {"eval_loss", 4.4}});
  WriteLines(dir + "/metrics.jsonl", lines);
  auto r = WriteRunReport(dir);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, "atoll train");
  const auto svgs = Svgs(*ReadFile(r->path));
  ASSERT_EQ(svgs.size(), 1u);
  EXPECT_EQ(XmlProblem(svgs[0]), "");

  // A syncer started by hand: syncer-summary.json (the status document) instead of summary.json.
  const std::string hand = Scratch("hand");
  WriteLines(hand + "/metrics-syncer.jsonl",
             {{{"t", 5.0}, {"kind", "round"}, {"contributors", {0}}, {"tokens_merged", 10}}});
  json s = {{"rounds", 1},
            {"params", 10},
            {"eval_loss_start", 5.0},
            {"eval_loss", 4.5},
            {"bytes_up", 100},
            {"bytes_down", 100},
            {"learners", {{{"id", 0}, {"tokens", 2000}, {"tokens_merged", 1000}, {"step", 4}}}}};
  ASSERT_TRUE(WriteFileAtomic(hand + "/syncer-summary.json", s.dump()).ok());
  auto h = WriteRunReport(hand);
  ASSERT_TRUE(h.ok()) << h.status();
  const std::string html = *ReadFile(h->path);
  EXPECT_NE(html.find("<tr><th>goodput</th><td>0.500</td></tr>"), std::string::npos) << html.substr(0, 2000);
  EXPECT_NE(html.find("<tr><th>learners</th><td>1</td></tr>"), std::string::npos);
  fs::remove_all(dir);
  fs::remove_all(hand);
}

TEST(ObserveReport, BadFoldersAreRefusedAndNothingIsWritten) {
  const std::string dir = Scratch("bad");
  auto missing = WriteRunReport(dir + "/nothing");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no run folder"), std::string::npos);
  auto empty = WriteRunReport(dir);
  EXPECT_EQ(empty.status().code(), StatusCode::kNotFound);
  EXPECT_NE(empty.status().message().find("no metrics in"), std::string::npos);
  WriteLines(dir + "/metrics.jsonl", {{{"kind", "something else"}}}, "not json\n");
  EXPECT_EQ(WriteRunReport(dir).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(fs::exists(dir + "/report.html"));
  fs::remove_all(dir);
}

TEST(ObserveReport, ReadJsonLinesSkipsBrokenLines) {
  const std::string dir = Scratch("jsonl");
  WriteLines(dir + "/m.jsonl", {{{"a", 1}}, {{"a", 2}}}, "[1,2]\n{\"a\": 3");
  const auto lines = ReadJsonLines(dir + "/m.jsonl");
  ASSERT_EQ(lines.size(), 2u) << "an array line and a cut line are skipped";
  EXPECT_EQ(lines[1]["a"], 2);
  EXPECT_TRUE(ReadJsonLines(dir + "/missing.jsonl").empty());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace atl::observe
