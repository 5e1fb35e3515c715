// `atoll learner`: one island. Trains on its own clock; the LearnerAgent exchanges fragments in
// the background. In `diloco` mode it blocks at every H-step barrier by design (the baseline).
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>

#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/learner/agent_group.h"
#include "atoll/learner/ddp_exchange.h"
#include "atoll/model/data.h"
#include "atoll/runtime/learner_process.h"
#include "atoll/runtime/run_options.h"
#include "chaos_control.h"
#include "learner_links.h"
#include "learner_report.h"
#include "learner_unit.h"

namespace atl::runtime {
namespace {

// `atoll learner` in named stages: Setup (data, trainer, plan, links, agent), then the training
// loop — one inner step, the mode's exchange (decoupled and diloco: the agent's after-step rule;
// ddp: the parameter server's step), progress and metrics (LearnerReport) — then the final sync,
// goodbye and summary. Runs on the main thread; the agent has its own threads.
class LearnerProcess {
 public:
  explicit LearnerProcess(const LearnerProcessOptions& opt)
      : opt_(opt),
        c_(Normalized(opt.config)),
        id_(opt.id),
        out_(opt.out_dir.empty() ? "." : opt.out_dir),
        report_(opt.id, out_, opt.start_step, c_.steps),
        control_(opt.control_file),
        step_(opt.start_step) {}

  int Run() {
    if (int rc = Setup(); rc != 0) return rc;
    t_start_ = UnixSeconds();
    if (Status st = agent_->Start(); !st.ok()) return Fail(st, 2);
    report_.Mark("join");  // join and catch-up (bounded wait when the syncer is unreachable)
    PrintStart();
    report_.OpenMetrics();
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

  // The run's shape against this process's flags: its id, the syncer addresses, the ranks.
  Status CheckOptions() {
    ATOLL_RETURN_IF_ERROR(ValidateRunConfig(c_));
    if (id_ < 0 || id_ >= c_.learners) {
      return InvalidArgumentError("--id " + std::to_string(id_) + " out of range [0, " + std::to_string(c_.learners) +
                                  ")");
    }
    if (opt_.syncer.empty()) return InvalidArgumentError("--syncer host:port is required");
    ATOLL_ASSIGN_OR_RETURN(addresses_, SyncerAddresses(opt_.syncer, c_.fragments));
    if (c_.syncer_shards > 1 && static_cast<int>(addresses_.size()) != c_.syncer_shards) {
      return InvalidArgumentError("the run file has syncer_shards = " + std::to_string(c_.syncer_shards) +
                                  " but --syncer lists " + std::to_string(addresses_.size()) +
                                  " address(es): give every shard's, in shard order");
    }
    if (addresses_.size() > 1 && c_.mode == diloco::Mode::kDdp) {
      return InvalidArgumentError("ddp mode runs one syncer (one fragment): give --syncer a single address");
    }
    if (opt_.ranks > 1 && c_.mode == diloco::Mode::kDdp) {
      return InvalidArgumentError("--ranks needs decoupled or diloco mode (ddp exchanges gradients every step)");
    }
    return Status::Ok();
  }

  int Setup() {
    if (Status st = CheckOptions(); !st.ok()) return Fail(st, 2);
    if (Status st = MakeDirs(out_); !st.ok()) return Fail(st, 1);
    auto manifest = model::EnsureDataPrepared(c_.data, nullptr);
    if (!manifest.ok()) return Fail(manifest.status(), 2);
    report_.Mark("data");
    auto topts = opt_.ranks > 1 ? RankTrainerOptions(c_, id_, 0, opt_.ranks) : MakeTrainerOptions(c_, id_);
    if (!topts.ok()) return Fail(topts.status(), 2);
    topts->start_step = opt_.start_step;
    auto trainer = model::Trainer::Create(*topts);
    if (!trainer.ok()) return Fail(trainer.status(), 1);
    trainer_ = std::move(*trainer);
    report_.Mark("model");  // libtorch set-up, the model built and its data shard opened
    params_ = model::ParameterViews(*trainer_);
    auto plan = MakePlan(c_, trainer_->tensors());
    if (!plan.ok()) return Fail(plan.status(), 2);
    plan_ = std::move(*plan);
    auto links = SyncerLinks::Connect(addresses_, opt_, c_, clock_);
    if (!links.ok()) return Fail(links.status(), 2);
    links_ = std::make_unique<SyncerLinks>(std::move(*links));
    MakeAgent();
    report_.Mark("connect");  // fragment plan, gRPC channel, agent
    if (opt_.ranks > 1) {
      auto group = RankGroup::Create(opt_.unit_store, 0, opt_.ranks, kRankTimeoutSeconds);
      if (!group.ok()) return Fail(group.status(), 1);
      group_ = std::move(*group);
    }
    return 0;
  }

  void MakeAgent() {
    learner::AgentOptions ao = MakeAgentOptions(c_, id_);
    char host[256] = "localhost";
    ::gethostname(host, sizeof(host) - 1);
    ao.host = std::string(host) + ":" + std::to_string(::getpid());
    ao.rejoin = opt_.rejoin;
    ao.state_dir = out_ + "/learner-" + std::to_string(id_) + "-state";
    agent_ = std::make_unique<learner::AgentGroup>(ao, plan_, params_, links_->apis(), clock_);
    if (c_.mode == diloco::Mode::kDdp) {
      ddp_ = std::make_unique<learner::DdpExchange>(plan_, links_->front(), UplinkCodec(c_), clock_);
    }
  }

  void PrintStart() {
    std::printf(
        "learner %d: %s, %s, joined=%s, steps %lld..%lld of %lld tokens, speed %.2f%s\n", id_,
        diloco::ModeName(c_.mode), model::PrecisionName(trainer_->precision()),
        agent_->counters().joined ? "yes" : "not yet (training on; retrying)", static_cast<long long>(opt_.start_step),
        static_cast<long long>(c_.steps), static_cast<long long>(trainer_->tokens_per_step() * opt_.ranks),
        c_.SpeedOf(id_),
        opt_.rejoin
            ? " (rejoined after a failure: global parameters, fresh AdamW moments, data and LR schedule continue at the start step)"
            : "");
    std::fflush(stdout);
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
    if (!control_.Poll(chaos_)) return;
    speed_ = c_.SpeedOf(id_) * std::clamp(chaos_.speed, 0.01, 1.0);
    links_->Apply(chaos_);
    const double bandwidth_mbps = chaos_.bandwidth_mbps > 0 ? chaos_.bandwidth_mbps : c_.bandwidth_mbps;
    std::printf("learner %d: chaos control: speed %.2f, partition %s, bandwidth %s\n", id_, speed_,
                chaos_.partition ? "on" : "off",
                bandwidth_mbps > 0 ? (std::to_string(bandwidth_mbps) + " Mbit/s").c_str() : "unlimited");
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
    agent_->SetProgress(report_.Step(Record(*s, step_s, applied)));
    return Status::Ok();
  }

  // What the report needs of a finished step, and whether the first contribution was accepted.
  StepRecord Record(const model::StepStats& s, double step_s, int applied) const {
    const learner::AgentCounters k = agent_->counters();
    StepRecord r{s, step_, tokens_total_, step_s, applied, links_->WireBytes(true), links_->WireBytes(false)};
    r.contributed = k.pushes > 0 || (ddp_ && applied > 0);
    r.first_contribution_s = k.first_contribution_s;
    // When the syncer accepted it (the agent's record), not this report up to a step later.
    r.contributed_at = !ddp_ && k.first_contribution_s >= 0 ? std::min(UnixSeconds(), t_start_ + k.first_contribution_s)
                                                            : UnixSeconds();
    return r;
  }

  // ddp: the all-reduce — push the gradient, block until the parameter server's next step.
  StatusOr<int> DdpStep(int64_t tokens) {
    const auto grads = model::GradientViews(*trainer_);  // valid until the next ComputeGradients
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

  // decoupled / diloco: the agent's after-step rule (diloco blocks at the H-step barrier).
  StatusOr<int> Exchange(int64_t tokens) {
    const learner::StepResult r = agent_->AfterStep(step_, tokens);
    ++step_;
    wait_seconds_ += r.barrier_wait_s;
    return r.applied;
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
    done.loss = report_.last_loss();
    done.state = syncer::LearnerState::kDone;
    agent_->SetProgress(done);
    if (Status st = agent_->Leave(); !st.ok()) {
      std::printf("learner %d: could not say goodbye to the syncer (%s); it will notice the silence\n", id_,
                  st.ToString().c_str());
    }
    const nlohmann::json summary = Summary();
    report_.WriteSummary(summary);
    std::printf("learner %d: done, %lld steps, %.0f tok/s, %lld pushes\n", id_, static_cast<long long>(step_),
                summary["tokens_per_second"].get<double>(), static_cast<long long>(summary["pushes"].get<int64_t>()));
    return 0;
  }

  nlohmann::json Summary() const {
    const auto k = agent_->counters();
    const double wall = UnixSeconds() - t_start_;
    return {{"learner", id_},
            {"steps", step_},
            {"tokens", tokens_total_},
            {"loss", report_.last_loss()},
            {"wall_seconds", wall},
            {"train_seconds", train_seconds_},
            {"barrier_wait_seconds", wait_seconds_},
            {"tokens_per_second", wall > 0 ? tokens_total_ / wall : 0.0},
            {"pushes", k.pushes},
            {"pushes_failed", k.pushes_failed},
            {"pulls", k.pulls},
            {"pulls_delta", k.pulls_delta},
            {"pulls_full", k.pulls_full},
            {"fragments_applied", k.fragments_applied},
            {"payload_bytes_up", ddp_ ? ddp_->payload_bytes_up() : k.payload_bytes_up},
            {"payload_bytes_down", ddp_ ? ddp_->payload_bytes_down() : k.payload_bytes_down},
            {"wire_bytes_up", links_->WireBytes(true)},
            {"wire_bytes_down", links_->WireBytes(false)},
            {"joins", k.joins},
            {"catchup_fragments", k.catchup_fragments},
            {"checksum_mismatches", k.checksum_mismatches},
            {"rejected", k.rejected},
            {"pushes_repeated", k.pushes_repeated},
            {"pushes_deferred", k.pushes_deferred},
            {"rebases", k.rebases},
            {"copies_offered", k.copies_offered},
            {"copies_adopted", k.copies_adopted},
            {"state_loaded", k.state_loaded},
            {"state_errors", k.state_errors},
            {"first_contribution_s", k.first_contribution_s},
            {"speed", c_.SpeedOf(id_)},
            {"start_step", opt_.start_step},
            {"precision", model::PrecisionName(trainer_->precision())}};
  }

  const LearnerProcessOptions& opt_;
  const RunConfig c_;
  const int id_;
  const std::string out_;
  RealClock& clock_ = RealClock::Default();
  LearnerReport report_;
  std::unique_ptr<model::Trainer> trainer_;
  std::vector<std::span<float>> params_;  // views of trainer_'s parameters
  diloco::FragmentPlan plan_;
  std::vector<std::string> addresses_;  // the syncer shards' addresses, in shard order
  std::unique_ptr<SyncerLinks> links_;
  std::unique_ptr<learner::AgentGroup> agent_;
  std::unique_ptr<learner::DdpExchange> ddp_;
  std::unique_ptr<RankGroup> group_;  // --ranks R ≥ 2: this is rank 0 of the unit
  ChaosControlReader control_;
  ChaosControl chaos_;
  double t_start_ = 0, speed_ = 1.0;
  double train_seconds_ = 0, wait_seconds_ = 0;
  int64_t step_ = 0, tokens_total_ = 0;
};

}  // namespace

int RunLearnerProcess(const LearnerProcessOptions& opt) {
  if (opt.ranks < 1 || opt.ranks > 64 || opt.rank >= opt.ranks || (opt.rank >= 0 && opt.unit_store.empty())) {
    std::fprintf(
        stderr,
        "atoll learner: error: --ranks %d --rank %d (ranks in [1, 64]; --rank and --unit-store are set by the unit's supervisor)\n",
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
