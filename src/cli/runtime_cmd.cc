// `atoll run`, `atoll syncer`, `atoll learner`: flags → RunConfig → the runtime library; and
// `atoll export` (durable syncer state → safetensors).
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "atoll/core/format.h"
#include "atoll/core/platform.h"
#include "atoll/model/trainer.h"
#include "atoll/runtime/export.h"
#include "atoll/runtime/learner_process.h"
#include "atoll/runtime/local_cluster.h"
#include "atoll/runtime/syncer_process.h"
#include "atoll/runtime/simulate.h"
#include "atoll/core/file.h"
#include "atoll/core/text.h"
#include "command.h"

namespace atl::cli {
namespace {

// Command-line overrides of the run file, as the flat JSON form of RunConfig (the keys of
// configs/run.toml): unset flags leave the file's (or default) value, and the run config's own
// parser checks types and names, so the field list lives in run_config.cc only.
struct Overrides {
  std::string config_file;
  nlohmann::json values = nlohmann::json::object();
};

// A flag that overrides one run-config key. Its help ends with what the code says of the key
// (runtime::HelpOf, from RunConfig{}): its spellings where it has a fixed set of values, and its
// default where it has one.
template <typename T>
void Flag(CLI::App* c, Overrides& o, const std::string& names, const char* key, const std::string& help) {
  const runtime::KeyHelp k = runtime::HelpOf(key);
  std::string text = help;
  if (!k.spellings.empty()) text += ": " + k.spellings;
  if (!k.default_text.empty()) text += " (default " + k.default_text + ")";
  c->add_option_function<T>(
      names, [&o, key](const T& v) { o.values[key] = v; }, text);
}

// "decoupled 1, diloco and ddp 0.7": a field of the outer optimizer by mode (DefaultOuterOptimizer).
std::string OuterDefaults(double diloco::OuterOptimizerOptions::*field) {
  auto text = [&](diloco::Mode m) { return fmt::format("{:g}", runtime::DefaultOuterOptimizer(m).*field); };
  return "decoupled " + text(diloco::Mode::kDecoupled) + ", diloco and ddp " + text(diloco::Mode::kDiloco);
}

// The run: its config, mode, size, folders, credentials and model.
void AddRunShapeFlags(CLI::App* c, Overrides& o) {
  c->add_option("-c,--config", o.config_file,
                "Run file (TOML, see configs/run.toml) or a run folder's config.json; flags override it")
      ->check(CLI::ExistingFile);
  Flag<std::string>(c, o, "--mode", "mode",
                    "How learners exchange work (decoupled: Decoupled DiLoCo; diloco: synchronous DiLoCo; ddp: "
                    "data-parallel through the syncer)");
  Flag<int>(c, o, "-M,--learners", "learners", "Number of learners M");
  Flag<int>(c, o, "--syncer-shards", "syncer_shards",
            "atoll run: start the syncer as S shard processes, shard i owning the fragments p with p mod S = i "
            "(1 <= S <= P; `atoll syncer` takes --shard i/S instead)");
  Flag<int64_t>(c, o, "--steps", "steps", "Inner steps per learner");
  Flag<uint64_t>(c, o, "--seed", "seed", "Seed of weights and data order");
  Flag<std::string>(c, o, "--out", "out", "Run folder (default runs/<timestamp>-<mode>)");
  Flag<std::string>(c, o, "--data", "data", "Prepared data folder, prepared when missing");
  Flag<std::string>(
      c, o, "--token", "token",
      "Shared auth token for every call (atoll run default: per-learner credentials from a run secret instead; a hand-started syncer checks none unless --token or --secret-file)");
  Flag<std::string>(c, o, "--run-id", "run_id", "Run id learners must present (default: run folder name)");
  Flag<std::string>(c, o, "--preset", "preset", "Model preset: tiny | small | base");
  Flag<std::string>(
      c, o, "--spec", "spec",
      "Model spec: a safetensors file of the initial weights, any architecture (default: the preset from the "
      "seed; `atoll init` writes one for a preset)");
  Flag<std::vector<std::string>>(c, o, "--embeddings", "embeddings",
                                 "Glob patterns of embedding tensors in a spec that does not list them");
}

// Inner training: batch, sequence, learning rate, threads, precision.
void AddTrainingFlags(CLI::App* c, Overrides& o) {
  Flag<int>(c, o, "--batch", "batch", "Sequences per inner step");
  Flag<int>(c, o, "--seq", "seq", "Sequence length");
  Flag<double>(c, o, "--lr", "lr", "Inner AdamW peak learning rate");
  Flag<int64_t>(c, o, "--warmup", "warmup", "Inner warm-up steps (at most half of --steps, so that the run decays)");
  Flag<int>(c, o, "--threads", "threads", "Torch threads per learner");
  Flag<std::string>(c, o, "--precision", "precision",
                    "Training arithmetic (auto: bf16 where the CPU has AMX or AVX-512-BF16, else fp32; bf16: matrix "
                    "products in bf16, fp32 weights, gradients and optimizer; evaluation in fp32)");
}

// The method: fragments, schedule, rounds, merge and outer step.
void AddMethodFlags(CLI::App* c, Overrides& o) {
  Flag<int>(c, o, "-P,--fragments", "fragments", "Fragments P");
  Flag<int>(c, o, "-H,--inner-steps", "H", "Inner steps between two syncs of a fragment, H ≥ P");
  Flag<int>(c, o, "--tau", "tau", "Overlap: a merged fragment is applied tau steps after it was sent");
  Flag<int>(c, o, "-K,--quorum", "quorum", "Minimum quorum K of learners per round");
  Flag<bool>(c, o, "--grace", "grace", "Adaptive grace window on/off");
  Flag<double>(c, o, "--gamma", "gamma", "Grace factor gamma in [0,1]");
  Flag<double>(c, o, "--grace-cap", "grace_cap", "Upper bound of the grace window, seconds");
  Flag<std::string>(c, o, "--merge", "merge",
                    "Merge of the outer gradients (rda: RDA, the embedding by the mean; rda-all: RDA for the tied "
                    "embedding too; mean: the weighted mean)");
  Flag<double>(c, o, "--outer-lr", "outer_lr",
               "Outer Nesterov learning rate (default: " + OuterDefaults(&diloco::OuterOptimizerOptions::lr) + ")");
  Flag<double>(c, o, "--outer-momentum", "outer_momentum",
               "Outer Nesterov momentum (default: " + OuterDefaults(&diloco::OuterOptimizerOptions::momentum) + ")");
  Flag<std::string>(c, o, "--outer-step", "outer_step",
                    "Outer step (sweep: each round moves by its token share, momentum once per full round of tokens; "
                    "round: a full step per round; running: as sweep, holding the estimated synchronous step between "
                    "rounds)");
  Flag<std::string>(c, o, "--outer-gradient", "outer_gradient",
                    "What an outer gradient is taken against (current: v = global now - local; base: v = the "
                    "learner's copy - local)");
  Flag<double>(c, o, "--alpha", "alpha", "Mixing on receipt: theta = alpha*local + (1-alpha)*global");
  Flag<bool>(c, o, "--keep-progress", "keep_progress",
             "Keep the steps trained since a fragment was sent when its merge arrives");
  Flag<std::string>(c, o, "--weights", "weights",
                    "Merge weights (tokens: c_tokens^2/c_steps, the paper's; uniform: an ablation)");
}

// Links: the plan, encodings, per-learner speeds, the emulated WAN, liveness and evaluation.
void AddLinkFlags(CLI::App* c, Overrides& o) {
  Flag<std::string>(c, o, "--plan", "plan", "Fragment plan");
  Flag<std::string>(c, o, "--uplink", "uplink", "Outer-gradient encoding (int2: 3 levels, the paper's 2-bit ablation)");
  Flag<std::string>(c, o, "--downlink", "downlink", "Global-fragment encoding");
  Flag<int>(c, o, "--block", "block", "int4/int8/int2 block size");
  Flag<std::string>(c, o, "--compression", "compression",
                    "Lossless stage after the encoding, both links (deflate entropy-codes the quantised values: int4 "
                    "payloads shrink to about 0.7)");
  Flag<std::vector<double>>(c, o, "--speeds", "speeds",
                            "Per-learner speed factors in (0,1], e.g. 1 1 0.5 0.5 (default: all 1)");
  Flag<std::vector<int>>(c, o, "--batches", "batches",
                         "Per-learner batch sizes, e.g. 24 24 8 8 (default: all --batch)");
  Flag<double>(c, o, "--bandwidth-mbps", "bandwidth_mbps",
               "Emulated WAN bandwidth per learner link, Mbit/s (0 = unlimited)");
  Flag<double>(c, o, "--latency-ms", "latency_ms", "Emulated added latency per call, ms");
  Flag<double>(c, o, "--loss", "loss", "Emulated probability that a call is dropped");
  Flag<double>(c, o, "--learner-timeout", "learner_timeout",
               "Seconds without heartbeat before a learner stops counting as live and must rejoin");
  Flag<int>(c, o, "--eval-batches", "eval_batches", "Validation batches for eval loss");
  Flag<int>(c, o, "--eval-every", "eval_every",
            "Rounds between evaluations of the global model during the run (0 = off)");
}

// [limits]: the syncer's protection against hostile or broken clients (docs/security.md).
void AddLimitFlags(CLI::App* c, Overrides& o) {
  Flag<int>(c, o, "--max-learners", "max_learners", "Limit: rows in the syncer's learner table");
  Flag<double>(c, o, "--max-inflight-push-mb", "max_inflight_push_mb",
               "Limit: MiB of push payload being received at once");
  Flag<int>(c, o, "--max-streams", "max_streams", "Limit: concurrent streams per connection");
  Flag<int>(c, o, "--max-threads", "max_threads", "Limit: gRPC handler threads");
  Flag<double>(c, o, "--memory-quota-mb", "memory_quota_mb", "Limit: MiB of gRPC buffers");
  Flag<double>(c, o, "--handshake-timeout", "handshake_timeout_s",
               "Limit: seconds a connection has to finish its handshake");
  Flag<double>(c, o, "--idle-timeout", "idle_timeout_s", "Limit: seconds without calls before a connection is closed");
  Flag<double>(c, o, "--quarantine-factor", "quarantine_factor",
               "Quarantine outer gradients above this x the other learners' typical size (0 = off)");
  Flag<int>(c, o, "--max-rejects", "max_consecutive_rejects",
            "Invalid pushes in a row before a learner is disconnected");
  Flag<double>(c, o, "--ban-seconds", "ban_seconds", "How long a disconnected learner is refused");
  Flag<int>(c, o, "--max-connections", "max_connections",
            "Limit: open gRPC connections, never more than ulimit -n - 256");
  Flag<int>(c, o, "--max-pushes-per-learner", "max_pushes_per_learner",
            "Limit: pushes of one learner in flight at once");
  Flag<int>(c, o, "--max-polls-per-learner", "max_polls_per_learner",
            "Limit: pulls (long polls) of one learner in flight at once");
  Flag<double>(c, o, "--max-heartbeats-per-s", "max_heartbeats_per_s", "Limit: heartbeats per second of one learner");
  Flag<double>(c, o, "--push-timeout", "push_timeout_s",
               "Limit: seconds a push stream may stay open, beyond its payload's time at --min-link-mbps");
  Flag<double>(
      c, o, "--min-link-mbps", "min_link_mbps",
      "The slowest learner link in Mbit/s: pushes and pulls get their payload's time at this rate on top of their deadline (0: none)");
  Flag<double>(c, o, "--commit-reserve-mb", "commit_reserve_mb",
               "MiB of free space a commit must leave in the state folder beyond its files; below it rounds are held");
  Flag<std::string>(
      c, o, "--allowed-learners", "allowed_learners",
      "Per-learner credentials: the learner ids whose tokens are accepted, e.g. 0-3,7 (default: any; leave an id out to revoke it)");
}

void AddRunFlags(CLI::App* c, Overrides& o) {
  AddRunShapeFlags(c, o);
  AddTrainingFlags(c, o);
  AddMethodFlags(c, o);
  AddLinkFlags(c, o);
  AddLimitFlags(c, o);
}

StatusOr<runtime::RunConfig> Resolve(const Overrides& o) {
  runtime::RunConfig c;
  if (!o.config_file.empty()) {
    ATOLL_ASSIGN_OR_RETURN(c, runtime::LoadRunConfig(o.config_file));
  }
  auto flagged = runtime::FromJson(o.values, c);
  if (!flagged.ok()) return flagged.status().WithContext("command-line flags");
  ATOLL_RETURN_IF_ERROR(runtime::ValidateRunConfig(*flagged));
  model::OptimizerConfig schedule;
  schedule.warmup_steps = flagged->warmup;
  schedule.total_steps = flagged->steps;
  if (auto note = model::WarmupCutNote(schedule); !note.empty())
    std::fprintf(stderr, "atoll: note: %s\n", note.c_str());
  return runtime::Normalized(*flagged);
}

int BadInput(const Status& st, const char* cmd) {
  std::fprintf(stderr, "atoll %s: error: %s\n", cmd, st.ToString().c_str());
  return 2;
}

// `atoll run`: the whole cluster as local processes.
void RegisterRun(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<Overrides>();
  auto live = std::make_shared<bool>(true);
  auto* c =
      app.add_subcommand("run",
                         "Start a local Decoupled DiLoCo cluster: one syncer and M learner processes on this machine,\n"
                         "live progress and a live status page (its URL is printed; /metrics for Prometheus), then a\n"
                         "report and a run folder (summary.json, report.html, metrics.jsonl, global.safetensors).");
  AddRunFlags(c, *o);
  c->add_flag("!--no-live", *live, "Print a progress line every 10 s instead of a live table");
  c->callback([&ctx, o, live] {
    ctx.action = [o, live] {
      auto cfg = Resolve(*o);
      if (!cfg.ok()) return BadInput(cfg.status(), "run");
      return runtime::RunLocalCluster({*cfg, *live});
    };
  });
}

// The action of `atoll syncer` / `atoll learner`: resolve the run config (file, then flags),
// hand it and the run folder to the process, exit 2 on bad input.
template <typename ProcessOptions>
void OnRun(CLI::App* c, CommandContext& ctx, std::shared_ptr<Overrides> o, std::shared_ptr<ProcessOptions> p,
           const char* name, int (*run)(const ProcessOptions&)) {
  c->callback([&ctx, o, p, name, run] {
    ctx.action = [o, p, name, run] {
      auto cfg = Resolve(*o);
      if (!cfg.ok()) return BadInput(cfg.status(), name);
      p->config = *cfg;
      p->out_dir = cfg->out;
      return run(*p);
    };
  });
}

// `atoll syncer`'s recovery from a lost machine: a rebuild from the learners, leader and standbys.
void AddRecoveryFlags(CLI::App* c, runtime::SyncerProcessOptions& o) {
  c->add_flag("--rebuild", o.rebuild,
              "Rebuild from the learners: the --state folder was lost (absent or empty; a committed state is refused). "
              "Starts from the run's initial model and adopts the newest public copy of each fragment the joining "
              "learners hold; outer momentum and the learner table's accounting restart from zero "
              "(docs/deployment.md)");
  c->add_option("--rebuild-wait", o.rebuild_wait_s,
                "With --rebuild: seconds the syncer adopts copies before it closes any round (pushes meanwhile are "
                "refused as Unavailable: learners rejoin and keep their work), in (0, 3600]")
      ->capture_default_str();
  c->add_option("--etcd", o.etcd,
                "Leader and standbys: etcd's endpoints (host:port or unix:path, comma-separated). This process is "
                "one candidate for its shard: it serves only while it holds the shard's etcd lease; the others "
                "wait and one takes over when the lease lapses. Give the learners every candidate's address, "
                "'|'-separated (docs/deployment.md)");
  c->add_option("--candidate-id", o.candidate_id,
                "With --etcd: this candidate's name among its shard's, unique (default <host>-<pid>)");
  c->add_option("--lease-ttl", o.lease_ttl_s,
                "With --etcd: the leadership lease in whole seconds, 1-60: a lost leader is replaced within about "
                "this long, and stops serving before then")
      ->capture_default_str();
  c->add_option_function<std::string>(
       "--replicate", [&o](const std::string& v) { o.replicate = v == "on"; },
       "With --etcd: on = each standby follows the leader's commits into its own --state folder and the "
       "leader publishes no round before the standbys in sync hold it, so a takeover loses no round; off "
       "= standbys keep nothing and a new leader rebuilds from the learners")
      ->check(CLI::IsMember({"on", "off"}))
      ->default_str("on");
  c->add_option("--replica-timeout", o.replica_timeout_s,
                "With --etcd: seconds a leader waits for an in-sync standby to acknowledge a commit before it drops "
                "it from the replica set (it rejoins once caught up), in (0, 60]")
      ->capture_default_str();
  c->add_option("--advertise", o.advertise,
                "With --etcd: host:port the other candidates reach this one at when it leads (default: --listen's "
                "host with the bound port)");
  c->add_option("--tls-ca", o.tls.ca,
                "With --etcd and TLS: the CA (PEM) that signed the other candidates' certificates (a standby "
                "follows the leader over its TLS port; with --tls-client-ca it presents --tls-cert)")
      ->check(CLI::ExistingFile);
  c->add_option("--tls-server-name", o.tls.server_name,
                "With --etcd and TLS: the name expected in the leader's certificate");
}

// `atoll syncer`: one syncer process.
void RegisterSyncer(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<Overrides>();
  auto p = std::make_shared<runtime::SyncerProcessOptions>();
  auto* c = app.add_subcommand("syncer", "Run the syncer: global parameters, rounds, gRPC service");
  AddRunFlags(c, *o);
  c->add_option("--listen", p->listen, "Address to listen on (port 0 = a free port)")->capture_default_str();
  c->add_option("--port-file", p->port_file, "Write the bound port to this file once listening");
  c->add_option(
      "--state", p->state_dir,
      "Durable state folder (default <out>/state); a syncer restarted on it resumes from the last committed round");
  c->add_option(
       "--secret-file", p->secret_file,
       "Run secret (per-learner credentials: learner m needs HMAC(secret, run id, m), Status/Finish the operator token)")
      ->check(CLI::ExistingFile);
  c->add_option("--tls-cert", p->tls.cert, "TLS server certificate (PEM); enables TLS")->check(CLI::ExistingFile);
  c->add_option("--tls-key", p->tls.key, "TLS server key (PEM)")->check(CLI::ExistingFile);
  c->add_option(
       "--tls-client-ca", p->tls.client_ca,
       "Mutual TLS: refuse every connection without a client certificate signed by this CA (PEM); needs --tls-cert")
      ->check(CLI::ExistingFile);
  c->add_option("--checkpoint-every", p->checkpoint_every,
                "Write global.safetensors and syncer-summary.json every N committed rounds (0 = only at the end: "
                "Finish, SIGTERM/SIGINT, or --finish-when-done)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  c->add_flag(
      "--finish-when-done", p->finish_when_done,
      "Finish by itself (final merge, evaluation, global.safetensors, summary) once all M learners have said they are done");
  c->add_option(
      "--http", p->http,
      "Serve the status page, /api/status, /metrics (Prometheus) and /healthz on this address, e.g. 127.0.0.1:0 "
      "(a free port; the URL is printed). Needs the same token as the gRPC port (Bearer header or ?token=)");
  c->add_option("--http-port-file", p->http_port_file, "Write the bound HTTP port to this file once serving");
  c->add_option("--http-host", p->http_hosts,
                "A host name the status page is reached by (repeatable); requests whose Host header is not an IP "
                "address, localhost, the --http host or one of these are refused (DNS rebinding)");
  AddRecoveryFlags(c, *p);
  c->add_option("--shard", p->shard,
                "i/S: run shard i of a syncer sharded S ways (0 <= i < S <= P). It owns the fragments p with "
                "p mod S = i, has its own port and --state folder (default <out>/state: give each shard its own "
                "--out), evaluates nothing and writes no global.safetensors; `atoll export --state "
                "s0/state,s1/state,...` combines the shards' states (docs/deployment.md)");
  // One heap: the live evaluation's thread would otherwise map its forward pass anew every time.
  OnRun(
      c, ctx, o, p, "syncer", +[](const runtime::SyncerProcessOptions& so) {
        OneHeapForAllThreads();
        return runtime::RunSyncerProcess(so);
      });
}

// `atoll learner`: one learner process.
void RegisterLearner(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<Overrides>();
  auto p = std::make_shared<runtime::LearnerProcessOptions>();
  auto* c =
      app.add_subcommand("learner", "Run one learner: trains on its own clock, syncs fragments in the background");
  AddRunFlags(c, *o);
  c->add_option("--id", p->id, "Learner id in [0, M)")->required();
  c->add_option("--syncer", p->syncer,
                "Syncer address host:port; a sharded syncer: every shard's address, comma-separated in shard "
                "order (shard 0 first; the learner joins every shard with its --id and sends each fragment to "
                "its owner, p mod S); a shard with standbys (atoll syncer --etcd): its candidates' addresses "
                "'|'-separated, e.g. \"a:7070|b:7070\" (the learner follows whichever leads)")
      ->required();
  c->add_option("--token-file", p->token_file, "This learner's token (per-learner credentials; overrides --token)")
      ->check(CLI::ExistingFile);
  c->add_flag("--rejoin", p->rejoin, "This learner restarts after a failure");
  c->add_option("--start-step", p->start_step, "Continue the step count from here (a restarted learner)");
  c->add_option("--control-file", p->control_file,
                "Chaos control file polled every step (speed, partition, bandwidth_mbps)");
  c->add_option("--tls-ca", p->tls.ca, "CA certificate (PEM) that signed the syncer's; enables TLS")
      ->check(CLI::ExistingFile);
  c->add_option("--tls-server-name", p->tls.server_name, "Expected server name in the syncer's certificate");
  c->add_option("--tls-cert", p->tls.cert, "Mutual TLS: this learner's client certificate (PEM), with --tls-key")
      ->check(CLI::ExistingFile);
  c->add_option("--tls-key", p->tls.key, "Mutual TLS: this learner's client key (PEM)")->check(CLI::ExistingFile);
  c->add_option("--ranks", p->ranks,
                "Processes that form this learner: synchronous data-parallel inside (gloo), each with "
                "the run's batch; rank 0 talks to the syncer; a dead rank restarts the whole unit")
      ->capture_default_str();
  c->add_option("--rank", p->rank, "(set by the unit's supervisor) this process's rank")->group("");
  c->add_option("--unit-store", p->unit_store, "(set by the unit's supervisor) the ranks' rendezvous file")->group("");
  OnRun(c, ctx, o, p, "learner", runtime::RunLearnerProcess);
}

// `atoll simulate`: the cluster of `atoll run` in one process on simulated time (deterministic).
void RegisterSimulate(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<Overrides>();
  auto so = std::make_shared<runtime::SimulateOptions>();
  auto* c = app.add_subcommand(
      "simulate",
      "Run the cluster of `atoll run` in one process on simulated time: the real syncer core and\n"
      "loop, M real learner agents and models, each inner step taking a simulated time. The same\n"
      "flags give the same losses on every run, whatever the machine's load: use it to compare\n"
      "configurations (docs/experiments.md). Writes <out>/summary.json and <out>/rounds.jsonl (every\n"
      "round: contributors, token share, merged and step norms, the global eval). No chaos, WAN emulation,\n"
      "shards or ddp; costs about M x steps training steps of one core.");
  AddRunFlags(c, *o);
  c->add_option("--step-time", so->step_seconds, "Simulated seconds of one inner step at speed 1")
      ->capture_default_str();
  c->add_option("--spread", so->spread,
                "Learners' persistent speed differences: each learner's step time x (1 +- spread), drawn from the seed")
      ->capture_default_str();
  c->add_option("--jitter", so->jitter, "Each step's time x (1 +- jitter), drawn from the seed")->capture_default_str();
  c->callback([&ctx, o, so] {
    ctx.action = [o, so] {
      auto cfg = Resolve(*o);
      if (!cfg.ok()) return BadInput(cfg.status(), "simulate");
      const std::string out = cfg->out.empty() ? "runs/simulate-" + std::to_string(cfg->seed) : cfg->out;
      if (Status st = MakeDirs(out); !st.ok()) return BadInput(st, "simulate");
      so->progress = [](const std::string& line) {
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      };
      auto r = runtime::Simulate(*cfg, *so);
      if (!r.ok()) {
        std::fprintf(stderr, "atoll simulate: error: %s\n", r.status().ToString().c_str());
        return r.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
      }
      const nlohmann::json summary = runtime::SimulateSummary(*cfg, *so, *r);
      std::string rounds;
      for (const auto& line : r->round_log) rounds += atl::DumpJson(line) + "\n";
      for (const auto& [name, text] :
           {std::pair{"/rounds.jsonl", rounds}, std::pair{"/summary.json", summary.dump(2)}}) {
        if (Status st = WriteFileAtomic(out + name, text); !st.ok()) {
          std::fprintf(stderr, "atoll simulate: error: %s\n", st.ToString().c_str());
          return 1;
        }
      }
      std::printf(
          "simulated %.0f s: %lld rounds (learners per round %s), eval loss of the global model %.4f "
          "(started at %.4f); %s\n",
          r->simulated_seconds, static_cast<long long>(r->rounds),
          nlohmann::json(r->contributors_histogram).dump().c_str(), r->eval_loss, r->eval_loss_start,
          (out + "/summary.json").c_str());
      return 0;
    };
  });
}

void Register(CLI::App& app, CommandContext& ctx) {
  RegisterRun(app, ctx);
  RegisterSimulate(app, ctx);
  RegisterSyncer(app, ctx);
  RegisterLearner(app, ctx);
}

void RegisterExport(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<runtime::ExportOptions>();
  auto* c =
      app.add_subcommand("export",
                         "Write the global model of a run from the syncer's committed durable state (state/) to a\n"
                         "safetensors file: for a run that ended without global.safetensors, or one still running.\n"
                         "`atoll export --state RUN/state` is enough: the run config is read beside it.");
  c->add_option("--config", o->config, "The run folder, or its config.json (default: the config.json beside --state)");
  c->add_option("--state", o->state,
                "Durable state folder (default <run folder>/state); give this or --config. A sharded "
                "syncer: every shard's state folder, comma-separated in shard order (each fragment is "
                "taken from the shard that owns it)");
  c->add_option("--out", o->out,
                "Output .safetensors (default <run folder>/global.safetensors, where `atoll sample` "
                "and `atoll eval` read it from the run folder)");
  c->add_flag("--force", o->force, "Overwrite --out if it exists");
  c->callback([&ctx, o] {
    ctx.action = [o] {
      auto r = runtime::ExportState(*o);
      if (!r.ok()) {
        std::fprintf(stderr, "atoll export: error: %s\n", r.status().ToString().c_str());
        return r.status().code() == StatusCode::kInternal ? 1 : 2;
      }
      std::printf(
          "exported the global model of run %s (%s params, %lld committed rounds, "
          "fragment versions %s) from %s to %s\n",
          r->run_id.c_str(), Grouped(r->params).c_str(), static_cast<long long>(r->rounds),
          nlohmann::json(r->versions).dump().c_str(), r->state.c_str(), r->out.c_str());
      return 0;
    };
  });
}

// `atoll init`: a model spec of an atoll preset, from the run's seed.
void RegisterInit(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<Overrides>();
  auto out = std::make_shared<std::string>();
  auto force = std::make_shared<bool>(false);
  auto* c = app.add_subcommand(
      "init",
      "Write a model spec: the initial weights of an atoll preset (--preset, --seed, the data folder's\n"
      "vocabulary) as a safetensors file that a run names with `[model] spec` (docs/model.md). Any\n"
      "other model's spec is its own state_dict saved with safetensors.");
  AddRunFlags(c, *o);
  c->remove_option(c->get_option("--out"));  // the run folder's flag; here --out is the spec file
  c->add_option("--out", *out, "The spec file to write (.safetensors)")->required();
  c->add_flag("--force", *force, "Overwrite --out if it exists");
  c->callback([&ctx, o, out, force] {
    ctx.action = [o, out, force] {
      auto cfg = Resolve(*o);
      if (!cfg.ok()) return BadInput(cfg.status(), "init");
      if (!cfg->spec.empty())
        return BadInput(InvalidArgumentError("--spec names an existing spec; init writes one"), "init");
      if (FileExists(*out) && !*force)
        return BadInput(AlreadyExistsError(*out + " exists (--force overwrites it)"), "init");
      auto written = runtime::WritePresetSpec(*cfg, *out);
      if (!written.ok()) {
        std::fprintf(stderr, "atoll init: error: %s\n", written.status().ToString().c_str());
        return written.status().code() == StatusCode::kInternal || written.status().code() == StatusCode::kUnavailable
                   ? 1
                   : 2;
      }
      std::printf("wrote %s: preset %s, seed %llu, %s params in %zu tensors\n", out->c_str(), cfg->preset.c_str(),
                  static_cast<unsigned long long>(cfg->seed), Grouped(written->params).c_str(), written->tensors);
      return 0;
    };
  });
}

}  // namespace
}  // namespace atl::cli

ATOLL_COMMAND(10, atl::cli::Register);
ATOLL_COMMAND(11, atl::cli::RegisterExport);
ATOLL_COMMAND(12, atl::cli::RegisterInit);
