#include "global_eval.h"

#include "atoll/exchange/fragment_exchange.h"

namespace atl::runtime {

GlobalEvaluator::GlobalEvaluator(std::unique_ptr<model::Trainer> trainer, diloco::FragmentPlan plan, int batches,
                                 std::function<void(const GlobalEvalPoint&)> on_result)
    : trainer_(std::move(trainer)), plan_(std::move(plan)), batches_(batches), on_result_(std::move(on_result)) {
  thread_ = std::thread([this] { Run(); });
}

GlobalEvaluator::~GlobalEvaluator() { Stop(); }

void GlobalEvaluator::Offer(std::vector<std::vector<float>> theta, GlobalEvalPoint at) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    waiting_.emplace(std::move(theta), at);
  }
  cv_.notify_all();
}

void GlobalEvaluator::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    waiting_.reset();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GlobalEvaluator::Run() {
  const auto params = model::ParameterViews(*trainer_);
  for (;;) {
    std::pair<std::vector<std::vector<float>>, GlobalEvalPoint> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || waiting_.has_value(); });
      if (stop_) return;
      job = std::move(*waiting_);
      waiting_.reset();
    }
    exchange::ScatterAll(
        plan_, [&](int p) { return std::span<const float>(job.first[static_cast<size_t>(p)]); }, params);
    auto e = trainer_->Evaluate(batches_);
    if (!e.ok()) continue;  // a failed evaluation leaves a gap in the curve, nothing else
    job.second.loss = e->loss;
    on_result_(job.second);
  }
}

}  // namespace atl::runtime
