#include "cluster.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/runtime/secrets.h"
#include "atoll/transport/credentials.h"

namespace atl::runtime {

std::string TailOf(const std::string& path, size_t lines) {
  auto text = ReadFile(path);
  if (!text.ok()) return "";
  std::vector<std::string> all;
  std::string cur;
  for (char ch : *text) {
    if (ch == '\n') {
      all.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!cur.empty()) all.push_back(cur);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "    " + all[i] + "\n";
  return out;
}

Cluster::Cluster(RunConfig config, std::string config_path)
    : c_(std::move(config)),
      config_path_(std::move(config_path)),
      self_(SelfExecutable()),
      faults_(c_.out + "/faults.jsonl") {
  learners_.resize(static_cast<size_t>(c_.learners));
  shards_.resize(static_cast<size_t>(std::max(1, c_.syncer_shards)));
  std::filesystem::create_directories(c_.out + "/control");
}

std::string Cluster::LearnerLog(int id) const { return c_.out + "/learner-" + std::to_string(id) + ".log"; }

std::string Cluster::ShardOut(int k) const {
  return shards_.size() == 1 ? c_.out : c_.out + "/syncer-" + std::to_string(k);
}

std::string Cluster::ShardLog(int k) const {
  return shards_.size() == 1 ? c_.out + "/syncer.log" : c_.out + "/syncer-" + std::to_string(k) + ".log";
}

std::string Cluster::LearnerSyncers() const {
  std::string list;
  for (const auto& s : shards_) list += (list.empty() ? "" : ",") + s.address;
  return list;
}

bool Cluster::syncer_down() const {
  return std::any_of(shards_.begin(), shards_.end(), [](const SyncerSlot& s) { return s.down; });
}

Status Cluster::StartSyncer() {
  for (int k = 0; k < static_cast<int>(shards_.size()); ++k) {
    SyncerSlot& s = shards_[static_cast<size_t>(k)];
    if (s.started && !s.down) continue;
    ATOLL_RETURN_IF_ERROR(StartShard(k));
  }
  return Status::Ok();
}

Status Cluster::StartShard(int k) {
  SyncerSlot& slot = shards_[static_cast<size_t>(k)];
  const std::string out = ShardOut(k);
  const std::string port_file = out + "/syncer.port";
  const std::string http_port_file = out + "/syncer.http-port";
  std::filesystem::create_directories(out);
  std::filesystem::remove(port_file);
  std::filesystem::remove(http_port_file);
  const std::string listen = "127.0.0.1:" + std::to_string(slot.port);  // port 0 the first time
  std::vector<std::string> argv = {self_,  "syncer",      "--config", config_path_, "--listen",
                                   listen, "--port-file", port_file,  "--out",      out};
  if (k == 0) {  // the status page on loopback, on the same port after a restart so its URL stays valid
    argv.insert(argv.end(),
                {"--http", "127.0.0.1:" + std::to_string(slot.http_port), "--http-port-file", http_port_file});
  }
  if (shards_.size() > 1)
    argv.insert(argv.end(), {"--shard", std::to_string(k) + "/" + std::to_string(shards_.size())});
  if (FileExists(SecretsDir(c_) + "/run.secret")) {
    argv.insert(argv.end(), {"--secret-file", SecretsDir(c_) + "/run.secret"});
  }
  if (slot.rebuild_wait_s > 0) {  // after a lose_syncer fault, once
    argv.insert(argv.end(), {"--rebuild", "--rebuild-wait", std::to_string(slot.rebuild_wait_s)});
    slot.rebuild_wait_s = 0;
  }
  const std::string what = shards_.size() == 1 ? "the syncer" : "syncer shard " + std::to_string(k);
  ATOLL_ASSIGN_OR_RETURN(slot.process, ChildProcess::Start(argv, ShardLog(k)));
  slot.started = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!slot.process.running()) {
      return UnavailableError(what + " exited before listening; " + ShardLog(k) + " ends with:\n" +
                              TailOf(ShardLog(k), 15));
    }
    auto text = ReadFile(port_file);
    if (text.ok() && !text->empty()) {
      slot.port = std::stoi(*text);
      auto http_text = ReadFile(http_port_file);  // written before the gRPC port file
      if (http_text.ok() && !http_text->empty()) slot.http_port = std::stoi(*http_text);
      slot.address = "127.0.0.1:" + std::to_string(slot.port);
      slot.down = false;
      return Status::Ok();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return DeadlineExceededError(what + " did not start listening within 300 s");
}

Status Cluster::StartLearner(int id, bool rejoin, int64_t start_step) {
  std::vector<std::string> argv = {self_,
                                   "learner",
                                   "--config",
                                   config_path_,
                                   "--id",
                                   std::to_string(id),
                                   "--syncer",
                                   LearnerSyncers(),
                                   "--out",
                                   c_.out,
                                   "--start-step",
                                   std::to_string(start_step),
                                   "--control-file",
                                   c_.out + "/control/learner-" + std::to_string(id) + ".json"};
  if (rejoin) argv.push_back("--rejoin");
  const std::string token_file = SecretsDir(c_) + "/learner-" + std::to_string(id) + ".token";
  if (FileExists(token_file)) argv.insert(argv.end(), {"--token-file", token_file});
  ATOLL_ASSIGN_OR_RETURN(auto p, ChildProcess::Start(argv, LearnerLog(id)));
  LearnerSlot& s = learners_[static_cast<size_t>(id)];
  s.process = std::move(p);
  s.state = ProcessState::kRunning;
  s.incarnations += 1;
  return Status::Ok();
}

Status Cluster::WriteControl(int id) {
  return WriteChaosControl(c_.out + "/control/learner-" + std::to_string(id) + ".json",
                           learners_[static_cast<size_t>(id)].control);
}

void Cluster::Note(double now, const std::string& kind, int target, const std::string& note) {
  nlohmann::json j = {{"t_run", now}, {"t", UnixSeconds()}, {"kind", kind}, {"note", note}};
  if (target >= 0) j["learner"] = target;
  faults_.Write(j);
  fault_log_.push_back(j);
  std::printf("[chaos t=%.1fs] %s%s: %s\n", now, kind.c_str(),
              target >= 0 ? (" learner " + std::to_string(target)).c_str() : "", note.c_str());
  std::fflush(stdout);
}

void Cluster::Inject(const chaos::FaultEvent& e, double now) {
  const int id = e.target;
  if (chaos::TargetsSyncer(e.kind)) return InjectSyncerFault(e, now);
  LearnerSlot* s = &learners_[static_cast<size_t>(id)];
  const std::string kind = chaos::FaultKindName(e.kind);
  auto skip = [&](const std::string& why) { Note(now, kind + "_skipped", id, why); };
  switch (e.kind) {
    case chaos::FaultKind::kKill:
      if (s->state != ProcessState::kRunning && s->state != ProcessState::kPaused) return skip("learner not running");
      if (s->state == ProcessState::kPaused) {
        s->paused_seconds += now - s->down_since;  // the pause ends here; the outage begins
        s->resume_at.reset();
      }
      s->process.Signal(SIGKILL);
      s->process.WaitOrKill(5);
      s->state = ProcessState::kDown;
      s->down_since = now;
      if (e.duration_s > 0) s->restart_at = now + e.duration_s;
      Note(now, "kill", id,
           "SIGKILL" +
               (e.duration_s > 0 ? ", repair " + std::to_string(e.duration_s) + " s" : std::string(", permanent")));
      break;
    case chaos::FaultKind::kPause:
      if (s->state != ProcessState::kRunning) return skip("learner not running");
      s->process.Signal(SIGSTOP);
      s->state = ProcessState::kPaused;
      s->resume_at = now + e.duration_s;
      s->down_since = now;
      Note(now, "pause", id, "SIGSTOP for " + std::to_string(e.duration_s) + " s");
      break;
    case chaos::FaultKind::kSlow:
    case chaos::FaultKind::kPartition:
    case chaos::FaultKind::kBandwidth: {
      if (e.kind == chaos::FaultKind::kSlow) s->control.speed = e.value;
      if (e.kind == chaos::FaultKind::kPartition) s->control.partition = true;
      if (e.kind == chaos::FaultKind::kBandwidth) s->control.bandwidth_mbps = e.value;
      (void)WriteControl(id);
      s->restore_control_at = now + e.duration_s;
      Note(now, kind, id,
           (e.kind == chaos::FaultKind::kPartition ? std::string("cut off from the syncer")
            : e.kind == chaos::FaultKind::kSlow    ? "speed x" + std::to_string(e.value)
                                                   : "link capped at " + std::to_string(e.value) + " Mbit/s") +
               " for " + std::to_string(e.duration_s) + " s");
      break;
    }
    default:  // the syncer's faults: InjectSyncerFault
      break;
  }
}

void Cluster::InjectSyncerFault(const chaos::FaultEvent& e, double now) {
  const std::string kind = chaos::FaultKindName(e.kind);
  // A sharded syncer: the shard the event names (its learner field), else shard 0.
  const int k = e.target >= 0 && e.target < static_cast<int>(shards_.size()) ? e.target : 0;
  SyncerSlot& shard = shards_[static_cast<size_t>(k)];
  if (shard.down) return Note(now, kind + "_skipped", e.target, "syncer already down");
  shard.process.Signal(SIGKILL);
  shard.process.WaitOrKill(5);
  shard.down = true;
  shard.restart_at = now + e.duration_s;
  std::string how = "from its durable state";
  if (e.kind == chaos::FaultKind::kLoseSyncer) {  // the host is lost with its disk
    std::error_code ec;
    std::filesystem::remove_all(ShardOut(k) + "/state", ec);
    shard.rebuild_wait_s = e.value > 0 ? e.value : 30.0;  // --rebuild-wait's default
    how = "with --rebuild (its state folder deleted), adopting the learners' copies for " +
          std::to_string(shard.rebuild_wait_s) + " s";
  }
  Note(now, kind, -1,
       std::string(shards_.size() > 1 ? "shard " + std::to_string(k) + ": " : "") + "SIGKILL, restart in " +
           std::to_string(e.duration_s) + " s " + how);
}

void Cluster::Tick(double now) {
  for (int k = 0; k < static_cast<int>(shards_.size()); ++k) {
    SyncerSlot& shard = shards_[static_cast<size_t>(k)];
    if (!shard.down || !shard.restart_at || now < *shard.restart_at) continue;
    shard.restart_at.reset();
    Status st = StartShard(k);
    Note(now, st.ok() ? "restart_syncer" : "restart_syncer_failed", -1,
         st.ok() ? "listening again on " + shard.address : st.ToString());
  }
  for (int id = 0; id < static_cast<int>(learners_.size()); ++id) {
    LearnerSlot& s = learners_[static_cast<size_t>(id)];
    if (s.state == ProcessState::kDown && s.restart_at && now >= *s.restart_at && !syncer_down()) {
      s.restart_at.reset();
      s.dead_seconds += now - s.down_since;
      // Synchronous modes: rejoin at the barrier the others are waiting at (completed barriers ×
      // H), so every learner takes part in the same rounds; decoupled: continue the step count.
      int64_t start = s.last_step;
      if (diloco::IsSynchronous(c_.mode) && !versions_.empty()) {
        start = *std::min_element(versions_.begin(), versions_.end()) * c_.H;
      }
      Status st = StartLearner(id, /*rejoin=*/true, start);
      s.restarted_at.push_back(now);
      Note(now, st.ok() ? "restart" : "restart_failed", id,
           st.ok() ? "rejoining from step " + std::to_string(start) : st.ToString());
    }
    if (s.state == ProcessState::kPaused && s.resume_at && now >= *s.resume_at) {
      s.resume_at.reset();
      s.process.Signal(SIGCONT);
      s.state = ProcessState::kRunning;
      s.paused_seconds += now - s.down_since;
      Note(now, "resume", id, "SIGCONT");
    }
    if (s.restore_control_at && now >= *s.restore_control_at) {
      s.restore_control_at.reset();
      s.control = ChaosControl{};
      (void)WriteControl(id);
      Note(now, "restore", id, "speed, link and partition back to normal");
    }
  }
}

std::vector<int> Cluster::ReapLearners(double now) {
  std::vector<int> failed;
  for (int id = 0; id < static_cast<int>(learners_.size()); ++id) {
    LearnerSlot& s = learners_[static_cast<size_t>(id)];
    if (s.state != ProcessState::kRunning) continue;
    if (s.process.running()) continue;
    const int code = s.process.exit_code().value_or(-1);
    if (code == 0) {
      s.state = ProcessState::kDone;
    } else {
      s.state = ProcessState::kFailed;
      failed.push_back(id);
      std::fprintf(
          stderr,
          "atoll run: learner %d exited with code %d at t=%.0fs; the others train on. learner-%d.log ends with:\n%s",
          id, code, now, id, TailOf(LearnerLog(id), 8).c_str());
    }
  }
  return failed;
}

bool Cluster::AllLearnersFinished() const {
  for (const auto& s : learners_) {
    if (s.state == ProcessState::kRunning || s.state == ProcessState::kPaused) return false;
    if (s.state == ProcessState::kDown && s.restart_at) return false;  // coming back
  }
  return true;
}

void ChaosInjector::InjectDue(double now) {
  while (next_timed_ < schedule_.size() && schedule_[next_timed_].at_step < 0 && schedule_[next_timed_].at_s <= now) {
    cluster_.Inject(schedule_[next_timed_], now);
    done_[next_timed_] = true;
    ++next_timed_;
  }
}

void ChaosInjector::InjectReached(double now) {
  for (size_t i = 0; i < schedule_.size(); ++i) {
    const auto& e = schedule_[i];
    if (done_[i] || e.at_step < 0) continue;
    const int target = chaos::TargetsSyncer(e.kind) ? 0 : e.target;
    if (cluster_.learners()[static_cast<size_t>(target)].last_step >= e.at_step) {
      cluster_.Inject(e, now);
      done_[i] = true;
    }
  }
}

}  // namespace atl::runtime
