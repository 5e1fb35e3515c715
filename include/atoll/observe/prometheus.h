// The syncer's live numbers for people and for Prometheus (docs/observability.md): the derived
// run-level figures every view shows the same way (AddDerived), the round histograms, and the
// Prometheus text exposition (format 0.0.4) of a status document.
//
// The status document is SyncerCore::StatusJson (the gRPC Status RPC's JSON) plus what the
// syncer process adds (uptime_s, eval_loss_start, global_eval_curve). Pure functions of their
// arguments; torch-free and socket-free, so the sanitizer builds test them.
// Thread-safety: Histogram and RoundStats are values; guard a shared one with a mutex.
// StatusHistory locks itself.
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace atl::observe {

// A Prometheus histogram: cumulative-at-render buckets with upper bounds (le), sum and count.
struct Histogram {
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);

  std::vector<double> upper_bounds;  // ascending; +Inf is implicit
  std::vector<uint64_t> counts;      // per bucket (not cumulative), upper_bounds.size() + 1
  double sum = 0;
  uint64_t count = 0;
};

// What every closed (committed) round adds: how many learners it merged, how long its grace
// window was.
struct RoundStats {
  Histogram contributors{{1, 2, 3, 4, 6, 8, 12, 16, 32, 64}};
  Histogram grace_seconds{{0, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30}};
  void Observe(int contributors_count, double grace_s) {
    contributors.Observe(contributors_count);
    grace_seconds.Observe(grace_s);
  }
};

// Adds the run-level figures derived from the learner table, so the page, /metrics and the
// report agree: tokens_trained (Σ learner tokens), tokens_merged (Σ tokens merged into Θ),
// goodput (merged ÷ trained; 0 before any token), dp_equivalent_bytes (what synchronous
// data-parallel would have moved for the same learner steps: every step the whole gradient up
// and the average down, bf16 both ways: Σ steps × params × 4).
void AddDerived(nlohmann::json& status);

// A bounded history of status documents for the page's curves (so a page opened late still shows
// the run from its start): per sample the syncer's uptime, rounds, bytes on the wire, the
// data-parallel equivalent and each learner's loss and tokens. At most `max_points`; when full,
// every other sample is dropped (the resolution halves, the span stays). Thread-safe.
class StatusHistory {
 public:
  explicit StatusHistory(size_t max_points = 1024) : max_points_(std::max<size_t>(2, max_points)) {}
  // `status` after AddDerived, with uptime_s.
  void Add(const nlohmann::json& status);
  // {"points": [{"t", "rounds", "wire_bytes", "dp_equivalent_bytes", "learners": {"<id>": {"loss",
  // "tokens"}}}, ...]} in time order.
  nlohmann::json ToJson() const;
  size_t size() const;

 private:
  const size_t max_points_;
  mutable std::mutex mu_;
  std::vector<nlohmann::json> points_;  // guarded by mu_
};

// The text exposition of `status` (after AddDerived) and the round histograms. Metric names,
// types and units are listed in docs/observability.md. Label values are escaped; fields missing
// from `status` are left out rather than reported as 0.
std::string RenderPrometheus(const nlohmann::json& status, const RoundStats& rounds);

}  // namespace atl::observe
