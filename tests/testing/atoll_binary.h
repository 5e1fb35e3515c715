// Tests of the `atoll` binary (ATOLL_BIN, a compile definition of the test target): running it
// with a time bound, a small byte-level data folder, and reading what it wrote.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "testing/scratch.h"

namespace atl::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;
};

// Runs `ATOLL_BIN args` with a wall-clock bound (timeout(1) kills it), capturing output.
inline CommandResult RunAtoll(const std::string& args, int timeout_s = 300) {
  std::string cmd = "timeout -k 5 " + std::to_string(timeout_s) + " " + ATOLL_BIN + " " + args + " 2>&1";
  CommandResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) r.output.append(buf, n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A small byte-level data folder: ~50 KB of English from the fortunes package (installed by
// scripts/setup), repeated so every learner's shard has enough sequences.
inline std::string PrepareSmallData(const std::string& dir) {
  const std::string text = dir + "/corpus.txt";
  std::ifstream in("/usr/share/games/fortunes/fortunes");
  std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_GT(body.size(), 10000u) << "fortunes corpus missing: run scripts/setup";
  std::ofstream out(text);
  for (int i = 0; i < 2; ++i) out << body;
  out.close();
  auto r = RunAtoll("data prepare --out " + dir + "/data --tokenizer byte --input " + text, 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir + "/data";
}

// A file's text, or `missing` when it cannot be read (for failure messages).
inline std::string TextOf(const std::string& path, const std::string& missing = "") {
  std::ifstream in(path);
  if (!in) return missing;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, false);
}

}  // namespace atl::testing
