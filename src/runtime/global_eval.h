// GlobalEvaluator: evaluates snapshots of the global model Θ during a run, on a thread of its
// own, so the syncer's loop (and the learners' rounds) never wait for it. The loop thread offers
// a snapshot every `eval_every` rounds; if the evaluator is still busy with the previous one the
// newer snapshot replaces any waiting one (the curve skips a point rather than falling behind).
// Each result goes to `on_result` on the evaluator thread.
// Thread-safety: Offer and Stop may be called from any thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "atoll/diloco/fragment_plan.h"
#include "atoll/model/trainer.h"

namespace atl::runtime {

struct GlobalEvalPoint {
  double t = 0;              // unix seconds when the snapshot was taken
  int64_t rounds = 0;        // rounds closed at the snapshot
  double tokens_merged = 0;  // tokens merged into Θ at the snapshot
  double loss = 0;           // eval loss of the snapshot
};

class GlobalEvaluator {
 public:
  // `trainer` is this evaluator's own model (not shared with any other thread); `batches` the
  // validation batches per evaluation.
  GlobalEvaluator(std::unique_ptr<model::Trainer> trainer, diloco::FragmentPlan plan, int batches,
                  std::function<void(const GlobalEvalPoint&)> on_result);
  ~GlobalEvaluator();
  GlobalEvaluator(const GlobalEvaluator&) = delete;
  GlobalEvaluator& operator=(const GlobalEvaluator&) = delete;

  // `theta` holds Θ per fragment (plan layout).
  void Offer(std::vector<std::vector<float>> theta, GlobalEvalPoint at);
  // Finishes the evaluation in progress (if any), drops a waiting one, joins the thread.
  void Stop();

 private:
  void Run();

  std::unique_ptr<model::Trainer> trainer_;
  diloco::FragmentPlan plan_;
  int batches_;
  std::function<void(const GlobalEvalPoint&)> on_result_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::pair<std::vector<std::vector<float>>, GlobalEvalPoint>> waiting_;  // guarded by mu_
  bool stop_ = false;                                                                   // guarded by mu_
  std::thread thread_;
};

}  // namespace atl::runtime
