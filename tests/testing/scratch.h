// ScratchDir: a fresh, empty folder for one test, under the system's temporary folder, unique per
// process and name. Every call removes what an earlier one left there.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace atl::testing {

inline std::string ScratchDir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("atoll_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace atl::testing
