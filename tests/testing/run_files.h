// What a run's processes leave in their folders, read by the multi-process tests: the public copy
// a learner's state folder holds of a fragment, the syncer's metrics lines, the fragments with a
// committed round.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/file.h"

namespace atl::testing {

struct Held {
  int64_t version = -1;
  uint64_t checksum = 0;
};

// The copy a learner's state folder holds of fragment p (its header: magic, version, numel, block,
// blocks, values checksum; learner_agent_state.cc).
inline Held HeldCopy(const std::string& state_dir, int p) {
  char name[32];
  std::snprintf(name, sizeof(name), "/fragment-%03d.bin", p);
  auto bytes = ReadFile(state_dir + name);
  Held h;
  if (!bytes.ok() || bytes->size() < 40 || bytes->compare(0, 8, "ATOLLST1") != 0) return h;
  std::memcpy(&h.version, bytes->data() + 8, 8);
  std::memcpy(&h.checksum, bytes->data() + 32, 8);
  return h;
}

inline std::vector<nlohmann::json> MetricLines(const std::string& path) {
  std::vector<nlohmann::json> out;
  auto text = ReadFile(path);
  if (!text.ok()) return out;
  size_t at = 0;
  while (at < text->size()) {
    size_t end = text->find('\n', at);
    if (end == std::string::npos) break;  // a line still being written
    auto j = nlohmann::json::parse(text->substr(at, end - at), nullptr, false);
    if (!j.is_discarded()) out.push_back(j);
    at = end + 1;
  }
  return out;
}

// Fragments with a committed round in the syncer's metrics.
inline int FragmentsWithARound(const std::string& metrics) {
  std::map<int, bool> seen;
  for (const auto& l : MetricLines(metrics)) {
    if (l.value("kind", "") == "round" && l.contains("fragment")) seen[l["fragment"].get<int>()] = true;
  }
  return static_cast<int>(seen.size());
}

}  // namespace atl::testing
