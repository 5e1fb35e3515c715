// `atoll syncer`: the global model, the rounds, the gRPC service, the final evaluation.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fmt/format.h>

#include "atoll/core/checksum.h"
#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/core/rng.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/model/data.h"
#include "atoll/model/safetensors.h"
#include "atoll/runtime/processes.h"
#include "atoll/syncer/durable_state.h"
#include "atoll/syncer/syncer_loop.h"
#include "atoll/transport/grpc.h"
#include "global_eval.h"
#include "jsonl.h"

namespace atl::runtime {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

std::string Ids(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return "[" + s + "]";
}

}  // namespace

StatusOr<syncer::SyncerOptions> MakeSyncerOptions(const RunConfig& c) {
  syncer::SyncerOptions o;
  o.run_id = c.run_id;
  o.mode = c.mode;
  o.H = c.H;
  o.round.quorum = c.quorum;  // Normalized: K = M in the synchronous modes
  o.round.grace = c.grace;
  o.round.gamma = c.gamma;
  o.round.grace_cap_s = c.grace_cap;
  o.round.tau = c.tau;
  o.merge_rule = c.merge == "rda" ? diloco::MergeRule::kRda : diloco::MergeRule::kMean;
  o.outer = {c.outer_lr, c.outer_momentum, true};
  o.outer_step = c.outer_step == "round" ? syncer::OuterStepRule::kRound : syncer::OuterStepRule::kSweep;
  o.outer_gradient = c.outer_gradient == "base" ? syncer::OuterGradientRule::kBase : syncer::OuterGradientRule::kCurrent;
  ATOLL_ASSIGN_OR_RETURN(auto up, diloco::ParseEncoding(c.uplink));
  ATOLL_ASSIGN_OR_RETURN(auto down, diloco::ParseEncoding(c.downlink));
  o.uplink = {up, c.block};
  o.downlink = {down, c.block};
  o.learner_timeout_s = c.learner_timeout;
  return o;
}

StatusOr<diloco::FragmentPlan> MakePlan(const RunConfig& c, const std::vector<diloco::TensorSpec>& tensors) {
  diloco::PlanOptions po;
  po.num_fragments = c.fragments;
  bool ok = true;
  po.strategy = diloco::ParsePlanStrategy(c.plan, &ok);
  if (!ok) return InvalidArgumentError("unknown plan strategy '" + c.plan + "'");
  return diloco::MakeFragmentPlan(tensors, po);
}

int RunSyncerProcess(const SyncerProcessOptions& opt) {
  const RunConfig c = Normalized(opt.config);
  auto fail = [](const Status& st, int code) {
    std::fprintf(stderr, "atoll syncer: error: %s\n", st.ToString().c_str());
    return code;
  };
  if (Status st = ValidateRunConfig(c); !st.ok()) return fail(st, 2);
  const std::string out = opt.out_dir.empty() ? "." : opt.out_dir;
  if (Status st = MakeDirs(out); !st.ok()) return fail(st, 1);
  auto manifest = model::EnsureDataPrepared(c.data, [](const std::string& m) { std::printf("%s\n", m.c_str()); });
  if (!manifest.ok()) return fail(manifest.status(), 2);
  auto topts = MakeTrainerOptions(c, 0);
  if (!topts.ok()) return fail(topts.status(), 2);
  auto evaluator = model::Trainer::Create(*topts);  // Θ⁰ (same seed as the learners) and evaluation
  if (!evaluator.ok()) return fail(evaluator.status(), 1);
  model::Trainer& ev = **evaluator;
  auto plan = MakePlan(c, ev.tensors());
  if (!plan.ok()) return fail(plan.status(), 2);
  std::vector<std::span<float>> params;
  for (int i = 0; i < static_cast<int>(ev.tensors().size()); ++i) params.push_back(ev.Parameter(i));
  std::vector<std::vector<float>> initial;
  for (const auto& f : plan->fragments) {
    initial.emplace_back(static_cast<size_t>(f.numel));
    exchange::GatherFragment(f, params, initial.back());
  }
  auto sopts = MakeSyncerOptions(c);
  if (!sopts.ok()) return fail(sopts.status(), 2);
  sopts->incarnation = static_cast<uint64_t>(UnixSeconds() * 1e6) ^ static_cast<uint64_t>(::getpid());
  if (c.mode == diloco::Mode::kDdp) {
    // The parameter server's optimizer: the evaluator trainer's AdamW applied to the averaged
    // gradient. Runs on the syncer's loop thread only.
    sopts->ddp_step = [&ev, &params, frag = plan->fragments[0]](std::span<const float> mean,
                                                               std::span<float> theta) -> Status {
      std::vector<std::span<float>> grads;
      for (int i = 0; i < static_cast<int>(ev.tensors().size()); ++i) grads.push_back(ev.Gradient(i));
      exchange::ScatterFragment(frag, mean, grads);
      exchange::ScatterFragment(frag, theta, params);
      ATOLL_RETURN_IF_ERROR(ev.ApplyGradients(model::StepStats{}).status());
      exchange::GatherFragment(frag, params, theta);
      return Status::Ok();
    };
  }
  auto core = syncer::SyncerCore::Create(*sopts, *plan, std::move(initial));
  if (!core.ok()) return fail(core.status(), 2);
  syncer::DurableState durable(opt.state_dir.empty() ? out + "/state" : opt.state_dir);
  const bool resumed = durable.Exists();
  if (resumed) {
    if (Status st = durable.Restore(*core, RealClock::Default().Now()); !st.ok()) {
      const char* hint = st.code() == StatusCode::kFailedPrecondition ? " (point --state at a fresh folder to start over)" : "";
      return fail(Status(st.code(), st.message() + hint).WithContext("resuming from " + durable.dir()), 2);
    }
    std::printf("syncer: resumed from %s: %lld committed rounds, fragment versions %s\n", durable.dir().c_str(),
                static_cast<long long>(core->rounds_closed()), nlohmann::json(core->versions()).dump().c_str());
  } else if (Status st = durable.SaveAll(*core); !st.ok()) {
    return fail(st.WithContext("writing the initial state"), 1);
  }

  std::printf("syncer: run %s, mode %s, %lld params in %d fragments (peak/ideal %.3f), H=%d tau=%d K=%d grace=%s merge=%s, up %s down %s\n",
              c.run_id.c_str(), diloco::ModeName(c.mode), static_cast<long long>(ev.num_params()),
              plan->num_fragments(), plan->peak_to_ideal, c.H, c.tau, sopts->round.quorum,
              sopts->round.grace ? "on" : "off", c.merge.c_str(), c.uplink.c_str(), c.downlink.c_str());
  // The initial model's eval loss, measured once per run (a restarted syncer reads it back
  // instead of spending seconds of its downtime re-evaluating).
  model::EvalStats start_eval_stats;
  const std::string start_eval_file = durable.dir() + "/eval-start.json";
  if (auto saved = ReadFile(start_eval_file); resumed && saved.ok()) {
    start_eval_stats.loss = nlohmann::json::parse(*saved, nullptr, false).value("loss", 0.0);
  } else {
    auto e = ev.Evaluate(c.eval_batches);
    if (!e.ok()) return fail(e.status(), 1);
    start_eval_stats = *e;
    (void)WriteFileAtomic(start_eval_file, nlohmann::json({{"loss", e->loss}}).dump());
  }
  const model::EvalStats* start_eval = &start_eval_stats;
  std::printf("syncer: eval loss of the initial global model %.4f\n", start_eval->loss);
  std::fflush(stdout);

  JsonlWriter metrics(out + "/metrics-syncer.jsonl");
  if (resumed) {
    std::vector<std::string> sums;
    for (int p = 0; p < plan->num_fragments(); ++p) sums.push_back(ChecksumHex(exchange::ValuesChecksum(core->theta(p))));
    metrics.Write({{"t", UnixSeconds()}, {"source", "syncer"}, {"kind", "resumed"}, {"versions", core->versions()},
                   {"rounds", core->rounds_closed()}, {"theta_checksums", sums}});
  }
  RealClock& clock = RealClock::Default();
  double last_table_save = 0;
  // The global model's eval loss during the run, off the loop thread (its own Trainer).
  std::mutex curve_mu;
  nlohmann::json curve = nlohmann::json::array();  // guarded by curve_mu
  std::unique_ptr<GlobalEvaluator> live_eval;
  syncer::SyncerLoop* loop_ptr = nullptr;
  if (c.eval_every > 0) {
    auto eval_trainer = model::Trainer::Create(*topts);
    if (!eval_trainer.ok()) return fail(eval_trainer.status(), 1);
    live_eval = std::make_unique<GlobalEvaluator>(std::move(*eval_trainer), *plan, std::max(1, c.eval_batches / 4),
        [&](const GlobalEvalPoint& e) {
          metrics.Write({{"t", e.t}, {"source", "syncer"}, {"kind", "global_eval"}, {"rounds", e.rounds},
                         {"tokens_merged", e.tokens_merged}, {"eval_loss", e.loss}});
          {
            std::lock_guard<std::mutex> lock(curve_mu);
            curve.push_back({{"t", e.t}, {"rounds", e.rounds}, {"tokens_merged", e.tokens_merged}, {"eval_loss", e.loss}});
          }
          // Stop() of this evaluator always comes before the loop stops, so this Call returns.
          if (loop_ptr) loop_ptr->Call([&e](syncer::SyncerCore& sc, TimePoint) { sc.SetGlobalEval(e.loss, e.rounds); return 0; });
        });
  }
  auto OfferGlobalEval = [&](const syncer::SyncerCore& sc) {
    if (!live_eval || sc.rounds_closed() % c.eval_every != 0) return;
    std::vector<std::vector<float>> theta;
    for (int p = 0; p < sc.plan().num_fragments(); ++p) {
      auto s = sc.theta(p);
      theta.emplace_back(s.begin(), s.end());
    }
    live_eval->Offer(std::move(theta), {UnixSeconds(), sc.rounds_closed(), sc.tokens_merged(), 0});
  };
  auto on_round = [&](const syncer::SyncerCore& sc, const syncer::RoundReport& r) {
    // Commit before the new version becomes visible (docs/failure-semantics.md).
    if (Status st = durable.SaveFragment(sc, r.fragment); !st.ok()) {
      std::fprintf(stderr, "syncer: FATAL: cannot persist fragment %d: %s\n", r.fragment, st.ToString().c_str());
      std::abort();  // never publish a version that is not durable
    }
    if (UnixSeconds() - last_table_save > 2.0) {
      (void)durable.SaveLearners(sc);
      last_table_save = UnixSeconds();
    }
    metrics.Write({{"t", UnixSeconds()}, {"source", "syncer"}, {"kind", "round"},
                   {"fragment", r.fragment}, {"round", r.round}, {"version", r.version},
                   {"contributors", r.contributors}, {"weights", r.weights}, {"late", r.late},
                   {"grace_s", r.grace_seconds}, {"merged_norm", r.merged_norm},
                   {"tokens_merged", r.tokens_merged}, {"token_share", r.token_share},
                   {"sweep", r.sweep_completed}, {"step_norm", r.step_norm}, {"reason", r.reason},
                   {"theta_checksum", ChecksumHex(exchange::ValuesChecksum(sc.theta(r.fragment)))}});
    std::printf("round f%d#%lld -> v%lld from %s (late %s, grace %.2fs): %s\n", r.fragment,
                static_cast<long long>(r.round), static_cast<long long>(r.version),
                Ids(r.contributors).c_str(), Ids(r.late).c_str(), r.grace_seconds, r.reason.c_str());
    std::fflush(stdout);
  };
  syncer::SyncerLoop loop(std::move(*core), clock, [&](const syncer::SyncerCore& sc, const syncer::RoundReport& r) {
    on_round(sc, r);
    OfferGlobalEval(sc);
  });
  loop_ptr = &loop;

  std::mutex finish_mu;
  std::condition_variable finish_cv;
  bool finished = false;
  std::string summary_text;
  auto on_finish = [&](bool evaluate) -> std::string {
    std::lock_guard<std::mutex> lock(finish_mu);
    if (finished) return summary_text;
    if (live_eval) live_eval->Stop();
    loop.RequestFinish();
    // Merge what the learners pushed last (their final sync) before taking Θ.
    loop.Call([&](syncer::SyncerCore& sc, TimePoint now) {
      for (const auto& r : sc.CloseAllPending(now, clock)) on_round(sc, r);
      return 0;
    });
    // Snapshot Θ and the table and load Θ into the evaluator on the loop thread (in ddp mode
    // the loop thread also steps that trainer's optimizer, so nothing else may touch it).
    auto snap = loop.Call([&](syncer::SyncerCore& sc, TimePoint now) {
      std::vector<std::vector<float>> theta;
      for (int p = 0; p < sc.plan().num_fragments(); ++p) {
        auto s = sc.theta(p);
        theta.emplace_back(s.begin(), s.end());
        exchange::ScatterFragment(plan->fragments[static_cast<size_t>(p)], theta.back(), params);
      }
      return std::make_pair(theta, sc.StatusJson(now));
    });
    nlohmann::json summary = snap.second;
    summary["eval_loss_start"] = start_eval->loss;
    {
      std::lock_guard<std::mutex> curve_lock(curve_mu);
      summary["global_eval_curve"] = curve;
    }
    summary["params"] = ev.num_params();
    summary["plan_peak_to_ideal"] = plan->peak_to_ideal;
    uint64_t theta_sum = 0;
    for (const auto& f : snap.first) theta_sum ^= exchange::ValuesChecksum(f);
    summary["theta_checksum"] = ChecksumHex(theta_sum);
    if (evaluate) {
      auto e = ev.Evaluate(c.eval_batches);
      if (e.ok()) {
        summary["eval_loss"] = e->loss;
        summary["eval_perplexity"] = e->perplexity;
      } else {
        summary["eval_error"] = e.status().ToString();
      }
    }
    std::vector<std::span<const float>> views(params.begin(), params.end());
    Status st = model::WriteSafetensors(out + "/global.safetensors", ev.tensors(), views,
                                        {{"run_id", c.run_id}, {"rounds", std::to_string(summary["rounds"].get<int64_t>())}});
    summary["checkpoint"] = st.ok() ? out + "/global.safetensors" : "error: " + st.ToString();
    summary_text = summary.dump();
    (void)WriteFileAtomic(out + "/syncer-summary.json", summary.dump(2));
    finished = true;
    finish_cv.notify_all();
    return summary_text;
  };

  transport::ServerOptions so;
  so.address = opt.listen;
  so.token = c.token;
  so.tls.enabled = !opt.tls.cert.empty();
  so.tls.cert_file = opt.tls.cert;
  so.tls.key_file = opt.tls.key;
  auto server = transport::GrpcSyncerServer::Start(so, loop, on_finish);
  if (!server.ok()) return fail(server.status(), 1);
  std::printf("syncer: listening on port %d\n", (*server)->port());
  std::fflush(stdout);
  if (!opt.port_file.empty()) {
    if (Status st = WriteFileAtomic(opt.port_file, std::to_string((*server)->port())); !st.ok()) return fail(st, 1);
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  {
    std::unique_lock<std::mutex> lock(finish_mu);
    while (!finished && !g_stop) finish_cv.wait_for(lock, std::chrono::milliseconds(200));
  }
  if (live_eval) live_eval->Stop();
  // Give learners a moment to see the finish flag in a heartbeat reply, then stop.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  (*server)->Shutdown();
  loop.Stop();
  std::printf("syncer: stopped (%s)\n", finished ? "run finished" : "signal");
  return 0;
}

}  // namespace atl::runtime
