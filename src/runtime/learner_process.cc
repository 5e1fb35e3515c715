// `atoll learner`: one island. Trains on its own clock; the LearnerAgent exchanges fragments in
// the background. In `diloco` mode it blocks at every H-step barrier by design (the baseline).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/learner/ddp_exchange.h"
#include "atoll/learner/learner_agent.h"
#include "atoll/learner/wan_shaper.h"
#include "atoll/model/data.h"
#include "atoll/runtime/processes.h"
#include "atoll/transport/grpc.h"
#include "jsonl.h"

namespace atl::runtime {
namespace {

// Faults the chaos injector asks for through a small JSON file (speed factor, partition,
// bandwidth cap). Re-read only when its modification time changes.
struct ControlState {
  double speed = 1.0;
  bool partition = false;
  double bandwidth_mbps = 0;
};

class ControlFile {
 public:
  explicit ControlFile(std::string path) : path_(std::move(path)) {}
  // True when the file changed since the last call; `state` then holds its contents.
  bool Poll(ControlState& state) {
    if (path_.empty()) return false;
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) return false;
    const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
    if (mtime == last_mtime_) return false;
    last_mtime_ = mtime;
    auto text = ReadFile(path_);
    if (!text.ok()) return false;
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_discarded()) return false;
    state.speed = j.value("speed", 1.0);
    state.partition = j.value("partition", false);
    state.bandwidth_mbps = j.value("bandwidth_mbps", 0.0);
    return true;
  }

 private:
  std::string path_;
  int64_t last_mtime_ = -1;
};

}  // namespace

int RunLearnerProcess(const LearnerProcessOptions& opt) {
  const RunConfig c = Normalized(opt.config);
  const int id = opt.id;
  auto fail = [id](const Status& st, int code) {
    std::fprintf(stderr, "atoll learner %d: error: %s\n", id, st.ToString().c_str());
    return code;
  };
  if (Status st = ValidateRunConfig(c); !st.ok()) return fail(st, 2);
  if (id < 0 || id >= c.learners) {
    return fail(InvalidArgumentError("--id " + std::to_string(id) + " out of range [0, " + std::to_string(c.learners) + ")"), 2);
  }
  if (opt.syncer.empty()) return fail(InvalidArgumentError("--syncer host:port is required"), 2);
  const std::string out = opt.out_dir.empty() ? "." : opt.out_dir;
  if (Status st = MakeDirs(out); !st.ok()) return fail(st, 1);
  auto manifest = model::EnsureDataPrepared(c.data, nullptr);
  if (!manifest.ok()) return fail(manifest.status(), 2);
  auto topts = MakeTrainerOptions(c, id);
  if (!topts.ok()) return fail(topts.status(), 2);
  topts->start_step = opt.start_step;
  auto trainer_or = model::Trainer::Create(*topts);
  if (!trainer_or.ok()) return fail(trainer_or.status(), 1);
  model::Trainer& trainer = **trainer_or;
  auto plan = MakePlan(c, trainer.tensors());
  if (!plan.ok()) return fail(plan.status(), 2);

  transport::ClientOptions co;
  co.target = opt.syncer;
  co.token = c.token;
  co.tls.enabled = !opt.tls.ca.empty();
  co.tls.ca_file = opt.tls.ca;
  co.tls.server_name = opt.tls.server_name;
  auto client = transport::GrpcSyncerClient::Connect(co);
  if (!client.ok()) return fail(client.status(), 2);
  RealClock& clock = RealClock::Default();
  // Always behind the WAN shaper: a no-op unless the run file or chaos sets bandwidth, latency,
  // loss or a partition.
  learner::ShaperOptions shaper_options;
  shaper_options.bandwidth_bps = c.bandwidth_mbps * 1e6;
  shaper_options.latency_s = c.latency_ms / 1000.0;
  shaper_options.loss = c.loss;
  shaper_options.seed = c.seed * 1000 + static_cast<uint64_t>(id) + 1;
  auto shaped = std::make_unique<learner::ShapedSyncerApi>(**client, shaper_options, clock);
  syncer::SyncerApi* api = shaped.get();
  ControlFile control(opt.control_file);
  ControlState chaos_state;

  learner::AgentOptions ao;
  ao.run_id = c.run_id;
  ao.learner_id = id;
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  ao.host = std::string(host) + ":" + std::to_string(::getpid());
  ao.rejoin = opt.rejoin;
  ao.mode = c.mode;
  ao.schedule = {c.H, c.fragments, c.tau};
  auto up = diloco::ParseEncoding(c.uplink);
  if (!up.ok()) return fail(up.status(), 2);
  ao.uplink = {*up, c.block};
  ao.alpha = c.alpha;
  ao.keep_progress = c.keep_progress;
  ao.exchange_fragments = c.mode != diloco::Mode::kDdp;
  learner::LearnerAgent agent(ao, *plan, [&] {
    std::vector<std::span<float>> v;
    for (int i = 0; i < static_cast<int>(trainer.tensors().size()); ++i) v.push_back(trainer.Parameter(i));
    return v;
  }(), *api, clock);
  const double t_start = UnixSeconds();
  if (Status st = agent.Start(); !st.ok()) return fail(st, 2);
  std::printf("learner %d: %s, joined=%s, steps %lld..%lld of %lld tokens, speed %.2f%s\n", id,
              diloco::ModeName(c.mode), agent.counters().joined ? "yes" : "not yet (training on; retrying)",
              static_cast<long long>(opt.start_step), static_cast<long long>(c.steps),
              static_cast<long long>(trainer.tokens_per_step()), c.SpeedOf(id),
              opt.rejoin ? " (rejoined after a failure: global parameters, fresh AdamW moments, data and LR schedule continue at the start step)" : "");
  std::fflush(stdout);

  JsonlWriter metrics(out + "/metrics-learner-" + std::to_string(id) + ".jsonl");
  const double base_speed = c.SpeedOf(id);
  double speed = base_speed;
  double ema_step = 0, ema_tps = 0, last_loss = 0;
  int64_t step = opt.start_step;
  int64_t tokens_total = 0;
  bool contributed = false;
  std::vector<std::span<float>> params;
  for (int i = 0; i < static_cast<int>(trainer.tensors().size()); ++i) params.push_back(trainer.Parameter(i));
  std::unique_ptr<learner::DdpExchange> ddp;
  if (c.mode == diloco::Mode::kDdp) {
    ddp = std::make_unique<learner::DdpExchange>(*plan, *api, diloco::CodecOptions{diloco::Encoding::kBf16, c.block});
    Status st = ddp->Sync(agent.counters().learner_id, params);
    while (!st.ok() && !agent.finish_requested()) {
      if (Status fatal = agent.fatal_error(); !fatal.ok()) return fail(fatal, 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      st = ddp->Sync(agent.counters().learner_id, params);
    }
  }
  double train_seconds = 0, wait_seconds = 0;
  while (step < c.steps && !agent.finish_requested()) {
    if (Status fatal = agent.fatal_error(); !fatal.ok()) return fail(fatal, 1);
    if (control.Poll(chaos_state)) {
      speed = base_speed * std::clamp(chaos_state.speed, 0.01, 1.0);
      shaped->SetPartitioned(chaos_state.partition);
      learner::ShaperOptions so = shaper_options;
      if (chaos_state.bandwidth_mbps > 0) so.bandwidth_bps = chaos_state.bandwidth_mbps * 1e6;
      shaped->SetOptions(so);
      std::printf("learner %d: chaos control: speed %.2f, partition %s, bandwidth %s\n", id, speed,
                  chaos_state.partition ? "on" : "off",
                  so.bandwidth_bps > 0 ? (std::to_string(so.bandwidth_bps / 1e6) + " Mbit/s").c_str() : "unlimited");
      std::fflush(stdout);
    }
    const TimePoint t0 = clock.Now();
    auto s = ddp ? trainer.ComputeGradients() : trainer.Step();
    if (!s.ok()) return fail(s.status(), 1);
    const double compute_s = ToSeconds(clock.Now() - t0);
    if (speed < 1.0) clock.SleepFor(FromSeconds(compute_s * (1.0 / speed - 1.0)));  // slower hardware
    const double step_s = ToSeconds(clock.Now() - t0);
    train_seconds += step_s;
    tokens_total += s->tokens;
    int applied = 0;
    if (ddp) {
      // The all-reduce: push the gradient, block until the parameter server's next step.
      // (Gradient views are valid until the next ComputeGradients.)
      std::vector<std::span<float>> grads;
      for (int i = 0; i < static_cast<int>(trainer.tensors().size()); ++i) grads.push_back(trainer.Gradient(i));
      const TimePoint w0 = clock.Now();
      Status st = ddp->Step(agent.counters().learner_id, s->tokens, grads, params, 3600.0,
                            [&] { return agent.finish_requested() || !agent.fatal_error().ok(); });
      while (st.code() == StatusCode::kAborted || st.code() == StatusCode::kDataLoss ||
             st.code() == StatusCode::kNotFound || st.code() == StatusCode::kUnavailable) {
        // Behind the others (restarted, or the syncer restarted): take the current parameters;
        // this step's gradient is lost, as in any synchronous job.
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        if (agent.finish_requested()) break;
        st = ddp->Sync(agent.counters().learner_id, params);
      }
      if (!st.ok() && st.code() != StatusCode::kCancelled) return fail(st, 1);
      wait_seconds += ToSeconds(clock.Now() - w0);
      applied = 1;
      ++step;
    } else if (agent.OnStep(step, s->tokens), ++step; c.mode == diloco::Mode::kDiloco && step % c.H == 0) {
      const TimePoint w0 = clock.Now();
      applied = agent.WaitForAllFragments(step, 600.0);  // the synchronous barrier
      wait_seconds += ToSeconds(clock.Now() - w0);
    } else {
      applied = agent.ApplyReady(step);
    }
    ema_step = ema_step == 0 ? step_s : 0.9 * ema_step + 0.1 * step_s;
    ema_tps = static_cast<double>(s->tokens) / ema_step;
    last_loss = s->loss;
    learner::Progress p;
    p.step = step;
    p.tokens = tokens_total;
    p.loss = s->loss;
    p.step_seconds = ema_step;
    p.tokens_per_second = ema_tps;
    agent.SetProgress(p);
    metrics.Write({{"t", UnixSeconds()}, {"source", "learner"}, {"learner", id},
                   {"step", step}, {"tokens", tokens_total}, {"step_tokens", s->tokens},
                   {"step_s", step_s}, {"loss", s->loss},
                   {"lr", s->lr}, {"tokens_per_s", ema_tps}, {"applied", applied}});
    if (!contributed && (agent.counters().pushes > 0 || (ddp && applied > 0))) {
      contributed = true;  // for the rejoin latency: restart → first accepted contribution
      metrics.Write({{"t", UnixSeconds()}, {"source", "learner"}, {"learner", id}, {"kind", "contributed"},
                     {"step", step}, {"after_start_s", agent.counters().first_contribution_s}});
    }
    if (step % 25 == 0 || step == c.steps) {
      std::printf("learner %d: step %lld/%lld loss %.4f %.0f tok/s\n", id, static_cast<long long>(step),
                  static_cast<long long>(c.steps), s->loss, ema_tps);
      std::fflush(stdout);
    }
  }
  if (!ddp && !agent.finish_requested()) {
    // Push what the last steps changed, so their tokens reach the global model too.
    const int flushed = agent.FlushAll(step, 30.0);
    if (flushed > 0) std::printf("learner %d: final sync of %d fragment(s)\n", id, flushed);
  }
  learner::Progress done;
  done.step = step;
  done.tokens = tokens_total;
  done.loss = last_loss;
  done.state = "done";
  agent.SetProgress(done);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // one heartbeat says "done"
  agent.Stop();
  const auto k = agent.counters();
  const double wall = UnixSeconds() - t_start;
  nlohmann::json summary = {
      {"learner", id}, {"steps", step}, {"tokens", tokens_total}, {"loss", last_loss},
      {"wall_seconds", wall}, {"train_seconds", train_seconds}, {"barrier_wait_seconds", wait_seconds},
      {"tokens_per_second", wall > 0 ? tokens_total / wall : 0.0},
      {"pushes", k.pushes}, {"pushes_failed", k.pushes_failed}, {"pulls", k.pulls},
      {"fragments_applied", k.fragments_applied}, {"payload_bytes_up", ddp ? ddp->payload_bytes_up() : k.payload_bytes_up},
      {"payload_bytes_down", ddp ? ddp->payload_bytes_down() : k.payload_bytes_down}, {"wire_bytes_up", (*client)->bytes_sent()},
      {"wire_bytes_down", (*client)->bytes_received()}, {"joins", k.joins},
      {"catchup_fragments", k.catchup_fragments},
      {"checksum_mismatches", k.checksum_mismatches}, {"rejected", k.rejected}, {"first_contribution_s", k.first_contribution_s},
      {"speed", base_speed}, {"start_step", opt.start_step}};
  (void)WriteFileAtomic(out + "/learner-" + std::to_string(id) + ".json", summary.dump(2));
  std::printf("learner %d: done, %lld steps, %.0f tok/s, %lld pushes\n", id, static_cast<long long>(step),
              summary["tokens_per_second"].get<double>(), static_cast<long long>(k.pushes));
  return 0;
}

}  // namespace atl::runtime
