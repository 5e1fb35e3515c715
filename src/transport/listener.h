// The gRPC port's listening socket and accept loop, owned by atoll instead of gRPC (private to
// src/transport). Accepted connections are handed to the server through ServerBuilder's external
// connection acceptor, so they get the same credentials (TLS, mutual TLS), handshake timeout,
// idle timeout and keepalive as connections gRPC accepts itself; what changes (docs/security.md):
//  - at most `max_connections` are open at once: a connection beyond them is closed at accept,
//    so connections can never take the file descriptors a commit needs. gRPC 1.51 has no such
//    limit: ~20,000 preface-only connections exhausted the syncer's descriptors and its next
//    commit aborted (issue 32);
//  - running out of descriptors pauses accepting for 100 ms instead of ending it: gRPC 1.51's own
//    accept loop stops for good at its first EMFILE.
// Which connections are still open is not reported by gRPC: the listener keeps each handed-over
// descriptor's (device, inode) and counts it closed once fstat no longer finds that socket there.
// Thread-safety: Start and Stop from one thread; the counters from any.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/server_builder.h>

#include "atoll/core/status.h"

namespace atl::transport {

class GrpcListener {
 public:
  // Binds and listens on `address` (host:port, [v6]:port; port 0 chooses a free port).
  // InvalidArgument for a malformed address, Unavailable when it cannot be bound. With `listen`
  // false the port is only bound (a standby's, docs/decisions/022): a connection to it is refused,
  // as to a port nobody listens on, until Listen.
  static StatusOr<std::unique_ptr<GrpcListener>> Bind(const std::string& address, int max_connections,
                                                      bool listen = true);
  // Starts listening on a port bound without (idempotent).
  Status Listen();
  ~GrpcListener();
  GrpcListener(const GrpcListener&) = delete;
  GrpcListener& operator=(const GrpcListener&) = delete;

  int port() const { return port_; }
  // Starts the accept thread, handing connections to `acceptor` (call after the server started).
  void Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor);
  // Stops accepting and closes the listening socket; connections already handed over stay
  // gRPC's (its Shutdown ends them). Idempotent.
  void Stop();
  // Connections closed at accept because `max_connections` were open.
  int64_t refused() const { return refused_.load(); }
  // Connections handed to gRPC and still open, as of the last count.
  int open() const { return open_.load(); }

 private:
  GrpcListener(int fd, int port, int max_connections);
  void AcceptLoop();
  // Drops the connections gRPC has closed since the last count; returns how many remain.
  int CountOpen();

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  int max_connections_ = 0;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  bool listening_ = false;
  std::thread thread_;
  struct Handed {
    int fd;
    uint64_t dev, ino;
  };
  std::vector<Handed> handed_;  // accept thread only
  std::atomic<int64_t> refused_{0};
  std::atomic<int> open_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace atl::transport
