#include "chaos_control.h"

#include <sys/stat.h>

#include "atoll/core/file.h"

namespace atl::runtime {

nlohmann::json ToJson(const ChaosControl& c) {
  return {{"speed", c.speed}, {"partition", c.partition}, {"bandwidth_mbps", c.bandwidth_mbps}};
}

ChaosControl ChaosControlFromJson(const nlohmann::json& j) {
  ChaosControl c;
  c.speed = j.value("speed", c.speed);
  c.partition = j.value("partition", c.partition);
  c.bandwidth_mbps = j.value("bandwidth_mbps", c.bandwidth_mbps);
  return c;
}

Status WriteChaosControl(const std::string& path, const ChaosControl& control) {
  return WriteFileAtomic(path, ToJson(control).dump());
}

bool ChaosControlReader::Poll(ChaosControl& control) {
  if (path_.empty()) return false;
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return false;
  const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  if (mtime == last_mtime_) return false;
  last_mtime_ = mtime;
  auto text = ReadFile(path_);
  if (!text.ok()) return false;
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  try {
    control = ChaosControlFromJson(j);
  } catch (const nlohmann::json::exception&) {  // a value of the wrong type: not a control file
    return false;
  }
  return true;
}

}  // namespace atl::runtime
