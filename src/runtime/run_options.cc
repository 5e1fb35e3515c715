// The options of each part of a run, from its RunConfig: the trainer, the fragment plan, the
// syncer, its gRPC server's limits and a learner's agent. What the processes, `atoll simulate` and
// `atoll export` build from the same run file, so they agree.
#include "atoll/model/data.h"
#include "atoll/runtime/run_options.h"

namespace atl::runtime {

StatusOr<model::TrainerOptions> MakeTrainerOptions(const RunConfig& c, int learner_id) {
  ATOLL_ASSIGN_OR_RETURN(auto manifest, model::LoadDataManifest(c.data));
  ATOLL_ASSIGN_OR_RETURN(auto mc, model::PresetConfig(c.preset, manifest.vocab_size));
  mc.seq_len = c.seq;
  model::TrainerOptions o;
  o.model = mc;
  o.optim.lr = c.lr;
  o.optim.warmup_steps = c.warmup;
  o.optim.total_steps = c.steps;
  o.data_dir = c.data;
  o.batch_size = c.BatchOf(learner_id);
  o.learner_id = learner_id;
  o.num_learners = c.learners;
  o.seed = c.seed;  // the same seed everywhere: identical initial weights on every process
  o.threads = c.threads;
  o.precision = c.precision;
  o.init_weights = c.spec;
  return o;
}

syncer::SyncerOptions MakeSyncerOptions(const RunConfig& c) {
  syncer::SyncerOptions o;
  o.run_id = c.run_id;
  o.mode = c.mode;
  o.H = c.H;
  o.round.quorum = c.quorum;  // Normalized: K = M in the synchronous modes
  o.round.grace = c.grace;
  o.round.gamma = c.gamma;
  o.round.grace_cap_s = c.grace_cap;
  o.round.tau = c.tau;
  o.merge_rule = c.merge;
  o.weight_rule = c.weights;
  o.outer = OuterOptimizerOf(c);
  o.outer_step = c.outer_step;
  o.outer_gradient = c.outer_gradient;
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
  l.min_link_mbps = c.min_link_mbps;
  return l;
}

StatusOr<diloco::FragmentPlan> MakePlan(const RunConfig& c, const std::vector<diloco::TensorSpec>& tensors) {
  diloco::PlanOptions po;
  po.num_fragments = c.fragments;
  po.strategy = c.plan;
  return diloco::MakeFragmentPlan(tensors, po);
}

learner::AgentOptions MakeAgentOptions(const RunConfig& c, int learner_id) {
  learner::AgentOptions ao;
  ao.run_id = c.run_id;
  ao.learner_id = learner_id;
  ao.schedule = diloco::Schedule::Of(c.mode, c.H, c.fragments, c.tau);
  ao.uplink = UplinkCodec(c);
  ao.alpha = c.alpha;
  ao.keep_progress = c.keep_progress;
  ao.exchange_fragments = c.mode != diloco::Mode::kDdp;
  return ao;
}

}  // namespace atl::runtime
