#include "learner_report.h"

#include <algorithm>
#include <cstdio>

#include "atoll/core/file.h"
#include "atoll/core/platform.h"
#include "atoll/core/text.h"

namespace atl::runtime {

LearnerReport::LearnerReport(int id, std::string out_dir, int64_t start_step, int64_t steps)
    : id_(id), out_(std::move(out_dir)), start_step_(start_step), steps_(steps) {
  // Restart → first contribution, in stages: from the process's creation on.
  const double now = UnixSeconds();
  stage_mark_ = now - ProcessAgeSeconds().value_or(0.0);
  Mark("load");
}

void LearnerReport::Mark(const char* name, double at) {
  const double seconds = std::max(0.0, at - stage_mark_);
  startup_[name] = seconds;
  startup_["total"] = startup_.value("total", 0.0) + seconds;
  stage_mark_ += seconds;
}

void LearnerReport::OpenMetrics() { metrics_.Open(out_ + "/metrics-learner-" + std::to_string(id_) + ".jsonl"); }

learner::Progress LearnerReport::Step(const StepRecord& r) {
  const model::StepStats& s = r.stats;
  ema_step_ = ema_step_ == 0 ? r.step_s : 0.9 * ema_step_ + 0.1 * r.step_s;
  const double ema_tps = static_cast<double>(s.tokens) / ema_step_;
  last_loss_ = s.loss;
  metrics_.Write({{"t", UnixSeconds()},
                  {"source", "learner"},
                  {"learner", id_},
                  {"step", r.step},
                  {"tokens", r.tokens_total},
                  {"step_tokens", s.tokens},
                  {"step_s", r.step_s},
                  {"loss", s.loss},
                  {"lr", s.lr},
                  {"tokens_per_s", ema_tps},
                  {"applied", r.applied},
                  {"wire_bytes_up", r.wire_up},
                  {"wire_bytes_down", r.wire_down}});
  if (r.step == start_step_ + 1) Mark("first_step");
  if (!contributed_ && r.contributed) {
    contributed_ = true;                   // for the rejoin latency: restart → first accepted contribution
    Mark("first_push", r.contributed_at);  // until the syncer accepted a push (the step it is scheduled at)
    metrics_.Write({{"t", r.contributed_at},
                    {"source", "learner"},
                    {"learner", id_},
                    {"kind", "contributed"},
                    {"step", r.step},
                    {"after_start_s", r.first_contribution_s},
                    {"startup_s", startup_}});
  }
  if (r.step % 25 == 0 || r.step == steps_) {
    std::printf("learner %d: step %lld/%lld loss %.4f %.0f tok/s\n", id_, static_cast<long long>(r.step),
                static_cast<long long>(steps_), s.loss, ema_tps);
    std::fflush(stdout);
  }
  learner::Progress p;
  p.step = r.step;
  p.tokens = r.tokens_total;
  p.loss = s.loss;
  p.step_seconds = ema_step_;
  p.tokens_per_second = ema_tps;
  return p;
}

void LearnerReport::WriteSummary(nlohmann::json summary) const {
  summary["startup_s"] = startup_;
  (void)WriteFileAtomic(out_ + "/learner-" + std::to_string(id_) + ".json", DumpJson(summary, 2));
}

}  // namespace atl::runtime
