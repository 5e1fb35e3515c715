// ChaosControl: the faults `atoll run` applies to a running learner through its control file
// (`atoll learner --control-file`, docs/decisions/005): a speed factor, a partition from the
// syncer, a bandwidth cap. The cluster writes it when a chaos event starts or ends (cluster.cc);
// the learner re-reads it when the file changes (ChaosControlReader, learner_process.cc).
// Thread-safety: values; a reader belongs to one thread.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "atoll/core/status.h"

namespace atl::runtime {

struct ChaosControl {
  double speed = 1.0;         // the learner trains at this × its configured speed, in (0, 1]
  bool partition = false;     // cut off from the syncer
  double bandwidth_mbps = 0;  // its link capped at this many Mbit/s; 0 = the run's own setting
  bool operator==(const ChaosControl&) const = default;
};

nlohmann::json ToJson(const ChaosControl& control);
// Missing keys keep their defaults (an empty object is "no fault").
ChaosControl ChaosControlFromJson(const nlohmann::json& j);
// Written atomically: a reader never sees half a file.
Status WriteChaosControl(const std::string& path, const ChaosControl& control);

// A learner's view of its control file ("" = none): Poll re-reads it when its modification time
// changed since the last call.
class ChaosControlReader {
 public:
  explicit ChaosControlReader(std::string path) : path_(std::move(path)) {}
  // True when the file changed and parsed; `control` then holds its contents. False (nothing
  // changes) when there is no file, it did not change, or it is not JSON.
  bool Poll(ChaosControl& control);

 private:
  std::string path_;
  int64_t last_mtime_ = -1;
};

}  // namespace atl::runtime
