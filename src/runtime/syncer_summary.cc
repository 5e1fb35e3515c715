#include "syncer_summary.h"

#include "atoll/core/checksum.h"
#include "atoll/exchange/fragment_exchange.h"

namespace atl::runtime {

std::vector<std::vector<float>> ThetaOf(const syncer::SyncerCore& core) {
  std::vector<std::vector<float>> t;
  for (int p = 0; p < core.plan().num_fragments(); ++p) {
    auto v = core.theta(p);
    t.emplace_back(v.begin(), v.end());
  }
  return t;
}

nlohmann::json SyncerSummary::Of(const syncer::SyncerCore& core, TimePoint now) const {
  nlohmann::json summary = core.StatusJson(now);
  AddEvaluation(summary);
  summary["params"] = plan_.total_numel;
  summary["model"] = model_.Describe();
  summary["plan_peak_to_ideal"] = plan_.peak_to_ideal;
  uint64_t theta_sum = 0;
  for (int p = 0; p < core.plan().num_fragments(); ++p) {
    if (core.owns(p)) theta_sum ^= exchange::ValuesChecksum(core.theta(p));
  }
  summary["theta_checksum"] = ChecksumHex(theta_sum);
  if (replication_) summary["replication"] = replication_();
  return summary;
}

void SyncerSummary::AddEvaluation(nlohmann::json& doc) const {
  if (start_eval_loss_) doc["eval_loss_start"] = *start_eval_loss_;
  if (!model_.no_evaluation().empty()) doc["evaluation"] = "off: " + model_.no_evaluation();
  doc["global_eval_curve"] = log_.Curve();
}

}  // namespace atl::runtime
