// `atoll syncer`: the global model, the rounds, the gRPC service, the final evaluation.
#include <sys/resource.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <future>
#include <fmt/format.h>

#include "atoll/core/checksum.h"
#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/core/rng.h"
#include "atoll/core/text.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/model/data.h"
#include "atoll/model/safetensors.h"
#include "atoll/observe/http_server.h"
#include "atoll/observe/prometheus.h"
#include "atoll/runtime/processes.h"
#include "atoll/syncer/commit_headroom.h"
#include "atoll/syncer/durable_state.h"
#include "atoll/syncer/syncer_loop.h"
#include "atoll/transport/credentials.h"
#include "atoll/transport/grpc.h"
#include "checkpoint_writer.h"
#include "global_eval.h"
#include "model_host.h"
#include "round_log.h"

namespace atl::runtime {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

// A file readable by its owner only (it may hold a token).
Status WriteOwnerOnly(const std::string& path, const std::string& text) {
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(path, text));
  std::error_code ec;
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write,
                               std::filesystem::perm_options::replace, ec);
  return ec ? InternalError("chmod 0600 " + path + ": " + ec.message()) : Status::Ok();
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
  ATOLL_ASSIGN_OR_RETURN(o.merge_rule, diloco::ParseMergeRule(c.merge));
  o.weight_rule = c.weights == "uniform" ? diloco::WeightRule::kUniform : diloco::WeightRule::kTokens;
  o.outer = {c.outer_lr.value_or(0.7), c.outer_momentum.value_or(0.9), true};  // set by Normalized
  o.outer_step = c.outer_step == "round"     ? syncer::OuterStepRule::kRound
                 : c.outer_step == "running" ? syncer::OuterStepRule::kRunning
                                             : syncer::OuterStepRule::kSweep;
  o.outer_gradient = c.outer_gradient == "base" ? syncer::OuterGradientRule::kBase : syncer::OuterGradientRule::kCurrent;
  ATOLL_RETURN_IF_ERROR(diloco::ParseEncoding(c.uplink).status());
  ATOLL_RETURN_IF_ERROR(diloco::ParseEncoding(c.downlink).status());
  ATOLL_RETURN_IF_ERROR(diloco::ParseCompression(c.compression).status());
  o.uplink = UplinkCodec(c);
  o.downlink = DownlinkCodec(c);
  o.learner_timeout_s = c.learner_timeout;
  o.max_learners = c.max_learners;
  o.quarantine_factor = c.quarantine_factor;
  o.max_consecutive_rejects = c.max_consecutive_rejects;
  o.ban_seconds = c.ban_seconds;
  return o;
}

transport::ServerLimits MakeServerLimits(const RunConfig& c) {
  transport::ServerLimits l;
  l.max_inflight_push_bytes = static_cast<int64_t>(c.max_inflight_push_mb * (1 << 20));
  l.max_concurrent_streams = c.max_streams;
  l.max_threads = c.max_threads;
  l.memory_quota_bytes = static_cast<int64_t>(c.memory_quota_mb * (1 << 20));
  l.handshake_timeout_ms = static_cast<int>(c.handshake_timeout_s * 1000);
  l.max_connection_idle_ms = static_cast<int>(c.idle_timeout_s * 1000);
  l.max_connections = c.max_connections;
  l.max_pushes_per_learner = c.max_pushes_per_learner;
  l.max_polls_per_learner = c.max_polls_per_learner;
  l.max_heartbeats_per_s = c.max_heartbeats_per_s;
  l.push_timeout_ms = static_cast<int>(c.push_timeout_s * 1000);
  return l;
}

StatusOr<diloco::FragmentPlan> MakePlan(const RunConfig& c, const std::vector<diloco::TensorSpec>& tensors) {
  diloco::PlanOptions po;
  po.num_fragments = c.fragments;
  bool ok = true;
  po.strategy = diloco::ParsePlanStrategy(c.plan, &ok);
  if (!ok) return InvalidArgumentError("unknown plan strategy '" + c.plan + "'");
  return diloco::MakeFragmentPlan(tensors, po);
}

namespace {

// `atoll syncer` in named stages: Setup (model, plan, Θ⁰, core, durable state, start evaluation),
// Serve (gRPC until Finish or a signal), and the per-round and finish work in between.
// Threads (docs/architecture.md#threading): the main thread runs Run and waits; the loop thread
// runs OnRound; a gRPC thread may run Finish (serialised by finish_mu_); the live evaluator's
// thread runs OnGlobalEval; HTTP handler threads read the status document.
class SyncerProcess {
 public:
  explicit SyncerProcess(const SyncerProcessOptions& opt)
      : opt_(opt), c_(Normalized(opt.config)), out_(opt.out_dir.empty() ? "." : opt.out_dir) {}

  // Exit code and message for each failure; 0 when the run finished or was stopped cleanly.
  int Run() {
    if (Status st = ValidateRunConfig(c_); !st.ok()) return Fail(st, 2);
    if (!opt_.shard.empty()) {
      auto shard = syncer::ParseShardSpec(opt_.shard);
      if (!shard.ok()) return Fail(shard.status(), 2);
      shard_ = *shard;
    }
    if (c_.syncer_shards > 1 && shard_.count != c_.syncer_shards) {  // the run file's S, when it says one
      return Fail(InvalidArgumentError("the run file has syncer_shards = " + std::to_string(c_.syncer_shards) +
                                       ": start each shard with --shard i/" + std::to_string(c_.syncer_shards) +
                                       (opt_.shard.empty() ? "" : " (not --shard " + opt_.shard + ")")), 2);
    }
    if (!opt_.http.empty()) {
      if (auto hp = observe::SplitHostPort(opt_.http); !hp.ok()) return Fail(hp.status().WithContext("--http"), 2);
      if (!IsLoopbackAddress(opt_.http) && c_.token.empty() && opt_.secret_file.empty()) {  // as for --listen
        return Fail(FailedPreconditionError("refusing to serve the HTTP status endpoint on " + opt_.http +
                                            " without credentials: anyone who reaches it would see the run's status "
                                            "(give --secret-file or --token, or a loopback --http address)"), 2);
      }
    }
    if (Status st = MakeDirs(out_); !st.ok()) return Fail(st, 1);
    if (Status st = WriteRunConfigOnce(); !st.ok()) return Fail(st, 1);
    RaiseDescriptorLimit();
    if (int rc = Setup(); rc != 0) return rc;
    // Rounds close only while a commit can succeed: otherwise they are held (commit_headroom.h).
    headroom_ = std::make_unique<syncer::CommitHeadroom>(
        durable_->dir(), syncer::CommitBytes(plan_, static_cast<uint64_t>(c_.commit_reserve_mb * (1 << 20))), kCommitFds);
    loop_ = std::make_unique<syncer::SyncerLoop>(
        std::move(*core_), clock_,
        [this](const syncer::SyncerCore& sc, const syncer::RoundReport& r) {
          Commit(sc, r);
          OfferGlobalEval(sc);
        },
        std::chrono::milliseconds(50), [this](const syncer::SyncerCore&) { return headroom_->Check(); });
    return Serve();
  }

  // Descriptors kept for commits (CommitHeadroom): a commit holds at most a temp file and the
  // folder open at once; the rest is slack for the learner table, copies and metrics.
  static constexpr int kCommitFds = 16;

  // The soft descriptor limit up to the hard one: connections are capped below the limit
  // (ServerLimits::max_connections), so a higher one means more of them before any is refused.
  static void RaiseDescriptorLimit() {
    rlimit r{};
    if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
      r.rlim_cur = r.rlim_max;
      (void)::setrlimit(RLIMIT_NOFILE, &r);
    }
  }

 private:
  static int Fail(const Status& st, int code) {
    std::fprintf(stderr, "atoll syncer: error: %s\n", st.ToString().c_str());
    return code;
  }

  // The run folder of a syncer started by hand holds its run config too, so the folder is a
  // model source (`atoll sample/eval --checkpoint`, `atoll export --state`) like an `atoll run`
  // folder. Owner-only: it may hold a shared token. An existing one (atoll run's) is kept.
  Status WriteRunConfigOnce() {
    const std::string path = out_ + "/config.json";
    if (FileExists(path)) return Status::Ok();
    return WriteOwnerOnly(path, ToJson(c_).dump(2));
  }

  int Setup() {
    auto host = ModelHost::Open(c_, /*evaluate=*/shard_.count == 1);  // a shard holds only its fragments of Θ
    if (!host.ok()) return Fail(host.status(), 2);
    model_ = std::move(*host);
    if (c_.mode == diloco::Mode::kDdp && model_->evaluator() == nullptr) {
      return Fail(FailedPreconditionError("ddp mode needs an atoll preset (its optimizer is an atoll Trainer's): " +
                                          model_->no_evaluation()), 2);
    }
    auto plan = MakePlan(c_, model_->tensors());
    if (!plan.ok()) return Fail(plan.status(), 2);
    plan_ = std::move(*plan);
    if (int rc = CreateCore(); rc != 0) return rc;
    if (shard_.count > 1) {
      std::printf("syncer: shard %s: owns the fragments p with p mod %d = %d\n", shard_.ToString().c_str(), shard_.count,
                  shard_.index);
    }
    std::printf("syncer: run %s, mode %s, model %s in %d fragments (peak/ideal %.3f), H=%d tau=%d K=%d grace=%s merge=%s, outer step %s (lr %g, momentum %g), up %s down %s\n",
                c_.run_id.c_str(), diloco::ModeName(c_.mode), model_->Describe().c_str(), plan_.num_fragments(),
                plan_.peak_to_ideal, c_.H, c_.tau, c_.quorum, c_.grace ? "on" : "off", c_.merge.c_str(),
                c_.outer_step.c_str(), c_.outer_lr.value_or(0), c_.outer_momentum.value_or(0), c_.uplink.c_str(),
                c_.downlink.c_str());
    log_ = std::make_unique<RoundLog>(out_ + "/metrics-syncer.jsonl");
    checkpoints_ = std::make_unique<CheckpointWriter>(*model_, plan_, out_, c_.run_id, shard_.count == 1);
    if (int rc = EvaluateStart(); rc != 0) return rc;
    if (resumed_) {
      std::vector<std::string> sums;
      for (int p = 0; p < plan_.num_fragments(); ++p) sums.push_back(ChecksumHex(exchange::ValuesChecksum(core_->theta(p))));
      log_->Line({{"t", UnixSeconds()}, {"source", "syncer"}, {"kind", "resumed"}, {"versions", core_->versions()},
                  {"rounds", core_->rounds_closed()}, {"theta_checksums", sums}});
    }
    return StartLiveEval();
  }

  // The parameter server's optimizer (ddp mode): the evaluator trainer's AdamW applied to the
  // averaged gradient. Runs on the syncer's loop thread only.
  syncer::DdpStep MakeDdpStep() {
    return [this](std::span<const float> mean, std::span<float> theta) -> Status {
      model::Trainer& ev = *model_->evaluator();
      const diloco::Fragment& frag = plan_.fragments[0];
      std::vector<std::span<float>> grads, params;
      for (int i = 0; i < static_cast<int>(ev.tensors().size()); ++i) {
        grads.push_back(ev.Gradient(i));
        params.push_back(ev.Parameter(i));
      }
      exchange::ScatterFragment(frag, mean, grads);
      exchange::ScatterFragment(frag, theta, params);
      ATOLL_RETURN_IF_ERROR(ev.ApplyGradients(model::StepStats{}).status());
      exchange::GatherFragment(frag, params, theta);
      return Status::Ok();
    };
  }

  // The core from Θ⁰, then restored from the durable state if there is one (or that state written).
  int CreateCore() {
    std::vector<std::vector<float>> initial(plan_.fragments.size());
    for (const auto& f : plan_.fragments) {
      if (!shard_.owns(f.index)) continue;  // another shard's: not needed here
      auto& values = initial[static_cast<size_t>(f.index)];
      values.resize(static_cast<size_t>(f.numel));
      if (Status st = model_->Initial(f, values); !st.ok()) return Fail(st.WithContext("initial values"), 2);
    }
    auto sopts = MakeSyncerOptions(c_);
    if (!sopts.ok()) return Fail(sopts.status(), 2);
    sopts->incarnation = static_cast<uint64_t>(UnixSeconds() * 1e6) ^ static_cast<uint64_t>(::getpid());
    if (c_.mode == diloco::Mode::kDdp) sopts->ddp_step = MakeDdpStep();
    sopts->shard = shard_;
    auto core = syncer::SyncerCore::Create(*sopts, plan_, std::move(initial));
    if (!core.ok()) return Fail(core.status(), 2);
    core_ = std::move(*core);
    durable_ = std::make_unique<syncer::DurableState>(opt_.state_dir.empty() ? out_ + "/state" : opt_.state_dir);
    std::vector<std::string> stale = durable_->RemoveStaleTempFiles();
    // The run folder's own files (a model write is as large as the model).
    if (auto out = RemoveStaleTempFiles(out_, {"global.safetensors", "syncer-summary.json", "config.json", "status-url"});
        out.ok()) {
      for (const auto& f : *out) stale.push_back(out_ + "/" + f);
    }
    for (const std::string& f : stale) std::printf("syncer: removed %s (a write a killed syncer left unfinished)\n", f.c_str());
    auto contents = durable_->Inspect();  // a damaged or foreign folder is refused, never overwritten
    if (!contents.ok()) return Fail(contents.status(), 2);
    resumed_ = *contents == syncer::DurableState::Contents::kSaved;
    if (resumed_) {
      if (Status st = durable_->Restore(*core_, clock_.Now()); !st.ok()) {
        const char* hint = st.code() == StatusCode::kFailedPrecondition ? " (point --state at a fresh folder to start over)" : "";
        return Fail(Status(st.code(), st.message() + hint).WithContext("resuming from " + durable_->dir()), 2);
      }
      std::printf("syncer: resumed from %s: %lld committed rounds, fragment versions %s\n", durable_->dir().c_str(),
                  static_cast<long long>(core_->rounds_closed()), nlohmann::json(core_->versions()).dump().c_str());
      PrintStateWarnings();
    } else if (Status st = durable_->SaveAll(*core_); !st.ok()) {
      return Fail(st.WithContext("writing the initial state"), 1);
    }
    return 0;
  }

  // What the durable state ignored or rebuilt at the resume, and what was lost with it.
  void PrintStateWarnings() {
    for (; warnings_printed_ < durable_->warnings().size(); ++warnings_printed_) {
      std::fprintf(stderr, "syncer: warning: %s\n", durable_->warnings()[warnings_printed_].c_str());
    }
  }

  // The initial model's eval loss, measured once per run (a restarted syncer reads it back
  // instead of spending seconds of its downtime re-evaluating). Nothing without an evaluator.
  int EvaluateStart() {
    if (model_->evaluator() == nullptr) {
      std::printf("syncer: no evaluation: %s\n", model_->no_evaluation().c_str());
      return 0;
    }
    const std::optional<double> saved = resumed_ ? durable_->SavedStartEval() : std::nullopt;
    PrintStateWarnings();  // a damaged file is evaluated again, not a blocked restart
    if (saved) {
      start_eval_loss_ = *saved;
    } else {
      auto e = model_->evaluator()->Evaluate(c_.eval_batches);
      if (!e.ok()) return Fail(e.status(), 1);
      start_eval_loss_ = e->loss;
      (void)durable_->SaveStartEval(e->loss);
    }
    std::printf("syncer: eval loss of the initial global model %.4f\n", *start_eval_loss_);
    std::fflush(stdout);
    return 0;
  }

  // The global model's eval loss during the run, off the loop thread (its own Trainer).
  int StartLiveEval() {
    if (c_.eval_every <= 0 || shard_.count > 1 || model_->evaluator() == nullptr) return 0;
    auto trainer = model_->NewTrainer();
    if (!trainer.ok()) return Fail(trainer.status(), 1);
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

  // Loop thread: commit before the new version becomes visible (docs/failure-semantics.md).
  void Commit(const syncer::SyncerCore& sc, const syncer::RoundReport& r) {
    if (!r.refused) {
      // The descriptors kept for commits are free while it writes (the gate made sure there was
      // room on the disk before this round closed).
      const auto released = headroom_->ReleaseForCommit();
      // The accounting counters this round moved (tokens merged, rounds joined per learner) are
      // part of the committed state: a restart must not forget merged work. Written just before
      // Θ_p: a crash in between counts a round that is then not in Θ_p, whose learners send that
      // work again (at least once, never lost).
      if (Status st = durable_->SaveLearners(sc); !st.ok()) {
        std::fprintf(stderr, "syncer: warning: cannot persist the learner table: %s\n", st.ToString().c_str());
      }
      if (Status st = durable_->SaveFragment(sc, r.fragment); !st.ok()) {
        std::fprintf(stderr, "syncer: FATAL: cannot persist fragment %d: %s\n", r.fragment, st.ToString().c_str());
        std::abort();  // never publish a version that is not durable
      }
    }
    log_->Round(sc, r);
    // Counted here, not from rounds_closed(): one Poll may close several rounds before their commits.
    if (!r.refused && opt_.checkpoint_every > 0 && ++commits_since_checkpoint_ >= opt_.checkpoint_every && !finishing_) {
      commits_since_checkpoint_ = 0;
      if (CheckpointFits()) checkpoints_->Offer(ThetaOf(sc), SummaryOf(sc, clock_.Now()));
    }
  }

  // Whether the periodic model write fits on the disk beside the space the next commits need
  // (otherwise it is skipped with a warning; the next comes N rounds later).
  bool CheckpointFits() const {
    const uint64_t model_bytes = static_cast<uint64_t>(plan_.total_numel) * sizeof(float) + headroom_->commit_bytes();
    auto free = syncer::CommitHeadroom::FileSystemFreeBytes(out_);
    if (free.ok() && *free >= model_bytes) return true;
    std::fprintf(stderr, "syncer: warning: the periodic model write is skipped: %s\n",
                 free.ok() ? fmt::format("{} bytes free in {}, it and the next commits need {}", *free, out_, model_bytes).c_str()
                           : free.status().ToString().c_str());
    return false;
  }

  // Θ per fragment (another shard's fragments empty).
  static std::vector<std::vector<float>> ThetaOf(const syncer::SyncerCore& sc) {
    std::vector<std::vector<float>> t;
    for (int p = 0; p < sc.plan().num_fragments(); ++p) {
      auto v = sc.theta(p);
      t.emplace_back(v.begin(), v.end());
    }
    return t;
  }

  // The summary of the run so far: the status document plus the start evaluation, the eval
  // curve, the model size and Θ's checksum. Any thread that holds `sc` (the loop thread).
  nlohmann::json SummaryOf(const syncer::SyncerCore& sc, TimePoint now) {
    nlohmann::json summary = sc.StatusJson(now);
    AddEvaluation(summary);
    summary["params"] = plan_.total_numel;
    summary["model"] = model_->Describe();
    summary["plan_peak_to_ideal"] = plan_.peak_to_ideal;
    uint64_t theta_sum = 0;
    for (int p = 0; p < sc.plan().num_fragments(); ++p) {
      if (sc.owns(p)) theta_sum ^= exchange::ValuesChecksum(sc.theta(p));
    }
    summary["theta_checksum"] = ChecksumHex(theta_sum);
    return summary;
  }

  // The start evaluation and the curve, or why there is none.
  void AddEvaluation(nlohmann::json& doc) const {
    if (start_eval_loss_) doc["eval_loss_start"] = *start_eval_loss_;
    if (!model_->no_evaluation().empty()) doc["evaluation"] = "off: " + model_->no_evaluation();
    doc["global_eval_curve"] = log_->Curve();
  }

  // gRPC thread (Finish) or the main thread (a signal, every learner done): merge what is
  // pending, evaluate, write the model and the summary. Once; later calls return the summary.
  std::string Finish(bool evaluate) {
    std::lock_guard<std::mutex> lock(finish_mu_);
    if (finished_) return summary_text_;
    if (live_eval_) live_eval_->Stop();
    finishing_ = true;  // no periodic checkpoint from now on: this finish writes the model
    loop_->RequestFinish();
    model::Trainer* ev = shard_.count == 1 ? model_->evaluator() : nullptr;
    // Snapshot Θ and the table and load Θ into the evaluator on the loop thread (in ddp mode the
    // loop thread also steps that trainer's optimizer, so nothing else may touch it), after merging
    // what the learners pushed last (their final sync).
    auto [theta, summary] = loop_->Call([&](syncer::SyncerCore& sc, TimePoint now) {
      if (Status gate = headroom_->Check(); gate.ok()) {
        for (const auto& r : sc.CloseAllPending(now, clock_)) Commit(sc, r);
      } else {  // nothing committed is lost; what the learners pushed last is not merged
        std::fprintf(stderr, "syncer: holding rounds: %s: the rounds still open at the finish are not merged\n",
                     gate.message().c_str());
      }
      auto t = ThetaOf(sc);
      if (ev != nullptr) {
        std::vector<std::span<float>> params;
        for (int i = 0; i < static_cast<int>(ev->tensors().size()); ++i) params.push_back(ev->Parameter(i));
        for (int p = 0; p < sc.plan().num_fragments(); ++p) {
          exchange::ScatterFragment(plan_.fragments[static_cast<size_t>(p)], t[static_cast<size_t>(p)], params);
        }
      }
      return std::make_pair(t, SummaryOf(sc, now));
    });
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
    checkpoints_->Final(theta, summary);
    summary_text_ = DumpJson(summary);
    finished_ = true;
    finish_cv_.notify_all();
    return summary_text_;
  }

  // The gRPC server's options from the flags; FailedPrecondition/InvalidArgument for unsafe or
  // inconsistent ones.
  StatusOr<transport::ServerOptions> GrpcOptions() {
    transport::ServerOptions so;
    so.address = opt_.listen;
    so.token = c_.token;
    if (!opt_.secret_file.empty()) {
      ATOLL_ASSIGN_OR_RETURN(so.secret, ReadSecretFile(opt_.secret_file));
    }
    so.limits = MakeServerLimits(c_);
    so.allowed_learners = c_.allowed_learners;
    so.tls.enabled = !opt_.tls.cert.empty();
    so.tls.cert_file = opt_.tls.cert;
    so.tls.key_file = opt_.tls.key;
    so.tls.client_ca_file = opt_.tls.client_ca;
    if (!so.tls.client_ca_file.empty() && !so.tls.enabled) {
      return InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key: mutual TLS runs over TLS");
    }
    if (!IsLoopbackAddress(so.address)) {
      if (so.token.empty() && so.secret.empty()) {
        return FailedPreconditionError("refusing to listen on " + so.address +
                                       " without credentials: give --secret-file (per-learner) or --token");
      }
      if (!so.tls.enabled) {
        std::fprintf(stderr, "syncer: WARNING: listening on %s without TLS: tokens and model values travel in plaintext "
                             "(--tls-cert/--tls-key)\n", so.address.c_str());
      }
    }
    return so;
  }

  // The live status document (/api/status; /metrics renders it). HTTP threads.
  StatusOr<nlohmann::json> StatusDocument() {
    nlohmann::json s = loop_->Call([](syncer::SyncerCore& sc, TimePoint now) { return sc.StatusJson(now); });
    s["now"] = UnixSeconds();
    s["uptime_s"] = s["now"].get<double>() - started_;
    AddEvaluation(s);
    if (const std::string why = loop_->holding(); !why.empty()) s["holding"] = why;  // rounds held: the page says why
    observe::AddDerived(s);
    return s;
  }

  // The HTTP status endpoint, when --http is given: the same credentials as the gRPC port (the
  // shared token, else the operator token of per-learner credentials).
  Status StartHttp(const transport::ServerOptions& so) {
    if (opt_.http.empty()) return Status::Ok();
    observe::HttpOptions ho;
    ho.address = opt_.http;
    ho.token = !so.token.empty() ? so.token : so.secret.empty() ? "" : transport::OperatorToken(so.secret, c_.run_id);
    ho.allowed_hosts = opt_.http_hosts;
    observe::HttpHandlers h;
    h.status = [this] { return StatusDocument(); };
    h.history = [this]() -> StatusOr<nlohmann::json> { return history_.ToJson(); };
    h.metrics = [this]() -> StatusOr<std::string> {
      ATOLL_ASSIGN_OR_RETURN(nlohmann::json s, StatusDocument());
      return log_->Prometheus(s);
    };
    ATOLL_ASSIGN_OR_RETURN(http_, observe::HttpStatusServer::Start(ho, std::move(h)));
    std::printf("syncer: status page at %s (metrics at %smetrics)\n", http_->url().c_str(), http_->url().c_str());
    if (!ho.token.empty()) {  // the URL with its token, readable by the owner only (not in the log)
      ATOLL_RETURN_IF_ERROR(WriteOwnerOnly(out_ + "/status-url", http_->url() + "?token=" + observe::QueryEscaped(ho.token) + "\n"));
      std::printf("syncer: the status page needs the token: the URL with it is in %s/status-url\n", out_.c_str());
    }
    std::fflush(stdout);
    if (!opt_.http_port_file.empty()) ATOLL_RETURN_IF_ERROR(WriteFileAtomic(opt_.http_port_file, std::to_string(http_->port())));
    return Status::Ok();
  }

  // Every one of the run's learners has left (done). Main thread.
  bool AllLearnersDone() {
    return loop_->Call([this](syncer::SyncerCore& sc, TimePoint) {
      int done = 0;
      for (const auto& [id, l] : sc.learners()) done += l.state == syncer::LearnerState::kDone ? 1 : 0;
      return done >= c_.learners && done == static_cast<int>(sc.learners().size());
    });
  }

  // Main thread: until Finish, a signal, or (finish_when_done) every learner done. Returns what
  // ended the run.
  // With the HTTP endpoint, a status sample every 2 s for the page's curves.
  const char* WaitForEnd() {
    std::unique_lock<std::mutex> lock(finish_mu_);
    double last_sample = 0;
    while (!finished_ && !g_stop) {
      finish_cv_.wait_for(lock, std::chrono::milliseconds(200));
      if (finished_ || g_stop) break;
      lock.unlock();
      const bool done = opt_.finish_when_done && AllLearnersDone();
      if (http_ && UnixSeconds() - last_sample >= 2.0) {
        last_sample = UnixSeconds();
        if (auto s = StatusDocument(); s.ok()) history_.Add(*s);
      }
      lock.lock();
      if (done) return "every learner done";
    }
    return finished_ ? "run finished" : "signal";
  }

  int Serve() {
    auto so = GrpcOptions();
    if (!so.ok()) return Fail(so.status(), 2);
    if (Status st = StartHttp(*so); !st.ok()) return Fail(st, st.code() == StatusCode::kInvalidArgument ? 2 : 1);
    auto server = transport::GrpcSyncerServer::Start(*so, *loop_, [this](bool evaluate) { return Finish(evaluate); });
    if (!server.ok()) return Fail(server.status(), 1);
    std::printf("syncer: listening on port %d\n", (*server)->port());
    std::fflush(stdout);
    if (!opt_.port_file.empty()) {
      if (Status st = WriteFileAtomic(opt_.port_file, std::to_string((*server)->port())); !st.ok()) return Fail(st, 1);
    }
    std::signal(SIGTERM, OnSignal);
    std::signal(SIGINT, OnSignal);
    const std::string why = WaitForEnd();
    if (why != "run finished") {
      // A signal or the last learner leaving: close the rounds in flight, evaluate, write the
      // model and the summary, as Finish would.
      std::printf("syncer: %s: closing the rounds in flight and writing the global model\n", why.c_str());
      std::fflush(stdout);
      Finish(/*evaluate=*/true);
    }
    if (live_eval_) live_eval_->Stop();
    // Learners still running learn of the finish from their next heartbeat reply and leave; wait
    // (bounded, 2 s) until none is live, then stop.
    for (int i = 0; i < 40; ++i) {
      if (loop_->Call([](syncer::SyncerCore& sc, TimePoint now) { return sc.LiveLearners(now).empty(); })) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (http_) http_->Stop();
    loop_->EndLongPolls();  // the server's shutdown waits for no long poll
    (*server)->Shutdown();
    loop_->Stop();
    if (shard_.count > 1) {
      std::printf("syncer: shard %s stopped (%s); its committed fragments are in %s\n", shard_.ToString().c_str(),
                  why.c_str(), durable_->dir().c_str());
    } else {
      std::printf("syncer: stopped (%s); global model in %s/global.safetensors\n", why.c_str(), out_.c_str());
    }
    return 0;
  }

  const SyncerProcessOptions& opt_;
  const RunConfig c_;
  syncer::ShardSpec shard_;                     // {0, 1}: the one syncer
  const std::string out_;
  RealClock& clock_ = RealClock::Default();
  std::unique_ptr<ModelHost> model_;
  diloco::FragmentPlan plan_;
  std::optional<syncer::SyncerCore> core_;      // until moved into loop_
  std::unique_ptr<syncer::DurableState> durable_;
  std::unique_ptr<syncer::CommitHeadroom> headroom_;  // loop thread, after Setup
  size_t warnings_printed_ = 0;                 // of durable_->warnings()
  bool resumed_ = false;
  std::optional<double> start_eval_loss_;       // none without an evaluator
  std::unique_ptr<RoundLog> log_;
  std::unique_ptr<CheckpointWriter> checkpoints_;
  std::unique_ptr<GlobalEvaluator> live_eval_;
  std::unique_ptr<syncer::SyncerLoop> loop_;
  std::mutex finish_mu_;
  std::condition_variable finish_cv_;
  bool finished_ = false;                       // guarded by finish_mu_
  std::string summary_text_;                    // guarded by finish_mu_
  int commits_since_checkpoint_ = 0;            // loop thread only
  std::atomic<bool> finishing_{false};
  const double started_ = UnixSeconds();
  observe::StatusHistory history_;              // samples for the status page's curves
  std::unique_ptr<observe::HttpStatusServer> http_;
};

}  // namespace

int RunSyncerProcess(const SyncerProcessOptions& opt) { return SyncerProcess(opt).Run(); }

}  // namespace atl::runtime
