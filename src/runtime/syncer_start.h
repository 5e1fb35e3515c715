// What `atoll syncer` does before it serves: the core from Θ⁰ restored from (or written to) its
// durable state, the initial model's evaluation, the ddp parameter server's optimizer, the gRPC
// server's options from the flags, and the process's descriptor limit.
// Private to src/runtime. Thread-safety: the main thread, before the loop starts (MakeDdpStep's
// function then runs on the loop thread only).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "atoll/runtime/run_options.h"
#include "atoll/runtime/syncer_process.h"
#include "atoll/syncer/durable_state.h"
#include "atoll/syncer/syncer_core.h"
#include "model_host.h"

namespace atl::runtime {

// Prints "atoll syncer: error: …" and returns `code` (2: bad input or a state the operator must
// fix; 1: a failure of this machine).
int SyncerFail(const Status& st, int code);

// The core and its durable state folder (--state, default <out>/state), and whether it resumed.
struct OpenedCore {
  std::optional<syncer::SyncerCore> core;
  std::unique_ptr<syncer::DurableState> durable;
  bool resumed = false;
  bool rebuild = false;         // --rebuild, or a leader taking over a run without its state (docs/decisions/022)
  size_t warnings_printed = 0;  // of durable->warnings()
};

// Creates the core from Θ⁰ (only the shard's fragments) and restores it from the durable state
// when that holds a committed run, else writes the initial state; removes the temporary files a
// killed syncer left. Returns 0, or SyncerFail's code: 2 for a model, plan or state folder that
// does not fit (a damaged or foreign folder is refused, never overwritten), 1 when the initial
// state cannot be written.
// `run_began`: an earlier leader of this shard began the run, so an empty folder means its state
// is elsewhere: the core is rebuilt from the learners (OpenedCore::rebuild) instead of starting.
int OpenCore(const RunConfig& c, const SyncerProcessOptions& opt, const ModelHost& model,
             const diloco::FragmentPlan& plan, syncer::SyncerOptions options, OpenedCore& out, bool run_began);

// The durable state folder: --state, else <out>/state (<out> defaulting to the working folder).
std::string StateDirOf(const SyncerProcessOptions& opt);

// Prints the durable state's warnings not printed yet (what the resume ignored or rebuilt).
void PrintStateWarnings(OpenedCore& opened);

// The initial model's eval loss, measured once per run (a restarted syncer reads it back instead
// of spending its downtime re-evaluating): nullopt without an evaluator.
StatusOr<std::optional<double>> StartEvaluation(const ModelHost& model, OpenedCore& opened, int batches);

// The parameter server's optimizer (ddp mode): the evaluator trainer's AdamW applied to the
// averaged gradient of the plan's one fragment.
syncer::DdpStep MakeDdpStep(const ModelHost& model, const diloco::FragmentPlan& plan);

// The gRPC server's options from the flags; FailedPrecondition/InvalidArgument for unsafe or
// inconsistent ones (a non-loopback address without credentials, mutual TLS without TLS).
StatusOr<transport::ServerOptions> ServerOptionsOf(const SyncerProcessOptions& opt, const RunConfig& c);

// The run folder of a syncer started by hand holds its run config too, so the folder is a model
// source (`atoll sample/eval --checkpoint`, `atoll export --state`) like an `atoll run` folder.
// Owner-only: it may hold a shared token. An existing one (atoll run's) is kept.
Status WriteRunConfigOnce(const std::string& out_dir, const RunConfig& c);

// The soft descriptor limit up to the hard one: connections are capped below the limit
// (ServerLimits::max_connections), so a higher one means more of them before any is refused.
void RaiseDescriptorLimit();

}  // namespace atl::runtime
