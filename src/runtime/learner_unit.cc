// `atoll learner --ranks R`: one learner made of R processes (docs/architecture.md, "Processes").
//
// The supervisor (this process) starts R ranks of its own binary and watches them. The ranks
// train synchronously data-parallel through RankGroup (c10d ProcessGroupGloo): each reads its own
// slice of the learner's data shard, their gradients are averaged before every AdamW step, so the
// unit trains like one learner with R times the batch. Rank 0 alone runs the LearnerAgent (join,
// fragments, heartbeats) and broadcasts the parameters whenever it applied merged fragments; the
// other ranks only follow (RunFollowerRank). When a rank dies, the supervisor kills the rest and
// starts the whole unit again (--rejoin, from rank 0's last reported step): elastic inside the
// unit, invisible to the other learners, which never wait for it.
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "atoll/core/checksum.h"
#include "atoll/core/child_process.h"
#include "atoll/core/file.h"
#include "atoll/core/text.h"
#include "atoll/model/data.h"
#include "learner_unit.h"

namespace atl::runtime {
namespace {

constexpr int kMaxUnitRestarts = 5;

// The step rank 0 last reported in its metrics file (the unit continues there after a restart).
int64_t LastReportedStep(const std::string& metrics_path, int64_t fallback) {
  std::ifstream in(metrics_path);
  std::string line;
  int64_t step = fallback;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && !j.contains("kind")) step = j.value("step", step);
  }
  return step;
}

std::vector<std::string> RankArgv(const LearnerProcessOptions& opt, const std::string& config, int rank,
                                  const std::string& store, int64_t start_step, bool rejoin) {
  std::vector<std::string> a = {SelfExecutable(),
                                "learner",
                                "-c",
                                config,
                                "--id",
                                std::to_string(opt.id),
                                "--syncer",
                                opt.syncer,
                                "--out",
                                opt.out_dir.empty() ? "." : opt.out_dir,
                                "--ranks",
                                std::to_string(opt.ranks),
                                "--rank",
                                std::to_string(rank),
                                "--unit-store",
                                store,
                                "--start-step",
                                std::to_string(start_step)};
  if (rejoin) a.push_back("--rejoin");
  const std::pair<const char*, const std::string*> files[] = {
      {"--control-file", &opt.control_file},       {"--token-file", &opt.token_file}, {"--tls-ca", &opt.tls.ca},
      {"--tls-server-name", &opt.tls.server_name}, {"--tls-cert", &opt.tls.cert},     {"--tls-key", &opt.tls.key}};
  for (const auto& [flag, value] : files) {
    if (!value->empty()) a.insert(a.end(), {flag, *value});
  }
  return a;
}

// Starts the R ranks of one incarnation; writes "rank pid" lines to <unit>/pids (for operators
// and tests that kill a rank).
StatusOr<std::vector<ChildProcess>> StartRanks(const LearnerProcessOptions& opt, const std::string& unit_dir,
                                               int incarnation, int64_t start_step, bool rejoin) {
  const std::string store = unit_dir + "/store-" + std::to_string(incarnation);
  std::filesystem::remove(store);
  std::vector<ChildProcess> ranks;
  std::string pids;
  for (int r = 0; r < opt.ranks; ++r) {
    const std::string log = r == 0 ? "/dev/stdout" : unit_dir + "/rank-" + std::to_string(r) + ".log";
    ATOLL_ASSIGN_OR_RETURN(
        auto child, ChildProcess::Start(RankArgv(opt, unit_dir + "/config.json", r, store, start_step, rejoin), log));
    pids += std::to_string(r) + " " + std::to_string(child.pid()) + "\n";
    ranks.push_back(std::move(child));
  }
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(unit_dir + "/pids", pids));
  return ranks;
}

// The failed rank to report among those that have exited: one killed by a signal before one that
// exited with an error (usually because a peer of its collective died: "broadcast failed"). -1 if
// none failed; *done counts the ranks that exited 0.
int FailedRank(std::vector<ChildProcess>& ranks, int* done) {
  int failed = -1, failed_code = 0;
  *done = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].running()) continue;
    const int code = ranks[r].exit_code().value_or(1);
    if (code == 0) {
      ++*done;
    } else if (failed < 0 || (code < 0 && failed_code >= 0)) {
      failed = static_cast<int>(r);
      failed_code = code;
    }
  }
  return failed;
}

// Waits until every rank exited 0 (returns -1) or one failed (returns its rank; the others are
// killed). A rank that exited with an error gives the others 0.5 s to be seen dying too, so that
// the rank whose death caused it (a SIGKILL, a crash) is the one reported.
int WatchRanks(std::vector<ChildProcess>& ranks) {
  for (;;) {
    int done = 0;
    int failed = FailedRank(ranks, &done);
    if (failed >= 0 && ranks[static_cast<size_t>(failed)].exit_code().value_or(1) > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      failed = FailedRank(ranks, &done);
    }
    if (failed >= 0) {
      for (auto& other : ranks) other.WaitOrKill(0);
      return failed;
    }
    if (done == static_cast<int>(ranks.size())) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

Status WriteRankChecksum(const std::string& out_dir, int id, int rank, const std::vector<std::span<float>>& params) {
  std::string bytes;
  for (const auto& p : params) bytes.append(reinterpret_cast<const char*>(p.data()), p.size_bytes());
  const std::string dir = (out_dir.empty() ? std::string(".") : out_dir) + "/unit-" + std::to_string(id);
  return WriteFileAtomic(dir + "/rank-" + std::to_string(rank) + ".checksum", ChecksumHex(Checksum64(bytes)) + "\n");
}

int RunLearnerUnit(const LearnerProcessOptions& opt) {
  const std::string out = opt.out_dir.empty() ? "." : opt.out_dir;
  if (Normalized(opt.config).mode == diloco::Mode::kDdp) {
    std::fprintf(
        stderr,
        "atoll learner %d: error: --ranks needs decoupled or diloco mode (ddp exchanges gradients every step)\n",
        opt.id);
    return 2;
  }
  const std::string unit_dir = out + "/unit-" + std::to_string(opt.id);
  if (Status st = MakeDirs(unit_dir); !st.ok()) {
    std::fprintf(stderr, "atoll learner %d: error: %s\n", opt.id, st.ToString().c_str());
    return 1;
  }
  // The ranks read the resolved run config from here (owner-only: it may hold the token).
  const std::string config_path = unit_dir + "/config.json";
  if (Status st = WriteFileAtomic(config_path, DumpJson(ToJson(opt.config), 2)); !st.ok()) {
    std::fprintf(stderr, "atoll learner %d: error: %s\n", opt.id, st.ToString().c_str());
    return 1;
  }
  ::chmod(config_path.c_str(), 0600);
  int64_t start = opt.start_step;
  bool rejoin = opt.rejoin;
  for (int incarnation = 0;; ++incarnation) {
    auto ranks = StartRanks(opt, unit_dir, incarnation, start, rejoin);
    if (!ranks.ok()) {
      std::fprintf(stderr, "atoll learner %d: error: %s\n", opt.id, ranks.status().ToString().c_str());
      return 1;
    }
    const int failed = WatchRanks(*ranks);
    if (failed < 0) return 0;
    const int code = (*ranks)[static_cast<size_t>(failed)].exit_code().value_or(1);
    if ((failed == 0 && code == 2) || incarnation == kMaxUnitRestarts) {
      std::fprintf(stderr, "atoll learner %d: rank %d exited with %d; giving up\n", opt.id, failed, code);
      return code == 2 ? 2 : 1;
    }
    start = LastReportedStep(out + "/metrics-learner-" + std::to_string(opt.id) + ".jsonl", start);
    rejoin = true;
    std::printf("learner unit %d: rank %d %s; restarting the unit from step %lld (restart %d of at most %d)\n", opt.id,
                failed,
                code < 0 ? ("killed by signal " + std::to_string(-code)).c_str()
                         : ("exited with " + std::to_string(code)).c_str(),
                static_cast<long long>(start), incarnation + 1, kMaxUnitRestarts);
    std::fflush(stdout);
  }
}

StatusOr<model::TrainerOptions> RankTrainerOptions(const RunConfig& c, int id, int rank, int ranks) {
  ATOLL_ASSIGN_OR_RETURN(auto o, MakeTrainerOptions(c, id));
  o.learner_id = id * ranks + rank;  // this rank's slice of the unit's data
  o.num_learners = c.learners * ranks;
  return o;
}

// Ranks 1..R-1: the same steps as rank 0, no syncer; parameters from rank 0 after it applied
// merged fragments.
int RunFollowerRank(const LearnerProcessOptions& opt) {
  auto fail = [&](const Status& st) {
    std::fprintf(stderr, "atoll learner %d rank %d: error: %s\n", opt.id, opt.rank, st.ToString().c_str());
    return 1;
  };
  const RunConfig c = Normalized(opt.config);
  if (auto m = model::EnsureDataPrepared(c.data, nullptr); !m.ok()) return fail(m.status());
  auto topts = RankTrainerOptions(c, opt.id, opt.rank, opt.ranks);
  if (!topts.ok()) return fail(topts.status());
  topts->start_step = opt.start_step;
  auto trainer = model::Trainer::Create(*topts);
  if (!trainer.ok()) return fail(trainer.status());
  auto group = RankGroup::Create(opt.unit_store, opt.rank, opt.ranks, kRankTimeoutSeconds);
  if (!group.ok()) return fail(group.status());
  const std::vector<std::span<float>> params = model::ParameterViews(**trainer);
  if (Status st = (*group)->Broadcast(params); !st.ok()) return fail(st);  // the global model rank 0 joined with
  for (;;) {
    int64_t go = 0;
    if (Status st = (*group)->BroadcastInts({&go, 1}); !st.ok()) return fail(st);
    if (go == 0) {
      Status st = WriteRankChecksum(opt.out_dir, opt.id, opt.rank, params);
      return st.ok() ? 0 : fail(st);
    }
    auto s = (*trainer)->ComputeGradients();
    if (!s.ok()) return fail(s.status());
    auto st = AverageAndApply(**group, **trainer, *s);
    if (!st.ok()) return fail(st.status());
    int64_t applied = 0;
    if (Status b = (*group)->BroadcastInts({&applied, 1}); !b.ok()) return fail(b);
    if (applied > 0) {
      if (Status b = (*group)->Broadcast(params); !b.ok()) return fail(b);
    }
  }
}

StatusOr<model::StepStats> AverageAndApply(RankGroup& group, model::Trainer& trainer, model::StepStats computed) {
  std::vector<std::span<float>> grads = model::GradientViews(trainer);
  float loss = static_cast<float>(computed.loss);
  grads.emplace_back(&loss, 1);  // the unit's loss: the mean over its ranks
  ATOLL_RETURN_IF_ERROR(group.AllReduceMean(grads));
  computed.loss = loss;
  ATOLL_ASSIGN_OR_RETURN(model::StepStats s, trainer.ApplyGradients(computed));
  s.loss = loss;
  s.tokens = computed.tokens * group.ranks();
  return s;
}

}  // namespace atl::runtime
