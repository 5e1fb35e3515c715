// `atoll run`: a whole Decoupled DiLoCo cluster on this machine — one syncer and M learner
// processes started from this binary, the chaos schedule applied to them, live progress, and the
// run folder with its report.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <thread>

#include "atoll/core/checksum.h"
#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/core/rng.h"
#include "atoll/core/text.h"
#include "atoll/model/data.h"
#include "atoll/runtime/processes.h"
#include "atoll/transport/grpc.h"
#include "cluster.h"
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

}  // namespace

int RunLocalCluster(const RunOptions& options) {
  RunConfig c = Normalized(options.config);  // idempotent; library callers may skip the CLI
  auto fail = [](const Status& st, int code) {
    std::fprintf(stderr, "atoll run: error: %s\n", st.ToString().c_str());
    return code;
  };
  if (Status st = ValidateRunConfig(c); !st.ok()) return fail(st, 2);
  if (c.out.empty()) c.out = "runs/" + Timestamp() + "-" + diloco::ModeName(c.mode);
  if (Status st = MakeDirs(c.out); !st.ok()) return fail(st, 1);
  c.out = std::filesystem::absolute(c.out).lexically_normal().string();
  c.data = std::filesystem::absolute(c.data).lexically_normal().string();
  if (FileExists(c.out + "/state/meta.json")) {
    return fail(FailedPreconditionError("run folder " + c.out + " already holds a run (state/); choose a new --out"), 2);
  }
  if (c.run_id.empty()) c.run_id = std::filesystem::path(c.out).filename().string();
  // Per-learner credentials unless a shared token was given (docs/security.md).
  std::string client_token = c.token;
  if (c.token.empty()) {
    auto operator_token = WriteRunCredentials(c);
    if (!operator_token.ok()) return fail(operator_token.status(), 1);
    client_token = *operator_token;
  }
  // The fault schedule: fixed before anything starts, written to the run folder.
  auto schedule = chaos::BuildSchedule(c.chaos, c.learners, 24 * 3600.0);
  if (!schedule.ok()) return fail(schedule.status(), 2);
  std::printf("atoll run: %s, %d learners, %lld steps each, preset %s, P=%d H=%d tau=%d K=%d grace=%s, %s/%s on the wire\n",
              diloco::ModeName(c.mode), c.learners, static_cast<long long>(c.steps), c.preset.c_str(), c.fragments,
              c.H, c.tau, c.quorum, c.grace ? "on" : "off", c.uplink.c_str(), c.downlink.c_str());
  if (!schedule->empty()) {
    std::printf("chaos (%s, seed %llu): %zu fault(s) scheduled, the first: %s\n", c.chaos.mode.c_str(),
                static_cast<unsigned long long>(c.chaos.seed), schedule->size(), schedule->front().ToJson().dump().c_str());
  }
  std::printf("run folder: %s\n", c.out.c_str());
  std::fflush(stdout);
  auto manifest = model::EnsureDataPrepared(c.data, [](const std::string& m) {
    std::printf("%s\n", m.c_str());  // the lines carry their own "data: " prefix
    std::fflush(stdout);
  });
  if (!manifest.ok()) return fail(manifest.status(), 2);
  const std::string config_path = c.out + "/config.json";
  if (Status st = WriteFileAtomic(config_path, ToJson(c).dump(2)); !st.ok()) return fail(st, 1);
  std::error_code perm_ec;  // it may hold a shared token: readable by the owner only
  std::filesystem::permissions(config_path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write,
                               std::filesystem::perm_options::replace, perm_ec);
  nlohmann::json planned = nlohmann::json::array();
  for (const auto& e : *schedule) planned.push_back(e.ToJson());
  if (Status st = WriteFileAtomic(c.out + "/chaos-schedule.json", planned.dump(2)); !st.ok()) return fail(st, 1);

  Cluster cluster(c, config_path);
  if (Status st = cluster.StartSyncer(); !st.ok()) return fail(st, 1);
  const double t0 = UnixSeconds();
  for (int i = 0; i < c.learners; ++i) {
    if (Status st = cluster.StartLearner(i, false, 0); !st.ok()) return fail(st, 1);
  }
  transport::ClientOptions co;
  co.target = cluster.address();
  co.token = client_token;
  co.call_timeout_s = 3;
  auto client = transport::GrpcSyncerClient::Connect(co);
  if (!client.ok()) return fail(client.status(), 1);

  ::signal(SIGINT, OnInterrupt);
  ::signal(SIGTERM, OnInterrupt);
  ProgressView view(c, options.live && ::isatty(STDOUT_FILENO));
  double last_poll = -1;
  size_t next_fault = 0;
  std::vector<bool> step_fault_done(schedule->size(), false);
  std::vector<int> failed;
  for (;;) {
    const double now = UnixSeconds() - t0;
    // Time-triggered faults.
    while (next_fault < schedule->size() && (*schedule)[next_fault].at_step < 0 &&
           (*schedule)[next_fault].at_s <= now) {
      cluster.Inject((*schedule)[next_fault], now);
      step_fault_done[next_fault] = true;
      ++next_fault;
    }
    cluster.Tick(now);
    for (int id : cluster.ReapLearners(now)) failed.push_back(id);
    if (cluster.syncer().running() == false && !cluster.syncer_down()) {
      std::fprintf(stderr, "atoll run: the syncer exited unexpectedly; syncer.log ends with:\n%s",
                   TailOf(c.out + "/syncer.log", 15).c_str());
      break;
    }
    if (now - last_poll >= 1.0) {
      last_poll = now;
      auto st = cluster.syncer_down() ? StatusOr<std::string>(UnavailableError("syncer down")) : (*client)->StatusJson();
      if (st.ok()) {
        auto status = nlohmann::json::parse(*st, nullptr, false);
        if (!status.is_discarded()) {
          if (status.contains("versions")) cluster.set_versions(status["versions"].get<std::vector<int64_t>>());
          for (const auto& l : status.value("learners", nlohmann::json::array())) {
            const int id = l.value("id", -1);
            if (id >= 0 && id < c.learners) {
              auto& slot = cluster.learners()[static_cast<size_t>(id)];
              slot.last_step = std::max(slot.last_step, l.value("step", int64_t{0}));
            }
          }
          // Step-triggered faults.
          for (size_t i = 0; i < schedule->size(); ++i) {
            const auto& e = (*schedule)[i];
            if (step_fault_done[i] || e.at_step < 0) continue;
            const int target = e.kind == chaos::FaultKind::kKillSyncer ? 0 : e.target;
            if (cluster.learners()[static_cast<size_t>(target)].last_step >= e.at_step) {
              cluster.Inject(e, now);
              step_fault_done[i] = true;
            }
          }
          view.Draw(status, now);
        }
      } else {
        view.DrawLine(now, "syncer unreachable (" + st.status().message() + "); learners train on");
      }
    }
    if (cluster.AllLearnersFinished() || g_interrupted) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (g_interrupted) {
    std::fprintf(stderr, "\natoll run: interrupted; stopping learners and asking the syncer for its summary\n");
    for (auto& l : cluster.learners()) l.process.Signal(SIGTERM);
  }
  for (auto& l : cluster.learners()) {
    l.process.Signal(SIGCONT);
    l.process.WaitOrKill(10);
  }
  if (cluster.syncer_down()) {
    // The run ended while the syncer was down: bring it back from its durable state to report.
    (void)cluster.StartSyncer();
  }
  std::printf("\nall learners finished; evaluating the global model ...\n");
  std::fflush(stdout);
  nlohmann::json syncer_summary;
  if (cluster.syncer().running()) {
    // Retried: on a loaded machine (or right after a syncer restart) the first call may time out.
    auto fin = (*client)->Finish(/*evaluate=*/true);
    for (int attempt = 1; attempt < 20 && !fin.ok() && cluster.syncer().running() &&
                          (fin.status().code() == StatusCode::kUnavailable ||
                           fin.status().code() == StatusCode::kDeadlineExceeded);
         ++attempt) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      fin = (*client)->Finish(/*evaluate=*/true);
    }
    if (fin.ok()) {
      syncer_summary = nlohmann::json::parse(*fin);
    } else {
      std::fprintf(stderr, "atoll run: the syncer did not finish cleanly: %s\n", fin.status().ToString().c_str());
    }
  }
  cluster.syncer().WaitOrKill(30);
  const double wall = UnixSeconds() - t0;
  MergeMetrics(c);
  auto summary = BuildRunSummary(c, syncer_summary, wall);
  AddAccounting(c, cluster, t0, wall, summary);
  if (Status st = WriteFileAtomic(c.out + "/summary.json", DumpJson(summary, 2)); !st.ok()) return fail(st, 1);
  std::printf("%s", FormatReport(summary).c_str());
  std::printf("run folder: %s (summary.json, metrics.jsonl, faults.jsonl, global.safetensors, logs)\n", c.out.c_str());
  return failed.empty() && !syncer_summary.is_null() ? 0 : 1;
}

}  // namespace atl::runtime
