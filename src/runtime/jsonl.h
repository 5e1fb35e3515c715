// Append-only JSON-lines writer for metrics. One writer per process and file (processes never
// share a metrics file; `atoll run` merges them at the end). Lines are flushed as written, so a
// killed process loses at most the line being written. Thread-safe.
#pragma once

#include <cstdio>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "atoll/core/text.h"

namespace atl::runtime {

class JsonlWriter {
 public:
  JsonlWriter() = default;
  explicit JsonlWriter(const std::string& path) { Open(path); }
  ~JsonlWriter() {
    if (f_) std::fclose(f_);
  }
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  bool Open(const std::string& path) {
    f_ = std::fopen(path.c_str(), "a");
    return f_ != nullptr;
  }
  void Write(const nlohmann::json& line) {
    if (!f_) return;
    std::string s = DumpJson(line);
    std::lock_guard<std::mutex> lock(mu_);
    std::fwrite(s.data(), 1, s.size(), f_);
    std::fputc('\n', f_);
    std::fflush(f_);
  }

 private:
  std::mutex mu_;
  std::FILE* f_ = nullptr;
};

}  // namespace atl::runtime
