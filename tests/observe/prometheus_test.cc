// The Prometheus text exposition and the derived run figures, on hand-written status documents
// with hand-checked values.
#include "atoll/observe/prometheus.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <sstream>

namespace atl::observe {
namespace {

using nlohmann::json;

json TwoLearners() {
  json s = {{"run_id", "run \"a\"\nx\\y"}, {"mode", "decoupled"}, {"params", 1000}, {"rounds", 7},
            {"rounds_refused", 1},         {"versions", {3, 4}},  {"live", {0}},    {"bytes_up", 1500},
            {"bytes_down", 2500},          {"uptime_s", 12.5}};
  s["learners"] = json::array({{{"id", 0},
                                {"state", "training"},
                                {"step", 10},
                                {"tokens", 3000},
                                {"tokens_merged", 1500.5},
                                {"loss", 2.25},
                                {"tokens_per_second", 600.0},
                                {"version_held", 4},
                                {"rounds_joined", 5},
                                {"seconds_since_seen", 0.5},
                                {"bytes_up", 1000},
                                {"bytes_down", 2000}},
                               {{"id", 1},
                                {"state", "done"},
                                {"step", 20},
                                {"tokens", 1000},
                                {"tokens_merged", 500.0},
                                {"loss", 2.5},
                                {"tokens_per_second", 0.0},
                                {"version_held", 3},
                                {"rounds_joined", 2},
                                {"seconds_since_seen", 30.0},
                                {"bytes_up", 500},
                                {"bytes_down", 500}}});
  return s;
}

// The sample lines (no comments) of an exposition.
std::vector<std::string> Samples(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') out.push_back(line);
  }
  return out;
}

bool Has(const std::vector<std::string>& lines, const std::string& line) {
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

TEST(ObservePrometheus, DerivedFiguresFromTheLearnerTable) {
  json s = TwoLearners();
  AddDerived(s);
  EXPECT_EQ(s["tokens_trained"].get<double>(), 4000);
  EXPECT_EQ(s["tokens_merged"].get<double>(), 2000.5);
  EXPECT_DOUBLE_EQ(s["goodput"].get<double>(), 2000.5 / 4000);
  // (10 + 20) steps × 1000 params × (2 bytes up + 2 bytes down).
  EXPECT_EQ(s["dp_equivalent_bytes"].get<double>(), 120000);

  json empty = {{"params", 5}};
  AddDerived(empty);
  EXPECT_EQ(empty["goodput"].get<double>(), 0.0) << "no tokens yet: 0, not NaN";
  EXPECT_EQ(empty["dp_equivalent_bytes"].get<double>(), 0.0);
}

TEST(ObservePrometheus, RendersEveryFamilyWithLabelsAndUnits) {
  json s = TwoLearners();
  AddDerived(s);
  RoundStats rounds;
  rounds.Observe(1, 0.0);
  rounds.Observe(2, 0.3);
  rounds.Observe(2, 7.0);
  const std::string text = RenderPrometheus(s, rounds);
  const auto lines = Samples(text);
  EXPECT_TRUE(Has(lines, R"(atoll_info{run_id="run \"a\"\nx\\y",mode="decoupled"} 1)")) << text;
  EXPECT_TRUE(Has(lines, "atoll_uptime_seconds 12.5")) << text;
  EXPECT_TRUE(Has(lines, "atoll_learners_live 1")) << text;
  EXPECT_TRUE(Has(lines, R"(atoll_learner_up{learner="0"} 1)")) << text;
  EXPECT_TRUE(Has(lines, R"(atoll_learner_up{learner="1"} 0)")) << text;
  EXPECT_TRUE(Has(lines, R"(atoll_tokens_trained_total{learner="0"} 3000)")) << text;
  EXPECT_TRUE(Has(lines, R"(atoll_tokens_merged_total{learner="0"} 1500.5)")) << text;
  EXPECT_TRUE(Has(lines, R"(atoll_learner_loss{learner="1"} 2.5)")) << text;
  EXPECT_TRUE(Has(lines, R"(atoll_rounds_total{fragment="0"} 3)")) << text;
  EXPECT_TRUE(Has(lines, R"(atoll_rounds_total{fragment="1"} 4)")) << text;
  EXPECT_TRUE(Has(lines, "atoll_rounds_refused_total 1")) << text;
  EXPECT_TRUE(Has(lines, "atoll_rounds_held 0")) << text;
  s["holding"] = "only 1.0 MiB free";
  EXPECT_TRUE(Has(Samples(RenderPrometheus(s, rounds)), "atoll_rounds_held 1"));
  EXPECT_TRUE(Has(lines, R"(atoll_wire_bytes_total{direction="up"} 1500)")) << text;
  EXPECT_TRUE(Has(lines, R"(atoll_wire_bytes_total{direction="down"} 2500)")) << text;
  EXPECT_TRUE(Has(lines, "atoll_dp_equivalent_bytes_total 120000")) << text;
  EXPECT_TRUE(Has(lines, "atoll_goodput_ratio 0.500125")) << text;
  EXPECT_EQ(text.find("atoll_global_eval_loss"), std::string::npos) << "not evaluated yet: left out";
  // Histograms: cumulative buckets, +Inf = count, sum.
  EXPECT_TRUE(Has(lines, R"(atoll_round_contributors_bucket{le="1"} 1)")) << text;
  EXPECT_TRUE(Has(lines, R"(atoll_round_contributors_bucket{le="2"} 3)")) << text;
  EXPECT_TRUE(Has(lines, R"(atoll_round_contributors_bucket{le="+Inf"} 3)")) << text;
  EXPECT_TRUE(Has(lines, "atoll_round_contributors_sum 5")) << text;
  EXPECT_TRUE(Has(lines, "atoll_round_contributors_count 3")) << text;
  EXPECT_TRUE(Has(lines, R"(atoll_grace_seconds_bucket{le="0"} 1)")) << text;
  EXPECT_TRUE(Has(lines, R"(atoll_grace_seconds_bucket{le="0.5"} 2)")) << text;
  EXPECT_TRUE(Has(lines, R"(atoll_grace_seconds_bucket{le="5"} 2)")) << text;
  EXPECT_TRUE(Has(lines, R"(atoll_grace_seconds_bucket{le="10"} 3)")) << text;
  EXPECT_TRUE(Has(lines, "atoll_grace_seconds_sum 7.3")) << text;
  // Every family is typed once, and every sample belongs to a typed family.
  EXPECT_NE(text.find("# TYPE atoll_tokens_trained_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE atoll_goodput_ratio gauge\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE atoll_grace_seconds histogram\n"), std::string::npos);
  for (const auto& l : lines) {
    std::string name = l.substr(0, l.find_first_of("{ "));
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sfx = suffix;
      if (name.size() > sfx.size() && name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0 &&
          text.find("# TYPE " + name.substr(0, name.size() - sfx.size()) + " histogram") != std::string::npos) {
        name = name.substr(0, name.size() - sfx.size());
      }
    }
    EXPECT_NE(text.find("# TYPE " + name + " "), std::string::npos) << l;
  }
}

TEST(ObservePrometheus, EvalLossAndOddValues) {
  json s = TwoLearners();
  s["global_eval_loss"] = 3.0;
  s["learners"][0]["loss"] = std::numeric_limits<double>::quiet_NaN();
  s["learners"][1]["loss"] = "not a number";
  AddDerived(s);
  const auto lines = Samples(RenderPrometheus(s, RoundStats{}));
  EXPECT_TRUE(Has(lines, "atoll_global_eval_loss 3"));
  EXPECT_TRUE(Has(lines, R"(atoll_learner_loss{learner="0"} NaN)")) << "Prometheus's spelling";
  EXPECT_TRUE(Has(lines, R"(atoll_learner_loss{learner="1"} 0)")) << "a non-number field reads as 0";
  EXPECT_TRUE(Has(lines, R"(atoll_round_contributors_bucket{le="+Inf"} 0)"));
}

TEST(ObserveHistory, KeepsTheWholeSpanAtHalvedResolution) {
  StatusHistory h(4);
  for (int i = 0; i < 9; ++i) {
    json s = TwoLearners();
    s["uptime_s"] = i;
    s["rounds"] = 10 * i;
    AddDerived(s);
    h.Add(s);
  }
  // 0..3 fill it; adding 4, 6 and 8 finds it full and halves it first: 0,2 | 0,4 | 0,6 → 0, 6, 8.
  const json points = h.ToJson()["points"];
  std::vector<double> t;
  for (const auto& p : points) t.push_back(p["t"].get<double>());
  EXPECT_EQ(t, (std::vector<double>{0, 6, 8}));
  EXPECT_LE(h.size(), 4u);
  const json& last = points.back();
  EXPECT_EQ(last["rounds"].get<double>(), 80);
  EXPECT_EQ(last["wire_bytes"].get<double>(), 4000);
  EXPECT_EQ(last["dp_equivalent_bytes"].get<double>(), 120000);
  EXPECT_EQ(last["learners"]["1"]["loss"].get<double>(), 2.5);
  EXPECT_EQ(last["learners"]["0"]["tokens"].get<double>(), 3000);
}

TEST(ObservePrometheus, HistogramBucketsAreUpperInclusive) {
  Histogram h({1, 2});
  for (double v : {0.5, 1.0, 1.5, 2.0, 9.0}) h.Observe(v);
  EXPECT_EQ(h.counts, (std::vector<uint64_t>{2, 2, 1}));
  EXPECT_EQ(h.count, 5u);
  EXPECT_DOUBLE_EQ(h.sum, 14.0);
}

}  // namespace
}  // namespace atl::observe
