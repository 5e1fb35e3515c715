// `atoll learner`: one island. Trains on its own clock; the LearnerAgent exchanges fragments in
// the background. In `diloco` mode it blocks at every H-step barrier by design (the baseline).
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <thread>

#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/core/platform.h"
#include "atoll/core/text.h"
#include "atoll/learner/ddp_exchange.h"
#include "atoll/learner/agent_group.h"
#include "atoll/learner/wan_shaper.h"
#include "atoll/model/data.h"
#include "atoll/runtime/processes.h"
#include "atoll/transport/grpc.h"
#include "jsonl.h"
#include "learner_unit.h"

namespace atl::runtime {
namespace {

// Faults the chaos injector asks for through a small JSON file (speed factor, partition,
// bandwidth cap). Re-read only when its modification time changes.
struct ControlState {
  double speed = 1.0;
  bool partition = false;
  double bandwidth_mbps = 0;
};

class ControlFile {
 public:
  explicit ControlFile(std::string path) : path_(std::move(path)) {}
  // True when the file changed since the last call; `state` then holds its contents.
  bool Poll(ControlState& state) {
    if (path_.empty()) return false;
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) return false;
    const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
    if (mtime == last_mtime_) return false;
    last_mtime_ = mtime;
    auto text = ReadFile(path_);
    if (!text.ok()) return false;
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_discarded()) return false;
    state.speed = j.value("speed", 1.0);
    state.partition = j.value("partition", false);
    state.bandwidth_mbps = j.value("bandwidth_mbps", 0.0);
    return true;
  }

 private:
  std::string path_;
  int64_t last_mtime_ = -1;
};

// --syncer: one host:port, or a sharded syncer's shards' addresses, comma-separated in shard order
// (shard i of S owns the fragments p ≡ i mod S). InvalidArgument for an empty entry, or more
// shards than the run has fragments (every shard owns one).
StatusOr<std::vector<std::string>> SyncerAddresses(const std::string& text, int fragments) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (out.back().empty()) {
      return InvalidArgumentError("--syncer '" + text + "': an empty address in the list (host:port[,host:port...])");
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.size() > 1 && static_cast<int>(out.size()) > fragments) {
    return InvalidArgumentError("--syncer lists " + std::to_string(out.size()) + " syncer shards, the run has only " +
                                std::to_string(fragments) + " fragments (at most one shard per fragment)");
  }
  return out;
}

}  // namespace

namespace {

// `atoll learner` in named stages: Setup (data, trainer, plan, transport, agent), then the
// training loop — one inner step, the mode's exchange (decoupled: hand-off to the agent;
// diloco: the H-step barrier; ddp: the parameter server's step), progress and metrics — then the
// final sync, goodbye and summary. Runs on the main thread; the agent has its own threads.
class LearnerProcess {
 public:
  explicit LearnerProcess(const LearnerProcessOptions& opt)
      : opt_(opt), c_(Normalized(opt.config)), id_(opt.id), out_(opt.out_dir.empty() ? "." : opt.out_dir),
        control_(opt.control_file), step_(opt.start_step) {
    // Restart → first contribution, in stages (issue 12): from the process's creation on.
    const double now = UnixSeconds();
    stage_mark_ = now - ProcessAgeSeconds().value_or(0.0);
    Mark("load");  // exec, dynamic linking (libtorch), static initialisers, flags
  }

  int Run() {
    if (int rc = Setup(); rc != 0) return rc;
    t_start_ = UnixSeconds();
    if (Status st = agent_->Start(); !st.ok()) return Fail(st, 2);
    Mark("join");  // join and catch-up (bounded wait when the syncer is unreachable)
    std::printf("learner %d: %s, %s, joined=%s, steps %lld..%lld of %lld tokens, speed %.2f%s\n", id_,
                diloco::ModeName(c_.mode), trainer_->precision().c_str(),
                agent_->counters().joined ? "yes" : "not yet (training on; retrying)",
                static_cast<long long>(opt_.start_step), static_cast<long long>(c_.steps),
                static_cast<long long>(trainer_->tokens_per_step() * opt_.ranks), c_.SpeedOf(id_),
                opt_.rejoin ? " (rejoined after a failure: global parameters, fresh AdamW moments, data and LR schedule continue at the start step)" : "");
    std::fflush(stdout);
    metrics_.Open(out_ + "/metrics-learner-" + std::to_string(id_) + ".jsonl");
    speed_ = c_.SpeedOf(id_);
    if (ddp_) {
      if (Status st = DdpCatchUp(); !st.ok()) return Fail(st, 1);
    }
    if (group_) {  // the other ranks start from the global model this rank joined with
      if (Status st = group_->Broadcast(params_); !st.ok()) return Fail(st, 1);
    }
    while (step_ < c_.steps && !agent_->finish_requested()) {
      if (Status fatal = agent_->fatal_error(); !fatal.ok()) return Fail(fatal, 1);
      PollChaos();
      if (Status st = TellRanks(1); !st.ok()) return Fail(st, 1);
      if (Status st = TrainOneStep(); !st.ok()) return Fail(st, 1);
    }
    if (Status st = TellRanks(0); !st.ok()) return Fail(st, 1);
    if (group_) {
      if (Status st = WriteRankChecksum(opt_.out_dir, id_, 0, params_); !st.ok()) return Fail(st, 1);
    }
    return Finish();
  }

 private:
  int Fail(const Status& st, int code) const {
    std::fprintf(stderr, "atoll learner %d: error: %s\n", id_, st.ToString().c_str());
    return code;
  }

  int Setup() {
    if (Status st = ValidateRunConfig(c_); !st.ok()) return Fail(st, 2);
    if (id_ < 0 || id_ >= c_.learners) {
      return Fail(InvalidArgumentError("--id " + std::to_string(id_) + " out of range [0, " + std::to_string(c_.learners) + ")"), 2);
    }
    if (opt_.syncer.empty()) return Fail(InvalidArgumentError("--syncer host:port is required"), 2);
    auto addresses = SyncerAddresses(opt_.syncer, c_.fragments);
    if (!addresses.ok()) return Fail(addresses.status(), 2);
    addresses_ = std::move(*addresses);
    if (c_.syncer_shards > 1 && static_cast<int>(addresses_.size()) != c_.syncer_shards) {
      return Fail(InvalidArgumentError("the run file has syncer_shards = " + std::to_string(c_.syncer_shards) + " but --syncer lists " +
                                       std::to_string(addresses_.size()) + " address(es): give every shard's, in shard order"), 2);
    }
    if (addresses_.size() > 1 && c_.mode == diloco::Mode::kDdp) {
      return Fail(InvalidArgumentError("ddp mode runs one syncer (one fragment): give --syncer a single address"), 2);
    }
    if (Status st = MakeDirs(out_); !st.ok()) return Fail(st, 1);
    auto manifest = model::EnsureDataPrepared(c_.data, nullptr);
    if (!manifest.ok()) return Fail(manifest.status(), 2);
    Mark("data");
    if (opt_.ranks > 1 && c_.mode == diloco::Mode::kDdp) {
      return Fail(InvalidArgumentError("--ranks needs decoupled or diloco mode (ddp exchanges gradients every step)"), 2);
    }
    auto topts = opt_.ranks > 1 ? RankTrainerOptions(c_, id_, 0, opt_.ranks) : MakeTrainerOptions(c_, id_);
    if (!topts.ok()) return Fail(topts.status(), 2);
    topts->start_step = opt_.start_step;
    auto trainer = model::Trainer::Create(*topts);
    if (!trainer.ok()) return Fail(trainer.status(), 1);
    trainer_ = std::move(*trainer);
    Mark("model");  // libtorch set-up, the model built and its data shard opened
    for (int i = 0; i < static_cast<int>(trainer_->tensors().size()); ++i) params_.push_back(trainer_->Parameter(i));
    auto plan = MakePlan(c_, trainer_->tensors());
    if (!plan.ok()) return Fail(plan.status(), 2);
    plan_ = std::move(*plan);
    if (int rc = Connect(); rc != 0) return rc;
    const int rc = MakeAgent();
    Mark("connect");  // fragment plan, gRPC channel, agent
    if (rc == 0 && opt_.ranks > 1) {
      auto group = RankGroup::Create(opt_.unit_store, 0, opt_.ranks, kRankTimeoutSeconds);
      if (!group.ok()) return Fail(group.status(), 1);
      group_ = std::move(*group);
    }
    return rc;
  }

  // Records the seconds from the previous mark to `at` (default: now) as stage `name`.
  void Mark(const char* name, double at = UnixSeconds()) {
    const double seconds = std::max(0.0, at - stage_mark_);
    startup_[name] = seconds;
    startup_["total"] = startup_.value("total", 0.0) + seconds;
    stage_mark_ += seconds;
  }

  // One gRPC client per syncer shard, each behind a WAN shaper: a no-op unless the run file or
  // chaos sets bandwidth, latency, loss or a partition. (Sharded, each shard's connection is
  // shaped on its own.)
  int Connect() {
    for (size_t i = 0; i < addresses_.size(); ++i) {
      if (int rc = ConnectShard(addresses_[i], i); rc != 0) return rc;
    }
    return 0;
  }

  int ConnectShard(const std::string& address, size_t shard) {
    transport::ClientOptions co;
    co.target = address;
    co.token = c_.token;
    if (!opt_.token_file.empty()) {
      auto token = ReadSecretFile(opt_.token_file);
      if (!token.ok()) return Fail(token.status(), 2);
      co.token = *token;
    }
    co.tls.enabled = !opt_.tls.ca.empty() || !opt_.tls.cert.empty();
    co.tls.ca_file = opt_.tls.ca;
    co.tls.server_name = opt_.tls.server_name;
    co.tls.cert_file = opt_.tls.cert;
    co.tls.key_file = opt_.tls.key;
    auto client = transport::GrpcSyncerClient::Connect(co);
    if (!client.ok()) return Fail(client.status(), 2);
    clients_.push_back(std::move(*client));
    shaper_options_.bandwidth_bps = c_.bandwidth_mbps * 1e6;
    shaper_options_.latency_s = c_.latency_ms / 1000.0;
    shaper_options_.loss = c_.loss;
    shaper_options_.seed = c_.seed * 1000 + static_cast<uint64_t>(id_) + 1;
    learner::ShaperOptions so = shaper_options_;
    so.seed += 7919 * shard;  // shard 0: the unsharded learner's seed
    shaped_.push_back(std::make_unique<learner::ShapedSyncerApi>(*clients_.back(), so, clock_));
    return 0;
  }

  int MakeAgent() {
    learner::AgentOptions ao;
    ao.run_id = c_.run_id;
    ao.learner_id = id_;
    char host[256] = "localhost";
    ::gethostname(host, sizeof(host) - 1);
    ao.host = std::string(host) + ":" + std::to_string(::getpid());
    ao.rejoin = opt_.rejoin;
    ao.state_dir = out_ + "/learner-" + std::to_string(id_) + "-state";
    ao.schedule = diloco::Schedule::Of(c_.mode, c_.H, c_.fragments, c_.tau);
    ao.uplink = UplinkCodec(c_);  // c_ was validated in Run
    ao.alpha = c_.alpha;
    ao.keep_progress = c_.keep_progress;
    ao.exchange_fragments = c_.mode != diloco::Mode::kDdp;
    std::vector<syncer::SyncerApi*> apis;
    for (auto& s : shaped_) apis.push_back(s.get());
    agent_ = std::make_unique<learner::AgentGroup>(ao, plan_, params_, apis, clock_);
    if (c_.mode == diloco::Mode::kDdp) {
      ddp_ = std::make_unique<learner::DdpExchange>(plan_, *shaped_.front(), UplinkCodec(c_), clock_);
    }
    return 0;
  }

  // ddp: take the parameter server's current parameters before the first step.
  Status DdpCatchUp() {
    Status st = ddp_->Sync(agent_->counters().learner_id, params_);
    while (!st.ok() && !agent_->finish_requested()) {
      if (Status fatal = agent_->fatal_error(); !fatal.ok()) return fatal;
      clock_.SleepFor(std::chrono::milliseconds(300));
      st = ddp_->Sync(agent_->counters().learner_id, params_);
    }
    return Status::Ok();
  }

  // Chaos faults from the control file: speed, partition, bandwidth (docs/decisions/005).
  void PollChaos() {
    if (!control_.Poll(chaos_state_)) return;
    speed_ = c_.SpeedOf(id_) * std::clamp(chaos_state_.speed, 0.01, 1.0);
    learner::ShaperOptions so = shaper_options_;
    if (chaos_state_.bandwidth_mbps > 0) so.bandwidth_bps = chaos_state_.bandwidth_mbps * 1e6;
    for (auto& s : shaped_) {
      s->SetPartitioned(chaos_state_.partition);
      learner::ShaperOptions shard_so = s->options();
      shard_so.bandwidth_bps = so.bandwidth_bps;
      s->SetOptions(shard_so);
    }
    std::printf("learner %d: chaos control: speed %.2f, partition %s, bandwidth %s\n", id_, speed_,
                chaos_state_.partition ? "on" : "off",
                so.bandwidth_bps > 0 ? (std::to_string(so.bandwidth_bps / 1e6) + " Mbit/s").c_str() : "unlimited");
    std::fflush(stdout);
  }

  // Multi-rank unit: whether the ranks train another step (1) or stop (0).
  Status TellRanks(int64_t go) {
    if (!group_) return Status::Ok();
    return group_->BroadcastInts({&go, 1});
  }

  // One inner step of this learner: of this process, or of the unit's ranks together.
  StatusOr<model::StepStats> InnerStep() {
    if (!group_) return ddp_ ? trainer_->ComputeGradients() : trainer_->Step();
    ATOLL_ASSIGN_OR_RETURN(auto computed, trainer_->ComputeGradients());
    return AverageAndApply(*group_, *trainer_, computed);
  }

  // Multi-rank unit: the other ranks take the parameters when merged fragments were applied.
  Status ShareApplied(int64_t applied) {
    if (!group_) return Status::Ok();
    ATOLL_RETURN_IF_ERROR(group_->BroadcastInts({&applied, 1}));
    return applied > 0 ? group_->Broadcast(params_) : Status::Ok();
  }

  Status TrainOneStep() {
    const TimePoint t0 = clock_.Now();
    auto s = InnerStep();
    if (!s.ok()) return s.status();
    const double compute_s = ToSeconds(clock_.Now() - t0);
    if (speed_ < 1.0) clock_.SleepFor(FromSeconds(compute_s * (1.0 / speed_ - 1.0)));  // slower hardware
    const double step_s = ToSeconds(clock_.Now() - t0);
    train_seconds_ += step_s;
    tokens_total_ += s->tokens;
    ATOLL_ASSIGN_OR_RETURN(int applied, ddp_ ? DdpStep(s->tokens) : Exchange(s->tokens));
    ATOLL_RETURN_IF_ERROR(ShareApplied(applied));
    Report(*s, step_s, applied);
    return Status::Ok();
  }

  // ddp: the all-reduce — push the gradient, block until the parameter server's next step.
  StatusOr<int> DdpStep(int64_t tokens) {
    std::vector<std::span<float>> grads;  // valid until the next ComputeGradients
    for (int i = 0; i < static_cast<int>(trainer_->tensors().size()); ++i) grads.push_back(trainer_->Gradient(i));
    const TimePoint w0 = clock_.Now();
    const learner::AgentCounters who = agent_->counters();
    Status st = ddp_->Step(who.learner_id, who.push_session, tokens, grads, params_, 3600.0,
                           [&] { return agent_->finish_requested() || !agent_->fatal_error().ok(); });
    while (st.code() == StatusCode::kAborted || st.code() == StatusCode::kDataLoss ||
           st.code() == StatusCode::kNotFound || st.code() == StatusCode::kUnavailable) {
      // Behind the others (restarted, or the syncer restarted): take the current parameters;
      // this step's gradient is lost, as in any synchronous job.
      clock_.SleepFor(std::chrono::milliseconds(200));
      if (agent_->finish_requested()) break;
      st = ddp_->Sync(agent_->counters().learner_id, params_);
    }
    if (!st.ok() && st.code() != StatusCode::kCancelled) return st;
    wait_seconds_ += ToSeconds(clock_.Now() - w0);
    ++step_;
    return 1;
  }

  // decoupled / diloco: hand the step to the agent; diloco blocks at the H-step barrier.
  StatusOr<int> Exchange(int64_t tokens) {
    agent_->OnStep(step_, tokens);
    ++step_;
    if (c_.mode != diloco::Mode::kDiloco || step_ % c_.H != 0) return agent_->ApplyReady(step_);
    const TimePoint w0 = clock_.Now();
    const int applied = agent_->WaitForAllFragments(step_, 600.0);  // the synchronous barrier
    wait_seconds_ += ToSeconds(clock_.Now() - w0);
    return applied;
  }

  void Report(const model::StepStats& s, double step_s, int applied) {
    ema_step_ = ema_step_ == 0 ? step_s : 0.9 * ema_step_ + 0.1 * step_s;
    const double ema_tps = static_cast<double>(s.tokens) / ema_step_;
    last_loss_ = s.loss;
    learner::Progress p;
    p.step = step_;
    p.tokens = tokens_total_;
    p.loss = s.loss;
    p.step_seconds = ema_step_;
    p.tokens_per_second = ema_tps;
    agent_->SetProgress(p);
    metrics_.Write({{"t", UnixSeconds()}, {"source", "learner"}, {"learner", id_}, {"step", step_},
                    {"tokens", tokens_total_}, {"step_tokens", s.tokens}, {"step_s", step_s}, {"loss", s.loss},
                    {"lr", s.lr}, {"tokens_per_s", ema_tps}, {"applied", applied},
                    {"wire_bytes_up", WireBytes(true)}, {"wire_bytes_down", WireBytes(false)}});
    if (step_ == opt_.start_step + 1) Mark("first_step");
    if (!contributed_ && (agent_->counters().pushes > 0 || (ddp_ && applied > 0))) {
      contributed_ = true;  // for the rejoin latency: restart → first accepted contribution
      // When the syncer accepted it (the agent's record), not this report up to a step later.
      const double first_s = agent_->counters().first_contribution_s;
      const double at = !ddp_ && first_s >= 0 ? std::min(UnixSeconds(), t_start_ + first_s) : UnixSeconds();
      Mark("first_push", at);  // until the syncer accepted a push (the step it is scheduled at)
      metrics_.Write({{"t", at}, {"source", "learner"}, {"learner", id_}, {"kind", "contributed"},
                      {"step", step_}, {"after_start_s", agent_->counters().first_contribution_s},
                      {"startup_s", startup_}});
    }
    if (step_ % 25 == 0 || step_ == c_.steps) {
      std::printf("learner %d: step %lld/%lld loss %.4f %.0f tok/s\n", id_, static_cast<long long>(step_),
                  static_cast<long long>(c_.steps), s.loss, ema_tps);
      std::fflush(stdout);
    }
  }

  // Final sync (what the last steps changed reaches the global model too), goodbye, summary.
  int Finish() {
    if (!ddp_ && !agent_->finish_requested()) {
      const int flushed = agent_->FlushAll(step_, 30.0);
      if (flushed > 0) std::printf("learner %d: final sync of %d fragment(s)\n", id_, flushed);
    }
    learner::Progress done;
    done.step = step_;
    done.tokens = tokens_total_;
    done.loss = last_loss_;
    done.state = syncer::LearnerState::kDone;
    agent_->SetProgress(done);
    if (Status st = agent_->Leave(); !st.ok()) {
      std::printf("learner %d: could not say goodbye to the syncer (%s); it will notice the silence\n", id_,
                  st.ToString().c_str());
    }
    const auto k = agent_->counters();
    const double wall = UnixSeconds() - t_start_;
    nlohmann::json summary = {
        {"learner", id_}, {"steps", step_}, {"tokens", tokens_total_}, {"loss", last_loss_},
        {"wall_seconds", wall}, {"train_seconds", train_seconds_}, {"barrier_wait_seconds", wait_seconds_},
        {"tokens_per_second", wall > 0 ? tokens_total_ / wall : 0.0},
        {"pushes", k.pushes}, {"pushes_failed", k.pushes_failed}, {"pulls", k.pulls},
        {"pulls_delta", k.pulls_delta}, {"pulls_full", k.pulls_full},
        {"fragments_applied", k.fragments_applied},
        {"payload_bytes_up", ddp_ ? ddp_->payload_bytes_up() : k.payload_bytes_up},
        {"payload_bytes_down", ddp_ ? ddp_->payload_bytes_down() : k.payload_bytes_down},
        {"wire_bytes_up", WireBytes(true)}, {"wire_bytes_down", WireBytes(false)},
        {"joins", k.joins}, {"catchup_fragments", k.catchup_fragments},
        {"checksum_mismatches", k.checksum_mismatches}, {"rejected", k.rejected},
        {"pushes_repeated", k.pushes_repeated}, {"pushes_deferred", k.pushes_deferred},
        {"state_loaded", k.state_loaded}, {"state_errors", k.state_errors},
        {"first_contribution_s", k.first_contribution_s}, {"startup_s", startup_},
        {"speed", c_.SpeedOf(id_)}, {"start_step", opt_.start_step}, {"precision", trainer_->precision()}};
    (void)WriteFileAtomic(out_ + "/learner-" + std::to_string(id_) + ".json", DumpJson(summary, 2));
    std::printf("learner %d: done, %lld steps, %.0f tok/s, %lld pushes\n", id_, static_cast<long long>(step_),
                summary["tokens_per_second"].get<double>(), static_cast<long long>(k.pushes));
    return 0;
  }

  // Bytes on the wire to (up) or from the syncer, over every shard's connection.
  int64_t WireBytes(bool up) const {
    int64_t n = 0;
    for (const auto& c : clients_) n += up ? c->bytes_sent() : c->bytes_received();
    return n;
  }

  const LearnerProcessOptions& opt_;
  const RunConfig c_;
  const int id_;
  const std::string out_;
  RealClock& clock_ = RealClock::Default();
  std::unique_ptr<model::Trainer> trainer_;
  std::vector<std::span<float>> params_;  // views of trainer_'s parameters
  diloco::FragmentPlan plan_;
  std::vector<std::string> addresses_;     // the syncer shards' addresses, in shard order
  std::vector<std::unique_ptr<transport::GrpcSyncerClient>> clients_;  // one per shard
  learner::ShaperOptions shaper_options_;
  std::vector<std::unique_ptr<learner::ShapedSyncerApi>> shaped_;      // one per shard
  std::unique_ptr<learner::AgentGroup> agent_;
  std::unique_ptr<learner::DdpExchange> ddp_;
  std::unique_ptr<RankGroup> group_;  // --ranks R ≥ 2: this is rank 0 of the unit
  ControlFile control_;
  ControlState chaos_state_;
  JsonlWriter metrics_;
  double t_start_ = 0, speed_ = 1.0, ema_step_ = 0, last_loss_ = 0;
  double train_seconds_ = 0, wait_seconds_ = 0;
  int64_t step_ = 0, tokens_total_ = 0;
  bool contributed_ = false;
  double stage_mark_ = 0;
  nlohmann::json startup_ = nlohmann::json::object();  // stage → seconds, and "total"
};

}  // namespace

int RunLearnerProcess(const LearnerProcessOptions& opt) {
  if (opt.ranks < 1 || opt.ranks > 64 || opt.rank >= opt.ranks || (opt.rank >= 0 && opt.unit_store.empty())) {
    std::fprintf(stderr, "atoll learner: error: --ranks %d --rank %d (ranks in [1, 64]; --rank and --unit-store are set by the unit's supervisor)\n",
                 opt.ranks, opt.rank);
    return 2;
  }
  if (opt.rank >= 0) {
    // A rank of a unit dies with its supervisor (it would otherwise train on alone, unsupervised).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() == 1) return 1;
  }
  if (opt.ranks > 1 && opt.rank < 0) return RunLearnerUnit(opt);
  if (opt.ranks > 1 && opt.rank > 0) return RunFollowerRank(opt);
  return LearnerProcess(opt).Run();
}

}  // namespace atl::runtime
