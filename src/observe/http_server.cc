#include "atoll/observe/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <cctype>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "atoll/core/text.h"
#include "atoll/observe/status_page.h"
#include "atoll/transport/credentials.h"

namespace atl::observe {
namespace {

// cpp-httplib's own pool queues without bound; this one makes the accept thread wait while
// `max_queued` connections are waiting (then the kernel's backlog, then refusals).
class BoundedPool : public httplib::TaskQueue {
 public:
  BoundedPool(int threads, int max_queued) : max_queued_(static_cast<size_t>(max_queued)) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
  }
  ~BoundedPool() override = default;

  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    room_.wait(lock, [this] { return jobs_.size() < max_queued_ || shutdown_; });
    jobs_.push_back(std::move(fn));
    work_.notify_one();
  }

  // Called once by the listening thread after its accept loop ended: runs what is queued, joins.
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutdown_ = true;
    }
    work_.notify_all();
    room_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_.wait(lock, [this] { return !jobs_.empty() || shutdown_; });
        if (jobs_.empty()) return;  // shutdown_ and nothing left
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      room_.notify_one();
      fn();
    }
  }

  const size_t max_queued_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_, room_;
  std::deque<std::function<void()>> jobs_;  // guarded by mu_
  bool shutdown_ = false;                   // guarded by mu_
};

// The presented token: `Authorization: Bearer <t>`, else `?token=<t>`.
std::string PresentedToken(const httplib::Request& req) {
  const std::string auth = req.get_header_value("Authorization");
  if (auth.rfind("Bearer ", 0) == 0) return auth.substr(7);
  return req.has_param("token") ? req.get_param_value("token") : std::string();
}

void Unavailable(httplib::Response& res, const Status& st) {
  res.status = 503;
  res.set_content(st.ToString() + "\n", "text/plain; charset=utf-8");
}

void AddRoutes(httplib::Server& svr, const HttpHandlers& h) {
  svr.Get("/healthz", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Content-Security-Policy",
                   "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:");
    res.set_content(std::string(StatusPageHtml()), "text/html; charset=utf-8");
  });
  svr.Get("/api/status", [h](const httplib::Request&, httplib::Response& res) {
    auto st = h.status ? h.status() : StatusOr<nlohmann::json>(UnavailableError("no status source"));
    if (!st.ok()) return Unavailable(res, st.status());
    res.set_content(DumpJson(*st), "application/json");
  });
  svr.Get("/api/history", [h](const httplib::Request&, httplib::Response& res) {
    auto st = h.history ? h.history() : StatusOr<nlohmann::json>(UnavailableError("no history"));
    if (!st.ok()) return Unavailable(res, st.status());
    res.set_content(DumpJson(*st), "application/json");
  });
  svr.Get("/metrics", [h](const httplib::Request&, httplib::Response& res) {
    auto text = h.metrics ? h.metrics() : StatusOr<std::string>(UnavailableError("no metrics source"));
    if (!text.ok()) return Unavailable(res, text.status());
    res.set_content(*text, "text/plain; version=0.0.4; charset=utf-8");
  });
}

Status CheckOptions(const HttpOptions& o) {
  if (o.threads < 1 || o.threads > 64 || o.max_queued < 1 || o.read_timeout_s < 1 || o.write_timeout_s < 1 ||
      o.keep_alive_max_count < 1 || o.keep_alive_timeout_s < 1) {
    return InvalidArgumentError("HTTP limits: threads in [1, 64], queue, timeouts and keep-alive ≥ 1");
  }
  return Status::Ok();
}

}  // namespace

struct HttpStatusServer::Impl {
  httplib::Server server;
  std::thread listener;
};

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
  auto impl = std::make_unique<Impl>();
  httplib::Server& svr = impl->server;
  const int threads = o.threads, queued = o.max_queued;
  svr.new_task_queue = [threads, queued] { return new BoundedPool(threads, queued); };
  svr.set_read_timeout(o.read_timeout_s, 0);
  svr.set_write_timeout(o.write_timeout_s, 0);
  svr.set_keep_alive_max_count(static_cast<size_t>(o.keep_alive_max_count));
  svr.set_keep_alive_timeout(o.keep_alive_timeout_s);
  svr.set_payload_max_length(1024);
  // httplib's default also sets SO_REUSEPORT, which lets a second process bind the same port and
  // take a share of the connections; keep only SO_REUSEADDR (a restart binds through TIME_WAIT).
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  svr.set_default_headers({{"Cache-Control", "no-store"}, {"X-Content-Type-Options", "nosniff"}});
  const std::string token = o.token;
  svr.set_pre_routing_handler([token](const httplib::Request& req, httplib::Response& res) {
    if (token.empty() || req.path == "/healthz" || transport::TokensEqual(PresentedToken(req), token)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.status = 401;
    res.set_header("WWW-Authenticate", "Bearer realm=\"atoll\"");
    res.set_content("this syncer needs its token: Authorization: Bearer <token> or ?token=<token>\n", "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  });
  AddRoutes(svr, handlers);
  const auto& [host, port] = host_port;
  int bound = port;
  if (port == 0) {
    bound = svr.bind_to_any_port(host);
  } else if (!svr.bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound <= 0) return UnavailableError("cannot bind the HTTP status endpoint to " + o.address);
  auto done = std::make_shared<std::atomic<bool>>(false);
  impl->listener = std::thread([&svr, done] {
    svr.listen_after_bind();
    *done = true;
  });
  // stop() is a no-op until the accept loop runs, so Stop() must not come before it.
  while (!svr.is_running() && !*done) std::this_thread::yield();
  if (*done) {
    impl->listener.join();
    return UnavailableError("the HTTP status endpoint on " + o.address + " stopped at once");
  }
  return std::unique_ptr<HttpStatusServer>(new HttpStatusServer(std::move(impl), bound, host));
}

HttpStatusServer::HttpStatusServer(std::unique_ptr<Impl> impl, int port, std::string host)
    : impl_(std::move(impl)), port_(port), host_(std::move(host)) {}

HttpStatusServer::~HttpStatusServer() { Stop(); }

void HttpStatusServer::Stop() {
  if (!impl_ || !impl_->listener.joinable()) return;
  impl_->server.stop();
  impl_->listener.join();
}

std::string HttpStatusServer::url() const {
  std::string host = host_;
  if (host == "0.0.0.0" || host == "::" || host.empty()) host = "127.0.0.1";
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return "http://" + host + ":" + std::to_string(port_) + "/";
}

}  // namespace atl::observe
