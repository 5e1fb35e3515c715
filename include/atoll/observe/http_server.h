// The syncer's HTTP status endpoint (docs/observability.md), on cpp-httplib from Debian:
//   GET /            the status page (self-contained HTML/JS/CSS; polls /api/status)
//   GET /api/status  the status document as JSON
//   GET /api/history the bounded history of status samples (StatusHistory) as JSON
//   GET /metrics     Prometheus text exposition
//   GET /healthz     "ok" (no credentials needed: it says nothing but that the process serves)
// Credentials follow the gRPC port's rule: with a token every path but /healthz needs it, as
// `Authorization: Bearer <token>` or `?token=<token>`, compared in constant time.
//
// The server is bounded against hostile clients: a fixed pool of handler threads, a bounded
// queue of accepted connections (the accept thread waits while it is full, so the kernel's small
// backlog refuses the rest), read/write timeouts, few requests per connection, 1 KiB bodies.
// It never touches syncer state itself: the handlers are callbacks.
// Thread-safety: handlers are called on the pool's threads, concurrently; Stop() from any one
// thread, once (the destructor calls it).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "atoll/core/status.h"

namespace atl::observe {

struct HttpOptions {
  std::string address = "127.0.0.1:0";  // host:port or [v6]:port; port 0 = a free port
  std::string token;                    // "" = no credentials required
  int threads = 4;                      // handler threads
  int max_queued = 16;                  // accepted connections waiting for a thread
  int read_timeout_s = 5;
  int write_timeout_s = 5;
  int keep_alive_max_count = 20;        // requests per connection
  int keep_alive_timeout_s = 5;
};

struct HttpHandlers {
  // The status document (after AddDerived); an error answers 503 with its message.
  std::function<StatusOr<nlohmann::json>()> status;
  // The history for the page's curves; an error answers 503.
  std::function<StatusOr<nlohmann::json>()> history;
  // The Prometheus text; an error answers 503.
  std::function<StatusOr<std::string>()> metrics;
};

class HttpStatusServer {
 public:
  // Binds and starts serving. InvalidArgument for a malformed address or bad limits;
  // Unavailable when the address cannot be bound.
  static StatusOr<std::unique_ptr<HttpStatusServer>> Start(const HttpOptions& options, HttpHandlers handlers);
  ~HttpStatusServer();
  HttpStatusServer(const HttpStatusServer&) = delete;
  HttpStatusServer& operator=(const HttpStatusServer&) = delete;

  int port() const { return port_; }
  // "http://host:port/" (a wildcard host is shown as 127.0.0.1).
  std::string url() const;
  void Stop();

 private:
  struct Impl;
  explicit HttpStatusServer(std::unique_ptr<Impl> impl, int port, std::string host);
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::string host_;
};

// `text` percent-encoded for a URL query value (everything but A-Z a-z 0-9 - _ . ~).
std::string QueryEscaped(const std::string& text);

// Splits "host:port" / "[v6]:port" (InvalidArgument otherwise; port in [0, 65535]).
StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address);

}  // namespace atl::observe
