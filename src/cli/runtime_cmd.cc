// `atoll run`, `atoll syncer`, `atoll learner`: flags → RunConfig → the runtime library.
#include <optional>

#include "atoll/runtime/processes.h"
#include "command.h"

namespace atl::cli {
namespace {

// Command-line overrides of the run file; unset flags leave the file's (or default) value.
struct Overrides {
  std::string config_file;
  std::optional<std::string> mode, out, data, token, run_id, preset, merge, plan, uplink, downlink;
  std::optional<int> learners, batch, seq, threads, fragments, H, tau, quorum, block, eval_batches;
  std::optional<int64_t> steps, warmup;
  std::optional<uint64_t> seed;
  std::optional<double> lr, gamma, grace_cap, outer_lr, outer_momentum, alpha, bandwidth_mbps,
      latency_ms, loss, learner_timeout;
  std::optional<bool> grace;
  std::vector<double> speeds;
};

void AddRunFlags(CLI::App* c, Overrides& o) {
  c->add_option("-c,--config", o.config_file,
                "Run file (TOML, see configs/run.toml) or a run folder's config.json; flags override it")
      ->check(CLI::ExistingFile);
  c->add_option("--mode", o.mode, "decoupled (default) | diloco (synchronous DiLoCo) | ddp");
  c->add_option("-M,--learners", o.learners, "Number of learners M (default 4)");
  c->add_option("--steps", o.steps, "Inner steps per learner (default 120)");
  c->add_option("--seed", o.seed, "Seed of weights and data order (default 0)");
  c->add_option("--out", o.out, "Run folder (default runs/<timestamp>-<mode>)");
  c->add_option("--data", o.data, "Prepared data folder (default data; prepared when missing)");
  c->add_option("--token", o.token, "Shared auth token (default: generated per run)");
  c->add_option("--run-id", o.run_id, "Run id learners must present (default: run folder name)");
  c->add_option("--preset", o.preset, "Model preset: tiny | small | base (default tiny)");
  c->add_option("--batch", o.batch, "Sequences per inner step (default 16)");
  c->add_option("--seq", o.seq, "Sequence length (default 256)");
  c->add_option("--lr", o.lr, "Inner AdamW peak learning rate (default 3e-3)");
  c->add_option("--warmup", o.warmup, "Inner warm-up steps (default 20)");
  c->add_option("--threads", o.threads, "Torch threads per learner (default 1)");
  c->add_option("-P,--fragments", o.fragments, "Fragments P (default 24)");
  c->add_option("-H,--inner-steps", o.H, "Inner steps between two syncs of a fragment, H ≥ P (default 24)");
  c->add_option("--tau", o.tau, "Overlap: a merged fragment is applied tau steps after it was sent (default 2)");
  c->add_option("-K,--quorum", o.quorum, "Minimum quorum K of learners per round (default 1)");
  c->add_option("--grace", o.grace, "Adaptive grace window on/off (default true)");
  c->add_option("--gamma", o.gamma, "Grace factor gamma in [0,1] (default 0.5)");
  c->add_option("--grace-cap", o.grace_cap, "Upper bound of the grace window, seconds (default 5)");
  c->add_option("--merge", o.merge, "rda (default) | mean");
  c->add_option("--outer-lr", o.outer_lr, "Outer Nesterov learning rate (default 0.7)");
  c->add_option("--outer-momentum", o.outer_momentum, "Outer Nesterov momentum (default 0.9)");
  c->add_option("--alpha", o.alpha, "Mixing on receipt: theta = alpha*local + (1-alpha)*global (default 0)");
  c->add_option("--plan", o.plan, "Fragment plan: balanced (default) | strided");
  c->add_option("--uplink", o.uplink, "Outer-gradient encoding: int4 (default) | int8 | bf16 | fp32");
  c->add_option("--downlink", o.downlink, "Global-fragment encoding: int4 (default) | int8 | bf16 | fp32");
  c->add_option("--block", o.block, "int4/int8 block size (default 256)");
  c->add_option("--speeds", o.speeds, "Per-learner speed factors in (0,1], e.g. 1 1 0.5 0.5")->expected(1, 256);
  c->add_option("--bandwidth-mbps", o.bandwidth_mbps, "Emulated WAN bandwidth per learner link, Mbit/s (0 = unlimited)");
  c->add_option("--latency-ms", o.latency_ms, "Emulated added latency per call, ms (default 0)");
  c->add_option("--loss", o.loss, "Emulated probability that a call is dropped (default 0)");
  c->add_option("--learner-timeout", o.learner_timeout, "Seconds without heartbeat before a learner stops counting as live (default 10)");
  c->add_option("--eval-batches", o.eval_batches, "Validation batches for eval loss (default 16)");
}

StatusOr<runtime::RunConfig> Resolve(const Overrides& o) {
  runtime::RunConfig c;
  if (!o.config_file.empty()) {
    ATOLL_ASSIGN_OR_RETURN(c, runtime::LoadRunConfig(o.config_file));
  }
#define ATOLL_OVERRIDE(field) \
  if (o.field) c.field = *o.field
  ATOLL_OVERRIDE(mode); ATOLL_OVERRIDE(out); ATOLL_OVERRIDE(data); ATOLL_OVERRIDE(token);
  ATOLL_OVERRIDE(run_id); ATOLL_OVERRIDE(preset); ATOLL_OVERRIDE(merge); ATOLL_OVERRIDE(plan);
  ATOLL_OVERRIDE(uplink); ATOLL_OVERRIDE(downlink); ATOLL_OVERRIDE(learners); ATOLL_OVERRIDE(batch);
  ATOLL_OVERRIDE(seq); ATOLL_OVERRIDE(threads); ATOLL_OVERRIDE(fragments); ATOLL_OVERRIDE(H);
  ATOLL_OVERRIDE(tau); ATOLL_OVERRIDE(quorum); ATOLL_OVERRIDE(block); ATOLL_OVERRIDE(eval_batches);
  ATOLL_OVERRIDE(steps); ATOLL_OVERRIDE(warmup); ATOLL_OVERRIDE(seed); ATOLL_OVERRIDE(lr);
  ATOLL_OVERRIDE(gamma); ATOLL_OVERRIDE(grace_cap); ATOLL_OVERRIDE(outer_lr);
  ATOLL_OVERRIDE(outer_momentum); ATOLL_OVERRIDE(alpha); ATOLL_OVERRIDE(bandwidth_mbps);
  ATOLL_OVERRIDE(latency_ms); ATOLL_OVERRIDE(loss); ATOLL_OVERRIDE(learner_timeout); ATOLL_OVERRIDE(grace);
#undef ATOLL_OVERRIDE
  if (!o.speeds.empty()) c.speeds = o.speeds;
  ATOLL_RETURN_IF_ERROR(runtime::ValidateRunConfig(c));
  return runtime::Normalized(c);
}

int BadInput(const Status& st, const char* cmd) {
  std::fprintf(stderr, "atoll %s: error: %s\n", cmd, st.ToString().c_str());
  return 2;
}

void Register(CLI::App& app, CommandContext& ctx) {
  {
    auto o = std::make_shared<Overrides>();
    auto live = std::make_shared<bool>(true);
    auto* c = app.add_subcommand("run",
        "Start a local Decoupled DiLoCo cluster: one syncer and M learner processes on this machine,\n"
        "live progress, then a report and a run folder (summary.json, metrics.jsonl, checkpoint).");
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
  {
    auto o = std::make_shared<Overrides>();
    auto p = std::make_shared<runtime::SyncerProcessOptions>();
    auto* c = app.add_subcommand("syncer", "Run the syncer: global parameters, rounds, gRPC service");
    AddRunFlags(c, *o);
    c->add_option("--listen", p->listen, "Address to listen on (default 127.0.0.1:0 = a free port)");
    c->add_option("--port-file", p->port_file, "Write the bound port to this file once listening");
    c->add_option("--state", p->state_dir,
                  "Durable state folder (default <out>/state); a syncer restarted on it resumes from the last committed round");
    c->add_option("--tls-cert", p->tls.cert, "TLS server certificate (PEM); enables TLS")->check(CLI::ExistingFile);
    c->add_option("--tls-key", p->tls.key, "TLS server key (PEM)")->check(CLI::ExistingFile);
    c->callback([&ctx, o, p] {
      ctx.action = [o, p] {
        auto cfg = Resolve(*o);
        if (!cfg.ok()) return BadInput(cfg.status(), "syncer");
        p->config = *cfg;
        p->out_dir = cfg->out;
        return runtime::RunSyncerProcess(*p);
      };
    });
  }
  {
    auto o = std::make_shared<Overrides>();
    auto p = std::make_shared<runtime::LearnerProcessOptions>();
    auto* c = app.add_subcommand("learner", "Run one learner: trains on its own clock, syncs fragments in the background");
    AddRunFlags(c, *o);
    c->add_option("--id", p->id, "Learner id in [0, M)")->required();
    c->add_option("--syncer", p->syncer, "Syncer address host:port")->required();
    c->add_flag("--rejoin", p->rejoin, "This learner restarts after a failure");
    c->add_option("--start-step", p->start_step, "Continue the step count from here (a restarted learner)");
    c->add_option("--control-file", p->control_file, "Chaos control file polled every step (speed, partition, bandwidth_mbps)");
    c->add_option("--tls-ca", p->tls.ca, "CA certificate (PEM) that signed the syncer's; enables TLS")->check(CLI::ExistingFile);
    c->add_option("--tls-server-name", p->tls.server_name, "Expected server name in the syncer's certificate");
    c->callback([&ctx, o, p] {
      ctx.action = [o, p] {
        auto cfg = Resolve(*o);
        if (!cfg.ok()) return BadInput(cfg.status(), "learner");
        p->config = *cfg;
        p->out_dir = cfg->out;
        return runtime::RunLearnerProcess(*p);
      };
    });
  }
}

}  // namespace
}  // namespace atl::cli

ATOLL_COMMAND(10, atl::cli::Register);
