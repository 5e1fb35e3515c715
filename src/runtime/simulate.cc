#include "atoll/runtime/simulate.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "atoll/core/rng.h"
#include "atoll/core/sim_clock.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/learner/learner_agent.h"
#include "atoll/model/trainer.h"
#include "atoll/runtime/run_options.h"
#include "atoll/syncer/syncer_loop.h"
#include "round_json.h"

namespace atl::runtime {
namespace {

Status CheckSimulated(const RunConfig& c, const SimulateOptions& o) {
  if (c.mode == diloco::Mode::kDdp) {
    return InvalidArgumentError(
        "simulate: ddp mode is not simulated (decoupled or diloco; `atoll train --replicas M` is data-parallel)");
  }
  if (c.chaos.mode != chaos::ChaosMode::kNone)
    return InvalidArgumentError("simulate: chaos is not simulated ([chaos] mode must be none)");
  if (c.bandwidth_mbps != 0 || c.latency_ms != 0 || c.loss != 0) {
    return InvalidArgumentError("simulate: the WAN emulation (bandwidth_mbps, latency_ms, loss) is not simulated");
  }
  if (c.syncer_shards != 1)
    return InvalidArgumentError("simulate: a sharded syncer is not simulated (syncer_shards must be 1)");
  if (!(o.step_seconds > 0) || !std::isfinite(o.step_seconds)) {
    return InvalidArgumentError(fmt::format("simulate: --step-time must be > 0 seconds, got {}", o.step_seconds));
  }
  if (!(o.spread >= 0 && o.spread < 1))
    return InvalidArgumentError(fmt::format("simulate: --spread must be in [0, 1), got {}", o.spread));
  if (!(o.jitter >= 0 && o.jitter < 1))
    return InvalidArgumentError(fmt::format("simulate: --jitter must be in [0, 1), got {}", o.jitter));
  return Status::Ok();
}

// The global model's evaluator: Θ scattered into its own Trainer (loop thread, then main thread).
class Evaluator {
 public:
  Evaluator(std::unique_ptr<model::Trainer> t, const diloco::FragmentPlan& plan) : t_(std::move(t)), plan_(plan) {}
  StatusOr<double> Of(const syncer::SyncerCore& core, int batches) {
    exchange::ScatterAll(
        plan_, [&](int p) { return core.theta(p); }, model::ParameterViews(*t_));
    ATOLL_ASSIGN_OR_RETURN(auto ev, t_->Evaluate(batches));
    return ev.loss;
  }
  model::Trainer& trainer() { return *t_; }

 private:
  std::unique_ptr<model::Trainer> t_;
  const diloco::FragmentPlan& plan_;
};

// One learner's thread: its trainer and agent, each inner step followed by its simulated time.
struct SimLearner {
  int id = 0;
  double factor = 1;      // persistent: 1 ± spread, ÷ the config's speed
  double finished_s = 0;  // simulated time when it left
  Status status;
  nlohmann::json summary;
};

learner::AgentOptions SimAgentOptions(const RunConfig& c, int id) {
  learner::AgentOptions ao = MakeAgentOptions(c, id);
  ao.host = "simulated";
  return ao;
}

// The learner's last sync and its leave, and what it did.
void Leave(learner::LearnerAgent& agent, int64_t step, int64_t tokens, double last_loss, SimClock& clock,
           SimLearner& me) {
  agent.FlushAll(step, 30.0);
  learner::Progress done;
  done.step = step;
  done.tokens = tokens;
  done.loss = last_loss;
  done.state = syncer::LearnerState::kDone;
  agent.SetProgress(done);
  const auto k = agent.counters();
  if (Status st = agent.Leave(); !st.ok()) me.status = st;
  me.finished_s = ToSeconds(clock.Now());
  me.summary = {{"learner", me.id},
                {"steps", step},
                {"tokens", tokens},
                {"loss", last_loss},
                {"speed_factor", 1.0 / me.factor},
                {"pushes", k.pushes},
                {"pushes_deferred", k.pushes_deferred},
                {"fragments_applied", k.fragments_applied},
                {"rejected", k.rejected},
                {"payload_bytes_up", k.payload_bytes_up},
                {"payload_bytes_down", k.payload_bytes_down}};
}

void RunLearner(const RunConfig& c, const SimulateOptions& o, const diloco::FragmentPlan& plan, syncer::SyncerApi& api,
                SimClock& clock, SimLearner& me) {
  auto topts = MakeTrainerOptions(c, me.id);
  if (!topts.ok()) return void(me.status = topts.status());
  auto trainer = model::Trainer::Create(*topts);
  if (!trainer.ok()) return void(me.status = trainer.status());
  auto params = model::ParameterViews(**trainer);
  learner::LearnerAgent agent(SimAgentOptions(c, me.id), plan, params, api, clock);
  // Each learner starts a few ms apart, off the syncer loop's 50 ms tick: its heartbeats (every
  // 0.5 s from its start) then never arrive at the same simulated instant as another's or as a
  // tick, where the loop would see them in whatever order the threads happen to run.
  clock.SleepFor(FromSeconds(0.0071 + 0.0137 * me.id));
  if (Status st = agent.Start(); !st.ok()) return void(me.status = st);
  Rng rng(c.seed * 7919 + static_cast<uint64_t>(me.id) * 104729 + 17);
  double ema = 0, last_loss = 0;
  int64_t step = 0, tokens = 0;
  for (; step < c.steps && !agent.finish_requested();) {
    auto s = (*trainer)->Step();
    if (!s.ok()) return void(me.status = s.status());
    const double dt = o.step_seconds * me.factor * (1.0 + o.jitter * rng.Uniform(-1.0, 1.0));
    clock.SleepFor(FromSeconds(dt));
    ema = ema == 0 ? dt : 0.9 * ema + 0.1 * dt;
    tokens += s->tokens;
    last_loss = s->loss;
    learner::Progress p;
    p.step = step + 1;
    p.tokens = tokens;
    p.loss = s->loss;
    p.step_seconds = ema;
    p.tokens_per_second = static_cast<double>(s->tokens) / ema;
    agent.SetProgress(p);
    agent.AfterStep(step, s->tokens);
    ++step;
  }
  Leave(agent, step, tokens, last_loss, clock, me);
}

// The mean of each quarter of `v` in order (empty when `v` is).
std::vector<double> QuarterMeans(const std::vector<double>& v) {
  std::vector<double> out;
  if (v.empty()) return out;
  for (int q = 0; q < 4; ++q) {
    const size_t a = v.size() * static_cast<size_t>(q) / 4, b = v.size() * static_cast<size_t>(q + 1) / 4;
    double s = 0;
    for (size_t i = a; i < b; ++i) s += v[i];
    out.push_back(b > a ? s / static_cast<double>(b - a) : NAN);
  }
  return out;
}

// The learners, each with its step-time factor: the seed's spread around 1, divided by its speed.
std::vector<SimLearner> MakeLearners(const RunConfig& c, const SimulateOptions& o) {
  std::vector<SimLearner> learners(static_cast<size_t>(c.learners));
  Rng spread_rng(c.seed * 31 + 5);
  for (int m = 0; m < c.learners; ++m) {
    learners[static_cast<size_t>(m)].id = m;
    learners[static_cast<size_t>(m)].factor = (1.0 + o.spread * spread_rng.Uniform(-1.0, 1.0)) / c.SpeedOf(m);
  }
  return learners;
}

// What the simulation records of every closed round, as the syncer's round log and live
// evaluator would.
class RoundObserver {
 public:
  RoundObserver(const RunConfig& c, const SimulateOptions& o, SimClock& clock, Evaluator& eval, SimulateResult& result)
      : c_(c), o_(o), clock_(clock), eval_(eval), result_(result), hist_(static_cast<size_t>(c.learners) + 1, 0) {}

  void operator()(const syncer::SyncerCore& sc, const syncer::RoundReport& r) {
    const double t = ToSeconds(clock_.Now());
    result_.round_log.push_back(RoundFields(r));
    result_.round_log.back()["t"] = t;
    if (r.refused) return;
    norms_.push_back(r.merged_norm);
    hist_[std::min(r.contributors.size(), hist_.size() - 1)] += 1;
    if (c_.eval_every <= 0 || sc.rounds_closed() % c_.eval_every != 0) return;
    auto loss = eval_.Of(sc, std::max(1, c_.eval_batches / 4));  // as the syncer's live evaluator
    if (!loss.ok()) return void(eval_status_ = loss.status());
    result_.round_log.back()["eval_loss"] = *loss;
    result_.global_eval_curve.push_back(
        {{"rounds", sc.rounds_closed()}, {"tokens_merged", sc.tokens_merged()}, {"t", t}, {"eval_loss", *loss}});
    if (o_.progress) {
      o_.progress(
          fmt::format("t = {:7.1f} s (simulated)  rounds {:5d}  tokens merged {:10.0f}  global eval loss {:.4f}", t,
                      sc.rounds_closed(), sc.tokens_merged(), *loss));
    }
  }
  const Status& eval_status() const { return eval_status_; }
  // Into the result: the contributors histogram and the merged norms by quarter.
  void Summarize() {
    result_.contributors_histogram = hist_;
    result_.merged_norm_quarters = QuarterMeans(norms_);
  }

 private:
  const RunConfig& c_;
  const SimulateOptions& o_;
  SimClock& clock_;
  Evaluator& eval_;
  SimulateResult& result_;
  std::vector<double> norms_;
  std::vector<int64_t> hist_;
  Status eval_status_;
};

}  // namespace

StatusOr<SimulateResult> Simulate(const RunConfig& config, const SimulateOptions& o) {
  ATOLL_RETURN_IF_ERROR(ValidateRunConfig(config));
  const RunConfig c = Normalized(config);
  ATOLL_RETURN_IF_ERROR(CheckSimulated(c, o));
  ATOLL_ASSIGN_OR_RETURN(auto topts, MakeTrainerOptions(c, 0));
  ATOLL_ASSIGN_OR_RETURN(auto evt, model::Trainer::Create(topts));
  ATOLL_ASSIGN_OR_RETURN(auto plan, MakePlan(c, evt->tensors()));
  Evaluator eval(std::move(evt), plan);
  SimulateResult result;
  result.params = plan.total_numel;
  {
    ATOLL_ASSIGN_OR_RETURN(auto e0, eval.trainer().Evaluate(c.eval_batches));
    result.eval_loss_start = e0.loss;
  }
  syncer::SyncerOptions sopts = MakeSyncerOptions(c);
  sopts.incarnation = 1;
  ATOLL_ASSIGN_OR_RETURN(auto core, syncer::SyncerCore::Create(
                                        sopts, plan, exchange::GatherAll(plan, model::ParameterViews(eval.trainer()))));

  SimClock clock;
  RoundObserver observe(c, o, clock, eval, result);
  // Simulated time must not move until every learner is counted: the loop's thread is a
  // participant from its construction, and while it alone was counted each of its waits jumped
  // the clock (a loaded machine that delayed the learners' start added ~380 simulated seconds).
  std::optional<ClockThread> setup(std::in_place, clock);
  syncer::SyncerLoop loop(std::move(core), clock, std::ref(observe));

  std::vector<SimLearner> learners = MakeLearners(c, o);
  std::vector<std::thread> threads;
  for (auto& l : learners) {
    threads.push_back(StartThread(clock, [&, lp = &l] { RunLearner(c, o, plan, loop, clock, *lp); }));
  }
  setup.reset();  // simulated time starts now that every learner is counted
  for (auto& t : threads) t.join();
  ClockThread hold(clock);  // from here on simulated time stands still (only the loop is left)
  for (const auto& l : learners) {
    result.simulated_seconds = std::max(result.simulated_seconds, l.finished_s);
    if (!l.status.ok()) {
      loop.Stop();
      return l.status.WithContext(fmt::format("learner {}", l.id));
    }
    result.learners.push_back(l.summary);
    result.tokens_trained += l.summary.value("tokens", int64_t{0});
    result.payload_bytes_up += l.summary.value("payload_bytes_up", int64_t{0});
    result.payload_bytes_down += l.summary.value("payload_bytes_down", int64_t{0});
  }
  // The end of the run, as the syncer's Finish: close what is pending, then evaluate Θ.
  auto final = loop.Call([&](syncer::SyncerCore& sc, TimePoint now) -> StatusOr<double> {
    for (const auto& r : sc.CloseAllPending(now, clock)) observe(sc, r);
    result.rounds = sc.rounds_closed();
    result.tokens_merged = sc.tokens_merged();
    return eval.Of(sc, c.eval_batches);
  });
  loop.Stop();
  if (!observe.eval_status().ok()) return observe.eval_status().WithContext("evaluation during the run");
  if (!final.ok()) return final.status().WithContext("final evaluation");
  result.eval_loss = *final;
  observe.Summarize();
  return result;
}

nlohmann::json SimulateSummary(const RunConfig& config, const SimulateOptions& o, const SimulateResult& r) {
  return {{"kind", "simulated"},
          {"config", ToJson(config)},
          {"simulation", {{"step_seconds", o.step_seconds}, {"spread", o.spread}, {"jitter", o.jitter}}},
          {"eval_loss", r.eval_loss},
          {"eval_loss_start", r.eval_loss_start},
          {"simulated_seconds", r.simulated_seconds},
          {"rounds", r.rounds},
          {"tokens_trained", r.tokens_trained},
          {"tokens_merged", r.tokens_merged},
          {"params", r.params},
          {"payload_bytes_up", r.payload_bytes_up},
          {"payload_bytes_down", r.payload_bytes_down},
          {"contributors_histogram", r.contributors_histogram},
          {"merged_norm_quarters", r.merged_norm_quarters},
          {"global_eval_curve", r.global_eval_curve},
          {"learners", r.learners}};
}

}  // namespace atl::runtime
