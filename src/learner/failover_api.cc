#include "atoll/learner/failover_api.h"

#include <fmt/format.h>

namespace atl::learner {
namespace {

// The candidate is down, a standby, fenced (UNAVAILABLE) or stopped without closing its port (a
// paused process: the call runs out of time).
bool Unreached(const Status& st) {
  return st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kDeadlineExceeded;
}

}  // namespace

FailoverSyncerApi::FailoverSyncerApi(std::vector<syncer::SyncerApi*> candidates, std::vector<std::string> names)
    : candidates_(std::move(candidates)), names_(std::move(names)) {
  names_.resize(candidates_.size());
}

void FailoverSyncerApi::MoveOn(size_t from) {
  size_t expected = from;  // concurrent failures of the same candidate move on once
  current_.compare_exchange_strong(expected, (from + 1) % candidates_.size());
}

Status FailoverSyncerApi::CheckEpoch(uint64_t epoch, size_t from) {
  uint64_t seen = highest_epoch_.load();
  while (epoch > seen && !highest_epoch_.compare_exchange_weak(seen, epoch)) {
  }
  if (epoch >= seen) return Status::Ok();
  stale_replies_.fetch_add(1);
  MoveOn(from);
  return UnavailableError(fmt::format(
      "syncer candidate {} answered with leadership epoch {}, older than epoch {} already seen: a former leader's "
      "reply, refused",
      names_[from], epoch, seen));
}

template <typename T, typename Call, typename EpochOf>
StatusOr<T> FailoverSyncerApi::Route(Call&& call, EpochOf&& epoch_of) {
  const size_t at = current_.load();
  StatusOr<T> out = call(*candidates_[at]);
  if (!out.ok()) {
    if (Unreached(out.status()) && candidates_.size() > 1) MoveOn(at);
    return out;
  }
  ATOLL_RETURN_IF_ERROR(CheckEpoch(epoch_of(*out), at));
  return out;
}

StatusOr<syncer::JoinReplyData> FailoverSyncerApi::Join(const syncer::JoinRequestData& request) {
  return Route<syncer::JoinReplyData>([&](syncer::SyncerApi& c) { return c.Join(request); },
                                      [](const syncer::JoinReplyData& r) { return r.epoch; });
}

StatusOr<syncer::HeartbeatReplyData> FailoverSyncerApi::Heartbeat(int learner_id,
                                                                  const syncer::LearnerProgress& progress) {
  return Route<syncer::HeartbeatReplyData>([&](syncer::SyncerApi& c) { return c.Heartbeat(learner_id, progress); },
                                           [](const syncer::HeartbeatReplyData& r) { return r.epoch; });
}

Status FailoverSyncerApi::Leave(int learner_id) {
  const size_t at = current_.load();
  Status st = candidates_[at]->Leave(learner_id);
  if (Unreached(st) && candidates_.size() > 1) MoveOn(at);
  return st;
}

StatusOr<syncer::PushResult> FailoverSyncerApi::Push(const syncer::PushHeaderData& header,
                                                     std::span<const std::byte> payload) {
  return Route<syncer::PushResult>([&](syncer::SyncerApi& c) { return c.Push(header, payload); },
                                   [](const syncer::PushResult& r) { return r.epoch; });
}

StatusOr<syncer::PullPayload> FailoverSyncerApi::Pull(int learner_id, int fragment, int64_t have_version,
                                                      double wait_seconds, int64_t want_version) {
  return Route<syncer::PullPayload>(
      [&](syncer::SyncerApi& c) { return c.Pull(learner_id, fragment, have_version, wait_seconds, want_version); },
      [](const syncer::PullPayload& r) { return r.epoch; });
}

}  // namespace atl::learner
