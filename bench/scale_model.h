// What the model-scale benchmarks (bench_syncer_scale, bench_syncer_grpc) share: the synthetic
// model's tensors and a process's memory from /proc. Header-only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "atoll/diloco/fragment_plan.h"

namespace atl::bench {

// `params` parameters in matrices of 4096 × 4096 (and one remainder), the first an embedding.
inline std::vector<diloco::TensorSpec> ScaleTensors(int64_t params) {
  std::vector<diloco::TensorSpec> tensors;
  for (int64_t left = params, i = 0; left > 0; ++i) {
    const int64_t rows = std::min<int64_t>(4096, left / 4096 > 0 ? left / 4096 : 1);
    const int64_t cols = rows * 4096 <= left ? 4096 : left;
    tensors.push_back(
        {i == 0 ? "tok_embed.weight" : "layers." + std::to_string(i) + ".w", {rows, cols}, rows * cols, i == 0});
    left -= rows * cols;
  }
  return tensors;
}

// kB → bytes of a /proc/<pid>/status line ("VmRSS:", "VmHWM:"); pid "self" for this process.
inline double ProcStatusBytes(const std::string& pid, const char* key) {
  std::ifstream in("/proc/" + pid + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0) return std::strtod(line.c_str() + std::strlen(key), nullptr) * 1024.0;
  }
  return 0;
}

}  // namespace atl::bench
