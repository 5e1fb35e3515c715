#include "atoll/core/platform.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

namespace atl {

namespace {

constexpr const char* kMallocTunables = "glibc.malloc.hugetlb=1";

std::set<std::string> FlagSet(std::string_view cpu_flags) {
  std::set<std::string> flags;
  std::istringstream in{std::string(cpu_flags)};
  for (std::string f; in >> f;) flags.insert(f);
  return flags;
}

}  // namespace

std::string OpenblasCoretypeForFlags(std::string_view cpu_flags) {
  const auto flags = FlagSet(cpu_flags);
  if (flags.count("avx512f") && flags.count("avx512bw")) return "SkylakeX";
  if (flags.count("avx2") && flags.count("fma")) return "Haswell";
  return "";
}

bool FlagsHaveFastBf16(std::string_view cpu_flags) {
  const auto flags = FlagSet(cpu_flags);
  return flags.count("amx_bf16") > 0 || flags.count("avx512_bf16") > 0;
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
  if (std::getenv("GLIBC_TUNABLES") == nullptr) {
    // malloc backs its heap with transparent huge pages (where the kernel offers them, even in
    // "madvise" mode): a training step's fresh activations then cost ~15x fewer page faults.
    // Measured on a 2-core VM, interleaved A/B (docs/benchmarks.md): steady steps 371 → 358 ms
    // (an earlier day 457 → 403); the first step pays for it, 0.47 → 1.1 s, as the kernel zeroes
    // whole 2 MiB pages on first touch. A run of more than ~50 steps comes out ahead.
    ::setenv("GLIBC_TUNABLES", kMallocTunables, 0);
    changed = true;
  }
  if (!changed) return;
  // The environment must be set before the dynamic loader maps OpenBLAS (and before glibc reads
  // its tunables): re-exec ourselves.
  ::execv("/proc/self/exe", argv);
  // execv failed (no /proc?): carry on; BLAS may run slower but results are correct.
}

bool KeepFreedMemory() {
  constexpr int kOneGiB = 1 << 30;
  bool changed = false;
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) changed |= ::mallopt(M_MMAP_THRESHOLD, kOneGiB) == 1;
  if (std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) changed |= ::mallopt(M_TRIM_THRESHOLD, kOneGiB) == 1;
  return changed;
}

bool OneHeapForAllThreads() {
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr) return false;
  return ::mallopt(M_ARENA_MAX, 1) == 1;
}

std::optional<double> ProcessAgeFrom(std::string_view proc_stat, std::string_view proc_uptime, long ticks_per_second) {
  // The command name (field 2) is in parentheses and may hold spaces or ')': fields resume after
  // the last ')'. The start time is field 22, i.e. the 20th after it (field 3 is the first).
  const size_t close = proc_stat.rfind(')');
  if (close == std::string_view::npos || ticks_per_second <= 0) return std::nullopt;
  std::istringstream fields{std::string(proc_stat.substr(close + 1))};
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> field)) return std::nullopt;
  }
  char* end = nullptr;
  const unsigned long long start_ticks = std::strtoull(field.c_str(), &end, 10);
  if (end == field.c_str() || *end != '\0') return std::nullopt;
  const std::string up_text(proc_uptime);
  const double uptime = std::strtod(up_text.c_str(), &end);
  if (end == up_text.c_str()) return std::nullopt;
  const double age = uptime - static_cast<double>(start_ticks) / static_cast<double>(ticks_per_second);
  return age >= -0.01 ? std::optional<double>(std::max(0.0, age)) : std::nullopt;
}

std::optional<double> ProcessAgeSeconds() {
  auto slurp = [](const char* path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  return ProcessAgeFrom(slurp("/proc/self/stat"), slurp("/proc/uptime"), ::sysconf(_SC_CLK_TCK));
}

}  // namespace atl
