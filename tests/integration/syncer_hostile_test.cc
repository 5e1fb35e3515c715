// A real `atoll syncer` process against hostile clients and a careless operator (issue 32):
// SIGTERM while slow HTTP clients, silent push streams and idle gRPC connections hold the
// syncer (it once could not stop at all), rounds held when a commit cannot find its disk space
// (the status page, /metrics and the log say so; nothing uncommitted is ever served), a state
// folder without meta.json (once overwritten from the initial model), and an HTTP endpoint off
// loopback without credentials. Processes of the real binary on 127.0.0.1, port 0; every wait is
// a bound, never a threshold.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "atoll.grpc.pb.h"
#include "atoll/core/child_process.h"
#include "atoll/core/file.h"
#include "testing/hand_run.h"
#include "testing/loopback_socket.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

using testing::HandRun;
using testing::RunFlags;

// The syncer's status document from its HTTP endpoint (null when it does not answer).
nlohmann::json StatusOf(const HandRun& r) {
  httplib::Client cli("127.0.0.1", r.http_port);
  auto res = cli.Get("/api/status", {{"Authorization", "Bearer hand-token"}});
  return res && res->status == 200 ? nlohmann::json::parse(res->body, nullptr, false) : nlohmann::json();
}

int Connect(int port) { return atl::testing::ConnectLoopback(port); }

// Slow HTTP clients until stopped: each sends a request head one byte every 100 ms and opens a
// new connection when the syncer cuts it off.
class SlowHttpClients {
 public:
  SlowHttpClients(int port, int n) : fds_(static_cast<size_t>(n), -1) {
    thread_ = std::thread([this, port] {
      while (!stop_) {
        for (int& fd : fds_) {
          if (fd < 0) fd = Connect(port);
          if (fd >= 0 && ::send(fd, "G", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN) {
            ::close(fd);
            fd = -1;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      for (int fd : fds_) {
        if (fd >= 0) ::close(fd);
      }
    });
  }
  ~SlowHttpClients() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::vector<int> fds_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Issue 32: 24 slow HTTP connections made SIGTERM unable to stop the syncer.
TEST(SyncerHostile, SigtermStopsTheSyncerWhileSlowClientsHoldItsConnections) {
  HandRun s;
  s.dir = testing::ScratchDir("syncer_hostile_term");
  s.data = testing::PrepareSmallData(s.dir);
  s.out = s.dir + "/run";
  ASSERT_NO_FATAL_FAILURE(s.StartSyncer(8, {}));
  SlowHttpClients slow_http(s.http_port, 40);
  std::vector<int> idle;  // gRPC connections that never speak
  for (int i = 0; i < 50; ++i) idle.push_back(Connect(s.port));
  // Silent push streams (admitted: a valid token, 4 per learner id) holding handler threads.
  auto stub = atl::v1::Syncer::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(s.port), grpc::InsecureChannelCredentials()));
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientAsyncWriter<atl::v1::PushChunk>>> pushes;
  std::vector<atl::v1::PushReply> replies(20);
  for (int i = 0; i < 20; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->AddMetadata("x-atoll-token", "hand-token");
    contexts.back()->AddMetadata("x-atoll-learner", std::to_string(i / 4));
    pushes.push_back(stub->PrepareAsyncPush(contexts.back().get(), &replies[static_cast<size_t>(i)], &cq));
    pushes.back()->StartCall(nullptr);
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));  // let the attack settle (not a bound of the check)
  EXPECT_TRUE(s.syncer.running()) << s.Log();
  s.syncer.Signal(SIGTERM);
  const int code = s.syncer.WaitOrKill(120);
  EXPECT_EQ(code, 0) << "stopped by SIGKILL after the bound, or failed:\n" << s.Log();
  EXPECT_NE(s.Log().find("syncer: stopped (signal)"), std::string::npos) << s.Log();
  for (auto& c : contexts) c->TryCancel();
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  for (int fd : idle) {
    if (fd >= 0) ::close(fd);
  }
  fs::remove_all(s.dir);
}

// A disk without room for a commit: every round is held, the status page, /metrics and the log
// say why, the learners train on, and no version beyond the committed one is ever served. The
// commit's margin (--commit-reserve-mb) set above the free space stands in for a full disk.
TEST(SyncerHostile, RoundsAreHeldWhileACommitCannotFindItsSpace) {
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(fs::temp_directory_path().c_str(), &vfs), 0);
  const double free_mib = static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize) / (1 << 20);
  ASSERT_LT(free_mib, 1 << 29) << "the margin below must exceed the free space";
  const std::string margin_mib = std::to_string(static_cast<int64_t>(2 * free_mib) + 1024);
  HandRun s;
  s.dir = testing::ScratchDir("syncer_hostile_hold");
  s.data = testing::PrepareSmallData(s.dir);
  s.out = s.dir + "/run";
  ASSERT_NO_FATAL_FAILURE(s.StartSyncer(8, {"--commit-reserve-mb", margin_mib}));
  EXPECT_EQ(s.RunLearners(8), (std::vector<int>{0, 0})) << s.Log();
  const nlohmann::json status = StatusOf(s);
  ASSERT_TRUE(status.is_object()) << s.Log();
  ASSERT_TRUE(status.contains("holding")) << status.dump(2);
  EXPECT_NE(status["holding"].get<std::string>().find("free in " + s.out + "/state"), std::string::npos)
      << status["holding"];
  EXPECT_EQ(status["rounds"], 0) << "no round closed";
  EXPECT_EQ(status["versions"], nlohmann::json::array({0, 0, 0, 0}));
  httplib::Client cli("127.0.0.1", s.http_port);
  auto metrics = cli.Get("/metrics?token=hand-token");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("atoll_rounds_held 1"), std::string::npos) << metrics->body;
  s.syncer.Signal(SIGTERM);
  EXPECT_EQ(s.syncer.WaitOrKill(120), 0) << s.Log();
  const std::string log = s.Log();
  EXPECT_NE(log.find("syncer: holding rounds: only"), std::string::npos) << log;
  EXPECT_NE(log.find("the rounds still open at the finish are not merged"), std::string::npos) << log;
  EXPECT_EQ(log.find("FATAL"), std::string::npos) << log;
  fs::remove_all(s.dir);
}

// Issue 32: with meta.json gone the syncer started over from the initial model and overwrote every
// committed fragment file. It refuses the folder, and leaves it as it was.
TEST(SyncerHostile, AStateFolderWithoutMetaJsonIsRefusedNotOverwritten) {
  const std::string dir = testing::ScratchDir("syncer_hostile_meta");
  const std::string data = testing::PrepareSmallData(dir);
  fs::create_directories(dir + "/run/state");
  const std::string committed = "committed rounds, not to be overwritten";
  ASSERT_TRUE(WriteFileAtomic(dir + "/run/state/fragment-000.bin", std::string_view(committed)).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/run/state/.fragment-001.bin.tmp.AbCdEf", std::string_view("partial")).ok());
  std::string args = "syncer";
  for (const auto& f : RunFlags(data, dir + "/run", 8)) args += " " + f;
  auto r = testing::RunAtoll(args, 240);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("holds fragment-000.bin but no meta.json"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("removed " + dir + "/run/state/.fragment-001.bin.tmp.AbCdEf"), std::string::npos) << r.output;
  EXPECT_EQ(ReadFile(dir + "/run/state/fragment-000.bin").value(), committed);
  EXPECT_FALSE(FileExists(dir + "/run/state/meta.json"));
  fs::remove_all(dir);
}

TEST(SyncerHostile, AnHttpEndpointOffLoopbackNeedsCredentials) {
  const std::string dir = testing::ScratchDir("syncer_hostile_http");
  auto r = testing::RunAtoll("syncer --http 0.0.0.0:0 --out " + dir + "/run --data " + dir + "/none", 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("refusing to serve the HTTP status endpoint on 0.0.0.0:0 without credentials"),
            std::string::npos)
      << r.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace atl
