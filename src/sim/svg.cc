#include "atoll/sim/svg.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <fmt/format.h>

namespace atl::sim {

namespace {

constexpr double kPanelW = 560, kPanelH = 450, kTitleH = 34;
constexpr double kLeft = 72, kRight = 24, kTop = 40, kPlotH = 280;
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                   "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

// The stylesheet and white background every figure starts with.
constexpr char kStyle[] =
    "<style>.grid{stroke:#e5e5e5;stroke-width:1}.axis{stroke:#333;stroke-width:1}"
    ".frame{fill:none;stroke:#333;stroke-width:1}.line{fill:none;stroke-width:2}"
    ".err{stroke-width:1}.tick{font-size:11px;fill:#333}.label{font-size:13px;fill:#111}"
    ".legend{font-size:12px;fill:#111}.ptitle{font-size:14px;font-weight:bold;fill:#111}"
    ".title{font-size:13px;fill:#444}</style>\n"
    "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";

struct Axis {
  bool log = false;
  double lo = 0, hi = 1;  // data range shown
  double p0 = 0, p1 = 1;  // pixel range
  double Map(double v) const {
    const double a = log ? std::log10(lo) : lo, b = log ? std::log10(hi) : hi;
    const double x = log ? std::log10(v) : v;
    return p0 + (x - a) / (b - a) * (p1 - p0);
  }
};

// Range of the data, widened to whole ticks (decades on log axes).
void FitAxis(Axis& ax, double lo, double hi) {
  if (!(lo <= hi)) lo = 0, hi = 1;
  if (ax.log) {
    // A small margin rather than whole decades, so the data fills the panel.
    lo = std::max(lo, 1e-300);
    if (hi <= lo) hi = lo * 10;
    const double pad = std::pow(hi / lo, 0.04);
    ax.lo = lo / pad;
    ax.hi = hi * pad;
    return;
  }
  if (hi == lo) hi = lo + 1;
  const auto t = LinearTicks(lo, hi, 5);
  const double step = t.size() >= 2 ? t[1] - t[0] : (hi - lo);
  ax.lo = std::floor(lo / step) * step;
  ax.hi = std::ceil(hi / step) * step;
}

std::string TickLabel(double v, bool percent) {
  return percent ? fmt::format("{:g}%", std::round(v * 1000) / 10) : CompactNumber(v);
}

// The panel's x and y axes in pixels: x fitted to the data, y too unless the panel fixes it.
// Error bars count towards the y range.
std::pair<Axis, Axis> PanelAxes(const Panel& p, double ox, double oy) {
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  for (const auto& s : p.series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      const double e = i < s.y_err.size() ? s.y_err[i] : 0;
      xlo = std::min(xlo, s.x[i]);
      xhi = std::max(xhi, s.x[i]);
      ylo = std::min(ylo, s.y[i] - e);
      yhi = std::max(yhi, s.y[i] + e);
    }
  }
  Axis ax{p.log_x, 0, 1, ox + kLeft, ox + kPanelW - kRight};
  Axis ay{p.log_y, 0, 1, oy + kTop + kPlotH, oy + kTop};
  FitAxis(ax, xlo, xhi);
  if (p.y_min < p.y_max) {
    ay.lo = p.y_min;
    ay.hi = p.y_max;
  } else {
    FitAxis(ay, ylo, yhi);
  }
  return {ax, ay};
}

std::string SvgLine(double x1, double y1, double x2, double y2, const char* cls) {
  return fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" class=\"{}\"/>\n", x1, y1, x2, y2,
                     cls);
}

// Grid lines, tick marks and tick labels of both axes.
std::string RenderGrid(const Panel& p, const Axis& ax, const Axis& ay) {
  const auto xt = !p.x_ticks.empty() ? p.x_ticks : ax.log ? LogTicks(ax.lo, ax.hi) : LinearTicks(ax.lo, ax.hi, 6);
  const auto yt = ay.log ? LogTicks(ay.lo, ay.hi) : LinearTicks(ay.lo, ay.hi, 5);
  std::string o;
  for (double v : xt) {
    const double x = ax.Map(v);
    o += SvgLine(x, ay.p1, x, ay.p0, "grid");
    o += SvgLine(x, ay.p0, x, ay.p0 + 5, "axis");
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"middle\">{}</text>\n", x, ay.p0 + 18,
                     EscapeXml(TickLabel(v, false)));
  }
  for (double v : yt) {
    const double y = ay.Map(v);
    o += SvgLine(ax.p0, y, ax.p1, y, "grid");
    o += SvgLine(ax.p0 - 5, y, ax.p0, y, "axis");
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"end\">{}</text>\n", ax.p0 - 8, y + 4,
                     EscapeXml(TickLabel(v, p.y_percent)));
  }
  return o;
}

// The plot frame and the axis labels (the y label rotated along the axis).
std::string RenderFrame(const Panel& p, const Axis& ax, const Axis& ay, double ox) {
  std::string o = fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" class=\"frame\"/>\n",
                              ax.p0, ay.p1, ax.p1 - ax.p0, ay.p0 - ay.p1);
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"label\" text-anchor=\"middle\">{}</text>\n",
                   (ax.p0 + ax.p1) / 2, ay.p0 + 40, EscapeXml(p.x_label));
  o += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"label\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 {:.1f} {:.1f})\">{}</text>\n",
      ox + 18, (ay.p0 + ay.p1) / 2, ox + 18, (ay.p0 + ay.p1) / 2, EscapeXml(p.y_label));
  return o;
}

// Series k: error bars and markers, the polyline through them (points clamped to the y range),
// and its legend entry, the k-th row below the x label.
std::string RenderSeries(const Series& s, size_t k, const Axis& ax, const Axis& ay) {
  const char* color = kColors[k % std::size(kColors)];
  std::string o, pts;
  for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
    const double x = ax.Map(s.x[i]), y = ay.Map(std::clamp(s.y[i], ay.lo, ay.hi));
    pts += fmt::format("{:.1f},{:.1f} ", x, y);
    if (i < s.y_err.size() && s.y_err[i] > 0) {
      const double y0 = ay.Map(std::clamp(s.y[i] - s.y_err[i], ay.lo, ay.hi));
      const double y1 = ay.Map(std::clamp(s.y[i] + s.y_err[i], ay.lo, ay.hi));
      o += fmt::format(
          "<path d=\"M{:.1f} {:.1f}V{:.1f}M{:.1f} {:.1f}H{:.1f}M{:.1f} "
          "{:.1f}H{:.1f}\" stroke=\"{}\" class=\"err\"/>\n",
          x, y0, y1, x - 3, y0, x + 3, x - 3, y1, x + 3, color);
    }
    o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", x, y, color);
  }
  if (!pts.empty()) pts.pop_back();
  o += fmt::format("<polyline points=\"{}\" stroke=\"{}\" class=\"line\"/>\n", pts, color);
  const double ly = ay.p0 + 62 + 18 * static_cast<double>(k);
  o += fmt::format(
      "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
      "stroke-width=\"2.5\"/>\n",
      ax.p0, ly - 4, ax.p0 + 24, ly - 4, color);
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"legend\">{}</text>\n", ax.p0 + 32, ly, EscapeXml(s.name));
  return o;
}

// Markers: dashed vertical lines with their labels written upwards from the top of the plot.
std::string RenderMarkers(const Panel& p, const Axis& ax, const Axis& ay) {
  std::string o;
  for (const Marker& m : p.markers) {
    if (!(m.x >= ax.lo && m.x <= ax.hi)) continue;
    const double x = ax.Map(m.x);
    o += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#b00020\" "
        "stroke-dasharray=\"4 3\"/>\n",
        x, ay.p1, x, ay.p0);
    o += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\" fill=\"#b00020\" "
        "transform=\"rotate(-90 {:.1f} {:.1f})\" text-anchor=\"end\">{}</text>\n",
        x + 10, ay.p1 + 4, x + 10, ay.p1 + 4, EscapeXml(m.label));
  }
  return o;
}

std::string RenderPanel(const Panel& p, double ox, double oy) {
  const auto [ax, ay] = PanelAxes(p, ox, oy);
  std::string o = fmt::format("<g>\n<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"ptitle\">{}</text>\n", ox + kLeft,
                              oy + kTop - 14, EscapeXml(p.title));
  o += RenderGrid(p, ax, ay);
  o += RenderFrame(p, ax, ay, ox);
  o += RenderMarkers(p, ax, ay);
  for (size_t k = 0; k < p.series.size(); ++k) o += RenderSeries(p.series[k], k, ax, ay);
  o += "</g>\n";
  return o;
}

}  // namespace

std::string EscapeXml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<double> LinearTicks(double lo, double hi, int target_count) {
  std::vector<double> out;
  if (!(hi > lo) || target_count < 1) return out;
  const double raw = (hi - lo) / target_count;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  const auto first = static_cast<int64_t>(std::ceil(lo / step - 1e-9));
  const auto last = static_cast<int64_t>(std::floor(hi / step + 1e-9));
  for (int64_t k = first; k <= last; ++k) {
    // k·step, cleaned to 12 significant digits (0.2·3 is 0.6000000000000001 in binary).
    out.push_back(std::stod(fmt::format("{:.12g}", static_cast<double>(k) * step)));
  }
  return out;
}

std::vector<double> LogTicks(double lo, double hi) {
  std::vector<double> out;
  if (!(lo > 0) || !(hi > lo)) return out;
  // Decades; with less than 2.5 decades shown, also 2× and 5× so there are enough labels.
  const bool fine = std::log10(hi / lo) < 2.5;
  const int a = static_cast<int>(std::floor(std::log10(lo)));
  const int b = static_cast<int>(std::ceil(std::log10(hi)));
  for (int k = a; k <= b; ++k) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m != 1.0 && !fine) continue;
      const double v = m * std::pow(10, k);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push_back(v);
    }
  }
  return out;
}

std::string CompactNumber(double v) {
  const double a = std::abs(v);
  if (a >= 1e9) return fmt::format("{:g}G", std::round(v / 1e7) / 100);
  if (a >= 1e6) return fmt::format("{:g}M", std::round(v / 1e4) / 100);
  if (a >= 1e3) return fmt::format("{:g}k", std::round(v / 10) / 100);
  return fmt::format("{:g}", std::round(v * 1000) / 1000);
}

std::string RenderSvg(const std::string& title, const std::vector<Panel>& panels) {
  const double w = kPanelW * static_cast<double>(std::max<size_t>(1, panels.size()));
  size_t rows = 3;  // legend rows kPanelH leaves room for
  for (const Panel& p : panels) rows = std::max(rows, p.series.size());
  const double h = kPanelH + kTitleH + 18.0 * static_cast<double>(rows - 3);
  std::string o = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "viewBox=\"0 0 {:.0f} {:.0f}\" font-family=\"Helvetica, Arial, sans-serif\">\n",
      w, h, w, h);
  o += kStyle;
  o += fmt::format("<text x=\"12\" y=\"22\" class=\"title\">{}</text>\n", EscapeXml(title));
  for (size_t i = 0; i < panels.size(); ++i) {
    o += RenderPanel(panels[i], kPanelW * static_cast<double>(i), kTitleH);
  }
  o += "</svg>\n";
  return o;
}

}  // namespace atl::sim
