// bench_syncer_scale: the syncer's state machine (SyncerCore, the one an `atoll syncer` runs) at
// model scale, with M learners played in this process: resident memory per parameter and what
// it is made of, the time a round takes against the cost of copying its fragment once, and the
// bytes each learner sends and receives per round.
//
// Each learner joins and pulls every fragment in full (the public copy Φ_p, once encoded for
// all of them), then for `--rounds` sweeps over the fragments every learner pushes an int4 outer
// gradient (one encoded once per fragment and sent by all: the syncer decodes each push on its
// own, so the work is the same as distinct ones), the round closes with all M (quorum M), and
// every learner pulls the delta. Nothing crosses a socket: gRPC's costs are in bench_runtime.
// The model is the default run's options (MakeSyncerOptions of RunConfig{}) over a plan of
// `--params` parameters in tensors of 4096 × 4096 (and one remainder), P = --fragments.
//
// Memory: VmRSS after the setup and after the rounds, VmHWM (peak), and SyncerCore::held_bytes.
// The bench itself holds one encoded push per fragment (≈ 0.5 bytes per parameter) and the
// initial values until they are moved into the core (counted in VmHWM, not in VmRSS after).
//
//   bench_syncer_scale [--params N] [--learners M] [--fragments P] [--rounds R] [--threads T] [--json]
// Exit 0; 2 on bad flags.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <algorithm>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/clock.h"
#include "atoll/core/rng.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/runtime/run_options.h"
#include "atoll/runtime/run_config.h"
#include "atoll/syncer/syncer_core.h"
#include "scale_model.h"

namespace {

using namespace atl;
using Wall = std::chrono::steady_clock;

double Seconds(Wall::time_point a, Wall::time_point b) { return std::chrono::duration<double>(b - a).count(); }

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr,
               "bench_syncer_scale: %s\nusage: bench_syncer_scale [--params N (default 100000000)] "
               "[--learners M (8)] [--fragments P (24)] [--rounds R (2)] [--threads T (0: one per core)] [--json]\n",
               error.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = 100'000'000;
  int learners = 8, fragments = 24, rounds = 2, threads = 0;
  bool json_out = false;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> int64_t {
      if (i + 1 >= argc) Usage(k + " needs a value");
      char* end = nullptr;
      const int64_t v = std::strtoll(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0') Usage(k + " takes an integer, not '" + argv[i] + "'");
      return v;
    };
    if (k == "--params") params = next();
    else if (k == "--learners") learners = static_cast<int>(next());
    else if (k == "--fragments") fragments = static_cast<int>(next());
    else if (k == "--rounds") rounds = static_cast<int>(next());
    else if (k == "--threads") threads = static_cast<int>(next());
    else if (k == "--json") json_out = true;
    else if (k == "-h" || k == "--help") Usage("the syncer's memory and round time at model scale");
    else Usage("unknown flag " + k);
  }
  if (params < 4096 || learners < 1 || fragments < 1 || rounds < 1 || threads < 0 || fragments > params / 4096) {
    Usage("need --params >= 4096, --learners/--fragments/--rounds >= 1, --threads >= 0, P <= params/4096");
  }

  // The model: 4096-wide matrices, the first one an embedding.
  const std::vector<diloco::TensorSpec> tensors = bench::ScaleTensors(params);
  diloco::PlanOptions po;
  po.num_fragments = fragments;
  auto plan = diloco::MakeFragmentPlan(tensors, po);
  if (!plan.ok()) Usage(plan.status().ToString());
  runtime::RunConfig rc;
  rc.learners = learners;
  rc.fragments = fragments;
  rc.H = std::max(rc.H, fragments);
  syncer::SyncerOptions opt = runtime::MakeSyncerOptions(runtime::Normalized(rc));
  opt.run_id = "bench";
  opt.round.quorum = learners;
  opt.round.grace = false;
  opt.threads = threads;

  const auto t0 = Wall::now();
  Rng rng(1);
  std::vector<std::vector<float>> initial;
  for (const auto& f : plan->fragments) {
    initial.emplace_back(static_cast<size_t>(f.numel));
    for (float& v : initial.back()) v = static_cast<float>(rng.Normal(0, 0.02));
  }
  // One "trained" copy per fragment and its int4 outer gradient against Θ⁰'s public copy: built
  // once, pushed by every learner.
  auto core = syncer::SyncerCore::Create(opt, *plan, std::move(initial));
  if (!core.ok()) Usage(core.status().ToString());
  ManualClock clock;
  syncer::JoinRequestData req;
  req.protocol_version = syncer::kProtocolVersion;
  req.run_id = "bench";
  req.model_signature = diloco::ModelSignature(plan->tensors);
  req.host = "bench";
  double full_pull_bytes = 0;
  std::vector<std::vector<std::byte>> pushes(static_cast<size_t>(fragments));
  for (int m = 0; m < learners; ++m) {
    req.learner_id = m;
    if (auto j = core->Join(req, clock.Now()); !j.ok()) Usage(j.status().ToString());
    for (int p = 0; p < fragments; ++p) {
      auto full = core->Pull(m, p, -1);
      if (!full.ok()) Usage(full.status().ToString());
      if (m == 0) full_pull_bytes += static_cast<double>(full->bytes.size());
    }
  }
  for (int p = 0; p < fragments; ++p) {
    const auto phi = core->public_values(p);
    std::vector<float> local(phi.begin(), phi.end());
    for (float& v : local) v -= static_cast<float>(rng.Normal(0.0005, 0.002));
    if (Status st = exchange::EncodeOuterGradient(opt.uplink, phi, local, pushes[static_cast<size_t>(p)]); !st.ok()) {
      Usage(st.ToString());
    }
  }
  const double setup_s = Seconds(t0, Wall::now());
  const double rss_setup = bench::ProcStatusBytes("self", "VmRSS:");

  // The memory-traffic floor of each round, timed right after it: one memcpy of half the bytes the
  // round must read and write (a memcpy of X bytes reads X and writes X) — the M pushes in the
  // quantiser's layout, Θ_p and Φ_p (and the momentum, when kept) read; Θ_p, Φ_p and the delta written.
  std::vector<std::byte> floor_src, floor_dst;
  const auto floor_copy = [&](size_t bytes) {
    if (floor_src.size() < bytes) {
      floor_src.assign(bytes, std::byte{1});
      floor_dst.assign(bytes, std::byte{0});
    }
    const auto a = Wall::now();
    std::memcpy(floor_dst.data(), floor_src.data(), bytes);
    return Seconds(a, Wall::now());
  };
  double memcpy_s = 0;
  for (int p = 0; p < fragments; ++p) memcpy_s += floor_copy(core->theta(p).size() * sizeof(float));

  double prepare_s = 0, admit_s = 0, close_s = 0, pull_s = 0, push_bytes = 0, pull_bytes = 0, floor_s = 0;
  int closed = 0;
  std::vector<double> round_ratio, close_ratio;
  std::vector<int64_t> have(static_cast<size_t>(fragments), 0);
  const bool momentum = opt.outer.momentum > 0;
  for (int r = 0; r < rounds; ++r) {
    for (int p = 0; p < fragments; ++p) {
      const auto& payload = pushes[static_cast<size_t>(p)];
      const size_t numel = static_cast<size_t>(plan->fragments[static_cast<size_t>(p)].numel);
      // The M payloads are prepared on M threads at once, as a syncer's gRPC handler threads do.
      auto a = Wall::now();
      std::vector<syncer::PreparedPush> prepared(static_cast<size_t>(learners));
      {
        std::vector<std::thread> handlers;
        for (int m = 0; m < learners; ++m) {
          handlers.emplace_back(
              [&, m] { prepared[static_cast<size_t>(m)] = syncer::PreparePush(opt.uplink, payload, numel); });
        }
        for (auto& t : handlers) t.join();
      }
      auto b = Wall::now();
      const size_t raw_bytes = prepared.front().raw.size();
      for (int m = 0; m < learners; ++m) {
        syncer::PushHeaderData h;
        h.learner_id = m;
        h.fragment = p;
        h.base_version = have[static_cast<size_t>(p)];
        h.c_tokens = 4096;
        h.c_steps = 1;
        h.encoding = opt.uplink.encoding;
        h.block_size = opt.uplink.block_size;
        h.compression = opt.uplink.compression;
        h.num_values = static_cast<int64_t>(numel);
        auto pushed = core->Push(h, std::move(prepared[static_cast<size_t>(m)]), clock.Now());
        if (!pushed.ok()) Usage("push: " + pushed.status().ToString());
        push_bytes += static_cast<double>(payload.size());
      }
      auto c = Wall::now();
      const auto reports = core->Poll(clock.Now(), clock);
      auto d = Wall::now();
      closed += static_cast<int>(reports.size());
      const size_t delta_bytes =
          core->public_copy(p)->HeldBytes() > 0 ? numel / 2 : 0;  // the delta: ≈ half a byte a value
      const size_t read = static_cast<size_t>(learners) * raw_bytes + numel * sizeof(float) * (momentum ? 3 : 2);
      const size_t written = numel * sizeof(float) * (momentum ? 3 : 2) + delta_bytes;
      const double fl = floor_copy((read + written) / 2);
      prepare_s += Seconds(a, b);
      admit_s += Seconds(b, c);
      close_s += Seconds(c, d);
      floor_s += fl;
      round_ratio.push_back(Seconds(a, d) / fl);
      close_ratio.push_back(Seconds(c, d) / fl);
      int64_t version = have[static_cast<size_t>(p)];
      for (int m = 0; m < learners; ++m) {
        auto pulled = core->Pull(m, p, have[static_cast<size_t>(p)]);
        if (!pulled.ok()) Usage("pull: " + pulled.status().ToString());
        pull_bytes += static_cast<double>(pulled->bytes.size());
        version = pulled->version;
      }
      have[static_cast<size_t>(p)] = version;
      pull_s += Seconds(d, Wall::now());
      clock.AdvanceSeconds(0.1);
    }
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const double push_s = prepare_s + admit_s;
  const auto held = core->held_bytes();
  const double rss_end = bench::ProcStatusBytes("self", "VmRSS:"), hwm = bench::ProcStatusBytes("self", "VmHWM:");
  const double n = static_cast<double>(plan->total_numel);
  const double model_rounds = static_cast<double>(rounds);
  nlohmann::json out = {
      {"params", plan->total_numel},
      {"learners", learners},
      {"fragments", fragments},
      {"threads", threads},
      {"rounds_closed", closed},
      {"setup_seconds", setup_s},
      {"held_bytes_per_param", static_cast<double>(held.total()) / n},
      {"held",
       {{"theta", held.theta},
        {"momentum", held.momentum},
        {"sweep", held.sweep},
        {"public_copies", held.public_copies},
        {"pending", held.pending},
        {"learners", held.learners}}},
      {"rss_after_setup_bytes_per_param", rss_setup / n},
      {"rss_end_bytes_per_param", rss_end / n},
      {"peak_rss_bytes_per_param", hwm / n},
      {"memcpy_model_seconds", memcpy_s},
      {"push_seconds_per_model_round", push_s / model_rounds},
      {"prepare_seconds_per_model_round", prepare_s / model_rounds},
      {"admit_seconds_per_model_round", admit_s / model_rounds},
      {"floor_seconds_per_model_round", floor_s / model_rounds},
      {"round_over_floor_median", median(round_ratio)},
      {"close_over_floor_median", median(close_ratio)},
      {"fragment_rounds_per_second", closed / (push_s + close_s)},
      {"close_seconds_per_model_round", close_s / model_rounds},
      {"pull_seconds_per_model_round", pull_s / model_rounds},
      {"close_over_memcpy", close_s / model_rounds / memcpy_s},
      {"full_pull_bytes_per_param", full_pull_bytes / n},
      {"push_bytes_per_param", push_bytes / model_rounds / learners / n},
      {"pull_delta_bytes_per_param", pull_bytes / model_rounds / learners / n},
  };
  if (json_out) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("bench_syncer_scale: %s params, M = %d learners, P = %d fragments, %d rounds of each, threads %d\n",
              std::to_string(plan->total_numel).c_str(), learners, fragments, rounds, threads);
  std::printf(
      "  memory per parameter: held by SyncerCore %.2f B (theta %.2f, momentum %.2f, sweep %.2f, public copies "
      "+ history %.2f, pending %.2f), process RSS %.2f B after setup, %.2f B after the rounds, peak %.2f B\n",
      static_cast<double>(held.total()) / n, held.theta / n, held.momentum / n, held.sweep / n, held.public_copies / n,
      held.pending / n, rss_setup / n, rss_end / n, hwm / n);
  std::printf(
      "  one round of every fragment: pushes prepared %.3f s (M threads) and admitted %.3f s, rounds closed "
      "%.3f s (%.1fx one memcpy of the model, %.3f s), pulls served %.3f s\n",
      prepare_s / model_rounds, admit_s / model_rounds, close_s / model_rounds, close_s / model_rounds / memcpy_s,
      memcpy_s, pull_s / model_rounds);
  std::printf(
      "  a fragment's round (prepare + admit + close) / its memory-traffic floor, median of %zu: %.2fx "
      "(close alone %.2fx); %.2f fragment rounds per second\n",
      round_ratio.size(), median(round_ratio), median(close_ratio), closed / (push_s + close_s));
  std::printf("  wire per learner per parameter: join pull %.3f B, push %.3f B, pull delta %.3f B per round\n",
              full_pull_bytes / n, push_bytes / model_rounds / learners / n, pull_bytes / model_rounds / learners / n);
  return 0;
}
