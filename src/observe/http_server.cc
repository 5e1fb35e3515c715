#include "atoll/observe/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "atoll/core/text.h"
#include "atoll/observe/http_request.h"
#include "atoll/observe/status_page.h"
#include "atoll/transport/credentials.h"

namespace atl::observe {
namespace {

using SteadyTime = std::chrono::steady_clock::time_point;

SteadyTime After(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

const char* Reason(int code) {
  switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 505: return "HTTP Version Not Supported";
    default: return "Service Unavailable";
  }
}

struct Response {
  int code = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

Response Text(int code, std::string body) { return {code, "text/plain; charset=utf-8", std::move(body), {}}; }

std::string Serialized(const Response& r) {
  std::string out = "HTTP/1.1 " + std::to_string(r.code) + " " + Reason(r.code) + "\r\n";
  out += "Content-Type: " + r.content_type + "\r\nContent-Length: " + std::to_string(r.body.size()) + "\r\n";
  out += "Connection: close\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n";
  for (const auto& [k, v] : r.headers) out += k + ": " + v + "\r\n";
  out += "\r\n";
  return out + r.body;
}

// Writes all of `data` before `deadline` (the socket is non-blocking); false when it cannot.
bool SendAll(int fd, std::string_view data, SteadyTime deadline) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000))) < 0 && errno != EINTR) return false;
  }
  return true;
}

// Answers a refused request from the event thread: one non-blocking send of a small response
// (a client that does not read it loses it), then the connection is closed.
void RefuseAndClose(int fd, const Response& r) {
  const std::string bytes = Serialized(r);
  (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(fd, SHUT_WR);
  ::close(fd);
}
void RefuseAndClose(int fd, int code, const std::string& why) { RefuseAndClose(fd, Text(code, why + "\n")); }

// The presented token: `Authorization: Bearer <t>`, else `?token=<t>`.
std::string PresentedToken(const HttpRequestHead& req) {
  const std::string auth = req.Header("authorization").value_or("");
  if (auth.rfind("Bearer ", 0) == 0) return auth.substr(7);
  return req.QueryParam("token").value_or("");
}

Response FromJson(const StatusOr<nlohmann::json>& st) {
  if (!st.ok()) return Text(503, st.status().ToString() + "\n");
  return {200, "application/json", DumpJson(*st), {}};
}

Status CheckOptions(const HttpOptions& o) {
  if (o.threads < 1 || o.threads > 64 || !(o.read_timeout_s > 0) || !(o.write_timeout_s > 0) || o.max_connections < 1 ||
      o.max_connections > 4096 || o.max_head_bytes < 256 || o.max_head_bytes > (1 << 20) || o.max_headers < 1) {
    return InvalidArgumentError(
        "HTTP limits: threads in [1, 64], max_connections in [1, 4096], max_head_bytes in [256, 1 MiB], "
        "header count and timeouts > 0");
  }
  return Status::Ok();
}

StatusOr<int> Listen(const std::string& host, int port, int* bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_text = std::to_string(port);
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &res) != 0 || !res) {
    return UnavailableError("cannot resolve the HTTP host '" + host + "'");
  }
  int fd = -1;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;  // SO_REUSEADDR only: a restart binds through TIME_WAIT, no second process shares the port
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) return UnavailableError("cannot bind the HTTP status endpoint to " + host + ":" + port_text);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  *bound_port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return fd;
}

}  // namespace

struct HttpStatusServer::Impl {
  // A connection still sending its request head (event thread only).
  struct Reading {
    int fd = -1;
    std::string head;
    SteadyTime deadline;
    uint64_t seq = 0;  // accept order: the lowest is the oldest
  };
  struct Job {
    int fd;
    HttpRequestHead head;
  };

  HttpOptions o;
  HttpHandlers h;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::thread events;
  std::vector<std::thread> workers;
  std::vector<Reading> reading;    // event thread only
  uint64_t next_seq = 0;           // event thread only
  SteadyTime accept_paused_until;  // event thread only: out of descriptors, accept later
  std::atomic<int> busy{0};        // connections queued for or held by a handler thread
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> jobs;   // guarded by mu
  std::set<int> serving;  // guarded by mu: fds being answered
  bool stopping = false;  // guarded by mu

  void EventLoop();
  void AcceptSome();
  bool ReadMore(Reading& c);  // false: the connection left the reading set
  void Dispatch(int fd, std::string_view head);
  void Work();
  Response Route(const HttpRequestHead& req) const;
  Status Authorize(const HttpRequestHead& req) const;
  void StopAll();
};

void HttpStatusServer::Impl::EventLoop() {
  std::vector<pollfd> fds;
  for (;;) {
    const SteadyTime now = std::chrono::steady_clock::now();
    int timeout_ms = 1000;
    for (const Reading& c : reading) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, timeout_ms));
    }
    const bool accepting = now >= accept_paused_until;
    fds.assign({{wake[0], POLLIN, 0}, {accepting ? listen_fd : -1, POLLIN, 0}});
    for (const Reading& c : reading) fds.push_back({c.fd, POLLIN, 0});
    if (!accepting) timeout_ms = std::min(timeout_ms, 100);
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;
    if (fds[0].revents != 0) {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) break;
    }
    const SteadyTime after = std::chrono::steady_clock::now();
    for (size_t i = 0; i < reading.size(); ++i) {
      Reading& c = reading[i];
      if (fds[i + 2].revents != 0 && !ReadMore(c)) {
        c.fd = -1;
      } else if (c.fd >= 0 && after >= c.deadline) {  // slow or silent: cut off, whatever its pace
        RefuseAndClose(c.fd, 408, "the request head did not arrive in time");
        c.fd = -1;
      }
    }
    std::erase_if(reading, [](const Reading& c) { return c.fd < 0; });
    if (fds[1].revents != 0) AcceptSome();
  }
  for (Reading& c : reading) ::close(c.fd);
  reading.clear();
}

void HttpStatusServer::Impl::AcceptSome() {
  for (int i = 0; i < 32; ++i) {  // then read what arrived before accepting more
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors or memory: the listener stays readable, so pause instead of spinning.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) accept_paused_until = After(0.1);
      return;
    }
    if (static_cast<int>(reading.size()) + busy.load() >= o.max_connections) {
      if (reading.empty()) {  // every slot is being answered: this one waits for nothing
        RefuseAndClose(fd, 503, "too many connections");
        continue;
      }
      auto oldest = std::min_element(reading.begin(), reading.end(),
                                     [](const Reading& a, const Reading& b) { return a.seq < b.seq; });
      RefuseAndClose(oldest->fd, 503, "too many connections: the oldest incomplete request is dropped");
      reading.erase(oldest);
    }
    reading.push_back({fd, {}, After(o.read_timeout_s), next_seq++});
    if (!ReadMore(reading.back())) reading.pop_back();
  }
}

bool HttpStatusServer::Impl::ReadMore(Reading& c) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) {  // closed by the client, or an error
      ::close(c.fd);
      return false;
    }
    const size_t from = c.head.size() < 3 ? 0 : c.head.size() - 3;  // a line end may straddle reads
    c.head.append(buf, static_cast<size_t>(n));
    const size_t end = FindHeadEnd(std::string_view(c.head).substr(from));
    if (end > 0 && from + end <= static_cast<size_t>(o.max_head_bytes)) {
      Dispatch(c.fd, std::string_view(c.head).substr(0, from + end));
      return false;
    }
    if (c.head.size() >= static_cast<size_t>(o.max_head_bytes)) {
      RefuseAndClose(c.fd, 431, "the request head exceeds " + std::to_string(o.max_head_bytes) + " bytes");
      return false;
    }
  }
}

// Everything that needs no handler is decided here, on the event thread.
void HttpStatusServer::Impl::Dispatch(int fd, std::string_view head) {
  auto req = ParseRequestHead(head, {static_cast<size_t>(o.max_head_bytes), o.max_headers});
  if (!req.ok()) return RefuseAndClose(fd, HttpStatusFor(req.status()), req.status().message());
  if (req->declares_body) return RefuseAndClose(fd, 413, "request bodies are refused: this endpoint is GET only");
  if (req->method != "GET") return RefuseAndClose(fd, 405, "GET only");
  if (req->path != "/healthz") {
    const auto host = req->Header("host");
    if (host && !HostIsAllowed(*host, o.allowed_hosts)) {
      return RefuseAndClose(fd, 403,
                            "Host '" + TruncateUtf8(*host, 64) +
                                "' is not a name of this syncer (DNS rebinding protection; see --http-host)");
    }
    if (Status st = Authorize(*req); !st.ok()) {
      return RefuseAndClose(
          fd,
          {401, "text/plain; charset=utf-8", st.message() + "\n", {{"WWW-Authenticate", "Bearer realm=\"atoll\""}}});
    }
  }
  // The queue needs no bound of its own: each job holds one of max_connections connections.
  std::lock_guard<std::mutex> lock(mu);
  ++busy;
  jobs.push_back({fd, std::move(*req)});
  cv.notify_one();
}

Status HttpStatusServer::Impl::Authorize(const HttpRequestHead& req) const {
  if (o.token.empty() || transport::TokensEqual(PresentedToken(req), o.token)) return Status::Ok();
  return UnauthenticatedError("this syncer needs its token: Authorization: Bearer <token> or ?token=<token>");
}

Response HttpStatusServer::Impl::Route(const HttpRequestHead& req) const {
  if (req.path == "/healthz") return Text(200, "ok\n");
  if (req.path == "/") {
    return {200,
            "text/html; charset=utf-8",
            std::string(StatusPageHtml()),
            {{"Content-Security-Policy",
              "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
              "connect-src 'self'; img-src data:"}}};
  }
  if (req.path == "/api/status") return FromJson(h.status ? h.status() : UnavailableError("no status source"));
  if (req.path == "/api/history") return FromJson(h.history ? h.history() : UnavailableError("no history"));
  if (req.path == "/metrics") {
    auto text = h.metrics ? h.metrics() : StatusOr<std::string>(UnavailableError("no metrics source"));
    if (!text.ok()) return Text(503, text.status().ToString() + "\n");
    return {200, "text/plain; version=0.0.4; charset=utf-8", *text, {}};
  }
  return Text(404, "not found\n");
}

void HttpStatusServer::Impl::Work() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [this] { return stopping || !jobs.empty(); });
      if (stopping) return;  // StopAll closes what is still queued
      job = std::move(jobs.front());
      jobs.pop_front();
      serving.insert(job.fd);
    }
    Response r;
    try {
      r = Route(job.head);
    } catch (const std::exception& e) {  // a handler's bug must not end the thread
      r = Text(503, std::string("status handler failed: ") + e.what() + "\n");
    }
    (void)SendAll(job.fd, Serialized(r), After(o.write_timeout_s));
    {
      std::lock_guard<std::mutex> lock(mu);
      serving.erase(job.fd);
      ::shutdown(job.fd, SHUT_WR);
      ::close(job.fd);
    }
    --busy;
  }
}

void HttpStatusServer::Impl::StopAll() {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping) return;
    stopping = true;
    for (int fd : serving) ::shutdown(fd, SHUT_RDWR);  // a response in progress fails at once
  }
  const char byte = 1;
  (void)!::write(wake[1], &byte, 1);
  cv.notify_all();
  if (events.joinable()) events.join();
  for (auto& t : workers) t.join();
  for (const Job& j : jobs) ::close(j.fd);
  jobs.clear();
  for (int fd : {listen_fd, wake[0], wake[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

std::string QueryEscaped(const std::string& text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return InvalidArgumentError("HTTP address '" + address + "' is not host:port (e.g. 127.0.0.1:0)");
  }
  std::string host = address.substr(0, colon);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port_text = address.substr(colon + 1);
  if (port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos) {
    return InvalidArgumentError("HTTP address '" + address + "': port must be a number in [0, 65535]");
  }
  const int port = std::stoi(port_text);
  if (port > 65535) return InvalidArgumentError("HTTP address '" + address + "': port must be in [0, 65535]");
  return std::make_pair(host, port);
}

StatusOr<std::unique_ptr<HttpStatusServer>> HttpStatusServer::Start(const HttpOptions& o, HttpHandlers handlers) {
  ATOLL_RETURN_IF_ERROR(CheckOptions(o));
  ATOLL_ASSIGN_OR_RETURN(auto host_port, SplitHostPort(o.address));
  const auto& [host, port] = host_port;
  auto impl = std::make_unique<Impl>();
  impl->o = o;
  impl->h = std::move(handlers);
  if (host != "0.0.0.0" && host != "::" && !host.empty()) impl->o.allowed_hosts.push_back(host);
  int bound = 0;
  ATOLL_ASSIGN_OR_RETURN(impl->listen_fd, Listen(host, port, &bound));
  if (::pipe2(impl->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    ::close(impl->listen_fd);
    return InternalError(std::string("pipe for the HTTP endpoint: ") + std::strerror(errno));
  }
  Impl* raw = impl.get();
  impl->events = std::thread([raw] { raw->EventLoop(); });
  for (int i = 0; i < o.threads; ++i) impl->workers.emplace_back([raw] { raw->Work(); });
  return std::unique_ptr<HttpStatusServer>(new HttpStatusServer(std::move(impl), bound, host));
}

HttpStatusServer::HttpStatusServer(std::unique_ptr<Impl> impl, int port, std::string host)
    : impl_(std::move(impl)), port_(port), host_(std::move(host)) {}

HttpStatusServer::~HttpStatusServer() { Stop(); }

void HttpStatusServer::Stop() {
  if (impl_) impl_->StopAll();
}

std::string HttpStatusServer::url() const {
  std::string host = host_;
  if (host == "0.0.0.0" || host == "::" || host.empty()) host = "127.0.0.1";
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return "http://" + host + ":" + std::to_string(port_) + "/";
}

}  // namespace atl::observe
