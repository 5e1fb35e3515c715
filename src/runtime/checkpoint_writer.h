// CheckpointWriter: the syncer's writes of the global model (global.safetensors) and of its
// summary (syncer-summary.json) — periodic ones while the run goes on, and the final one.
//
// One write at a time, the final one last: a periodic write runs on a thread of its own with a
// copy of Θ the loop thread made (so rounds never wait for the disk; it costs one copy of Θ while
// it runs), and is skipped while the previous one is still being written; the final write waits
// for a periodic one in progress first. A shard writes only its summary (its Θ is not the model).
// Private to src/runtime. Thread-safety: Offer on the loop thread; Final on any thread, once.
#pragma once

#include <functional>
#include <future>
#include <span>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/diloco/fragment_plan.h"
#include "model_host.h"

namespace atl::runtime {

class CheckpointWriter {
 public:
  CheckpointWriter(const ModelHost& model, diloco::FragmentPlan plan, std::string out_dir, std::string run_id,
                   bool write_model);
  ~CheckpointWriter();

  // Loop thread: a periodic write of `theta` (per fragment) and `summary` (its "final" false),
  // unless the previous one is still being written.
  void Offer(std::vector<std::vector<float>> theta, nlohmann::json summary);
  // The final write, of Θ as `theta(p)` gives it fragment by fragment (no copy: called on the
  // loop thread with the core's own values); sets summary["checkpoint"] (the model's path, or why
  // it is missing).
  using Fragments = std::function<std::span<const float>(int)>;
  void Final(const Fragments& theta, nlohmann::json& summary);

 private:
  void Write(const Fragments& theta, nlohmann::json& summary);

  const ModelHost& model_;
  const diloco::FragmentPlan plan_;
  const std::string out_dir_, run_id_;
  const bool write_model_;
  std::mutex write_mu_;        // one write at a time
  std::future<void> pending_;  // the periodic write in progress (loop thread, and Final)
  std::mutex pending_mu_;
};

}  // namespace atl::runtime
