// A syncer and learners started by hand as separate processes of the real binary on 127.0.0.1
// (port 0), as the README describes for separate machines: the run flags they share, a syncer
// with its HTTP endpoint, two learners run to the end. For syncer_by_hand_test.cc and
// syncer_hostile_test.cc.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "atoll/core/child_process.h"
#include "atoll/core/file.h"
#include "testing/atoll_binary.h"
#include "testing/await.h"

namespace atl::testing {

inline std::vector<std::string> RunFlags(const std::string& data, const std::string& out, int steps) {
  return {"--data", data, "--out",          out, "-M",           "2", "--steps", std::to_string(steps),
          "--seq",  "32", "--batch",        "4", "-P",           "4", "-H",      "4",
          "--tau",  "1",  "--eval-batches", "2", "--eval-every", "0", "--token", "hand-token"};
}

// The contents of `path` once the process wrote it (bounded; the process may not die first).
inline std::string AwaitFile(const std::string& path, ChildProcess& process, double seconds) {
  std::string text;
  AwaitFor(
      [&] {
        auto t = ReadFile(path);
        if (t.ok()) text = *t;
        return !text.empty() || !process.running();
      },
      seconds, std::chrono::milliseconds(50));
  return text;
}

struct HandRun {
  std::string dir, data, out;
  ChildProcess syncer;
  int port = 0, http_port = 0;

  void StartSyncer(int steps, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {ATOLL_BIN, "syncer"};
    for (const auto& f : RunFlags(data, out, steps)) argv.push_back(f);
    for (const auto& f : {"--port-file", "PORT", "--http", "127.0.0.1:0", "--http-port-file", "HTTP"})
      argv.push_back(f);
    std::replace(argv.begin(), argv.end(), std::string("PORT"), dir + "/syncer.port");
    std::replace(argv.begin(), argv.end(), std::string("HTTP"), dir + "/syncer.http-port");
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto s = ChildProcess::Start(argv, dir + "/syncer.log");
    ASSERT_TRUE(s.ok()) << s.status();
    syncer = std::move(*s);
    const std::string port_text = AwaitFile(dir + "/syncer.port", syncer, 240);
    ASSERT_FALSE(port_text.empty()) << Log();
    port = std::stoi(port_text);
    http_port = std::stoi(*ReadFile(dir + "/syncer.http-port"));  // written before the gRPC port
  }

  // Both learners to the end; their exit codes.
  std::vector<int> RunLearners(int steps) {
    std::vector<ChildProcess> learners;
    for (int id = 0; id < 2; ++id) {
      std::vector<std::string> argv = {ATOLL_BIN,          "learner",  "--id",
                                       std::to_string(id), "--syncer", "127.0.0.1:" + std::to_string(port)};
      for (const auto& f : RunFlags(data, out, steps)) argv.push_back(f);
      auto l = ChildProcess::Start(argv, dir + "/learner-" + std::to_string(id) + ".log");
      EXPECT_TRUE(l.ok()) << l.status();
      if (l.ok()) learners.push_back(std::move(*l));
    }
    std::vector<int> codes;
    for (auto& l : learners) codes.push_back(l.WaitOrKill(240));
    return codes;
  }

  std::string Log() const { return TextOf(dir + "/syncer.log", "(no syncer.log)"); }
};

}  // namespace atl::testing
