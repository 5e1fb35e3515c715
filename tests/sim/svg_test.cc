#include "atoll/sim/svg.h"

#include <gtest/gtest.h>

#include "atoll/sim/bandwidth.h"
#include "atoll/sim/goodput.h"

namespace atl::sim {
namespace {

size_t Count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(SimSvg, Ticks) {
  EXPECT_EQ(LinearTicks(0, 1, 5), (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1.0}));
  EXPECT_EQ(LinearTicks(0, 100, 4), (std::vector<double>{0, 50, 100}));
  EXPECT_EQ(LogTicks(1, 100), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));  // < 2.5 decades
  EXPECT_EQ(LogTicks(0.9, 1100), (std::vector<double>{1, 10, 100, 1000}));
  EXPECT_EQ(LogTicks(1e3, 1e7), (std::vector<double>{1e3, 1e4, 1e5, 1e6, 1e7}));
  EXPECT_EQ(CompactNumber(1'200'000), "1.2M");
  EXPECT_EQ(CompactNumber(20'000), "20k");
  EXPECT_EQ(CompactNumber(0.84), "0.84");
}

TEST(SimSvg, PanelHasAxesTicksLegendAndEscapedText) {
  Panel p;
  p.title = "a < b & c";
  p.x_label = "chips";
  p.y_label = "goodput";
  p.log_x = true;
  p.y_percent = true;
  p.y_min = 0;
  p.y_max = 1;
  p.series.push_back({"one", {1e3, 1e4, 1e5}, {0.9, 0.8, 0.7}, {0.01, 0.01, 0.01}});
  p.series.push_back({"two", {1e3, 1e4, 1e5}, {0.5, 0.4, 0.3}, {}});
  const std::string svg = RenderSvg("title", {p});
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("a &lt; b &amp; c"), std::string::npos);
  EXPECT_EQ(svg.find("a < b"), std::string::npos);
  EXPECT_EQ(Count(svg, "<polyline"), 2u);
  EXPECT_EQ(Count(svg, "<circle"), 6u);
  EXPECT_EQ(Count(svg, "class=\"err\""), 3u);
  EXPECT_EQ(Count(svg, "class=\"legend\""), 2u);
  EXPECT_NE(svg.find(">100%<"), std::string::npos);
  EXPECT_NE(svg.find(">10k<"), std::string::npos);
  EXPECT_EQ(RenderSvg("title", {p}), svg);  // deterministic
}

TEST(SimSvg, GoodputAndBandwidthPlots) {
  GoodputParams p;
  p.chips = 100'000;
  p.days = 0.5;
  p.seeds = 2;
  auto g = GoodputSweepSvg(p);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(Count(*g, "<polyline"), 8u);  // 4 modes × (goodput, uptime)
  EXPECT_NE(g->find("decoupled-diloco (M=8)"), std::string::npos);
  const std::string b = BandwidthSweepSvg(BandwidthParams());
  EXPECT_EQ(Count(b, "<polyline"), 4u);
  EXPECT_NE(b.find(">64<"), std::string::npos);
}

}  // namespace
}  // namespace atl::sim
