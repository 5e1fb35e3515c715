// The HTTP status endpoint in-process on 127.0.0.1 (port 0) with fake handlers: routes, content
// types, credentials (header, query, none, wrong), handler errors, bad addresses, and that more
// clients than threads are all answered. Hostile clients: http_hostile_test.cc.
#include "atoll/observe/http_server.h"

#include <httplib.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace atl::observe {
namespace {

HttpHandlers FakeHandlers(std::atomic<int>* calls) {
  HttpHandlers h;
  h.status = [calls]() -> StatusOr<nlohmann::json> {
    ++*calls;
    return nlohmann::json{{"rounds", 42}, {"run_id", "r"}};
  };
  h.metrics = []() -> StatusOr<std::string> { return std::string("atoll_rounds_total{fragment=\"0\"} 42\n"); };
  h.history = []() -> StatusOr<nlohmann::json> {
    return nlohmann::json{{"points", nlohmann::json::array({{{"t", 1}}})}};
  };
  return h;
}

TEST(ObserveHttp, ServesEveryRouteWithoutToken) {
  std::atomic<int> calls{0};
  auto server = HttpStatusServer::Start({}, FakeHandlers(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->url(), "http://127.0.0.1:" + std::to_string((*server)->port()) + "/");
  httplib::Client cli("127.0.0.1", (*server)->port());
  auto health = cli.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok\n");
  auto status = cli.Get("/api/status");
  ASSERT_TRUE(status);
  EXPECT_EQ(status->status, 200);
  EXPECT_EQ(status->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(nlohmann::json::parse(status->body)["rounds"], 42);
  auto history = cli.Get("/api/history");
  ASSERT_TRUE(history);
  EXPECT_EQ(nlohmann::json::parse(history->body)["points"][0]["t"], 1);
  auto metrics = cli.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->get_header_value("Content-Type").find("version=0.0.4"), std::string::npos);
  EXPECT_NE(metrics->body.find("atoll_rounds_total"), std::string::npos);
  auto page = cli.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("<!doctype html>"), std::string::npos);
  EXPECT_NE(page->body.find("id=\"learners\""), std::string::npos);
  for (const char* external : {"src=", "href=", "<link", "@import", "url(", "https://"}) {
    EXPECT_EQ(page->body.find(external), std::string::npos) << "self-contained: no external resources: " << external;
  }
  EXPECT_EQ(page->get_header_value("Cache-Control"), "no-store");
  EXPECT_EQ(cli.Get("/nothing")->status, 404);
  EXPECT_EQ(cli.Post("/api/status", "x", "text/plain")->status, 413) << "read-only: no bodies";
  EXPECT_EQ(cli.Post("/api/status")->status, 405) << "read-only: GET only";
  EXPECT_EQ(calls.load(), 1);
}

TEST(ObserveHttp, TokenIsRequiredExceptForHealth) {
  std::atomic<int> calls{0};
  HttpOptions o;
  o.token = "s3cret";
  auto server = HttpStatusServer::Start(o, FakeHandlers(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client cli("127.0.0.1", (*server)->port());
  EXPECT_EQ(cli.Get("/healthz")->status, 200);
  for (const char* path :
       {"/", "/api/status", "/api/history", "/metrics", "/api/status?token=wrong", "/api/status?token=s3cre"}) {
    auto r = cli.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 401) << path;
    EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer realm=\"atoll\"") << path;
  }
  EXPECT_EQ(cli.Get("/api/status", {{"Authorization", "Bearer wrong!"}})->status, 401);
  EXPECT_EQ(cli.Get("/api/status", {{"Authorization", "Basic s3cret"}})->status, 401);
  EXPECT_EQ(calls.load(), 0) << "no handler ran for a refused request";
  EXPECT_EQ(cli.Get("/api/status", {{"Authorization", "Bearer s3cret"}})->status, 200);
  EXPECT_EQ(cli.Get("/metrics?token=s3cret")->status, 200);
  EXPECT_EQ(cli.Get("/?token=s3cret")->status, 200);
  EXPECT_EQ(calls.load(), 1);
}

TEST(ObserveHttp, HandlerErrorsAre503) {
  HttpHandlers h;
  h.status = []() -> StatusOr<nlohmann::json> { return UnavailableError("syncer stopping"); };
  auto server = HttpStatusServer::Start({}, h);  // no metrics handler at all
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client cli("127.0.0.1", (*server)->port());
  auto s = cli.Get("/api/status");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, 503);
  EXPECT_NE(s->body.find("syncer stopping"), std::string::npos);
  EXPECT_EQ(cli.Get("/metrics")->status, 503);
  EXPECT_EQ(cli.Get("/api/history")->status, 503);
}

TEST(ObserveHttp, BadAddressesAndLimitsAreRefused) {
  for (const char* a : {"127.0.0.1", "127.0.0.1:", ":80", "127.0.0.1:http", "127.0.0.1:70000", "127.0.0.1:123456"}) {
    HttpOptions o;
    o.address = a;
    auto s = HttpStatusServer::Start(o, {});
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << a;
  }
  HttpOptions o;
  o.threads = 0;
  EXPECT_EQ(HttpStatusServer::Start(o, {}).status().code(), StatusCode::kInvalidArgument);
  // A port already taken (no SO_REUSEPORT sharing).
  auto first = HttpStatusServer::Start({}, {});
  ASSERT_TRUE(first.ok());
  o = HttpOptions{};
  o.address = "127.0.0.1:" + std::to_string((*first)->port());
  EXPECT_EQ(HttpStatusServer::Start(o, {}).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(QueryEscaped("a-Z_0.~"), "a-Z_0.~");
  EXPECT_EQ(QueryEscaped("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
  auto v6 = SplitHostPort("[::1]:8080");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->first, "::1");
  EXPECT_EQ(v6->second, 8080);
}

// More concurrent clients than handler threads: every one is answered (complete requests wait
// for a thread; the connection cap bounds how many may wait).
TEST(ObserveHttp, MoreClientsThanThreadsAreAllServed) {
  std::atomic<int> calls{0};
  HttpOptions o;
  o.threads = 2;
  auto server = HttpStatusServer::Start(o, FakeHandlers(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 12; ++i) {
    clients.emplace_back([port, &ok] {
      httplib::Client cli("127.0.0.1", port);
      cli.set_keep_alive(false);
      auto r = cli.Get("/api/status");
      if (r && r->status == 200) ++ok;
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 12);
  (*server)->Stop();
  (*server)->Stop();  // idempotent
  httplib::Client after("127.0.0.1", port);
  EXPECT_FALSE(after.Get("/healthz")) << "stopped: nothing listens any more";
}

}  // namespace
}  // namespace atl::observe
