// The processes of a Decoupled DiLoCo run: the syncer, a learner, and `atoll run`, which starts
// a syncer and M learners on this machine and reports on them. Each returns a process exit code
// (0 ok, 1 runtime failure, 2 bad input) after printing a clear message; they never call exit().
#pragma once

#include <string>
#include <vector>

#include "atoll/diloco/fragment_plan.h"
#include "atoll/learner/learner_agent.h"
#include "atoll/model/trainer.h"
#include "atoll/runtime/run_config.h"
#include "atoll/syncer/syncer_core.h"
#include "atoll/transport/grpc.h"

namespace atl::runtime {

struct TlsFiles {
  std::string cert, key;    // syncer: its certificate; learner: its client certificate (mutual TLS)
  std::string ca;           // learner: the CA that signed the syncer's certificate
  std::string server_name;  // learner
  std::string client_ca;    // syncer: require learner certificates signed by this CA (mutual TLS)
};

struct SyncerProcessOptions {
  RunConfig config;
  std::string listen = "127.0.0.1:0";
  std::string port_file;   // written (atomically) with the bound port once listening
  std::string out_dir;     // metrics-syncer.jsonl, checkpoint, syncer-summary.json
  std::string state_dir;   // durable state; "" = <out_dir>/state. Resumed from when present.
  // File holding the run secret (per-learner credentials, docs/security.md); "" = the shared
  // token of the config, if any. A non-loopback listen address needs one or the other.
  std::string secret_file;
  TlsFiles tls;
  // Rounds between two writes of global.safetensors and syncer-summary.json while the run goes
  // on (0 = only at the end). The end is Finish, SIGTERM/SIGINT (after closing the rounds in
  // flight) or, with finish_when_done, the last learner leaving.
  int checkpoint_every = 100;
  // Finish by itself (final merge, evaluation, model, summary) once the run's M learners have all
  // said they are done (Leave), as `atoll run` would ask it to.
  bool finish_when_done = false;
  // HTTP status endpoint (docs/observability.md): "" = off; "127.0.0.1:0" = a free loopback port.
  // Same credentials as the gRPC port (the shared token, or the operator token of --secret-file).
  std::string http;
  std::string http_port_file;  // written (atomically) with the bound HTTP port, before port_file
  // Host names the HTTP endpoint answers to beyond IP addresses, localhost and the --http host
  // (observe::HttpOptions::allowed_hosts). An --http address that is not loopback needs
  // credentials (the shared token or --secret-file): without, the syncer refuses to start.
  std::vector<std::string> http_hosts;
  // "i/S": shard i of a syncer sharded S ways (docs/decisions/011); "" = the one syncer. A shard
  // owns the fragments p ≡ i (mod S); it evaluates nothing and writes no global.safetensors
  // (it holds only its fragments of Θ): `atoll export --state s0,...` combines the shards'.
  std::string shard;
};
int RunSyncerProcess(const SyncerProcessOptions& options);

// A secret or token file's contents without surrounding whitespace; InvalidArgument when empty.
StatusOr<std::string> ReadSecretFile(const std::string& path);
// True for 127.x.x.x, localhost, [::1] and unix: addresses.
bool IsLoopbackAddress(const std::string& address);

struct LearnerProcessOptions {
  RunConfig config;
  int id = 0;
  std::string syncer;      // host:port, or every syncer shard's, comma-separated in shard order
  std::string out_dir;     // metrics-learner-<id>.jsonl, learner-<id>.json
  bool rejoin = false;
  int64_t start_step = 0;  // a restarted learner continues its step count from here
  // Chaos control file (JSON: speed, partition, bandwidth_mbps), polled every step; "" = none.
  std::string control_file;
  std::string token_file;  // this learner's token (per-learner credentials); "" = the config's token
  TlsFiles tls;
  // A multi-rank learner unit (`--ranks R`, R ≥ 2): R processes train one learner synchronously
  // data-parallel; rank 0 talks to the syncer. rank -1: the unit's supervisor (it starts the
  // ranks); unit_store: the ranks' rendezvous file (set by the supervisor).
  int ranks = 1;
  int rank = -1;
  std::string unit_store;
};
// One learner; with ranks ≥ 2 the unit's supervisor or one of its ranks (learner_unit.cc).
int RunLearnerProcess(const LearnerProcessOptions& options);

struct RunOptions {
  RunConfig config;
  bool live = true;        // live progress table on a terminal
};
int RunLocalCluster(const RunOptions& options);

// The TrainerOptions a learner (or the syncer's evaluator) of this run uses. Needs the prepared
// data folder for the vocabulary size.
StatusOr<model::TrainerOptions> MakeTrainerOptions(const RunConfig& config, int learner_id);
// The fragment plan of this run over the model's tensors (what the syncer and every learner
// build, and `atoll export` rebuilds). InvalidArgument when the tensors cannot be cut into P fragments.
StatusOr<diloco::FragmentPlan> MakePlan(const RunConfig& config,
                                        const std::vector<diloco::TensorSpec>& tensors);
// The syncer's options for this run (mode, quorum, grace, merge, outer optimizer, codecs).
syncer::SyncerOptions MakeSyncerOptions(const RunConfig& config);
// The gRPC server's limits of a run config's [limits] (docs/security.md).
transport::ServerLimits MakeServerLimits(const RunConfig& config);
// Learner `learner_id`'s agent options for this run (schedule, uplink codec, receipt rule); the
// caller adds where it runs (host, rejoin, state folder).
learner::AgentOptions MakeAgentOptions(const RunConfig& config, int learner_id);

}  // namespace atl::runtime
