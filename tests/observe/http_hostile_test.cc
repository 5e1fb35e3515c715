// Hostile clients of the HTTP status endpoint (issue 32), over raw sockets on 127.0.0.1: the
// attacks that grew a cpp-httplib server's memory until bad_alloc (endless header lines, a
// 600 MiB line, a chunked body), slow connections that held every handler thread, DNS
// rebinding, and the request-head parser itself. Each attack test asserts that the server cut
// the attacker off within its bounds, the process's resident memory stayed bounded, and /healthz
// kept answering. No timing thresholds: every wait is a bound.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "atoll/observe/http_request.h"
#include "atoll/observe/http_server.h"
#include "testing/loopback_socket.h"

namespace atl::observe {
namespace {

constexpr int64_t kMiB = 1 << 20;

int64_t RssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// A blocking loopback connection whose sends and receives give up after 20 s (the tests' bound).
int Connect(int port) { return atl::testing::ConnectLoopback(port, 20); }

// Sends `prefix`, then `filler` again and again, until the server cuts the connection or
// `max_bytes` went out. The bytes sent; -1 when the server neither read nor cut (a send timed out).
int64_t SendUntilCut(int fd, const std::string& prefix, const std::string& filler, int64_t max_bytes) {
  int64_t sent = 0;
  std::string_view rest = prefix;
  while (sent < max_bytes) {
    if (rest.empty()) {
      if (filler.empty()) break;
      rest = filler;
    }
    const ssize_t n = ::send(fd, rest.data(), rest.size(), MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? -1 : sent;
    sent += n;
    rest.remove_prefix(static_cast<size_t>(n));
  }
  return sent;
}

// The status code of the response the server sent on `fd`, read until it closes (0: none came).
int ResponseCode(int fd) {
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) got.append(buf, static_cast<size_t>(n));
  if (got.rfind("HTTP/1.1 ", 0) != 0 || got.size() < 12) return 0;
  return std::stoi(got.substr(9, 3));
}

// One raw request, its response code.
int Raw(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return -1;
  (void)SendUntilCut(fd, request, "", static_cast<int64_t>(request.size()));
  const int code = ResponseCode(fd);
  ::close(fd);
  return code;
}

bool Healthy(int port) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(20);
  cli.set_read_timeout(20);
  auto r = cli.Get("/healthz");
  return r && r->status == 200;
}

HttpHandlers Handlers() {
  HttpHandlers h;
  h.status = []() -> StatusOr<nlohmann::json> { return nlohmann::json{{"rounds", 7}}; };
  return h;
}

std::unique_ptr<HttpStatusServer> Start(HttpOptions o = {}) {
  auto s = HttpStatusServer::Start(o, Handlers());
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// Four connections sending header lines without end (each grew a cpp-httplib server by more than
// a gigabyte): each is cut after the head bound, before any credential is looked at.
TEST(HostileHttp, EndlessHeaderLinesAreCutOffWithBoundedMemory) {
  HttpOptions o;
  o.token = "s3cret";
  auto server = Start(o);
  ASSERT_TRUE(server);
  const int port = server->port();
  const int64_t rss_before = RssBytes();
  std::vector<int64_t> sent(4);
  std::vector<std::thread> attackers;
  for (size_t i = 0; i < sent.size(); ++i) {
    attackers.emplace_back([&, i] {
      const int fd = Connect(port);
      sent[i] = SendUntilCut(fd, "GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                             "X-Flood: " + std::string(200, 'a') + "\r\n", 4096 * kMiB);
      ::close(fd);
    });
  }
  for (auto& t : attackers) t.join();
  const int64_t rss_growth = RssBytes() - rss_before;
  std::printf("header flood: cut after %lld, %lld, %lld, %lld bytes sent; RSS %+lld KiB\n",
              static_cast<long long>(sent[0]), static_cast<long long>(sent[1]), static_cast<long long>(sent[2]),
              static_cast<long long>(sent[3]), static_cast<long long>(rss_growth / 1024));
  for (int64_t n : sent) {
    EXPECT_GE(n, 0) << "the server neither read nor closed";
    EXPECT_LT(n, 64 * kMiB) << "cut off after the head bound (plus what the kernel buffers)";
  }
  EXPECT_LT(rss_growth, 32 * kMiB);
  EXPECT_TRUE(Healthy(port));
  // Under the byte bound but over the line count: 431 as well.
  std::string many = "GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (int i = 0; i < 100; ++i) many += "a:b\r\n";
  EXPECT_EQ(Raw(port, many + "\r\n"), 431);
}

// One line of 600 MiB, and a declared body of that size, chunked or not.
TEST(HostileHttp, AnEndlessLineAndBodiesAreRefused) {
  auto server = Start();
  ASSERT_TRUE(server);
  const int port = server->port();
  const int64_t rss_before = RssBytes();
  const int fd = Connect(port);
  const int64_t sent = SendUntilCut(fd, "GET /", std::string(64 << 10, 'a'), 600 * kMiB);
  ::close(fd);
  std::printf("600 MiB line: cut after %lld bytes sent\n", static_cast<long long>(sent));
  EXPECT_GE(sent, 0);
  EXPECT_LT(sent, 64 * kMiB);
  const std::string chunked = "POST /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  const int cfd = Connect(port);
  ASSERT_EQ(SendUntilCut(cfd, chunked, "", static_cast<int64_t>(chunked.size())), static_cast<int64_t>(chunked.size()));
  EXPECT_EQ(ResponseCode(cfd), 413) << "refused at the head, before any chunk";
  const int64_t chunks = SendUntilCut(cfd, "10000\r\n", std::string(1 << 16, 'b') + "\r\n10000\r\n", 600 * kMiB);
  EXPECT_GE(chunks, 0);
  EXPECT_LT(chunks, 64 * kMiB);
  ::close(cfd);
  EXPECT_EQ(Raw(port, "GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 629145600\r\n\r\n"), 413);
  EXPECT_EQ(Raw(port, "GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"), 200);
  EXPECT_EQ(Raw(port, "DELETE /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), 405);
  EXPECT_EQ(Raw(port, "GET /api/status HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n"), 505);
  EXPECT_EQ(Raw(port, "GET /api/status HTTP/1.1\r\n\r\n"), 400) << "HTTP/1.1 without Host";
  EXPECT_LT(RssBytes() - rss_before, 32 * kMiB);
  EXPECT_TRUE(Healthy(port));
}

// 200 connections that send a byte every 100 ms (24 of them once made the page and /healthz
// unreachable): each is cut off once its head is overdue, the oldest first when the connection
// cap is reached, and honest requests are answered throughout.
TEST(HostileHttp, SlowClientsAreCutOffAndHonestOnesAreAnswered) {
  HttpOptions o;
  o.read_timeout_s = 1;
  o.max_connections = 32;
  auto server = Start(o);
  ASSERT_TRUE(server);
  const int port = server->port();
  std::vector<int> slow;
  for (int i = 0; i < 200; ++i) {
    const int fd = Connect(port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(SendUntilCut(fd, "GET /api/status HTTP/1.1\r\n", "", 26), 26);
    slow.push_back(fd);
  }
  std::atomic<bool> done{false};
  std::atomic<int> cut{0};
  std::thread dribble([&] {
    const auto bound = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done && cut < static_cast<int>(slow.size()) && std::chrono::steady_clock::now() < bound) {
      for (int& fd : slow) {
        if (fd >= 0 && ::send(fd, "X", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN) {
          ::close(fd);
          fd = -1;
          ++cut;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(Healthy(port)) << "request " << i;
  httplib::Client cli("127.0.0.1", port);
  auto status = cli.Get("/api/status");
  ASSERT_TRUE(status);
  EXPECT_EQ(status->status, 200);
  dribble.join();
  EXPECT_EQ(cut.load(), 200) << "every slow connection was closed by the server";
  done = true;
  for (int fd : slow) {
    if (fd >= 0) ::close(fd);
  }
}

// Stop() returns while clients hold connections open (once it waited for them without end).
TEST(HostileHttp, StopReturnsWhileClientsHoldConnections) {
  auto server = Start();
  ASSERT_TRUE(server);
  std::vector<int> held;
  for (int i = 0; i < 50; ++i) {
    const int fd = Connect(server->port());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(SendUntilCut(fd, "GET /api/sta", "", 12), 12);
    held.push_back(fd);
  }
  server->Stop();
  for (int fd : held) {
    char c;
    EXPECT_LE(::recv(fd, &c, 1, 0), 0) << "closed by Stop";
    ::close(fd);
  }
}

// DNS rebinding: a page of attacker.example that resolves to 127.0.0.1 sends its own name as Host.
TEST(HostileHttp, TheHostHeaderMustNameThisServer) {
  HttpOptions o;
  o.allowed_hosts = {"syncer.lan"};
  auto server = Start(o);
  ASSERT_TRUE(server);
  const int port = server->port();
  const auto get = [&](const std::string& host) {
    return Raw(port, "GET /api/status HTTP/1.1\r\nHost: " + host + "\r\n\r\n");
  };
  EXPECT_EQ(get("attacker.example"), 403);
  EXPECT_EQ(get("attacker.example:" + std::to_string(port)), 403);
  EXPECT_EQ(get("127.0.0.1.attacker.example"), 403);
  EXPECT_EQ(get("127.0.0.1:" + std::to_string(port)), 200);
  EXPECT_EQ(get("[::1]:" + std::to_string(port)), 200);
  EXPECT_EQ(get("localhost:" + std::to_string(port)), 200);
  EXPECT_EQ(get("Syncer.LAN:" + std::to_string(port)), 200);
  EXPECT_EQ(Raw(port, "GET /healthz HTTP/1.1\r\nHost: attacker.example\r\n\r\n"), 200) << "/healthz says nothing";
  EXPECT_EQ(Raw(port, "GET /api/status HTTP/1.0\r\n\r\n"), 200) << "HTTP/1.0 without Host: no browser";
}

TEST(HttpRequestHead, ParsesWhatBrowsersAndScrapersSend) {
  const std::string head =
      "GET /api/status?token=a%2Bb+c&x HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAuthorization:  Bearer t \r\n"
      "Accept: */*\r\n\r\n";
  EXPECT_EQ(FindHeadEnd(head), head.size());
  EXPECT_EQ(FindHeadEnd(head.substr(0, head.size() - 1)), 0u);
  auto h = ParseRequestHead(head, {});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->method, "GET");
  EXPECT_EQ(h->path, "/api/status");
  EXPECT_EQ(h->QueryParam("token"), "a+b c");
  EXPECT_EQ(h->QueryParam("x"), "");
  EXPECT_FALSE(h->QueryParam("y"));
  EXPECT_EQ(h->Header("authorization"), "Bearer t");
  EXPECT_EQ(h->Header("host"), "127.0.0.1:8080");
  EXPECT_FALSE(h->declares_body);
  const std::string lf = "GET / HTTP/1.0\nX: y\n\n";
  EXPECT_EQ(FindHeadEnd(lf), lf.size());
  EXPECT_TRUE(ParseRequestHead(lf, {}).ok());
}

TEST(HttpRequestHead, RefusesMalformedAndOversizedHeads) {
  const auto code = [](const std::string& head) {
    auto h = ParseRequestHead(head, {512, 4});
    return h.ok() ? 200 : HttpStatusFor(h.status());
  };
  EXPECT_EQ(code("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), 200);
  EXPECT_EQ(code("GET /  HTTP/1.1\r\nHost: a\r\n\r\n"), 400) << "two spaces";
  EXPECT_EQ(code("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n"), 400) << "absolute form";
  EXPECT_EQ(code("G(T / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(code("GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n"), 400);
  EXPECT_EQ(code("GET / HTTP/1.1\r\nHost: a\r\nBad Name: x\r\n\r\n"), 400);
  EXPECT_EQ(code("GET / HTTP/1.1\r\nHost: a\r\nX: \x01\r\n\r\n"), 400);
  EXPECT_EQ(code("GET / HTTP/1.1\r\nHost: a\rX: y\r\n\r\n"), 400) << "bare CR";
  EXPECT_EQ(code("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
  EXPECT_EQ(code("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1x\r\n\r\n"), 400);
  EXPECT_EQ(code("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n"), 400);
  EXPECT_EQ(code("GET / HTTP/1.1\r\nHost: a\r\n\r\nextra"), 400);
  EXPECT_EQ(code("GET / HTTP/1.1\r\nHost: a\r\n"), 400) << "no blank line";
  EXPECT_EQ(code("GET / HTTP/3.0\r\nHost: a\r\n\r\n"), 505);
  EXPECT_EQ(code("GET / HTTP/1.1\r\nHost: a\r\nA:1\r\nB:2\r\nC:3\r\nD:4\r\n\r\n"), 431) << "5 header lines";
  EXPECT_EQ(code("GET /" + std::string(600, 'a') + " HTTP/1.1\r\nHost: a\r\n\r\n"), 431);
  auto body = ParseRequestHead("GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", {});
  ASSERT_TRUE(body.ok());
  EXPECT_TRUE(body->declares_body);
}

TEST(HttpRequestHead, HostCheck) {
  const std::vector<std::string> allowed = {"syncer.lan"};
  for (const char* ok : {"127.0.0.1", "127.0.0.1:80", "10.1.2.3:8080", "[::1]:8080", "[::1]", "localhost",
                         "LOCALHOST:1", "localhost.", "syncer.lan", "SYNCER.lan:9"}) {
    EXPECT_TRUE(HostIsAllowed(ok, allowed)) << ok;
  }
  for (const char* bad : {"", "evil.example", "evil.example:80", "127.0.0.1.evil.example", "[::1", "[::1]x",
                          "[evil]:80", "127.0.0.1:", "127.0.0.1:http", ":80", "localhost.evil", "syncer.lan.evil"}) {
    EXPECT_FALSE(HostIsAllowed(bad, allowed)) << bad;
  }
}

}  // namespace
}  // namespace atl::observe
