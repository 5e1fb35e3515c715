// SyncerStatusPage: the syncer's HTTP status endpoint (`atoll syncer --http`, docs/observability.md):
// the status page, /api/status, /metrics and /healthz, with the same credentials as the gRPC port
// (the shared token, else the operator token of per-learner credentials), and the history of
// status samples behind the page's curves. With a token, the URL with it is written to
// <out>/status-url (owner-only), never to the log.
// Private to src/runtime. Thread-safety: Start and Stop on the main thread; Sample on the main
// thread while serving; the handlers run on the HTTP server's threads (each status document is one
// call to the loop).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "atoll/observe/http_server.h"
#include "atoll/observe/prometheus.h"
#include "atoll/syncer/syncer_loop.h"
#include "round_log.h"
#include "syncer_summary.h"

namespace atl::runtime {

struct StatusPageOptions {
  std::string address;             // --http; "" = no endpoint
  std::string token;               // "" = no credentials required
  std::vector<std::string> hosts;  // --http-host
  std::string out_dir;             // for status-url
  std::string port_file;           // --http-port-file
};

class SyncerStatusPage {
 public:
  SyncerStatusPage(syncer::SyncerLoop& loop, const SyncerSummary& summary, const RoundLog& log)
      : loop_(loop), summary_(summary), log_(log) {}

  // Serves when options.address is set (nothing otherwise). InvalidArgument for a bad address,
  // Unavailable when it cannot be bound; the status-url or port file's write errors.
  Status Start(const StatusPageOptions& options);
  bool serving() const { return http_ != nullptr; }
  // Adds a status sample to the page's history (the main thread, every 2 s).
  void Sample();
  void Stop();

 private:
  // The live status document (/api/status; /metrics renders it).
  StatusOr<nlohmann::json> StatusDocument();

  syncer::SyncerLoop& loop_;
  const SyncerSummary& summary_;
  const RoundLog& log_;
  const double started_ = UnixSeconds();
  observe::StatusHistory history_;
  std::unique_ptr<observe::HttpStatusServer> http_;
};

}  // namespace atl::runtime
