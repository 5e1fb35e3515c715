#include "model_host.h"

#include <algorithm>
#include <fmt/format.h>

#include "atoll/core/format.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/model/data.h"
#include "atoll/runtime/run_options.h"

namespace atl::runtime {

StatusOr<std::unique_ptr<ModelHost>> ModelHost::Open(const RunConfig& c, bool evaluate) {
  std::unique_ptr<ModelHost> host(new ModelHost());
  host->c_ = c;
  if (!c.spec.empty()) {
    ATOLL_ASSIGN_OR_RETURN(model::ModelSpec spec, model::OpenModelSpec(c.spec, c.embeddings));
    ATOLL_RETURN_IF_ERROR(model::VerifyModelSpec(spec));
    host->tensors_ = spec.tensors;
    host->spec_ = std::move(spec);
    if (host->spec_->preset().empty()) {
      host->no_evaluation_ = "the model spec is not an atoll preset (atoll evaluates its own GPT only)";
      return host;
    }
    if (host->spec_->preset() != c.preset) {
      return FailedPreconditionError(fmt::format("model spec {} was written for preset {}, the run file says preset {}",
                                                 c.spec, host->spec_->preset(), c.preset));
    }
  }
  if (!evaluate && host->spec_) {
    host->no_evaluation_ = "evaluation is off for this syncer";
    return host;
  }
  // The preset's Trainer: Θ⁰ (from the seed, or the spec's weights) and the evaluator. It needs
  // the data folder's vocabulary; an evaluator needs its validation data too (prepared if missing).
  if (evaluate) {
    auto manifest = model::EnsureDataPrepared(c.data, [](const std::string& m) { std::printf("%s\n", m.c_str()); });
    if (!manifest.ok()) return manifest.status();
  }
  ATOLL_ASSIGN_OR_RETURN(auto topts, MakeTrainerOptions(c, 0));
  ATOLL_ASSIGN_OR_RETURN(host->evaluator_, model::Trainer::Create(topts));  // loads the spec's weights
  if (!host->spec_) host->tensors_ = host->evaluator_->tensors();
  if (!evaluate) host->no_evaluation_ = "evaluation is off for this syncer";
  return host;
}

int64_t ModelHost::num_params() const {
  int64_t n = 0;
  for (const auto& t : tensors_) n += t.numel;
  return n;
}

std::string ModelHost::Describe() const {
  if (spec_) {
    return fmt::format("spec {} ({}, {} params)", spec_->path,
                       spec_->preset().empty() ? "not an atoll preset" : "preset " + spec_->preset(),
                       Grouped(num_params()));
  }
  return fmt::format("preset {} ({} params)", c_.preset, Grouped(num_params()));
}

Status ModelHost::Initial(const diloco::Fragment& fragment, std::span<float> out) const {
  if (evaluator_ == nullptr) return model::ReadSpecFragment(*spec_, fragment, out);
  exchange::GatherFragment(fragment, model::ParameterViews(*evaluator_), out);
  return Status::Ok();
}

StatusOr<std::unique_ptr<model::Trainer>> ModelHost::NewTrainer() const {
  if (evaluator_ == nullptr) return FailedPreconditionError(no_evaluation_);
  ATOLL_ASSIGN_OR_RETURN(auto topts, MakeTrainerOptions(c_, 0));
  return model::Trainer::Create(topts);
}

Status ModelHost::WriteModel(const std::string& path, const diloco::FragmentPlan& plan,
                             const std::function<std::span<const float>(int)>& theta,
                             const nlohmann::json& metadata) const {
  // Where each tensor's elements are: (offset in the tensor, count, fragment, position in it).
  struct Piece {
    int64_t offset, count;
    int fragment;
    int64_t pos;
  };
  std::vector<std::vector<Piece>> pieces(tensors_.size());
  for (const auto& f : plan.fragments) {
    int64_t pos = 0;
    for (const auto& s : f.slices) {
      pieces[static_cast<size_t>(s.tensor)].push_back({s.offset, s.count, f.index, pos});
      pos += s.count;
    }
  }
  for (auto& list : pieces) {
    std::sort(list.begin(), list.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
  }
  // The spec's own metadata (a model's configuration, say) goes with it, so the global model loads
  // back the way the spec does; atoll's keys are atoll's, and `metadata` wins.
  nlohmann::json meta = nlohmann::json::object();
  if (spec_ && spec_->metadata.is_object()) {
    for (const auto& [key, value] : spec_->metadata.items()) {
      if (key.rfind("atoll.", 0) != 0) meta[key] = value;
    }
  }
  if (metadata.is_object()) {
    for (const auto& [key, value] : metadata.items()) meta[key] = value;
  }
  return model::WriteModelSpec(path, tensors_, meta, [&](size_t t, int64_t begin, std::span<float> out) {
    const int64_t end = begin + static_cast<int64_t>(out.size());
    for (const Piece& piece : pieces[t]) {
      const int64_t lo = std::max(begin, piece.offset), hi = std::min(end, piece.offset + piece.count);
      if (lo >= hi) continue;
      const std::span<const float> values = theta(piece.fragment);
      std::copy(values.begin() + piece.pos + (lo - piece.offset), values.begin() + piece.pos + (hi - piece.offset),
                out.begin() + (lo - begin));
    }
  });
}

}  // namespace atl::runtime
