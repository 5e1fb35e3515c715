#include "atoll/observe/prometheus.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

namespace atl::observe {
namespace {

using nlohmann::json;

double Num(const json& j, const char* key, double fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

// Go's float syntax, which Prometheus parses: shortest round trip, NaN, +Inf, -Inf.
std::string Value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

// Label values escape backslash, double quote and newline (the exposition format's rule).
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// One metric family: HELP, TYPE, then samples added with Sample().
class Family {
 public:
  Family(std::string& out, const char* name, const char* type, const char* help) : out_(out), name_(name) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void Sample(double v, const std::string& labels = "") {
    out_ += name_;
    if (!labels.empty()) out_ += "{" + labels + "}";
    out_ += " " + Value(v) + "\n";
  }

 private:
  std::string& out_;
  std::string name_;
};

std::string Label(const char* key, const std::string& value) { return fmt::format("{}=\"{}\"", key, Escape(value)); }

void RenderHistogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.upper_bounds.size(); ++i) {
    cumulative += h.counts[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, Value(h.upper_bounds[i]), cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, h.count, name, Value(h.sum), name,
                     h.count);
}

// Per-learner series: one family per field of the learner table.
void RenderLearners(std::string& out, const json& status) {
  const json learners = status.value("learners", json::array());
  const json live = status.value("live", json::array());
  const std::set<int> live_ids(live.begin(), live.end());
  struct Field {
    const char* name;
    const char* type;
    const char* help;
    const char* key;
  };
  static constexpr Field kFields[] = {
      {"atoll_tokens_trained_total", "counter", "Tokens the learner trained on, as it last reported.", "tokens"},
      {"atoll_tokens_merged_total", "counter", "Tokens of the learner merged into the global model.", "tokens_merged"},
      {"atoll_learner_rounds_joined_total", "counter", "Rounds the learner contributed to.", "rounds_joined"},
      {"atoll_learner_step", "gauge", "The learner's inner step.", "step"},
      {"atoll_learner_loss", "gauge", "The learner's last training loss (nats per token).", "loss"},
      {"atoll_learner_tokens_per_second", "gauge", "The learner's training throughput.", "tokens_per_second"},
      {"atoll_learner_version_held", "gauge", "Newest fragment version the learner holds.", "version_held"},
      {"atoll_learner_last_seen_seconds", "gauge", "Seconds since the learner's last call.", "seconds_since_seen"},
      {"atoll_learner_wire_bytes_up_total", "counter", "Bytes the learner sent, as the syncer counted them.",
       "bytes_up"},
      {"atoll_learner_wire_bytes_down_total", "counter", "Bytes the learner received.", "bytes_down"},
  };
  {
    Family f(out, "atoll_learner_up", "gauge", "1 while the learner counts as live (heartbeat within the timeout).");
    for (const auto& l : learners) {
      const int id = l.value("id", -1);
      f.Sample(live_ids.count(id) ? 1 : 0, Label("learner", std::to_string(id)));
    }
  }
  for (const Field& field : kFields) {
    Family f(out, field.name, field.type, field.help);
    for (const auto& l : learners) {
      if (l.contains(field.key)) f.Sample(Num(l, field.key), Label("learner", std::to_string(l.value("id", -1))));
    }
  }
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : upper_bounds(std::move(bounds)), counts(upper_bounds.size() + 1) {}

void Histogram::Observe(double value) {
  const auto it = std::lower_bound(upper_bounds.begin(), upper_bounds.end(), value);  // first bound ≥ value
  ++counts[static_cast<size_t>(it - upper_bounds.begin())];
  sum += value;
  ++count;
}

void AddDerived(json& status) {
  double tokens = 0, merged = 0, steps = 0;
  for (const auto& l : status.value("learners", json::array())) {
    tokens += Num(l, "tokens");
    merged += Num(l, "tokens_merged");
    steps += Num(l, "step");
  }
  status["tokens_trained"] = tokens;
  status["tokens_merged"] = merged;
  status["goodput"] = tokens > 0 ? std::min(1.0, merged / tokens) : 0.0;
  status["dp_equivalent_bytes"] = steps * Num(status, "params") * 4.0;
}

void StatusHistory::Add(const json& status) {
  json learners = json::object();
  for (const auto& l : status.value("learners", json::array())) {
    learners[std::to_string(l.value("id", -1))] = {{"loss", Num(l, "loss")}, {"tokens", Num(l, "tokens")}};
  }
  json point = {{"t", Num(status, "uptime_s")},
                {"rounds", Num(status, "rounds")},
                {"wire_bytes", Num(status, "bytes_up") + Num(status, "bytes_down")},
                {"dp_equivalent_bytes", Num(status, "dp_equivalent_bytes")},
                {"learners", std::move(learners)}};
  std::lock_guard<std::mutex> lock(mu_);
  if (points_.size() >= max_points_) {
    std::vector<json> kept;
    for (size_t i = 0; i < points_.size(); i += 2) kept.push_back(std::move(points_[i]));
    points_ = std::move(kept);
  }
  points_.push_back(std::move(point));
}

json StatusHistory::ToJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {{"points", points_}};
}

size_t StatusHistory::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return points_.size();
}

std::string RenderPrometheus(const json& status, const RoundStats& rounds) {
  std::string out;
  Family(out, "atoll_info", "gauge", "The run this syncer serves (value always 1).")
      .Sample(1, Label("run_id", status.value("run_id", "")) + "," + Label("mode", status.value("mode", "")));
  if (status.contains("uptime_s")) {
    Family(out, "atoll_uptime_seconds", "gauge", "Seconds since this syncer process started.")
        .Sample(Num(status, "uptime_s"));
  }
  Family(out, "atoll_learners_live", "gauge", "Learners that count as live.")
      .Sample(static_cast<double>(status.value("live", json::array()).size()));
  RenderLearners(out, status);
  {
    Family f(out, "atoll_rounds_total", "counter", "Rounds committed per fragment (its version).");
    const json versions = status.value("versions", json::array());
    for (size_t p = 0; p < versions.size(); ++p)
      f.Sample(versions[p].get<double>(), Label("fragment", std::to_string(p)));
  }
  Family(out, "atoll_rounds_refused_total", "counter", "Rounds refused by the numeric safety checks.")
      .Sample(Num(status, "rounds_refused"));
  Family(
      out, "atoll_rounds_held", "gauge",
      "1 while rounds are held because a commit could not succeed (disk full, out of file descriptors); the status says why.")
      .Sample(status.contains("holding") ? 1 : 0);
  {
    Family f(out, "atoll_wire_bytes_total", "counter", "Bytes on the wire between learners and syncer, by direction.");
    f.Sample(Num(status, "bytes_up"), Label("direction", "up"));
    f.Sample(Num(status, "bytes_down"), Label("direction", "down"));
  }
  Family(out, "atoll_dp_equivalent_bytes_total", "counter",
         "Bytes synchronous data-parallel would have moved for the same learner steps (bf16 gradients up and down).")
      .Sample(Num(status, "dp_equivalent_bytes"));
  Family(out, "atoll_goodput_ratio", "gauge", "Tokens merged into the global model / tokens trained.")
      .Sample(Num(status, "goodput"));
  if (status.contains("global_eval_loss")) {
    Family(out, "atoll_global_eval_loss", "gauge",
           "Eval loss of the global model at its last evaluation (nats per token).")
        .Sample(Num(status, "global_eval_loss"));
  }
  RenderHistogram(out, "atoll_round_contributors", "Learners merged per committed round.", rounds.contributors);
  RenderHistogram(out, "atoll_grace_seconds", "Grace window of each committed round, seconds.", rounds.grace_seconds);
  return out;
}

}  // namespace atl::observe
