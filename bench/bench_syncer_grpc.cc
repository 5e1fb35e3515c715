// bench_syncer_grpc: a real `atoll syncer` process started from a model spec of `--params`
// parameters, loaded over gRPC on 127.0.0.1 by M learner clients in this process: the syncer's
// resident memory per parameter (its peak, read from /proc while it runs), the wall time of a
// round of every fragment against one memcpy of the model in this process, and the bytes on the
// wire per learner per parameter.
//
// The spec is written first (tensors of 4096 × 4096, the first an embedding; N(0, 0.02) values)
// into --dir. Every learner joins and pulls every fragment in full; then, for --rounds sweeps over
// the fragments, every learner pushes an int4 outer gradient of fragment p against the public
// copy it holds (one payload encoded once and sent by all M: the syncer decodes each on its own),
// the round closes with all M (quorum M, no grace), and every learner long-polls the new version
// (a delta); every learner heartbeats each second. One copy of Φ is kept by the bench (learner 0's); the others' pulls are received and
// counted, not decoded, so the bench itself holds ≈ 4 bytes per parameter whatever M is.
//
// --standby (replicated commits, docs/decisions/023): a single-member etcd is started in --dir and
// the load runs twice, one after the other — on a leader alone, then on a leader whose standby
// (a second `atoll syncer` candidate) follows its commits, the load starting once the standby is in
// the replica set — and the bench prints the round times side by side: a fragment's round (its
// pushes until every learner holds the new version), which includes the leader's commit and its
// wait for the standby, and the leader's own account of that wait.
//
// --inflight-mb B sets the syncer's budget of push bytes received at once ([limits]
// max_inflight_push_mb): pushes beyond it are refused (RESOURCE_EXHAUSTED) and sent again after
// 5 ms, as a learner does, so that the memory of pushes in flight is the same for any M.
//
// --outer-momentum μ runs the syncer with that outer momentum (default: the mode's, 0 for
// decoupled): with μ > 0 the syncer keeps a momentum buffer per fragment, and the bench measures
// what it costs in resident memory and round time.
//
//   bench_syncer_grpc [--params N] [--learners M] [--fragments P] [--rounds R] [--inflight-mb B] [--standby]
//                     [--outer-momentum MU] [--dir D] [--json]
// Exit 0; 1 when the syncer fails; 2 on bad flags.
#include <sys/types.h>

#include <csignal>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/coord/etcd_client.h"
#include "atoll/core/child_process.h"
#include "atoll/core/file.h"
#include "atoll/core/rng.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/model/model_spec.h"
#include "atoll/syncer/api.h"
#include "atoll/transport/grpc_client.h"
#include "scale_model.h"

namespace {

using namespace atl;
using Wall = std::chrono::steady_clock;

double Seconds(Wall::time_point a, Wall::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::string TextOf(const std::string& path, const std::string& missing) {
  auto text = ReadFile(path);
  return text.ok() ? *text : missing;
}

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr,
               "bench_syncer_grpc: %s\nusage: bench_syncer_grpc [--params N (default 100000000)] [--learners M (8)] "
               "[--fragments P (24)] [--rounds R (2)] [--inflight-mb B (the syncer's default)] "
               "[--standby (with and without a standby following the commits)] "
               "[--outer-momentum MU (the syncer's outer momentum, 0 <= MU < 1; default the mode's)] "
               "[--dir D (default a fresh folder under /tmp)] [--json]\n",
               error.c_str());
  std::exit(2);
}

[[noreturn]] void Fail(const std::string& what, const Status& st, const std::string& log) {
  std::fprintf(stderr, "bench_syncer_grpc: %s: %s\n--- syncer log (%s) ---\n%s\n", what.c_str(), st.ToString().c_str(),
               log.c_str(), TextOf(log, "(none)").c_str());
  std::exit(1);
}

struct Bench {
  int64_t params = 100'000'000, inflight_mb = 0;
  int learners = 8, fragments = 24, rounds = 2;
  std::string dir, spec, etcd;
  std::string outer_momentum;  // empty: the syncer's default
  std::vector<diloco::TensorSpec> tensors;
  bool json_out = false;
};

// A single-member etcd on a unix socket in `dir` (etcd cannot bind port 0); its endpoint.
std::string StartEtcd(const std::string& dir, std::optional<ChildProcess>& etcd) {
  const std::string at = dir + "/etcd";
  std::filesystem::create_directories(at);
  auto p = ChildProcess::Start(
      {"/bin/sh", "-c",
       "cd '" + at +
           "' && exec /usr/bin/etcd --name b --data-dir d --listen-client-urls unix://localhost:1 "
           "--advertise-client-urls unix://localhost:1 --listen-peer-urls unix://localhost:2 "
           "--initial-advertise-peer-urls unix://localhost:2 --initial-cluster b=unix://localhost:2 "
           "--heartbeat-interval 10 --election-timeout 100"},
      at + "/etcd.log");
  if (!p.ok()) Usage("--standby needs etcd (/usr/bin/etcd, scripts/setup installs it): " + p.status().ToString());
  etcd = std::move(*p);
  const std::string endpoint = "unix:" + at + "/localhost:1";
  if (auto c = coord::EtcdClient::Connect(endpoint, 30); !c.ok()) Fail("etcd", c.status(), at + "/etcd.log");
  return endpoint;
}

// Whether the leader of run `run_id` recorded candidate b in its replica set.
bool StandbyInSync(coord::EtcdClient& etcd, const std::string& run_id) {
  auto kv = etcd.Get("/atoll/" + run_id + "/shard-0-of-1/replicas");
  if (!kv.ok() || !kv->has_value()) return false;
  const auto j = nlohmann::json::parse((*kv)->value, nullptr, false);
  if (!j.is_object() || !j.contains("in_sync")) return false;
  return std::find(j["in_sync"].begin(), j["in_sync"].end(), "b") != j["in_sync"].end();
}

// Candidate b of the leader's run, with the leader's flags and its own folder; returns once the
// leader's replica set names it (a snapshot installed and acknowledged).
ChildProcess StartStandby(std::vector<std::string> argv, const std::string& out_dir, const std::string& run_id,
                          const std::string& endpoint, const std::string& leader_log) {
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "--out") argv[i + 1] = out_dir + "-standby";
    if (argv[i] == "--port-file") argv[i + 1] = out_dir + "-standby.port";
    if (argv[i] == "--candidate-id") argv[i + 1] = "b";
  }
  const std::string log = out_dir + "-standby.log";
  auto p = ChildProcess::Start(argv, log);
  if (!p.ok()) Fail("starting the standby", p.status(), log);
  auto etcd = coord::EtcdClient::Connect(endpoint, 30);
  if (!etcd.ok()) Fail("etcd", etcd.status(), leader_log);
  for (int i = 0; i < 6000; ++i) {
    if (!p->running()) Fail("the standby exited", UnavailableError("exited"), log);
    if (StandbyInSync(**etcd, run_id)) return std::move(*p);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  Fail("the standby was not in sync within 600 s", DeadlineExceededError("not in sync"), log);
}

// One syncer (with `b.etcd`: the shard's leader, candidate a) under the load, measured; `label`
// names its run folder and run id ("" for the one run of the plain bench), and with `standby` a
// second candidate (b) follows its commits, the load starting once b is in the replica set.
nlohmann::json RunOnce(const Bench& b, const std::string& label, bool standby) {
  const int64_t params = b.params, inflight_mb = b.inflight_mb;
  const int learners = b.learners, fragments = b.fragments, rounds = b.rounds;
  const std::string &dir = b.dir, &spec = b.spec;
  const auto& tensors = b.tensors;
  const bool json_out = b.json_out;
  const auto t_start = Wall::now();
  const std::string token = "bench-token", P = std::to_string(fragments), M = std::to_string(learners);
  const std::string out_dir = dir + "/" + (label.empty() ? std::string("run") : label), log = out_dir + ".log";
  const std::string run_id = label.empty() ? std::string("bench") : "bench-" + label;
  std::vector<std::string> argv_s = {ATOLL_BIN,      "syncer",
                                     "--spec",       spec,
                                     "--out",        out_dir,
                                     "-M",           M,
                                     "-P",           P,
                                     "-H",           P,
                                     "--tau",        "1",
                                     "--quorum",     M,
                                     "--grace",      "false",
                                     "--eval-every", "0",
                                     "--steps",      "1000000",
                                     "--token",      token,
                                     "--listen",     "127.0.0.1:0",
                                     "--port-file",  out_dir + ".port",
                                     "--run-id",     run_id,
                                     "--data",       dir + "/data"};
  if (inflight_mb > 0) {
    argv_s.push_back("--max-inflight-push-mb");
    argv_s.push_back(std::to_string(inflight_mb));
  }
  if (!b.outer_momentum.empty()) {
    argv_s.push_back("--outer-momentum");
    argv_s.push_back(b.outer_momentum);
  }
  if (!b.etcd.empty()) {  // the shard's leader through etcd; with `standby`, a second candidate follows it
    for (const char* f : {"--etcd", b.etcd.c_str(), "--candidate-id", "a"}) argv_s.push_back(f);
  }
  std::filesystem::remove(out_dir + ".port");
  auto syncer = ChildProcess::Start(argv_s, log);
  if (!syncer.ok()) Usage("starting the syncer: " + syncer.status().ToString());
  const std::string pid = std::to_string(syncer->pid());
  std::string port;
  for (int i = 0; i < 6000 && port.empty(); ++i) {
    if (!syncer->running()) Fail("the syncer exited before listening", UnavailableError("exited"), log);
    port = TextOf(out_dir + ".port", "");
    if (port.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // A candidate writes its port when it binds it, and serves once it leads.
  for (int i = 0; i < 6000 && !b.etcd.empty() && TextOf(log, "").find("listening on port") == std::string::npos; ++i) {
    if (!syncer->running()) Fail("the syncer exited before serving", UnavailableError("exited"), log);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (port.empty()) Fail("the syncer did not listen within 600 s", DeadlineExceededError("no port"), log);
  const double start_s = Seconds(t_start, Wall::now());
  const double rss_idle = bench::ProcStatusBytes(pid, "VmRSS:");

  transport::ClientOptions co;
  co.target = "127.0.0.1:" + port;
  co.token = token;
  co.call_timeout_s = 600;
  co.push_timeout_s = 600;
  std::vector<std::unique_ptr<transport::GrpcSyncerClient>> clients;
  for (int m = 0; m < learners; ++m) {
    auto c = transport::GrpcSyncerClient::Connect(co);
    if (!c.ok()) Fail("connect", c.status(), log);
    clients.push_back(std::move(*c));
  }
  syncer::JoinRequestData req;
  req.protocol_version = syncer::kProtocolVersion;
  req.run_id = run_id;
  req.model_signature = diloco::ModelSignature(tensors);
  req.host = "bench";
  std::vector<int64_t> numel;
  std::vector<uint64_t> sessions;  // each learner's push session; its pushes are numbered 1, 2, …
  for (int m = 0; m < learners; ++m) {
    req.learner_id = m;
    auto j = clients[static_cast<size_t>(m)]->Join(req);
    if (!j.ok()) Fail("join", j.status(), log);
    numel = j->fragment_numel;
    sessions.push_back(j->push_session);
  }
  // Every learner heartbeats every second from its own thread, as a real learner does (a learner
  // the syncer has not heard from for its learner timeout must rejoin).
  std::atomic<bool> stop_heartbeats{false};
  std::vector<std::thread> heartbeats;
  for (int m = 0; m < learners; ++m) {
    heartbeats.emplace_back([&, m] {
      syncer::LearnerProgress progress;
      progress.state = syncer::LearnerState::kTraining;
      while (!stop_heartbeats.load()) {
        (void)clients[static_cast<size_t>(m)]->Heartbeat(m, progress);
        for (int i = 0; i < 10 && !stop_heartbeats.load(); ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  // Learner 0's public copies (the bench's one copy of Φ); everyone pulls in full.
  std::vector<std::vector<float>> phi(static_cast<size_t>(fragments));
  std::vector<exchange::Lattice> lattice(static_cast<size_t>(fragments));
  std::vector<int64_t> have(static_cast<size_t>(fragments), -1);
  std::atomic<int64_t> join_bytes{0};
  const auto tj = Wall::now();
  auto each_learner = [&](auto&& fn) {
    std::vector<std::thread> threads;
    for (int m = 0; m < learners; ++m) threads.emplace_back([&, m] { fn(m); });
    for (auto& t : threads) t.join();
  };
  each_learner([&](int m) {
    for (int p = 0; p < fragments; ++p) {
      auto full = clients[static_cast<size_t>(m)]->Pull(m, p, -1, 0.0, 0);
      if (!full.ok()) Fail("full pull", full.status(), log);
      join_bytes += static_cast<int64_t>(full->bytes.size());
      if (m != 0) continue;
      Status st = syncer::ApplyPulled(*full, -1, static_cast<size_t>(numel[static_cast<size_t>(p)]),
                                      phi[static_cast<size_t>(p)], lattice[static_cast<size_t>(p)]);
      if (!st.ok()) Fail("applying a full pull", st, log);
      have[static_cast<size_t>(p)] = full->version;
    }
  });
  const double join_s = Seconds(tj, Wall::now());
  const double rss_join = bench::ProcStatusBytes(pid, "VmRSS:"), hwm_join = bench::ProcStatusBytes(pid, "VmHWM:");

  std::optional<ChildProcess> follower;
  if (standby) follower = StartStandby(argv_s, out_dir, run_id, b.etcd, log);

  // The memcpy floor: one copy of every fragment, in this process.
  double memcpy_s = 0;
  {
    std::vector<float> dst;
    for (const auto& f : phi) {
      dst.resize(f.size());
      const auto a = Wall::now();
      std::memcpy(dst.data(), f.data(), f.size() * sizeof(float));
      memcpy_s += Seconds(a, Wall::now());
    }
  }

  const diloco::CodecOptions uplink{diloco::Encoding::kInt4, 256, diloco::Compression::kDeflate};
  Rng rng(7);
  std::atomic<int64_t> push_bytes{0}, pull_bytes{0};
  double push_s = 0, pull_s = 0, encode_s = 0;
  std::vector<double> fragment_round_s;  // a fragment's pushes to every learner holding its new version
  const int64_t wire_up0 = [&] {
    int64_t s = 0;
    for (auto& c : clients) s += c->bytes_sent();
    return s;
  }();
  const int64_t wire_down0 = [&] {
    int64_t s = 0;
    for (auto& c : clients) s += c->bytes_received();
    return s;
  }();
  const auto tr = Wall::now();
  for (int r = 0; r < rounds; ++r) {
    for (int p = 0; p < fragments; ++p) {
      const auto ps = static_cast<size_t>(p);
      std::vector<float> local(phi[ps]);
      for (float& v : local) v -= static_cast<float>(rng.Normal(0.0005, 0.002));
      std::vector<std::byte> payload;
      const auto te = Wall::now();  // the learner's cost of a push: outer gradient, int4, deflate
      if (Status st = exchange::EncodeOuterGradient(uplink, phi[ps], local, payload); !st.ok()) Fail("encode", st, log);
      encode_s += Seconds(te, Wall::now());
      local = {};
      const auto a = Wall::now();
      each_learner([&](int m) {
        syncer::PushHeaderData h;
        h.learner_id = m;
        h.fragment = p;
        h.base_version = have[ps];
        h.c_tokens = 4096;
        h.c_steps = 1;
        h.encoding = uplink.encoding;
        h.block_size = uplink.block_size;
        h.compression = uplink.compression;
        h.num_values = numel[ps];
        h.push_session = sessions[static_cast<size_t>(m)];
        h.push_seq = static_cast<uint64_t>(r) * static_cast<uint64_t>(fragments) + ps + 1;
        auto pushed = clients[static_cast<size_t>(m)]->Push(h, payload);
        for (int tries = 0; !pushed.ok() && pushed.status().code() == StatusCode::kResourceExhausted && tries < 100'000;
             ++tries) {
          std::this_thread::sleep_for(
              std::chrono::milliseconds(5));  // over the in-flight budget: again, as a learner does
          pushed = clients[static_cast<size_t>(m)]->Push(h, payload);
        }
        if (!pushed.ok()) Fail("push", pushed.status(), log);
        push_bytes += static_cast<int64_t>(payload.size());
      });
      const auto pushed_at = Wall::now();
      push_s += Seconds(a, pushed_at);
      int64_t version = have[ps];
      each_learner([&](int m) {
        auto pulled = clients[static_cast<size_t>(m)]->Pull(m, p, have[ps], 600.0, have[ps] + 1);
        if (!pulled.ok() || pulled->not_modified)
          Fail("pull of the new version", pulled.ok() ? DeadlineExceededError("not modified") : pulled.status(), log);
        pull_bytes += static_cast<int64_t>(pulled->bytes.size());
        if (m != 0) return;
        Status st = syncer::ApplyPulled(*pulled, have[ps], static_cast<size_t>(numel[ps]), phi[ps], lattice[ps]);
        if (!st.ok()) Fail("applying a delta", st, log);
        version = pulled->version;
      });
      have[ps] = version;
      pull_s += Seconds(pushed_at, Wall::now());
      fragment_round_s.push_back(Seconds(a, Wall::now()));
    }
  }
  const double rounds_s = Seconds(tr, Wall::now());
  int64_t wire_up = -wire_up0, wire_down = -wire_down0;
  for (auto& c : clients) {
    wire_up += c->bytes_sent();
    wire_down += c->bytes_received();
  }
  const double rss_end = bench::ProcStatusBytes(pid, "VmRSS:"), hwm = bench::ProcStatusBytes(pid, "VmHWM:");
  const double self_hwm = bench::ProcStatusBytes("self", "VmHWM:");
  stop_heartbeats = true;
  for (auto& t : heartbeats) t.join();
  // Done: the syncer is stopped as an operator stops it (SIGTERM); its final model write is not
  // part of what is measured.
  clients.clear();
  syncer->Signal(SIGTERM);
  const int rc = syncer->WaitOrKill(600);
  int standby_rc = 0;
  if (follower) {  // it leads once the leader resigns, sees the run finished and exits 0
    standby_rc = follower->WaitOrKill(120);
  }
  nlohmann::json replication;  // the leader's account of its replicated commits
  {
    auto summary = nlohmann::json::parse(TextOf(out_dir + "/syncer-summary.json", "{}"), nullptr, false);
    if (summary.is_object() && summary.contains("replication")) replication = summary["replication"];
  }
  std::sort(fragment_round_s.begin(), fragment_round_s.end());
  const double fragment_round_median = fragment_round_s.empty() ? 0.0 : fragment_round_s[fragment_round_s.size() / 2];

  // The syncer's own timing of each round's pass and commit (its metrics' close_s), against the
  // memory-traffic floor of such a round measured here: one memcpy of half the bytes it reads and
  // writes (M pushes in the quantiser's layout, Θ_p and Φ_p read; Θ_p, Φ_p and the delta written).
  std::vector<double> closes;
  {
    std::ifstream metrics(out_dir + "/metrics-syncer.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.value("kind", "") == "round") closes.push_back(j.value("close_s", 0.0));
    }
  }
  std::sort(closes.begin(), closes.end());
  const double close_median = closes.empty() ? 0.0 : closes[closes.size() / 2];
  double floor_s = 0;
  {
    const size_t numel0 = static_cast<size_t>(numel.front());
    const size_t bytes =
        (static_cast<size_t>(learners) * diloco::EncodedSize(uplink, numel0) + 16 * numel0 + numel0 / 2) / 2;
    std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes, std::byte{0});
    floor_s = 1e30;
    for (int i = 0; i < 5; ++i) {
      const auto a = Wall::now();
      std::memcpy(dst.data(), src.data(), bytes);
      floor_s = std::min(floor_s, Seconds(a, Wall::now()));
    }
  }
  const double n = static_cast<double>(params), R = static_cast<double>(rounds);
  const double model_round_s = (push_s + pull_s) / R;
  nlohmann::json out = {
      {"params", params},
      {"learners", learners},
      {"fragments", fragments},
      {"rounds", rounds},
      {"inflight_mb", inflight_mb},
      {"outer_momentum",
       b.outer_momentum.empty() ? nlohmann::json(nullptr) : nlohmann::json(std::stod(b.outer_momentum))},
      {"syncer_start_seconds", start_s},
      {"join_pull_seconds", join_s},
      {"syncer_rss_idle_bytes_per_param", rss_idle / n},
      {"syncer_rss_after_join_bytes_per_param", rss_join / n},
      {"syncer_peak_rss_join_bytes_per_param", hwm_join / n},
      {"syncer_rss_end_bytes_per_param", rss_end / n},
      {"syncer_peak_rss_bytes_per_param", hwm / n},
      {"bench_peak_rss_bytes_per_param", self_hwm / n},
      {"memcpy_model_seconds", memcpy_s},
      {"encode_seconds_per_model_round", encode_s / R},
      {"push_seconds_per_model_round", push_s / R},
      {"pull_seconds_per_model_round", pull_s / R},
      {"model_round_seconds", model_round_s},
      {"model_round_over_memcpy", model_round_s / memcpy_s},
      {"rounds_wall_seconds", rounds_s},
      {"join_bytes_per_param", static_cast<double>(join_bytes.load()) / learners / n},
      {"push_payload_bytes_per_param", static_cast<double>(push_bytes.load()) / R / learners / n},
      {"pull_payload_bytes_per_param", static_cast<double>(pull_bytes.load()) / R / learners / n},
      {"wire_up_bytes_per_param", static_cast<double>(wire_up) / R / learners / n},
      {"wire_down_bytes_per_param", static_cast<double>(wire_down) / R / learners / n},
      {"syncer_close_seconds_median", close_median},
      {"round_floor_seconds", floor_s},
      {"syncer_close_over_floor", close_median / floor_s},
      {"syncer_close_seconds_best", closes.empty() ? 0.0 : closes.front()},
      {"syncer_close_best_over_floor", closes.empty() ? 0.0 : closes.front() / floor_s},
      {"fragment_rounds_per_second", close_median > 0 ? 1.0 / close_median : 0.0},
      {"encode_seconds_per_push", encode_s / R / fragments},
      {"fragment_round_seconds_median", fragment_round_median},
      {"syncer_exit", rc},
  };
  if (standby) {
    out["standby_exit"] = standby_rc;
    out["replication"] = replication;
  }
  if (!json_out) {
    std::printf(
        "bench_syncer_grpc%s: atoll syncer from a %lld-parameter spec, M = %d gRPC learners, P = %d, %d rounds "
        "of each fragment, push bytes in flight: %s, outer momentum: %s\n",
        label.empty() ? "" : (" [" + label + "]").c_str(), static_cast<long long>(params), learners, fragments, rounds,
        inflight_mb > 0 ? (std::to_string(inflight_mb) + " MiB").c_str() : "the syncer's default",
        b.outer_momentum.empty() ? "the syncer's default" : b.outer_momentum.c_str());
    std::printf(
        "  syncer memory per parameter: %.2f B idle after start, %.2f B after the joins (peak %.2f B), %.2f B after "
        "the rounds, peak %.2f B (the bench: peak %.2f B)\n",
        rss_idle / n, rss_join / n, hwm_join / n, rss_end / n, hwm / n, self_hwm / n);
    std::printf(
        "  a round of every fragment: %.2f s (pushes %.2f s, pulls of the new versions %.2f s) = %.0fx one "
        "memcpy of the model (%.4f s); start %.1f s, every learner's full join pull %.1f s\n",
        model_round_s, push_s / R, pull_s / R, model_round_s / memcpy_s, memcpy_s, start_s, join_s);
    std::printf(
        "  the syncer's pass and commit of a fragment's round (its metrics): median %.4f s over %zu rounds = %.2fx "
        "the round's memory-traffic floor (%.4f s, the best of five); the best round %.4f s = %.2fx\n",
        close_median, closes.size(), close_median / floor_s, floor_s, closes.empty() ? 0.0 : closes.front(),
        closes.empty() ? 0.0 : closes.front() / floor_s);
    std::printf(
        "  the syncer closes %.2f rounds of a %lld-value fragment per second; the learner's cost per push: "
        "encode %.4f s (%.2f ns per value)\n",
        close_median > 0 ? 1.0 / close_median : 0.0, static_cast<long long>(numel.front()), encode_s / R / fragments,
        1e9 * encode_s / R / static_cast<double>(params));
    std::printf(
        "  per learner per parameter: join %.3f B, push %.3f B, pull %.3f B per round (wire %.3f up, %.3f down)\n",
        static_cast<double>(join_bytes.load()) / learners / n,
        static_cast<double>(push_bytes.load()) / R / learners / n,
        static_cast<double>(pull_bytes.load()) / R / learners / n, static_cast<double>(wire_up) / R / learners / n,
        static_cast<double>(wire_down) / R / learners / n);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = 100'000'000;
  int learners = 8, fragments = 24, rounds = 2;
  int64_t inflight_mb = 0;  // 0: the syncer's default
  std::string dir, outer_momentum;
  bool json_out = false, standby = false;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(k + " needs a value");
      return argv[++i];
    };
    auto next = [&]() -> int64_t {
      const std::string v = value();
      char* end = nullptr;
      const int64_t n = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0') Usage(k + " takes an integer, not '" + v + "'");
      return n;
    };
    if (k == "--params") params = next();
    else if (k == "--learners") learners = static_cast<int>(next());
    else if (k == "--fragments") fragments = static_cast<int>(next());
    else if (k == "--rounds") rounds = static_cast<int>(next());
    else if (k == "--inflight-mb") inflight_mb = next();
    else if (k == "--dir") dir = value();
    else if (k == "--json") json_out = true;
    else if (k == "--standby") standby = true;
    else if (k == "--outer-momentum") {
      outer_momentum = value();
      char* end = nullptr;
      const double mu = std::strtod(outer_momentum.c_str(), &end);
      if (end == outer_momentum.c_str() || *end != '\0' || !(mu >= 0 && mu < 1))
        Usage("--outer-momentum takes a number in [0, 1), not '" + outer_momentum + "'");
    } else if (k == "-h" || k == "--help") Usage("a real atoll syncer at model scale over gRPC");
    else Usage("unknown flag " + k);
  }
  if (params < 4096 || learners < 1 || learners > 256 || fragments < 1 || rounds < 1 || fragments > params / 4096 ||
      inflight_mb < 0) {
    Usage(
        "need --params >= 4096, 1 <= --learners <= 256, --fragments/--rounds >= 1, P <= params/4096, --inflight-mb >= 0");
  }
  if (dir.empty())
    dir = (std::filesystem::temp_directory_path() / ("bench-syncer-grpc-" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  const std::string spec = dir + "/model.safetensors";

  // The spec, written tensor by tensor (never whole in memory).
  const auto tensors = bench::ScaleTensors(params);
  const auto t0 = Wall::now();
  {
    Rng rng(1);
    Status st =
        model::WriteModelSpec(spec, tensors, nlohmann::json::object(), [&](size_t, int64_t, std::span<float> out) {
          for (float& v : out) v = static_cast<float>(rng.Normal(0, 0.02));
        });
    if (!st.ok()) Usage("writing the spec: " + st.ToString());
  }
  const double spec_s = Seconds(t0, Wall::now());

  Bench b{params, inflight_mb, learners, fragments, rounds, dir, spec, "", outer_momentum, tensors, json_out};
  if (!standby) {
    nlohmann::json out = RunOnce(b, "", false);
    out["spec_write_seconds"] = spec_s;
    if (json_out) std::printf("%s\n", out.dump(2).c_str());
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    return out["syncer_exit"] == 0 ? 0 : 1;
  }
  // Replicated commits (docs/decisions/023): the same load on a leader alone and on a leader whose
  // standby follows its commits, one after the other on this machine.
  std::optional<ChildProcess> etcd;
  b.etcd = StartEtcd(dir, etcd);
  const nlohmann::json alone = RunOnce(b, "alone", false), with = RunOnce(b, "standby", true);
  etcd->Signal(SIGTERM);
  etcd->WaitOrKill(10);
  const double ratio = with["fragment_round_seconds_median"].get<double>() /
                       std::max(1e-9, alone["fragment_round_seconds_median"].get<double>());
  const double model_ratio =
      with["model_round_seconds"].get<double>() / std::max(1e-9, alone["model_round_seconds"].get<double>());
  if (json_out) {
    std::printf("%s\n", nlohmann::json{{"spec_write_seconds", spec_s},
                                       {"alone", alone},
                                       {"standby", with},
                                       {"fragment_round_with_over_without", ratio},
                                       {"model_round_with_over_without", model_ratio}}
                            .dump(2)
                            .c_str());
  } else {
    const nlohmann::json& r = with["replication"];
    std::printf(
        "replicated commits: a fragment's round (pushes to every learner holding the new version), median: %.4f s "
        "alone, %.4f s with a standby in sync = %.2fx; a round of every fragment %.2fx; the leader's wait per commit "
        "%.2f ms mean, %.2f ms largest over %lld commits, %lld standby drops\n",
        alone["fragment_round_seconds_median"].get<double>(), with["fragment_round_seconds_median"].get<double>(),
        ratio, model_ratio, r.value("wait_ms_mean", 0.0), r.value("wait_ms_max", 0.0),
        static_cast<long long>(r.value("commits", int64_t{0})), static_cast<long long>(r.value("dropped", int64_t{0})));
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return alone["syncer_exit"] == 0 && with["syncer_exit"] == 0 && with["standby_exit"] == 0 ? 0 : 1;
}
