// `atoll run`: a whole Decoupled DiLoCo cluster on this machine — one syncer and M learner
// processes started from this binary, the chaos schedule applied to them, live progress, and the
// run folder with its report.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <thread>

#include "atoll/core/checksum.h"
#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/core/rng.h"
#include "atoll/core/text.h"
#include "atoll/model/data.h"
#include "atoll/observe/http_server.h"
#include "atoll/observe/run_report.h"
#include "atoll/runtime/export.h"
#include "atoll/runtime/local_cluster.h"
#include "atoll/runtime/secrets.h"
#include "atoll/transport/grpc_client.h"
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

namespace {

int Fail(const Status& st, int code) {
  std::fprintf(stderr, "atoll run: error: %s\n", st.ToString().c_str());
  return code;
}

// `atoll run` in named stages: Prepare (run folder, id, token, fault schedule, data, config),
// Start (syncer and learners), Supervise (faults, restarts, the live view, until every learner
// finished), Stop (learners, then the syncer's Finish), Report (summary.json and the report).
class LocalCluster {
 public:
  explicit LocalCluster(const RunOptions& options) : options_(options), c_(Normalized(options.config)) {}

  int Run() {
    if (int rc = Prepare(); rc != 0) return rc;
    cluster_ = std::make_unique<Cluster>(c_, c_.out + "/config.json");
    chaos_ = std::make_unique<ChaosInjector>(*cluster_, schedule_);
    if (int rc = Start(); rc != 0) return rc;
    Supervise();
    const nlohmann::json syncer_summary = Stop();
    const double wall = UnixSeconds() - t0_;
    MergeMetrics(c_);
    auto summary = BuildRunSummary(c_, syncer_summary, wall);
    AddAccounting(c_, *cluster_, t0_, wall, summary);
    if (Status st = WriteFileAtomic(c_.out + "/summary.json", DumpJson(summary, 2)); !st.ok()) return Fail(st, 1);
    std::printf("%s", FormatReport(summary).c_str());
    if (auto report = observe::WriteRunReport(c_.out); report.ok()) {
      std::printf("report with plots: %s\n", report->path.c_str());
    } else {
      std::fprintf(stderr, "atoll run: warning: no report.html: %s\n", report.status().ToString().c_str());
    }
    std::printf("run folder: %s (summary.json, report.html, metrics.jsonl, faults.jsonl, global.safetensors, logs)\n",
                c_.out.c_str());
    return failed_.empty() && !syncer_summary.is_null() ? 0 : 1;
  }

 private:
  int Prepare() {
    if (Status st = ValidateRunConfig(c_); !st.ok()) return Fail(st, 2);
    if (c_.out.empty()) c_.out = "runs/" + Timestamp() + "-" + diloco::ModeName(c_.mode);
    if (Status st = MakeDirs(c_.out); !st.ok()) return Fail(st, 1);
    c_.out = std::filesystem::absolute(c_.out).lexically_normal().string();
    c_.data = std::filesystem::absolute(c_.data).lexically_normal().string();
    if (FileExists(c_.out + "/state/meta.json") || FileExists(c_.out + "/syncer-0/state/meta.json")) {
      return Fail(FailedPreconditionError("run folder " + c_.out + " already holds a run (state/); choose a new --out"),
                  2);
    }
    if (c_.run_id.empty()) c_.run_id = std::filesystem::path(c_.out).filename().string();
    // Per-learner credentials unless a shared token was given (docs/security.md).
    client_token_ = c_.token;
    if (c_.token.empty()) {
      auto operator_token = WriteRunCredentials(c_);
      if (!operator_token.ok()) return Fail(operator_token.status(), 1);
      client_token_ = *operator_token;
    }
    // The fault schedule: fixed before anything starts, written to the run folder.
    auto schedule = chaos::BuildSchedule(c_.chaos, c_.learners, 24 * 3600.0);
    if (!schedule.ok()) return Fail(schedule.status(), 2);
    schedule_ = std::move(*schedule);
    std::printf(
        "atoll run: %s, %d learners, %lld steps each, preset %s, P=%d H=%d tau=%d K=%d grace=%s, %s/%s on the wire\n",
        diloco::ModeName(c_.mode), c_.learners, static_cast<long long>(c_.steps), c_.preset.c_str(), c_.fragments, c_.H,
        c_.tau, c_.quorum, c_.grace ? "on" : "off", diloco::EncodingName(c_.uplink), diloco::EncodingName(c_.downlink));
    if (!schedule_.empty()) {
      std::printf("chaos (%s, seed %llu): %zu fault(s) scheduled, the first: %s\n", chaos::ChaosModeName(c_.chaos.mode),
                  static_cast<unsigned long long>(c_.chaos.seed), schedule_.size(),
                  schedule_.front().ToJson().dump().c_str());
    }
    std::printf("run folder: %s\n", c_.out.c_str());
    std::fflush(stdout);
    auto manifest = model::EnsureDataPrepared(c_.data, [](const std::string& m) {
      std::printf("%s\n", m.c_str());  // the lines carry their own "data: " prefix
      std::fflush(stdout);
    });
    if (!manifest.ok()) return Fail(manifest.status(), 2);
    // It may hold a shared token: readable by the owner only.
    if (Status st = WriteFileOwnerOnly(c_.out + "/config.json", ToJson(c_).dump(2)); !st.ok()) return Fail(st, 1);
    nlohmann::json planned = nlohmann::json::array();
    for (const auto& e : schedule_) planned.push_back(e.ToJson());
    if (Status st = WriteFileAtomic(c_.out + "/chaos-schedule.json", planned.dump(2)); !st.ok()) return Fail(st, 1);
    return 0;
  }

  int Start() {
    if (Status st = cluster_->StartSyncer(); !st.ok()) return Fail(st, 1);
    t0_ = UnixSeconds();
    for (int i = 0; i < c_.learners; ++i) {
      if (Status st = cluster_->StartLearner(i, false, 0); !st.ok()) return Fail(st, 1);
    }
    for (const auto& shard : cluster_->shards()) {  // shard 0 first: the status calls go there
      transport::ClientOptions co;
      co.target = shard.address;
      co.token = client_token_;
      co.call_timeout_s = 3;
      auto client = transport::GrpcSyncerClient::Connect(co);
      if (!client.ok()) return Fail(client.status(), 1);
      clients_.push_back(std::move(*client));
    }
    if (cluster_->http_port() > 0) {  // the token in the URL, as notebook servers print theirs
      std::printf("status page: http://127.0.0.1:%d/?token=%s  (Prometheus: /metrics with that token as bearer)\n",
                  cluster_->http_port(), observe::QueryEscaped(client_token_).c_str());
      std::fflush(stdout);
    }
    ::signal(SIGINT, OnInterrupt);
    ::signal(SIGTERM, OnInterrupt);
    return 0;
  }

  void Supervise() {
    ProgressView view(c_, options_.live && ::isatty(STDOUT_FILENO));
    double last_poll = -1;
    for (;;) {
      const double now = UnixSeconds() - t0_;
      chaos_->InjectDue(now);
      cluster_->Tick(now);
      for (int id : cluster_->ReapLearners(now)) failed_.push_back(id);
      for (int k = 0; k < static_cast<int>(cluster_->shards().size()); ++k) {
        SyncerSlot& shard = cluster_->shards()[static_cast<size_t>(k)];
        if (shard.process.running() || shard.down) continue;
        std::fprintf(stderr, "atoll run: the syncer exited unexpectedly; %s ends with:\n%s",
                     cluster_->ShardLog(k).c_str(), TailOf(cluster_->ShardLog(k), 15).c_str());
        return;
      }
      if (now - last_poll >= 1.0) {
        last_poll = now;
        PollStatus(view, now);
      }
      if (cluster_->AllLearnersFinished() || g_interrupted) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  // The syncer's status: learners' steps (for step-triggered faults and restarts), the live view.
  void PollStatus(ProgressView& view, double now) {
    auto st = cluster_->shards().front().down ? StatusOr<std::string>(UnavailableError("syncer down"))
                                              : clients_.front()->StatusJson();
    if (!st.ok()) {
      view.DrawLine(now, "syncer unreachable (" + st.status().message() + "); learners train on");
      return;
    }
    auto status = nlohmann::json::parse(*st, nullptr, false);
    if (status.is_discarded()) return;
    if (status.contains("versions")) {
      auto versions = status["versions"].get<std::vector<int64_t>>();
      if (status.contains("owned_fragments")) {  // a shard: only its own fragments move
        std::vector<int64_t> owned;
        for (int p : status["owned_fragments"].get<std::vector<int>>())
          owned.push_back(versions.at(static_cast<size_t>(p)));
        versions = std::move(owned);
      }
      cluster_->set_versions(std::move(versions));
    }
    for (const auto& l : status.value("learners", nlohmann::json::array())) {
      const int id = l.value("id", -1);
      if (id >= 0 && id < c_.learners) {
        auto& slot = cluster_->learners()[static_cast<size_t>(id)];
        slot.last_step = std::max(slot.last_step, l.value("step", int64_t{0}));
      }
    }
    chaos_->InjectReached(now);
    view.Draw(status, now);
  }

  // Learners stopped, then the syncer's Finish (final merge, evaluation, model); its summary.
  nlohmann::json Stop() {
    if (g_interrupted) {
      std::fprintf(stderr, "\natoll run: interrupted; stopping learners and asking the syncer for its summary\n");
      for (auto& l : cluster_->learners()) l.process.Signal(SIGTERM);
    }
    for (auto& l : cluster_->learners()) {
      l.process.Signal(SIGCONT);
      l.process.WaitOrKill(10);
    }
    // The run ended while the syncer was down: bring it back from its durable state to report.
    if (cluster_->syncer_down()) (void)cluster_->StartSyncer();
    std::printf("\nall learners finished; evaluating the global model ...\n");
    std::fflush(stdout);
    if (cluster_->shards().size() == 1) return FinishShard(0, /*evaluate=*/true);
    // Sharded: every shard's final merge, then the global model from their committed states.
    std::vector<nlohmann::json> shards;
    for (int k = 0; k < static_cast<int>(cluster_->shards().size()); ++k) {
      shards.push_back(FinishShard(k, /*evaluate=*/false));
      if (shards.back().is_null()) return nullptr;
    }
    std::vector<std::string> states;
    for (int k = 0; k < static_cast<int>(shards.size()); ++k) states.push_back(cluster_->ShardOut(k) + "/state");
    auto combined = CombineShardSummaries(c_, shards, states);
    if (combined.ok()) return *combined;
    std::fprintf(stderr, "atoll run: cannot combine the shards' states: %s\n", combined.status().ToString().c_str());
    return nullptr;
  }

  // Shard k's Finish (final merge; with `evaluate` the evaluation and global.safetensors) and
  // its summary; null when it did not finish.
  nlohmann::json FinishShard(int k, bool evaluate) {
    SyncerSlot& shard = cluster_->shards()[static_cast<size_t>(k)];
    transport::GrpcSyncerClient& client = *clients_[static_cast<size_t>(k)];
    nlohmann::json summary;
    if (shard.process.running()) {
      // Retried: on a loaded machine (or right after a syncer restart) the first call may time out.
      auto fin = client.Finish(evaluate);
      for (int attempt = 1;
           attempt < 20 && !fin.ok() && shard.process.running() &&
           (fin.status().code() == StatusCode::kUnavailable || fin.status().code() == StatusCode::kDeadlineExceeded);
           ++attempt) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        fin = client.Finish(evaluate);
      }
      if (fin.ok()) {
        summary = nlohmann::json::parse(*fin);
      } else {
        std::fprintf(stderr, "atoll run: the syncer did not finish cleanly: %s\n", fin.status().ToString().c_str());
      }
    }
    shard.process.WaitOrKill(30);
    // Ctrl-C reaches the syncer too: it finishes by itself (final merge, evaluation, model) and
    // may be gone before our Finish call; its final summary is on disk.
    if (summary.is_null()) {
      auto text = ReadFile(cluster_->ShardOut(k) + "/syncer-summary.json");
      auto on_disk = text.ok() ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
      if (on_disk.is_object() && on_disk.value("final", false)) summary = on_disk;
    }
    return summary;
  }

  const RunOptions& options_;
  RunConfig c_;
  std::string client_token_;  // the operator token (per-learner credentials) or the shared token
  std::vector<chaos::FaultEvent> schedule_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<ChaosInjector> chaos_;
  std::vector<std::unique_ptr<transport::GrpcSyncerClient>> clients_;  // one per syncer shard
  double t0_ = 0;
  std::vector<int> failed_;
};

}  // namespace

int RunLocalCluster(const RunOptions& options) { return LocalCluster(options).Run(); }

}  // namespace atl::runtime
