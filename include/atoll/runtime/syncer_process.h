// `atoll syncer`: the global model, the rounds, the gRPC service (and with --http the status
// page), the durable state, the evaluation of the global model. Returns a process exit code (0 ok,
// 1 runtime failure, 2 bad input, 3 its leadership lapsed: it stopped serving, docs/decisions/022)
// after printing a clear message; it never calls exit().
// Thread-safety: run once per process, from its main thread.
#pragma once

#include <string>
#include <vector>

#include "atoll/runtime/run_config.h"
#include "atoll/runtime/secrets.h"

namespace atl::runtime {

struct SyncerProcessOptions {
  RunConfig config;
  std::string listen = "127.0.0.1:0";
  std::string port_file;  // written (atomically) with the bound port once listening
  std::string out_dir;    // metrics-syncer.jsonl, checkpoint, syncer-summary.json
  std::string state_dir;  // durable state; "" = <out_dir>/state. Resumed from when present.
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
  // Rebuild from the learners (docs/decisions/021): the durable state was lost (the --state folder
  // is absent or empty; a committed state is refused, never discarded). The syncer starts from Θ⁰
  // and for rebuild_wait_s seconds adopts the newest public copies the joining learners hold,
  // closing no round and refusing pushes (Unavailable) meanwhile.
  bool rebuild = false;
  double rebuild_wait_s = 30;
  // Leadership through etcd (docs/decisions/022): "" = none, this process is its shard's syncer.
  // Else etcd's endpoints (comma-separated host:port or unix:path) and this process is one of the
  // shard's candidates: it serves only while it holds the shard's lease (lease_ttl_s whole seconds
  // in [1, 60]), the others wait as standbys; candidate_id names it among them ("" = <host>-<pid>).
  // A leader whose --state folder holds no committed state of a run an earlier leader began
  // rebuilds from the learners (as with rebuild).
  std::string etcd;
  std::string candidate_id;
  double lease_ttl_s = 2;
  // Replicated commits (docs/decisions/023), with etcd: a standby follows the leader's commits
  // into its own --state folder, and a leader publishes no round before every standby in sync
  // holds it (one that does not acknowledge within replica_timeout_s is dropped from the set and
  // catches up by itself); a standby in the set takes over from its own folder, losing nothing.
  // Off: standbys keep nothing and a takeover rebuilds from the learners.
  bool replicate = true;
  double replica_timeout_s = 2;
  // The address the other candidates reach this one at when it leads ("" = --listen's host and the
  // bound port).
  std::string advertise;
};
// The most --rebuild-wait may be: an hour.
inline constexpr double kMaxRebuildWaitSeconds = 3600;
int RunSyncerProcess(const SyncerProcessOptions& options);

}  // namespace atl::runtime
