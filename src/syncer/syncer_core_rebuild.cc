// A SyncerCore rebuilt from the learners' public copies after its durable state was lost
// (docs/decisions/021).
#include <chrono>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "atoll/exchange/fragment_exchange.h"
#include "atoll/syncer/syncer_core.h"

namespace atl::syncer {

void SyncerCore::BeginRebuild(TimePoint until, int expected_learners) {
  rebuild_until_ = until;
  rebuild_expected_ = expected_learners;
}

void SyncerCore::EndRebuildWhenAllOffered(TimePoint now) {
  if (!rebuilding(now) || rebuild_expected_ <= 0) return;
  int declared = 0;
  for (const auto& [id, l] : learners_) {
    if (l.declared_versions.size() != fragments_.size()) continue;  // declared nothing
    ++declared;
    for (size_t p = 0; p < fragments_.size(); ++p) {
      if (owns(static_cast<int>(p)) && l.declared_versions[p] > fragments_[p].version) return;  // still wanted
    }
  }
  if (declared >= rebuild_expected_) rebuild_until_ = now;
}

std::vector<int> SyncerCore::WantedCopies(const JoinRequestData& r, LearnerRecord& l) const {
  const auto P = static_cast<size_t>(plan_.num_fragments());
  l.declared_checksums.clear();
  l.declared_versions.clear();
  std::vector<int> wanted;
  if (r.fragment_checksums.size() != P || r.fragment_versions.size() != P) return wanted;  // nothing declared
  l.declared_checksums = r.fragment_checksums;
  l.declared_versions = r.fragment_versions;
  for (size_t p = 0; p < P; ++p) {
    if (owns(static_cast<int>(p)) && r.fragment_versions[p] > fragments_[p].version) {
      wanted.push_back(static_cast<int>(p));
    }
  }
  return wanted;
}

Status SyncerCore::RebuildingError(TimePoint now) const {
  const double left = std::chrono::duration<double>(*rebuild_until_ - now).count();
  return UnavailableError(
      fmt::format("the syncer is rebuilding from the learners' copies: rounds start in {:.1f} s (join again)", left));
}

Status SyncerCore::CheckOffer(const LearnerRecord& l, const PushHeaderData& h, size_t payload_bytes,
                              TimePoint now) const {
  const std::string what = fmt::format("offered copy of fragment {} from learner {}", h.fragment, l.id);
  if (!rebuilding(now)) {
    return FailedPreconditionError(what +
                                   ": this syncer is not rebuilding (it adopts copies only while started "
                                   "with --rebuild, within its --rebuild-wait)");
  }
  ATOLL_RETURN_IF_ERROR(CheckPushSession(l, h));
  if (h.fragment < 0 || h.fragment >= plan_.num_fragments()) return InvalidArgumentError(what + ": no such fragment");
  ATOLL_RETURN_IF_ERROR(CheckOwned(h.fragment, "offered copy"));
  const FragmentState& f = fragments_[static_cast<size_t>(h.fragment)];
  const auto p = static_cast<size_t>(h.fragment);
  if (l.declared_versions.size() <= p || l.declared_versions[p] != h.base_version) {
    return InvalidArgumentError(fmt::format("{}: version {} is not the one its join declared ({})", what,
                                            h.base_version,
                                            l.declared_versions.size() > p ? l.declared_versions[p] : -1));
  }
  if (h.base_version <= f.version) {
    return AlreadyExistsError(
        fmt::format("{}: version {} is not newer than the version {} held", what, h.base_version, f.version));
  }
  const size_t n = f.theta.size();
  if (h.encoding != diloco::Encoding::kFp32 || h.compression != diloco::Compression::kNone ||
      h.num_values != static_cast<int64_t>(n) || payload_bytes != n * sizeof(float)) {
    return InvalidArgumentError(
        fmt::format("{}: {} values in {} bytes ({}, {}), the fragment has {} fp32 values, "
                    "uncompressed",
                    what, h.num_values, payload_bytes, diloco::kEncodingNames.Name(h.encoding),
                    diloco::kCompressionNames.Name(h.compression), n));
  }
  return Status::Ok();
}

StatusOr<RoundReport> SyncerCore::AdoptCopy(const PushHeaderData& h, std::span<const float> values, TimePoint now) {
  auto it = learners_.find(h.learner_id);
  if (it == learners_.end()) {
    return NotFoundError(fmt::format("copy offered by learner {} which has not joined (join first)", h.learner_id));
  }
  LearnerRecord& l = it->second;
  ATOLL_RETURN_IF_ERROR(CheckOffer(l, h, values.size() * sizeof(float), now));
  l.push_seq = h.push_seq;
  const auto p = static_cast<size_t>(h.fragment);
  const std::string what = fmt::format("offered copy of fragment {} from learner {}", h.fragment, l.id);
  if (!exchange::AllFinite(values)) return InvalidArgumentError(what + ": values are not finite");
  if (exchange::ValuesChecksum(values, pool_.get()) != l.declared_checksums[p]) {
    return InvalidArgumentError(what + ": its value checksum is not the one its join declared");
  }
  FragmentState& f = fragments_[p];
  FragmentSnapshot snap;
  snap.version = h.base_version;
  snap.theta.assign(values.begin(), values.end());
  snap.public_values = snap.theta;
  snap.lattice_exp = f.copy->lattice().exp;  // the run's lattice, set from Θ⁰: the learner's too
  const int64_t before = f.version;
  if (Status st = RestoreFragment(h.fragment, std::move(snap)); !st.ok()) {
    return InvalidArgumentError(what + ": " + st.message());
  }
  adopted_.push_back({h.fragment, h.base_version, l.id});
  EndRebuildWhenAllOffered(now);
  RoundReport report;
  report.fragment = h.fragment;
  report.round = before;
  report.version = h.base_version;
  report.contributors = {l.id};
  report.reason = "adopted";
  report.closed_at = now;
  return report;
}

nlohmann::json SyncerCore::RebuildJson(TimePoint now) const {
  nlohmann::json j;
  j["rebuilding"] = rebuilding(now);
  j["seconds_left"] = rebuilding(now) ? std::chrono::duration<double>(*rebuild_until_ - now).count() : 0.0;
  nlohmann::json adopted = nlohmann::json::array();
  for (const AdoptedCopy& a : adopted_) {
    adopted.push_back({{"fragment", a.fragment}, {"version", a.version}, {"learner", a.learner}});
  }
  j["adopted"] = adopted;
  // What a lost state cannot give back: the outer momentum and sweep (zero from the adoption on),
  // the deltas' history, and the learner table's accounting (counted again from the rebuild).
  j["momentum_reset"] = true;
  j["learner_table_reset"] = true;
  return j;
}

}  // namespace atl::syncer
