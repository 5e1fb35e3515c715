// `atoll run`: a whole Decoupled DiLoCo cluster on this machine — one syncer and M learner
// processes started from this binary, live progress, and the run folder with its report.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include "atoll/core/checksum.h"
#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/core/rng.h"
#include "atoll/model/data.h"
#include "atoll/runtime/child_process.h"
#include "atoll/runtime/processes.h"
#include "atoll/transport/grpc.h"
#include "report.h"

namespace atl::runtime {
namespace {

std::atomic<bool> g_interrupted{false};
void OnInterrupt(int) { g_interrupted = true; }

std::string Timestamp() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

std::string TailOf(const std::string& path, size_t lines) {
  auto text = ReadFile(path);
  if (!text.ok()) return "";
  std::vector<std::string> all;
  std::string cur;
  for (char ch : *text) {
    if (ch == '\n') {
      all.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!cur.empty()) all.push_back(cur);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "    " + all[i] + "\n";
  return out;
}

StatusOr<int> WaitForPort(const std::string& port_file, ChildProcess& syncer, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!syncer.running()) return UnavailableError("the syncer exited before listening");
    auto text = ReadFile(port_file);
    if (text.ok() && !text->empty()) return std::stoi(*text);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return DeadlineExceededError("the syncer did not start listening within " + std::to_string(static_cast<int>(timeout_s)) + " s");
}

}  // namespace

int RunLocalCluster(const RunOptions& options) {
  RunConfig c = options.config;
  auto fail = [](const Status& st, int code) {
    std::fprintf(stderr, "atoll run: error: %s\n", st.ToString().c_str());
    return code;
  };
  if (Status st = ValidateRunConfig(c); !st.ok()) return fail(st, 2);
  if (c.out.empty()) c.out = "runs/" + Timestamp() + "-" + c.mode;
  if (Status st = MakeDirs(c.out); !st.ok()) return fail(st, 1);
  c.out = std::filesystem::absolute(c.out).lexically_normal().string();
  c.data = std::filesystem::absolute(c.data).lexically_normal().string();
  if (c.run_id.empty()) c.run_id = std::filesystem::path(c.out).filename().string();
  if (c.token.empty()) {
    Rng rng(static_cast<uint64_t>(UnixSeconds() * 1e6) ^ static_cast<uint64_t>(::getpid()));
    c.token = ChecksumHex(rng.NextU64()) + ChecksumHex(rng.NextU64());
  }
  std::printf("atoll run: %s, %d learners, %lld steps each, preset %s, P=%d H=%d tau=%d K=%d grace=%s, %s/%s on the wire\n",
              c.mode.c_str(), c.learners, static_cast<long long>(c.steps), c.preset.c_str(), c.fragments,
              c.H, c.tau, c.quorum, c.grace ? "on" : "off", c.uplink.c_str(), c.downlink.c_str());
  std::printf("run folder: %s\n", c.out.c_str());
  std::fflush(stdout);
  auto manifest = model::EnsureDataPrepared(c.data, [](const std::string& m) {
    std::printf("data: %s\n", m.c_str());
    std::fflush(stdout);
  });
  if (!manifest.ok()) return fail(manifest.status(), 2);
  const std::string config_path = c.out + "/config.json";
  if (Status st = WriteFileAtomic(config_path, ToJson(c).dump(2)); !st.ok()) return fail(st, 1);

  const std::string self = SelfExecutable();
  const std::string port_file = c.out + "/syncer.port";
  std::filesystem::remove(port_file);
  const double t0 = UnixSeconds();
  auto syncer = ChildProcess::Start({self, "syncer", "--config", config_path, "--listen", "127.0.0.1:0",
                                     "--port-file", port_file, "--out", c.out},
                                    c.out + "/syncer.log");
  if (!syncer.ok()) return fail(syncer.status(), 1);
  auto port = WaitForPort(port_file, *syncer, 300);
  if (!port.ok()) {
    std::fprintf(stderr, "atoll run: %s; syncer.log ends with:\n%s", port.status().ToString().c_str(),
                 TailOf(c.out + "/syncer.log", 15).c_str());
    return 1;
  }
  const std::string address = "127.0.0.1:" + std::to_string(*port);
  std::vector<ChildProcess> learners;
  for (int i = 0; i < c.learners; ++i) {
    auto l = ChildProcess::Start({self, "learner", "--config", config_path, "--id", std::to_string(i),
                                  "--syncer", address, "--out", c.out},
                                 c.out + "/learner-" + std::to_string(i) + ".log");
    if (!l.ok()) return fail(l.status(), 1);
    learners.push_back(std::move(*l));
  }
  transport::ClientOptions co;
  co.target = address;
  co.token = c.token;
  co.call_timeout_s = 5;
  auto client = transport::GrpcSyncerClient::Connect(co);
  if (!client.ok()) return fail(client.status(), 1);

  ::signal(SIGINT, OnInterrupt);
  ::signal(SIGTERM, OnInterrupt);
  ProgressView view(c, options.live && ::isatty(STDOUT_FILENO));
  double last_draw = 0;
  std::vector<int> failed;
  for (;;) {
    int running = 0;
    for (int i = 0; i < c.learners; ++i) {
      if (learners[static_cast<size_t>(i)].running()) {
        ++running;
      } else if (learners[static_cast<size_t>(i)].exit_code().value_or(0) != 0 &&
                 std::find(failed.begin(), failed.end(), i) == failed.end()) {
        failed.push_back(i);
        std::fprintf(stderr, "atoll run: learner %d exited with code %d; the others train on. learner-%d.log ends with:\n%s",
                     i, *learners[static_cast<size_t>(i)].exit_code(), i,
                     TailOf(c.out + "/learner-" + std::to_string(i) + ".log", 8).c_str());
      }
    }
    if (!syncer->running()) {
      std::fprintf(stderr, "atoll run: the syncer exited unexpectedly; syncer.log ends with:\n%s",
                   TailOf(c.out + "/syncer.log", 15).c_str());
      break;
    }
    const double now = UnixSeconds() - t0;
    if (now - last_draw >= 1.0) {
      auto st = (*client)->StatusJson();
      if (st.ok()) view.Draw(nlohmann::json::parse(*st), now);
      last_draw = now;
    }
    if (running == 0 || g_interrupted) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (g_interrupted) {
    std::fprintf(stderr, "\natoll run: interrupted; stopping learners and asking the syncer for its summary\n");
    for (auto& l : learners) l.Signal(SIGTERM);
  }
  for (auto& l : learners) l.WaitOrKill(10);

  std::printf("\nall learners finished; evaluating the global model ...\n");
  std::fflush(stdout);
  nlohmann::json syncer_summary;
  if (syncer->running()) {
    auto fin = (*client)->Finish(/*evaluate=*/true);
    if (fin.ok()) {
      syncer_summary = nlohmann::json::parse(*fin);
    } else {
      std::fprintf(stderr, "atoll run: the syncer did not finish cleanly: %s\n", fin.status().ToString().c_str());
    }
  }
  syncer->WaitOrKill(30);
  const double wall = UnixSeconds() - t0;
  auto summary = BuildRunSummary(c, syncer_summary, wall);
  MergeMetrics(c);
  if (Status st = WriteFileAtomic(c.out + "/summary.json", summary.dump(2)); !st.ok()) return fail(st, 1);
  std::printf("%s", FormatReport(summary).c_str());
  std::printf("run folder: %s (summary.json, metrics.jsonl, global.safetensors, logs)\n", c.out.c_str());
  return failed.empty() && !syncer_summary.is_null() ? 0 : 1;
}

}  // namespace atl::runtime
