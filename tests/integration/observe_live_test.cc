// The syncer's HTTP endpoint seen by real clients during an `atoll run` of four learners on
// loopback: a real Prometheus (Debian's `prometheus`, temp config and storage) scrapes /metrics
// and its query API shows the atoll series moving; headless Chromium (Debian's `chromium`) loads
// the status page, runs its JavaScript and the DOM holds every learner and a rising round count,
// then renders the report.html the run wrote.
// Each test skips, saying why, where its program is not installed (scripts/setup installs both).
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <thread>

#include "atoll/core/child_process.h"
#include "atoll/core/file.h"
#include "testing/atoll_binary.h"
#include "testing/await.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

// A port that was free a moment ago (Prometheus cannot listen on port 0 and report it).
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// An `atoll run` of 4 learners, long enough to watch; interrupted (SIGINT, as Ctrl-C) at the end.
struct LiveRun {
  std::string dir;
  ChildProcess run;
  int http_port = 0;
  std::string token;

  void Start(const std::string& name) {
    dir = testing::ScratchDir(name);
    const std::string data = testing::PrepareSmallData(dir);
    auto p = ChildProcess::Start(
        {ATOLL_BIN,        "run", "--data",       data, "--out",    dir + "/run", "-M", "4", "--steps", "2000",
         "--seq",          "32",  "--batch",      "4",  "-P",       "4",          "-H", "4", "--tau",   "1",
         "--eval-batches", "2",   "--eval-every", "0",  "--no-live"},
        dir + "/run.log", {.own_process_group = true});  // no orphans if the test dies
    ASSERT_TRUE(p.ok()) << p.status();
    run = std::move(*p);
    const std::regex url("status page: http://127\\.0\\.0\\.1:([0-9]+)/\\?token=([0-9a-f]+)");
    std::smatch m;
    std::string log;
    testing::AwaitFor([&] { return std::regex_search(log = Log(), m, url) || !run.running(); }, 120.0,
                      std::chrono::milliseconds(100));
    ASSERT_FALSE(m.empty()) << "atoll run printed no status page URL:\n" << Log();
    http_port = std::stoi(m[1]);
    token = m[2];
  }

  nlohmann::json Status() const {
    httplib::Client cli("127.0.0.1", http_port);
    auto r = cli.Get("/api/status", {{"Authorization", "Bearer " + token}});
    return r && r->status == 200 ? nlohmann::json::parse(r->body, nullptr, false) : nlohmann::json();
  }

  // Waits (bounded) until the syncer reports `rounds` > `above` with all 4 learners in its table.
  int64_t AwaitRounds(int64_t above, double seconds) const {
    int64_t rounds = -1;
    testing::AwaitFor(
        [&] {
          auto s = Status();
          if (!s.is_object() || s.value("rounds", int64_t{0}) <= above || s["learners"].size() != 4) return false;
          rounds = s["rounds"];
          return true;
        },
        seconds, std::chrono::milliseconds(200));
    return rounds;
  }

  std::string Log() const { return testing::TextOf(dir + "/run.log", ""); }

  // Ctrl-C: atoll run stops its learners and syncer itself, then writes its report.
  void Stop(bool remove = true) {
    ::kill(run.pid(), SIGINT);
    run.WaitOrKill(120);
    if (remove) fs::remove_all(dir);
  }
};

// One Prometheus query's scalar result (the first sample's value), or NaN.
double Query(httplib::Client& prom, const std::string& promql) {
  auto r = prom.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
  if (!r || r->status != 200) return std::nan("");
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded() || j["data"]["result"].empty()) return std::nan("");
  return std::stod(j["data"]["result"][0]["value"][1].get<std::string>());
}

// Polls `promql` until `ok(value)` (bounded); the last value.
template <typename Pred>
double AwaitQuery(httplib::Client& prom, const std::string& promql, Pred ok, double seconds) {
  double v = std::nan("");
  testing::AwaitFor([&] { return ok(v = Query(prom, promql)); }, seconds, std::chrono::milliseconds(250));
  return v;
}

TEST(ObserveLive, PrometheusScrapesTheRun) {
  ASSERT_TRUE(fs::exists("/usr/bin/prometheus")) << "prometheus is not installed (scripts/setup installs it)";
  LiveRun live;
  ASSERT_NO_FATAL_FAILURE(live.Start("observe_prometheus"));
  const int port = FreePort();
  std::ofstream(live.dir + "/prometheus.yml")
      << "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
      << "scrape_configs:\n  - job_name: atoll\n    scrape_interval: 1s\n"
      << "    authorization: {type: Bearer, credentials: " << live.token << "}\n"
      << "    static_configs: [{targets: ['127.0.0.1:" << live.http_port << "']}]\n";
  auto p = ChildProcess::Start({"/usr/bin/prometheus", "--config.file=" + live.dir + "/prometheus.yml",
                                "--storage.tsdb.path=" + live.dir + "/tsdb",
                                "--web.listen-address=127.0.0.1:" + std::to_string(port), "--log.level=warn"},
                               live.dir + "/prometheus.log");
  ASSERT_TRUE(p.ok()) << p.status();
  httplib::Client prom("127.0.0.1", port);
  auto positive = [](double v) { return v > 0; };
  const double first = AwaitQuery(prom, "sum(atoll_tokens_trained_total)", positive, 60);
  ASSERT_GT(first, 0) << testing::TextOf(live.dir + "/prometheus.log", "") << live.Log();
  const double later = AwaitQuery(
      prom, "sum(atoll_tokens_trained_total)", [&](double v) { return v > first; }, 60);
  EXPECT_GT(later, first) << "tokens move between scrapes";
  EXPECT_EQ(AwaitQuery(
                prom, "count(atoll_learner_up == 1)", [](double v) { return v == 4; }, 60),
            4);
  EXPECT_GT(AwaitQuery(prom, "sum(atoll_rounds_total)", positive, 60), 0);
  EXPECT_GT(AwaitQuery(prom, "atoll_round_contributors_count", positive, 60), 0);
  EXPECT_EQ(Query(prom, "up{job=\"atoll\"}"), 1) << "scraped with the bearer token";
  p->Signal(SIGTERM);
  p->WaitOrKill(30);
  live.Stop();
}

// The rendered page (after its JavaScript ran): the round count and the learner rows.
struct Dom {
  int64_t rounds = -1;
  std::vector<int> learners;
};

// The DOM headless Chromium holds after running the page's scripts.
std::string DumpHtml(const std::string& dir, const std::string& url) {
  const std::string cmd =
      "timeout -k 5 60 /usr/bin/chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run "
      "--user-data-dir=" +
      dir + "/chromium --virtual-time-budget=4000 --dump-dom '" + url + "' 2>/dev/null";
  std::string html;
  if (FILE* f = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (size_t n = std::fread(buf, 1, sizeof(buf), f)) html.append(buf, n);
    ::pclose(f);
  }
  return html;
}

Dom DumpDom(const std::string& dir, const std::string& url) {
  const std::string html = DumpHtml(dir, url);
  Dom d;
  std::smatch m;
  if (std::regex_search(html, m, std::regex("<b id=\"rounds\">([0-9,]+)</b>"))) {
    std::string digits = m[1];
    digits.erase(std::remove(digits.begin(), digits.end(), ','), digits.end());
    d.rounds = std::stoll(digits);
  }
  const std::regex row("<tr id=\"learner-([0-9]+)\">");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), row); it != std::sregex_iterator(); ++it) {
    d.learners.push_back(std::stoi((*it)[1]));
  }
  return d;
}

TEST(ObserveLive, StatusPageRendersInHeadlessChromium) {
  ASSERT_TRUE(fs::exists("/usr/bin/chromium")) << "chromium is not installed (scripts/setup installs it)";
  LiveRun live;
  ASSERT_NO_FATAL_FAILURE(live.Start("observe_chromium"));
  const std::string url = "http://127.0.0.1:" + std::to_string(live.http_port) + "/?token=" + live.token;
  ASSERT_GT(live.AwaitRounds(0, 90), 0) << live.Log();
  const Dom first = DumpDom(live.dir, url);
  EXPECT_EQ(first.learners, (std::vector<int>{0, 1, 2, 3})) << "every learner has its row";
  ASSERT_GT(first.rounds, 0);
  ASSERT_GT(live.AwaitRounds(first.rounds, 60), first.rounds) << live.Log();
  const Dom second = DumpDom(live.dir, url);
  EXPECT_GT(second.rounds, first.rounds) << "the round count rises";
  // Without the token nothing is shown (the page itself needs it).
  const Dom refused = DumpDom(live.dir, "http://127.0.0.1:" + std::to_string(live.http_port) + "/");
  EXPECT_EQ(refused.rounds, -1);
  EXPECT_TRUE(refused.learners.empty());
  live.Stop(/*remove=*/false);
  // The report atoll run wrote at its end renders its three figures.
  const std::string report = DumpHtml(live.dir, "file://" + live.dir + "/run/report.html");
  size_t svgs = 0;
  for (size_t at = report.find("<svg"); at != std::string::npos; at = report.find("<svg", at + 1)) ++svgs;
  EXPECT_EQ(svgs, 3u) << live.Log();
  EXPECT_NE(report.find("Loss vs tokens"), std::string::npos);
  EXPECT_NE(report.find("<polyline"), std::string::npos);
  fs::remove_all(live.dir);
}

}  // namespace
}  // namespace atl
