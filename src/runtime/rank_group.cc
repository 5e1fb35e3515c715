#include "atoll/runtime/rank_group.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <ATen/ATen.h>

#include <chrono>

namespace atl::runtime {
namespace {

class GlooRankGroup final : public RankGroup {
 public:
  GlooRankGroup(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int rank, int ranks)
      : pg_(std::move(pg)), rank_(rank), ranks_(ranks) {}

  int rank() const override { return rank_; }
  int ranks() const override { return ranks_; }

  Status AllReduceMean(const std::vector<std::span<float>>& values) override {
    Pack(values);
    std::vector<at::Tensor> t = {flat_};
    ATOLL_RETURN_IF_ERROR(Wait([&] { return pg_->allreduce(t); }, "all-reduce"));
    flat_.div_(static_cast<double>(ranks_));
    Unpack(values);
    return Status::Ok();
  }

  Status Broadcast(const std::vector<std::span<float>>& values) override {
    Pack(values);
    std::vector<at::Tensor> t = {flat_};
    ATOLL_RETURN_IF_ERROR(Wait([&] { return pg_->broadcast(t); }, "broadcast"));
    Unpack(values);
    return Status::Ok();
  }

  Status BroadcastInts(std::span<int64_t> values) override {
    std::vector<at::Tensor> t = {at::from_blob(values.data(), {static_cast<int64_t>(values.size())}, at::kLong)};
    return Wait([&] { return pg_->broadcast(t); }, "broadcast");
  }

 private:
  // One flat buffer per collective (one message instead of one per tensor).
  void Pack(const std::vector<std::span<float>>& values) {
    int64_t n = 0;
    for (const auto& v : values) n += static_cast<int64_t>(v.size());
    if (!flat_.defined() || flat_.numel() != n) flat_ = at::empty({n}, at::kFloat);
    float* out = flat_.data_ptr<float>();
    for (const auto& v : values) out = std::copy(v.begin(), v.end(), out);
  }
  void Unpack(const std::vector<std::span<float>>& values) {
    const float* in = flat_.data_ptr<float>();
    for (const auto& v : values) {
      std::copy(in, in + v.size(), v.begin());
      in += v.size();
    }
  }
  template <typename F>
  Status Wait(F&& start, const char* what) {
    try {
      auto work = start();
      work->wait();
      return Status::Ok();
    } catch (const std::exception& e) {
      return UnavailableError(std::string("rank ") + std::to_string(rank_) + ": " + what +
                              " failed (a rank of this unit died?): " + e.what());
    }
  }

  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int rank_, ranks_;
  at::Tensor flat_;
};

}  // namespace

StatusOr<std::unique_ptr<RankGroup>> RankGroup::Create(const std::string& store_path, int rank, int ranks,
                                                       double timeout_s) {
  if (ranks < 2 || rank < 0 || rank >= ranks) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                                " (ranks ≥ 2, rank in [0, ranks))");
  }
  try {
    auto store = c10::make_intrusive<c10d::FileStore>(store_path, ranks);
    auto options =
        c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, ranks, options);
    return std::unique_ptr<RankGroup>(new GlooRankGroup(std::move(pg), rank, ranks));
  } catch (const std::exception& e) {
    return UnavailableError("rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                            ": process group rendezvous at " + store_path + " failed: " + e.what());
  }
}

}  // namespace atl::runtime
