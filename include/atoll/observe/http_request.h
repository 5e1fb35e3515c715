// The request head of the syncer's HTTP status endpoint, parsed within fixed bounds before any
// credential is checked (docs/security.md): the endpoint serves GET only, so a request is its
// head — request line and header lines — and nothing else.
//
// The parser is pure (fuzzed: fuzz/fuzz_http_request.cc). Its caller (HttpStatusServer) reads at
// most `max_head_bytes` of a connection before it knows where the head ends (FindHeadEnd), so no
// line, header or header count can grow memory beyond that bound. Bare LF line ends are accepted
// beside CRLF; obsolete line folding, control characters, a missing or doubled Host, absolute
// targets and versions other than HTTP/1.0 and 1.1 are refused.
// Thread-safety: pure functions and values.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "atoll/core/status.h"

namespace atl::observe {

struct HttpRequestLimits {
  size_t max_head_bytes = 8192;  // request line + header lines + the blank line
  int max_headers = 64;
};

struct HttpRequestHead {
  std::string method;                                        // "GET", …: an HTTP token
  std::string target;                                        // as sent: path and query ("/api/status?token=…")
  std::string path;                                          // the target without its query
  std::string query;                                         // after '?', undecoded ("" if none)
  std::string version;                                       // "HTTP/1.0" or "HTTP/1.1"
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, values trimmed
  // The request announces a body (a Content-Length other than 0, or any Transfer-Encoding).
  bool declares_body = false;

  // The first header of that (lower-case) name.
  std::optional<std::string> Header(std::string_view lower_name) const;
  // A query parameter, percent-decoded ('+' is a space); nullopt when absent.
  std::optional<std::string> QueryParam(std::string_view name) const;
};

// Index just past the blank line that ends the head in `buffer` (CRLF or LF line ends), or 0
// while the head is incomplete.
size_t FindHeadEnd(std::string_view buffer);

// Parses a complete head (as delimited by FindHeadEnd; trailing bytes after it are an error).
// Each error's code maps to the HTTP status to answer (HttpStatusFor):
//   InvalidArgument   400  malformed request line or header, no Host on HTTP/1.1, two Hosts
//   ResourceExhausted 431  more than max_headers header lines, or a head over max_head_bytes
//   Unimplemented     505  an HTTP version other than 1.0 and 1.1
StatusOr<HttpRequestHead> ParseRequestHead(std::string_view head, const HttpRequestLimits& limits);

// The HTTP status code for a ParseRequestHead error.
int HttpStatusFor(const Status& parse_error);

// Percent-decodes a query component ('+' is a space; a malformed escape stays as it is).
std::string PercentDecoded(std::string_view text);

// Whether `host_header` (a Host header value: "name", "name:port", "[v6]:port") names this
// server for a browser that could not have been steered there by DNS rebinding: an IP literal,
// "localhost", or one of `allowed` (compared case-insensitively, without the port).
bool HostIsAllowed(std::string_view host_header, const std::vector<std::string>& allowed);

}  // namespace atl::observe
