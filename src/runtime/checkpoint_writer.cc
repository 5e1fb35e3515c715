#include "checkpoint_writer.h"

#include <cstdio>

#include "atoll/core/file.h"
#include "atoll/core/text.h"

namespace atl::runtime {

CheckpointWriter::CheckpointWriter(const ModelHost& model, diloco::FragmentPlan plan, std::string out_dir,
                                   std::string run_id, bool write_model)
    : model_(model),
      plan_(std::move(plan)),
      out_dir_(std::move(out_dir)),
      run_id_(std::move(run_id)),
      write_model_(write_model) {}

CheckpointWriter::~CheckpointWriter() {
  std::lock_guard<std::mutex> lock(pending_mu_);
  if (pending_.valid()) pending_.wait();
}

void CheckpointWriter::Offer(std::vector<std::vector<float>> theta, nlohmann::json summary) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  if (pending_.valid() && pending_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
  summary["final"] = false;
  pending_ = std::async(std::launch::async, [this, theta = std::move(theta), summary = std::move(summary)]() mutable {
    Write([&theta](int p) { return std::span<const float>(theta[static_cast<size_t>(p)]); }, summary);
  });
}

void CheckpointWriter::Final(const Fragments& theta, nlohmann::json& summary) {
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (pending_.valid()) pending_.wait();  // a periodic write must not land after this one
  }
  Write(theta, summary);
}

void CheckpointWriter::Write(const Fragments& theta, nlohmann::json& summary) {
  std::lock_guard<std::mutex> lock(write_mu_);
  if (!write_model_) {  // a shard: its fragments of Θ only (`atoll export --state` combines the shards')
    summary["checkpoint"] = nullptr;
    (void)WriteFileAtomic(out_dir_ + "/syncer-summary.json", DumpJson(summary, 2));
    return;
  }
  const std::string path = out_dir_ + "/global.safetensors";
  Status st = model_.WriteModel(path, plan_, theta,
                                {{"run_id", run_id_}, {"rounds", std::to_string(summary.value("rounds", int64_t{0}))}});
  summary["checkpoint"] = st.ok() ? nlohmann::json(path) : nlohmann::json("error: " + st.ToString());
  if (!st.ok()) std::fprintf(stderr, "syncer: warning: cannot write the global model: %s\n", st.ToString().c_str());
  (void)WriteFileAtomic(out_dir_ + "/syncer-summary.json", DumpJson(summary, 2));
}

}  // namespace atl::runtime
