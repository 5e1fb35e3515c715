#include "atoll/core/platform.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

namespace atl {

std::string OpenblasCoretypeForFlags(std::string_view cpu_flags) {
  std::set<std::string> flags;
  std::istringstream in{std::string(cpu_flags)};
  for (std::string f; in >> f;) flags.insert(f);
  if (flags.count("avx512f") && flags.count("avx512bw")) return "SkylakeX";
  if (flags.count("avx2") && flags.count("fma")) return "Haswell";
  return "";
}

std::string ReadCpuFlags() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 1);
    }
  }
  return "";
}

void EnsureBlasEnvironmentOrReexec(int argc, char** argv) {
  (void)argc;
  if (std::getenv("ATOLL_LAUNCHED") != nullptr) return;
  ::setenv("ATOLL_LAUNCHED", "1", 1);
  bool changed = false;
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    ::setenv("OMP_NUM_THREADS", "1", 0);
    changed = true;
  }
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    std::string core = OpenblasCoretypeForFlags(ReadCpuFlags());
    if (!core.empty()) {
      ::setenv("OPENBLAS_CORETYPE", core.c_str(), 0);
      changed = true;
    }
  }
  if (!changed) return;
  // The environment must be set before the dynamic loader maps OpenBLAS: re-exec ourselves.
  ::execv("/proc/self/exe", argv);
  // execv failed (no /proc?): carry on; BLAS may run slower but results are correct.
}

}  // namespace atl
