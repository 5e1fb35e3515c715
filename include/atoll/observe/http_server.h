// The syncer's HTTP status endpoint (docs/observability.md):
//   GET /            the status page (self-contained HTML/JS/CSS; polls /api/status)
//   GET /api/status  the status document as JSON
//   GET /api/history the bounded history of status samples (StatusHistory) as JSON
//   GET /metrics     Prometheus text exposition
//   GET /healthz     "ok" (no credentials needed: it says nothing but that the process serves)
// Credentials follow the gRPC port's rule: with a token every path but /healthz needs it, as
// `Authorization: Bearer <token>` or `?token=<token>`, compared in constant time.
//
// Its own small HTTP/1.1 server, so that every bound holds before authentication
// (docs/security.md; cpp-httplib 0.11 stores every header line it is sent). One event thread
// accepts and reads request heads: at most `max_connections` open (a new connection beyond them
// closes the oldest one still sending its head), each head at most `max_head_bytes` and
// `max_headers` lines (431) and complete within `read_timeout_s` of the accept, whatever the
// client's pace (slow clients are cut off, not waited for). Bodies are refused (413: the endpoint
// is GET only), as are other methods (405), malformed heads (400) and a Host that is not an IP
// literal, "localhost", the bound host or one of `allowed_hosts` (403: DNS rebinding). Complete
// requests wait for one of `threads` handler threads (the queue is bounded by the connection cap);
// a response must be written within `write_timeout_s`; every connection closes after one response.
// Memory is bounded by max_connections × max_head_bytes; Stop() returns within write_timeout_s
// plus the slowest handler call, whatever the clients do.
// It never touches syncer state itself: the handlers are callbacks.
// Thread-safety: handlers are called on the handler threads, concurrently; Stop() from any one
// thread, once (the destructor calls it).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/status.h"

namespace atl::observe {

struct HttpOptions {
  std::string address = "127.0.0.1:0";  // host:port or [v6]:port; port 0 = a free port
  std::string token;                    // "" = no credentials required
  // Host names (beyond IP literals, "localhost" and the host of `address`) a request's Host
  // header may carry: the names the page is reached by through DNS.
  std::vector<std::string> allowed_hosts;
  int threads = 4;             // handler threads
  int max_connections = 64;    // open connections, reading or being answered
  int max_head_bytes = 8192;   // request line and header lines together
  int max_headers = 64;        // header lines
  double read_timeout_s = 5;   // from accept until the request head is complete
  double write_timeout_s = 5;  // to write one response
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
