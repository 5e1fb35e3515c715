// The C API's state folder (atoll_learner_settings.state_dir): `lock` (an flock held while a
// handle is open, so two processes never claim one learner), learner.json (who this learner is,
// written with its own checksum) and the agent's public copies (fragment-NNN.bin, written by the
// LearnerAgent). A restarted learner rejoins as the learner the folder names and catches up with
// deltas from those copies.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "atoll/core/checksum.h"
#include "atoll/core/file.h"
#include "atoll/core/json_file.h"
#include "c_api_internal.h"

namespace atl::capi {
namespace {

constexpr char kFormat[] = "atoll.learner_state";
constexpr int kVersion = 1;
constexpr int64_t kStateEverySteps = 50;  // learner.json's step count may lag this much

std::string StateFile(const std::string& dir) { return dir + "/learner.json"; }

Status LockState(atoll_learner& l, const std::string& dir) {
  ATOLL_RETURN_IF_ERROR(MakeDirs(dir));
  const std::string path = dir + "/lock";
  const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0)
    return InvalidArgumentError("state folder " + dir + ": cannot open " + path + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return AlreadyExistsError("state folder " + dir + " is in use by another live learner process");
    }
    return InvalidArgumentError("state folder " + dir + ": cannot lock " + path + ": " + std::strerror(err));
  }
  l.state_lock_fd = fd;
  return Status::Ok();
}

// What a learner.json says, checked against this learner (nothing is changed on error).
Status ReadState(const std::string& dir, const std::string& run_id, int num_fragments, const nlohmann::json& j,
                 int& learner_id, int64_t& step, int64_t& tokens) {
  const std::string file = StateFile(dir);
  if (!j.is_object() || j.value("format", "") != kFormat || j.value("version", 0) != kVersion) {
    return InvalidArgumentError(file + " is not an atoll learner state of version " + std::to_string(kVersion));
  }
  if (j.value("run_id", "") != run_id) {
    return InvalidArgumentError(file + " is a learner of run '" + j.value("run_id", "") + "', not of run '" + run_id +
                                "' (give this run's learner another state folder)");
  }
  const int saved = j.value("learner_id", -1);
  if (j.value("fragments_count", -1) != num_fragments) {
    return InvalidArgumentError(file + " has " + std::to_string(j.value("fragments_count", -1)) +
                                " fragments, this learner " + std::to_string(num_fragments));
  }
  if (saved >= 0 && learner_id >= 0 && saved != learner_id) {
    return InvalidArgumentError(file + " is learner " + std::to_string(saved) + "'s, options.learner_id is " +
                                std::to_string(learner_id) + " (-1 takes the folder's)");
  }
  if (saved >= 0) learner_id = saved;
  step = std::max<int64_t>(0, j.value("step", int64_t{0}));
  tokens = std::max<int64_t>(0, j.value("tokens", int64_t{0}));
  return Status::Ok();
}

nlohmann::json CountersJson(const learner::AgentCounters& k) {
  return {{"pushes", k.pushes},
          {"pushes_failed", k.pushes_failed},
          {"pushes_deferred", k.pushes_deferred},
          {"rebases", k.rebases},
          {"pushes_repeated", k.pushes_repeated},
          {"pulls", k.pulls},
          {"pulls_delta", k.pulls_delta},
          {"pulls_full", k.pulls_full},
          {"fragments_applied", k.fragments_applied},
          {"payload_bytes_up", k.payload_bytes_up},
          {"payload_bytes_down", k.payload_bytes_down},
          {"joins", k.joins},
          {"catchup_fragments", k.catchup_fragments},
          {"rejected", k.rejected},
          {"checksum_mismatches", k.checksum_mismatches},
          {"state_loaded", k.state_loaded},
          {"state_errors", k.state_errors},
          {"version_held", k.version_held}};
}

nlohmann::json StateObject(const atoll_learner& l) {
  const learner::AgentCounters k = l.agent->counters();
  nlohmann::json fragments = nlohmann::json::array();
  for (const auto& h : l.agent->HeldCopies()) {
    fragments.push_back({{"version", h.version}, {"checksum", ChecksumHex(h.checksum)}});
  }
  return {{"format", kFormat},
          {"version", kVersion},
          {"run_id", l.run_id},
          {"learner_id", k.learner_id},
          {"fragments_count", l.plan.num_fragments()},
          {"step", l.step},
          {"tokens", l.tokens},
          {"fragments", fragments},
          {"counters", CountersJson(k)}};
}

}  // namespace

Status OpenState(atoll_learner& l, const std::string& dir, int num_fragments, int& learner_id, bool& rejoin) {
  ATOLL_RETURN_IF_ERROR(LockState(l, dir));
  auto j = ReadJsonWithChecksum(StateFile(dir));
  if (!j.ok() && j.status().code() == StatusCode::kNotFound) {
    l.state_dir = dir;  // a new learner: the folder fills as it trains
    return Status::Ok();
  }
  Status st = j.ok() ? Status::Ok()
                     : InvalidArgumentError(StateFile(dir) + " is damaged (" + j.status().message() +
                                            "); remove the state folder to start this learner afresh");
  int id = learner_id;
  int64_t step = 0, tokens = 0;
  if (st.ok()) st = ReadState(dir, l.run_id, num_fragments, *j, id, step, tokens);
  if (!st.ok()) {
    ::close(l.state_lock_fd);
    l.state_lock_fd = -1;
    return st;
  }
  learner_id = id;
  rejoin = true;  // the syncer may still count the previous process as live: this is it, restarted
  l.step = step;
  l.tokens = tokens;
  l.state_dir = dir;
  return Status::Ok();
}

bool StateDue(const atoll_learner& l) {
  if (l.state_dir.empty()) return false;
  if (l.agent->counters().learner_id != l.state_written_id) return true;
  return l.step - l.state_written_step >= kStateEverySteps;
}

void WriteState(atoll_learner& l) {
  if (l.state_dir.empty()) return;
  const nlohmann::json j = StateObject(l);
  if (!WriteJsonWithChecksum(StateFile(l.state_dir), j).ok()) return;  // tried again at the next due step
  l.state_written_step = l.step;
  l.state_written_id = j["learner_id"].get<int>();
}

std::string StateJson(const atoll_learner& l) { return StateObject(l).dump(); }

}  // namespace atl::capi
