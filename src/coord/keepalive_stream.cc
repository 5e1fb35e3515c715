#include "keepalive_stream.h"

#include <string>

namespace atl::coord {

namespace {
// Tags of the stream's operations: at most one is outstanding at a time.
void* const kTag = reinterpret_cast<void*>(1);
}  // namespace

KeepAliveStream::KeepAliveStream(etcdserverpb::Lease::Stub* stub)
    : rw_(stub->PrepareAsyncLeaseKeepAlive(&ctx_, &cq_)) {}

KeepAliveStream::~KeepAliveStream() {
  void* tag = nullptr;
  bool ok = false;
  if (started_) {
    ctx_.TryCancel();
    if (pending_) cq_.Next(&tag, &ok);  // a cancelled operation completes at once
    if (!finish_issued_) {
      rw_->Finish(&finish_status_, kTag);
      cq_.Next(&tag, &ok);
    }
  }
  rw_.reset();
  cq_.Shutdown();
  while (cq_.Next(&tag, &ok)) {
  }
}

KeepAliveStream::Outcome KeepAliveStream::Await(std::chrono::system_clock::time_point deadline) {
  void* tag = nullptr;
  bool ok = false;
  switch (cq_.AsyncNext(&tag, &ok, deadline)) {
    case grpc::CompletionQueue::TIMEOUT: return Outcome::kTimeout;
    case grpc::CompletionQueue::SHUTDOWN: pending_ = false; return Outcome::kFailed;
    case grpc::CompletionQueue::GOT_EVENT: break;
  }
  pending_ = false;
  return ok ? Outcome::kOk : Outcome::kFailed;
}

grpc::Status KeepAliveStream::Fail(const char* step, Outcome outcome, std::chrono::system_clock::time_point deadline) {
  broken_ = true;
  if (outcome == Outcome::kTimeout) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, std::string("no keep-alive reply in time (") + step + ")");
  }
  // The stream ended: its status says why (bounded: the server already closed it).
  finish_issued_ = true;
  pending_ = true;
  rw_->Finish(&finish_status_, kTag);
  if (Await(deadline + std::chrono::seconds(1)) != Outcome::kTimeout && !finish_status_.ok()) return finish_status_;
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string("keep-alive stream closed (") + step + ")");
}

grpc::Status KeepAliveStream::RoundTrip(int64_t lease, std::chrono::system_clock::time_point deadline,
                                        etcdserverpb::LeaseKeepAliveResponse* reply) {
  if (broken_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "keep-alive stream broken");
  if (!started_) {
    started_ = true;
    pending_ = true;
    rw_->StartCall(kTag);
    if (auto o = Await(deadline); o != Outcome::kOk) return Fail("open", o, deadline);
  }
  request_.set_id(lease);
  pending_ = true;
  rw_->Write(request_, kTag);
  if (auto o = Await(deadline); o != Outcome::kOk) return Fail("write", o, deadline);
  pending_ = true;
  rw_->Read(&reply_, kTag);
  if (auto o = Await(deadline); o != Outcome::kOk) return Fail("read", o, deadline);
  *reply = reply_;
  return grpc::Status::OK;
}

}  // namespace atl::coord
