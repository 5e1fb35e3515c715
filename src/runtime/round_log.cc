#include "round_log.h"

#include <cstdio>

#include "atoll/core/checksum.h"
#include "atoll/core/file.h"
#include "atoll/exchange/fragment_exchange.h"
#include "round_json.h"

namespace atl::runtime {
namespace {

std::string Ids(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return "[" + s + "]";
}

}  // namespace

RoundLog::RoundLog(const std::string& metrics_path) { metrics_.Open(metrics_path); }

void RoundLog::Round(const syncer::SyncerCore& core, const syncer::RoundReport& r) {
  nlohmann::json line = RoundFields(r);
  if (r.refused) {  // numeric safety: nothing changed, nothing committed (syncer/guards.h)
    std::fprintf(stderr, "syncer: round f%d#%lld REFUSED (contributors %s): %s\n", r.fragment,
                 static_cast<long long>(r.round), Ids(r.contributors).c_str(), r.refusal.c_str());
    line.update({{"t", UnixSeconds()}, {"source", "syncer"}, {"rounds_refused", core.rounds_refused()}});
    metrics_.Write(line);
    return;
  }
  line.update({{"t", UnixSeconds()},
               {"source", "syncer"},
               {"theta_checksum", ChecksumHex(exchange::ValuesChecksum(core.theta(r.fragment)))}});
  metrics_.Write(line);
  std::printf("round f%d#%lld -> v%lld from %s (late %s, grace %.2fs, share %.2f): %s\n", r.fragment,
              static_cast<long long>(r.round), static_cast<long long>(r.version), Ids(r.contributors).c_str(),
              Ids(r.late).c_str(), r.grace_seconds, r.token_share, r.reason.c_str());
  std::fflush(stdout);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.Observe(static_cast<int>(r.contributors.size()), r.grace_seconds);
}

void RoundLog::Evaluation(const GlobalEvalPoint& e) {
  metrics_.Write({{"t", e.t},
                  {"source", "syncer"},
                  {"kind", "global_eval"},
                  {"rounds", e.rounds},
                  {"tokens_merged", e.tokens_merged},
                  {"eval_loss", e.loss}});
  std::lock_guard<std::mutex> lock(mu_);
  curve_.push_back({{"t", e.t}, {"rounds", e.rounds}, {"tokens_merged", e.tokens_merged}, {"eval_loss", e.loss}});
}

nlohmann::json RoundLog::Curve() const {
  std::lock_guard<std::mutex> lock(mu_);
  return curve_;
}

std::string RoundLog::Prometheus(const nlohmann::json& status) const {
  std::lock_guard<std::mutex> lock(mu_);
  return observe::RenderPrometheus(status, stats_);
}

}  // namespace atl::runtime
