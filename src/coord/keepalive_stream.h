// KeepAliveStream: one open LeaseKeepAlive stream to etcd, driven through a completion queue so
// that every request/reply round trip has its own deadline although the stream outlives it.
// Private to src/coord. Thread-safety: one caller at a time (EtcdClient holds a mutex).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>

#include "etcd_v3.grpc.pb.h"

namespace atl::coord {

class KeepAliveStream {
 public:
  explicit KeepAliveStream(etcdserverpb::Lease::Stub* stub);
  ~KeepAliveStream();  // cancels the stream and waits for gRPC to release it
  KeepAliveStream(const KeepAliveStream&) = delete;
  KeepAliveStream& operator=(const KeepAliveStream&) = delete;

  // Sends one keep-alive for `lease` and reads its reply, all before `deadline`. On an error the
  // stream is broken (broken() is true) and must be replaced.
  grpc::Status RoundTrip(int64_t lease, std::chrono::system_clock::time_point deadline,
                         etcdserverpb::LeaseKeepAliveResponse* reply);
  bool broken() const { return broken_; }

 private:
  enum class Outcome { kOk, kFailed, kTimeout };
  Outcome Await(std::chrono::system_clock::time_point deadline);
  grpc::Status Fail(const char* step, Outcome outcome, std::chrono::system_clock::time_point deadline);

  grpc::ClientContext ctx_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<
      grpc::ClientAsyncReaderWriter<etcdserverpb::LeaseKeepAliveRequest, etcdserverpb::LeaseKeepAliveResponse>>
      rw_;
  // The buffers of the operations: members, since a timed-out operation completes later.
  etcdserverpb::LeaseKeepAliveRequest request_;
  etcdserverpb::LeaseKeepAliveResponse reply_;
  grpc::Status finish_status_;
  bool started_ = false;
  bool pending_ = false;  // an operation was issued and its completion not yet taken from cq_
  bool finish_issued_ = false;
  bool broken_ = false;
};

}  // namespace atl::coord
