// A small SVG line-chart writer: panels with axes, ticks, labels, a legend and optional error
// bars, laid out side by side. Written by atoll, no dependencies; output is deterministic text.
// Thread-safety: values; no shared state.
#pragma once

#include <string>
#include <vector>

namespace atl::sim {

struct Series {
  std::string name;
  std::vector<double> x, y;
  std::vector<double> y_err;  // empty, or one half-width per point (drawn as error bars)
};

// A vertical dashed line at x across the plot, labelled at its top (e.g. an injected fault).
struct Marker {
  double x = 0;
  std::string label;
};

struct Panel {
  std::string title;
  std::string x_label, y_label;
  bool log_x = false, log_y = false;
  bool y_percent = false;  // tick labels as percentages of 1.0
  // Fixed y range when y_min < y_max; otherwise fitted to the data.
  double y_min = 0, y_max = 0;
  std::vector<double> x_ticks;  // explicit x ticks; empty: automatic
  std::vector<Series> series;
  std::vector<Marker> markers;  // outside the x range of the data: not drawn
};

// Renders panels left to right in one SVG document (each panel 560×450 px, taller when a panel
// has more than three series, so every legend row fits).
std::string RenderSvg(const std::string& title, const std::vector<Panel>& panels);

// Tick positions for [lo, hi]: "nice" 1/2/5×10^k steps (linear) or decades (log, lo > 0).
std::vector<double> LinearTicks(double lo, double hi, int target_count);
std::vector<double> LogTicks(double lo, double hi);
// Text for XML and HTML: & < > " escaped.
std::string EscapeXml(const std::string& s);
// Compact number for tick labels: 1200000 → "1.2M", 0.84 → "0.84", 20000 → "20k".
std::string CompactNumber(double v);

}  // namespace atl::sim
