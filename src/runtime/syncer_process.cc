// `atoll syncer`: the global model, the rounds, the gRPC service, the final evaluation.
#include <csignal>
#include <filesystem>
#include <cstdio>
#include <thread>

#include <fmt/format.h>

#include "atoll/core/checksum.h"
#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/core/text.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/observe/http_server.h"
#include "atoll/runtime/run_options.h"
#include "atoll/runtime/syncer_process.h"
#include "atoll/syncer/commit_headroom.h"
#include "atoll/syncer/syncer_loop.h"
#include "atoll/transport/credentials.h"
#include "atoll/transport/grpc_server.h"
#include "checkpoint_writer.h"
#include "global_eval.h"
#include "model_host.h"
#include "round_committer.h"
#include "round_log.h"
#include "replicator.h"
#include "syncer_leadership.h"
#include "syncer_start.h"
#include "syncer_status_page.h"
#include "syncer_summary.h"

namespace atl::runtime {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

// What ended a syncer's run.
enum class EndReason { kFinished, kSignal, kLearnersDone, kFenced };
const char* EndReasonText(EndReason r) {
  switch (r) {
    case EndReason::kFinished: return "run finished";
    case EndReason::kSignal: return "signal";
    case EndReason::kLearnersDone: return "every learner done";
    case EndReason::kFenced: return "leadership lapsed";
  }
  return "?";
}

// Descriptors kept for commits (CommitHeadroom): a commit holds at most a temp file and the folder
// open at once; the rest is slack for the learner table, copies and metrics.
constexpr int kCommitFds = 16;

// `atoll syncer` in named stages: Setup (model, plan, Θ⁰, core restored from its durable state,
// start evaluation), Serve (gRPC, and HTTP with --http, until Finish, a signal or every learner
// done), and the finish. The parts each own one job: RoundCommitter (the loop thread's work after a
// round), CheckpointWriter (model writes), RoundLog (metrics), SyncerSummary, SyncerStatusPage,
// GlobalEvaluator (the live evaluation's thread).
// Threads (docs/architecture.md#threading): the main thread runs Run and waits; the loop thread
// runs the committer; a gRPC thread may run Finish (serialised by finish_mu_); the live
// evaluator's thread runs OnGlobalEval; HTTP handler threads read the status document.
class SyncerProcess {
 public:
  explicit SyncerProcess(const SyncerProcessOptions& opt)
      : opt_(opt), c_(Normalized(opt.config)), out_(opt.out_dir.empty() ? "." : opt.out_dir) {}

  // Exit code and message for each failure; 0 when the run finished or was stopped cleanly.
  int Run() {
    if (Status st = CheckOptions(); !st.ok()) return SyncerFail(st, 2);
    if (Status st = MakeDirs(out_); !st.ok()) return SyncerFail(st, 1);
    if (Status st = WriteRunConfigOnce(out_, c_); !st.ok()) return SyncerFail(st, 1);
    RaiseDescriptorLimit();
    if (!opt_.etcd.empty()) {  // a standby until it leads; SIGTERM stops it while it waits
      if (int rc = HoldPort(); rc != 0) return rc;
      std::signal(SIGTERM, OnSignal);
      std::signal(SIGINT, OnSignal);
      auto follow = FollowerOptions();
      if (!follow.ok()) return SyncerFail(follow.status(), 2);
      if (int rc = lead_.Campaign(opt_, c_.run_id, shard_, AdvertisedAddress(), *follow, g_stop);
          rc != 0 || !lead_.active()) {
        return rc;
      }
    }
    if (int rc = Setup(); rc != 0) return rc;
    // Rounds close only while a commit can succeed: otherwise they are held (commit_headroom.h).
    headroom_ = std::make_unique<syncer::CommitHeadroom>(
        opened_.durable->dir(), syncer::CommitBytes(plan_, static_cast<uint64_t>(c_.commit_reserve_mb * (1 << 20))),
        kCommitFds);
    committer_ = std::make_unique<RoundCommitter>(*opened_.durable, *headroom_, *log_, *checkpoints_, *summary_, plan_,
                                                  out_, opt_.checkpoint_every, replicator_.get());
    if (opened_.rebuild) BeginRebuild();
    loop_ = std::make_unique<syncer::SyncerLoop>(
        std::move(*opened_.core), clock_,
        [this](const syncer::SyncerCore& sc, const syncer::RoundReport& r) {
          committer_->Commit(sc, r, clock_.Now());
          OfferGlobalEval(sc);
        },
        std::chrono::milliseconds(50),
        [this](const syncer::SyncerCore&) {
          // A leader whose lease may have lapsed closes no round (docs/decisions/022).
          if (!lead_.leading()) return UnavailableError("this syncer's leadership lapsed");
          return headroom_->Check();
        });
    return Serve();
  }

 private:
  // Where the other candidates reach this one when it leads: --advertise, else --listen's host
  // with the held port.
  std::string AdvertisedAddress() const {
    if (!opt_.advertise.empty()) return opt_.advertise;
    const size_t colon = opt_.listen.rfind(':');
    return opt_.listen.substr(0, colon == std::string::npos ? opt_.listen.size() : colon) + ":" +
           std::to_string(held_port_->port());
  }

  // How this candidate follows the leader's commits while a standby (docs/decisions/023): with the
  // operator's credentials and, when the candidates serve TLS, --tls-ca (and for mutual TLS its own
  // certificate). nullopt with --replicate off.
  StatusOr<std::optional<ReplicaFollowerOptions>> FollowerOptions() const {
    if (!opt_.replicate) return std::optional<ReplicaFollowerOptions>();
    ReplicaFollowerOptions f;
    f.state_dir = StateDirOf(opt_);
    f.client.token = c_.token;
    if (!opt_.secret_file.empty()) {
      ATOLL_ASSIGN_OR_RETURN(std::string secret, ReadSecretFile(opt_.secret_file));
      f.client.token = transport::OperatorToken(secret, c_.run_id);
    }
    f.client.tls.enabled = !opt_.tls.cert.empty();
    f.client.tls.ca_file = opt_.tls.ca;
    f.client.tls.server_name = opt_.tls.server_name;
    if (!opt_.tls.client_ca.empty()) {
      f.client.tls.cert_file = opt_.tls.cert;
      f.client.tls.key_file = opt_.tls.key;
    }
    return std::optional<ReplicaFollowerOptions>(std::move(f));
  }

  // A leader with --replicate on keeps the log its standbys follow; the replica set in etcd starts
  // empty under it, before it serves.
  int StartReplication() {
    if (!lead_.active() || !opt_.replicate) return 0;
    std::vector<std::string> files = {"eval-start.json", "learners.json"};
    for (int p = 0; p < plan_.num_fragments(); ++p) {
      if (opened_.core->owns(p)) files.push_back(syncer::DurableState::FragmentFileName(p));
    }
    files.push_back("meta.json");  // last: a snapshot is complete once it is there
    ReplicatorOptions ro{lead_.candidate_id(), lead_.epoch(), opt_.replica_timeout_s,
                         [this](const std::string& v) { return lead_.PutReplicas(v); },
                         [this] { return lead_.leading(); }};
    replicator_ = std::make_unique<Replicator>(std::make_shared<syncer::ReplicationLog>(lead_.epoch(), files), ro);
    if (Status st = replicator_->Reset(); !st.ok()) return SyncerFail(st.WithContext("leadership: replica set"), 1);
    return 0;
  }

  // --rebuild (docs/decisions/021): copies are adopted from now until the wait ends.
  void BeginRebuild() {
    opened_.core->BeginRebuild(clock_.Now() + FromSeconds(opt_.rebuild_wait_s), c_.learners);
    std::printf(
        "syncer: rebuild: the durable state was lost; starting from the run's initial model and adopting the "
        "learners' newest public copies for %g s before any round closes, or until all %d learners have offered "
        "theirs (outer momentum, sweeps and the learner table's accounting start from zero)\n",
        opt_.rebuild_wait_s, c_.learners);
    std::fflush(stdout);
    log_->Line({{"t", UnixSeconds()}, {"source", "syncer"}, {"kind", "rebuild"}, {"wait_s", opt_.rebuild_wait_s}});
  }

  // A candidate's gRPC port is bound from the start, so the learners can be given its address; it
  // refuses every connection until this candidate leads (transport::HeldPort).
  int HoldPort() {
    auto so = ServerOptionsOf(opt_, c_);
    if (!so.ok()) return SyncerFail(so.status(), 2);
    auto held = transport::HeldPort::Bind(so->address, so->limits);
    if (!held.ok()) return SyncerFail(held.status(), 1);
    held_port_ = *held;
    std::printf("syncer: candidate port %d held (connections are refused until this candidate leads)\n",
                held_port_->port());
    std::fflush(stdout);
    return WritePortFile(held_port_->port());
  }

  int WritePortFile(int port) {
    if (opt_.port_file.empty()) return 0;
    if (Status st = WriteFileAtomic(opt_.port_file, std::to_string(port)); !st.ok()) return SyncerFail(st, 1);
    return 0;
  }

  // Another candidate led since this disk's state was written: that state is behind the run (or
  // diverged from it, if this process committed rounds after its lease lapsed) and is moved aside,
  // never resumed nor deleted; the learners' copies rebuild the core.
  int SetStateAside() {
    const std::string dir = StateDirOf(opt_);
    std::error_code ec;
    if (!std::filesystem::exists(dir, ec) || std::filesystem::is_empty(dir, ec)) return 0;
    const std::string aside = SupersededDirOf(dir, lead_.epoch());
    std::filesystem::rename(dir, aside, ec);
    if (ec) return SyncerFail(InternalError("moving " + dir + " aside to " + aside + ": " + ec.message()), 1);
    std::printf(
        "syncer: another candidate led this shard since %s was written: moved it to %s (kept, not resumed); "
        "rebuilding from the learners\n",
        dir.c_str(), aside.c_str());
    return 0;
  }

  // The flags against the run file: the shard, the HTTP address and its credentials.
  Status CheckOptions() {
    ATOLL_RETURN_IF_ERROR(ValidateRunConfig(c_));
    if (!(opt_.rebuild_wait_s > 0 && opt_.rebuild_wait_s <= kMaxRebuildWaitSeconds)) {
      return InvalidArgumentError(fmt::format("--rebuild-wait {} is out of range: give seconds in (0, {}]",
                                              opt_.rebuild_wait_s, kMaxRebuildWaitSeconds));
    }
    if (!(opt_.replica_timeout_s > 0 && opt_.replica_timeout_s <= 60)) {
      return InvalidArgumentError(
          fmt::format("--replica-timeout {} is out of range: give seconds in (0, 60]", opt_.replica_timeout_s));
    }
    if (!opt_.shard.empty()) {
      ATOLL_ASSIGN_OR_RETURN(shard_, syncer::ParseShardSpec(opt_.shard));
    }
    if (c_.syncer_shards > 1 && shard_.count != c_.syncer_shards) {  // the run file's S, when it says one
      return InvalidArgumentError("the run file has syncer_shards = " + std::to_string(c_.syncer_shards) +
                                  ": start each shard with --shard i/" + std::to_string(c_.syncer_shards) +
                                  (opt_.shard.empty() ? "" : " (not --shard " + opt_.shard + ")"));
    }
    if (opt_.http.empty()) return Status::Ok();
    if (auto hp = observe::SplitHostPort(opt_.http); !hp.ok()) return hp.status().WithContext("--http");
    if (!IsLoopbackAddress(opt_.http) && c_.token.empty() && opt_.secret_file.empty()) {  // as for --listen
      return FailedPreconditionError("refusing to serve the HTTP status endpoint on " + opt_.http +
                                     " without credentials: anyone who reaches it would see the run's status "
                                     "(give --secret-file or --token, or a loopback --http address)");
    }
    return Status::Ok();
  }

  int Setup() {
    auto host = ModelHost::Open(c_, /*evaluate=*/shard_.count == 1);  // a shard holds only its fragments of Θ
    if (!host.ok()) return SyncerFail(host.status(), 2);
    model_ = std::move(*host);
    if (c_.mode == diloco::Mode::kDdp && model_->evaluator() == nullptr) {
      return SyncerFail(
          FailedPreconditionError("ddp mode needs an atoll preset (its optimizer is an atoll Trainer's): " +
                                  model_->no_evaluation()),
          2);
    }
    auto plan = MakePlan(c_, model_->tensors());
    if (!plan.ok()) return SyncerFail(plan.status(), 2);
    plan_ = std::move(*plan);
    syncer::SyncerOptions sopts = MakeSyncerOptions(c_);
    sopts.incarnation = static_cast<uint64_t>(UnixSeconds() * 1e6) ^ static_cast<uint64_t>(::getpid());
    if (c_.mode == diloco::Mode::kDdp) sopts.ddp_step = MakeDdpStep(*model_, plan_);
    sopts.shard = shard_;
    sopts.leadership = {lead_.epoch(), lead_.candidate_id(), lead_.run_began(), lead_.from_replica()};
    if (lead_.another_led()) {
      if (int rc = SetStateAside(); rc != 0) return rc;
    }
    if (int rc = OpenCore(c_, opt_, *model_, plan_, std::move(sopts), opened_, lead_.run_began()); rc != 0) return rc;
    if (int rc = StartReplication(); rc != 0) return rc;
    if (Status st = lead_.MarkBegan(); !st.ok()) return SyncerFail(st.WithContext("leadership"), 1);
    PrintRun();
    log_ = std::make_unique<RoundLog>(out_ + "/metrics-syncer.jsonl");
    summary_ = std::make_unique<SyncerSummary>(*model_, plan_, *log_);
    if (replicator_) summary_->set_replication([r = replicator_.get()] { return r->Stats(); });
    checkpoints_ = std::make_unique<CheckpointWriter>(*model_, plan_, out_, c_.run_id, shard_.count == 1);
    auto start_eval = StartEvaluation(*model_, opened_, c_.eval_batches);
    if (!start_eval.ok()) return SyncerFail(start_eval.status(), 1);
    if (*start_eval) summary_->set_start_eval_loss(**start_eval);
    if (opened_.resumed) LogResumed();
    return StartLiveEval();
  }

  void PrintRun() const {
    if (shard_.count > 1) {
      std::printf("syncer: shard %s: owns the fragments p with p mod %d = %d\n", shard_.ToString().c_str(),
                  shard_.count, shard_.index);
    }
    std::printf(
        "syncer: run %s, mode %s, model %s in %d fragments (peak/ideal %.3f), H=%d tau=%d K=%d grace=%s merge=%s, outer step %s (lr %g, momentum %g), up %s down %s\n",
        c_.run_id.c_str(), diloco::ModeName(c_.mode), model_->Describe().c_str(), plan_.num_fragments(),
        plan_.peak_to_ideal, c_.H, c_.tau, c_.quorum, c_.grace ? "on" : "off", diloco::MergeRuleName(c_.merge),
        syncer::OuterStepRuleName(c_.outer_step), OuterOptimizerOf(c_).lr, OuterOptimizerOf(c_).momentum,
        diloco::EncodingName(c_.uplink), diloco::EncodingName(c_.downlink));
  }

  void LogResumed() {
    const syncer::SyncerCore& core = *opened_.core;
    std::vector<std::string> sums, public_sums;  // Θ, and the public copies the learners hold
    for (int p = 0; p < plan_.num_fragments(); ++p) {
      sums.push_back(ChecksumHex(exchange::ValuesChecksum(core.theta(p))));
      public_sums.push_back(ChecksumHex(exchange::ValuesChecksum(core.public_values(p))));
    }
    log_->Line({{"t", UnixSeconds()},
                {"source", "syncer"},
                {"kind", "resumed"},
                {"versions", core.versions()},
                {"rounds", core.rounds_closed()},
                {"theta_checksums", sums},
                {"public_checksums", public_sums}});
  }

  // The global model's eval loss during the run, off the loop thread (its own Trainer).
  int StartLiveEval() {
    if (c_.eval_every <= 0 || shard_.count > 1 || model_->evaluator() == nullptr) return 0;
    auto trainer = model_->NewTrainer();
    if (!trainer.ok()) return SyncerFail(trainer.status(), 1);
    live_eval_ = std::make_unique<GlobalEvaluator>(std::move(*trainer), plan_, std::max(1, c_.eval_batches / 4),
                                                   [this](const GlobalEvalPoint& e) { OnGlobalEval(e); });
    return 0;
  }

  // Evaluator thread.
  void OnGlobalEval(const GlobalEvalPoint& e) {
    log_->Evaluation(e);
    // The evaluator is always stopped before the loop, so this call returns.
    loop_->Call([&e](syncer::SyncerCore& sc, TimePoint) {
      sc.SetGlobalEval(e.loss, e.rounds);
      return 0;
    });
  }

  // Loop thread, after each closed round.
  void OfferGlobalEval(const syncer::SyncerCore& sc) {
    if (!live_eval_ || sc.rounds_closed() % c_.eval_every != 0) return;
    live_eval_->Offer(ThetaOf(sc), {UnixSeconds(), sc.rounds_closed(), sc.tokens_merged(), 0});
  }

  // gRPC thread (Finish) or the main thread (a signal, every learner done): merge what is
  // pending, evaluate, write the model and the summary. Once; later calls return the summary.
  std::string Finish(bool evaluate) {
    std::lock_guard<std::mutex> lock(finish_mu_);
    if (finished_) return summary_text_;
    if (live_eval_) live_eval_->Stop();
    committer_->StopCheckpoints();  // this finish writes the model
    loop_->RequestFinish();
    model::Trainer* ev = shard_.count == 1 ? model_->evaluator() : nullptr;
    auto summary = loop_->Call([&](syncer::SyncerCore& sc, TimePoint now) { return FinalState(sc, now, ev); });
    summary["final"] = true;
    if (evaluate && ev != nullptr) {  // a shard's Θ is not the global model
      auto e = ev->Evaluate(c_.eval_batches);
      if (e.ok()) {
        summary["eval_loss"] = e->loss;
        summary["eval_perplexity"] = e->perplexity;
      } else {
        summary["eval_error"] = e.status().ToString();
      }
    }
    // Written on the loop thread from the core's own Θ: no copy of the model at the finish (calls
    // wait while it is written; the learners are finishing).
    loop_->Call([&](syncer::SyncerCore& sc, TimePoint) {
      checkpoints_->Final([&sc](int p) { return std::span<const float>(sc.theta(p)); }, summary);
      return 0;
    });
    summary_text_ = DumpJson(summary);
    finished_ = true;
    finish_cv_.notify_all();
    return summary_text_;
  }

  // Loop thread, at the finish: merges what the learners pushed last (their final sync), then
  // loads Θ into the evaluator `ev` and returns the summary (in ddp mode the loop thread also
  // steps that trainer's optimizer, so nothing else may touch it).
  nlohmann::json FinalState(syncer::SyncerCore& sc, TimePoint now, model::Trainer* ev) {
    if (Status gate = headroom_->Check(); gate.ok()) {
      for (const auto& r : sc.CloseAllPending(now, clock_)) committer_->Commit(sc, r, now);
    } else {  // nothing committed is lost; what the learners pushed last is not merged
      std::fprintf(stderr, "syncer: holding rounds: %s: the rounds still open at the finish are not merged\n",
                   gate.message().c_str());
    }
    if (ev != nullptr) {
      exchange::ScatterAll(
          plan_, [&](int p) { return std::span<const float>(sc.theta(p)); }, model::ParameterViews(*ev));
    }
    return summary_->Of(sc, now);
  }

  // Every one of the run's learners has left (done). Main thread.
  bool AllLearnersDone() {
    return loop_->Call([this](syncer::SyncerCore& sc, TimePoint) {
      int done = 0;
      for (const auto& [id, l] : sc.learners()) done += l.state == syncer::LearnerState::kDone ? 1 : 0;
      return done >= c_.learners && done == static_cast<int>(sc.learners().size());
    });
  }

  // Main thread: until Finish, a signal, or (finish_when_done) every learner done; with the HTTP
  // endpoint, a status sample every 2 s for the page's curves.
  EndReason WaitForEnd() {
    std::unique_lock<std::mutex> lock(finish_mu_);
    double last_sample = 0;
    while (!finished_ && !g_stop) {
      finish_cv_.wait_for(lock, std::chrono::milliseconds(200));
      if (finished_ || g_stop) break;
      if (lead_.lost()) return EndReason::kFenced;
      lock.unlock();
      const bool done = opt_.finish_when_done && AllLearnersDone();
      if (status_page_->serving() && UnixSeconds() - last_sample >= 2.0) {
        last_sample = UnixSeconds();
        status_page_->Sample();
      }
      lock.lock();
      if (done) return EndReason::kLearnersDone;
    }
    return finished_ ? EndReason::kFinished : EndReason::kSignal;
  }

  // The status page, with the gRPC port's credentials (the shared token, else the operator token).
  Status StartStatusPage(const transport::ServerOptions& so) {
    status_page_ = std::make_unique<SyncerStatusPage>(*loop_, *summary_, *log_);
    StatusPageOptions po{opt_.http, so.token, opt_.http_hosts, out_, opt_.http_port_file};
    if (po.token.empty() && !so.secret.empty()) po.token = transport::OperatorToken(so.secret, c_.run_id);
    return status_page_->Start(po);
  }

  int Serve() {
    auto so = ServerOptionsOf(opt_, c_);
    if (!so.ok()) return SyncerFail(so.status(), 2);
    if (Status st = StartStatusPage(*so); !st.ok())
      return SyncerFail(st, st.code() == StatusCode::kInvalidArgument ? 2 : 1);
    if (lead_.active()) so->fence = {lead_.epoch(), [this] { return lead_.leading(); }};
    so->held_port = held_port_;
    if (replicator_) so->replication = {replicator_->log(), opened_.durable->dir()};
    auto server = transport::GrpcSyncerServer::Start(*so, *loop_, [this](bool evaluate) { return Finish(evaluate); });
    if (!server.ok()) return SyncerFail(server.status(), 1);
    std::printf("syncer: listening on port %d\n", (*server)->port());
    std::fflush(stdout);
    if (int rc = WritePortFile((*server)->port()); rc != 0) return rc;
    std::signal(SIGTERM, OnSignal);
    std::signal(SIGINT, OnSignal);
    const EndReason why = WaitForEnd();
    if (why == EndReason::kFenced) return StopFenced(**server);
    if (why != EndReason::kFinished) {
      // A signal or the last learner leaving: close the rounds in flight, evaluate, write the
      // model and the summary, as Finish would.
      std::printf("syncer: %s: closing the rounds in flight and writing the global model\n", EndReasonText(why));
      std::fflush(stdout);
      Finish(/*evaluate=*/true);
    }
    Stop(**server, why);
    lead_.MarkFinishedAndResign();
    return 0;
  }

  // The lease lapsed (paused, cut off from etcd): another candidate may lead by now. Nothing more
  // is served or committed here: no finish, no final rounds; the learners follow the new leader.
  int StopFenced(transport::GrpcSyncerServer& server) {
    std::fprintf(stderr,
                 "atoll syncer: error: leadership lapsed (%s): stopped serving; the shard's next leader continues the "
                 "run from its committed rounds\n",
                 lead_.Describe().c_str());
    if (live_eval_) live_eval_->Stop();
    status_page_->Stop();
    loop_->EndLongPolls();
    if (replicator_) replicator_->log()->Close();
    server.Shutdown();
    loop_->Stop();
    return 3;
  }

  // Learners still running learn of the finish from their next heartbeat reply and leave: waits
  // (bounded, 2 s) until none is live, then stops serving.
  void Stop(transport::GrpcSyncerServer& server, EndReason why) {
    if (live_eval_) live_eval_->Stop();
    for (int i = 0; i < 40; ++i) {
      if (loop_->Call([](syncer::SyncerCore& sc, TimePoint now) { return sc.LiveLearners(now).empty(); })) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    status_page_->Stop();
    loop_->EndLongPolls();  // the server's shutdown waits for no long poll
    if (replicator_) replicator_->log()->Close();
    server.Shutdown();
    loop_->Stop();
    if (shard_.count > 1) {
      std::printf("syncer: shard %s stopped (%s); its committed fragments are in %s\n", shard_.ToString().c_str(),
                  EndReasonText(why), opened_.durable->dir().c_str());
    } else {
      std::printf("syncer: stopped (%s); global model in %s/global.safetensors\n", EndReasonText(why), out_.c_str());
    }
  }

  const SyncerProcessOptions& opt_;
  const RunConfig c_;
  SyncerLeadership lead_;                           // inactive without --etcd
  std::shared_ptr<transport::HeldPort> held_port_;  // with --etcd: the port, held until leading
  syncer::ShardSpec shard_;                         // {0, 1}: the one syncer
  const std::string out_;
  RealClock& clock_ = RealClock::Default();
  std::unique_ptr<ModelHost> model_;
  diloco::FragmentPlan plan_;
  OpenedCore opened_;                                 // its core until moved into loop_
  std::unique_ptr<syncer::CommitHeadroom> headroom_;  // loop thread, after Setup
  std::unique_ptr<RoundLog> log_;
  std::unique_ptr<SyncerSummary> summary_;
  std::unique_ptr<CheckpointWriter> checkpoints_;
  std::unique_ptr<Replicator> replicator_;  // a leader with --replicate on
  std::unique_ptr<RoundCommitter> committer_;
  std::unique_ptr<GlobalEvaluator> live_eval_;
  std::unique_ptr<syncer::SyncerLoop> loop_;
  std::unique_ptr<SyncerStatusPage> status_page_;
  std::mutex finish_mu_;
  std::condition_variable finish_cv_;
  bool finished_ = false;     // guarded by finish_mu_
  std::string summary_text_;  // guarded by finish_mu_
};

}  // namespace

int RunSyncerProcess(const SyncerProcessOptions& opt) { return SyncerProcess(opt).Run(); }

}  // namespace atl::runtime
