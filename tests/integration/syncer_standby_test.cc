// A shard served by a leader and a standby through etcd (`atoll syncer --etcd`,
// docs/decisions/022 and 023), as separate processes of the real binary on 127.0.0.1 with a real
// etcd on unix sockets: the leader's host is lost (SIGKILL, its state folder deleted) and the
// standby takes over from the commits it followed (replicated) or, without replication, from the
// learners' copies; a paused leader comes back fenced; bad leadership inputs are refused with
// clear errors.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/checksum.h"
#include "atoll/core/child_process.h"
#include "atoll/core/file.h"
#include "testing/atoll_binary.h"
#include "testing/await.h"
#include "testing/etcd.h"
#include "testing/hand_run.h"
#include "testing/run_files.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using testing::AwaitFor;
using testing::Held;
using testing::HeldCopy;
using testing::MetricLines;

constexpr int kFragments = 4;   // RunFlags: -P 4
constexpr int kSteps = 100000;  // the learners train throughout; the leader's SIGTERM ends them

// One candidate syncer: its own --out (its own state folder: another host's disk), its port.
struct Candidate {
  std::string id, out, log;
  ChildProcess process;
  int port = 0;
  int starts = 0;
  std::string Log() const { return testing::TextOf(log, "(no log)"); }
  bool Leads() const { return Log().find("candidate " + id + " leads shard") != std::string::npos; }
};

class SyncerStandby : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::ScratchDir("syncer_standby");
    data_ = testing::PrepareSmallData(dir_);
    auto etcd = testing::EtcdServer::Start("syncer_standby_etcd");
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = std::move(*etcd);
  }
  void TearDown() override {
    for (auto* c : {&a_, &b_}) {
      c->process.Signal(SIGCONT);
      c->process.Signal(SIGKILL);
      c->process.WaitOrKill(10);
    }
    for (auto& l : learners_) l.WaitOrKill(1);
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_);
  }

  std::vector<std::string> Flags(const std::string& out) const { return testing::RunFlags(data_, out, kSteps); }

  void StartCandidate(Candidate& c, const std::string& id) {
    c.id = id;
    c.out = dir_ + "/syncer-" + id;
    c.log = c.out + "-" + std::to_string(++c.starts) + ".log";
    std::filesystem::remove(c.out + ".port");
    std::vector<std::string> argv = {ATOLL_BIN, "syncer"};
    for (const auto& f : Flags(c.out)) argv.push_back(f);
    for (const std::string& f :
         {std::string("--etcd"), etcd_->endpoint(), std::string("--candidate-id"), id, std::string("--lease-ttl"),
          std::string("2"), std::string("--port-file"), c.out + ".port"}) {
      argv.push_back(f);
    }
    if (!replicate_) argv.insert(argv.end(), {"--replicate", "off"});
    auto p = ChildProcess::Start(argv, c.log);
    ASSERT_TRUE(p.ok()) << p.status();
    c.process = std::move(*p);
    const std::string port = testing::AwaitFile(c.out + ".port", c.process, 120);
    ASSERT_FALSE(port.empty()) << c.Log();
    c.port = std::stoi(port);
  }

  // Two learners given both candidates' addresses.
  void StartLearners() {
    const std::string syncers = "127.0.0.1:" + std::to_string(a_.port) + "|127.0.0.1:" + std::to_string(b_.port);
    for (int id = 0; id < 2; ++id) {
      std::vector<std::string> argv = {ATOLL_BIN, "learner", "--id", std::to_string(id), "--syncer", syncers};
      for (const auto& f : Flags(dir_ + "/learners")) argv.push_back(f);
      auto l = ChildProcess::Start(argv, dir_ + "/learner-" + std::to_string(id) + ".log");
      ASSERT_TRUE(l.ok()) << l.status();
      learners_.push_back(std::move(*l));
    }
  }
  std::string LearnerState(int m) const { return dir_ + "/learners/learner-" + std::to_string(m) + "-state"; }

  // A leads with rounds on every fragment, and each learner holds a copy of each beyond Θ⁰.
  void TrainUnderA() {
    StartCandidate(a_, "a");
    ASSERT_TRUE(AwaitFor([&] { return a_.Leads(); }, 120, std::chrono::milliseconds(50))) << a_.Log();
    StartCandidate(b_, "b");
    ASSERT_TRUE(AwaitFor([&] { return b_.Log().find("waiting for the leadership") != std::string::npos; }, 60,
                         std::chrono::milliseconds(50)))
        << b_.Log();
    EXPECT_FALSE(b_.Leads()) << b_.Log();
    StartLearners();
    auto every_copy_moved = [&] {
      for (int m = 0; m < 2; ++m) {
        for (int p = 0; p < kFragments; ++p) {
          if (HeldCopy(LearnerState(m), p).version < 1) return false;
        }
      }
      return testing::FragmentsWithARound(a_.out + "/metrics-syncer.jsonl") == kFragments;
    };
    ASSERT_TRUE(AwaitFor(every_copy_moved, 240, std::chrono::milliseconds(100))) << a_.Log();
  }

  // `c` closed a round of its own (not an adopted copy).
  static bool ClosedARound(const Candidate& c) {
    for (const auto& l : MetricLines(c.out + "/metrics-syncer.jsonl")) {
      if (l.value("kind", "") == "round" && l.value("reason", "") != "adopted") return true;
    }
    return false;
  }

  // The replica set the leader recorded in etcd names `id`.
  bool InReplicaSet(const std::string& id) const {
    auto v = etcd_->ValueEndingWith("/atoll/", "/replicas");
    if (!v.ok() || v->empty()) return false;
    const auto j = nlohmann::json::parse(*v, nullptr, false);
    if (!j.is_object() || !j.contains("in_sync")) return false;
    for (const auto& x : j["in_sync"]) {
      if (x == id) return true;
    }
    return false;
  }

  // The newest copy of each fragment any learner holds.
  std::map<int, Held> NewestCopies() const {
    std::map<int, Held> newest;
    for (int m = 0; m < 2; ++m) {
      for (int p = 0; p < kFragments; ++p) {
        const Held h = HeldCopy(LearnerState(m), p);
        if (h.version > newest[p].version) newest[p] = h;
      }
    }
    return newest;
  }

  // SIGTERM to `c`, which finishes the run; the learners then leave by themselves.
  void FinishUnder(Candidate& c) {
    c.process.Signal(SIGTERM);
    EXPECT_EQ(c.process.WaitOrKill(120), 0) << c.Log();
    for (auto& l : learners_) EXPECT_EQ(l.WaitOrKill(120), 0);
  }

  bool replicate_ = true;
  std::string dir_, data_;
  std::unique_ptr<testing::EtcdServer> etcd_;
  Candidate a_, b_;
  std::vector<ChildProcess> learners_;
};

TEST_F(SyncerStandby, ALostLeaderHostIsReplacedByTheStandbyFromTheLearnersCopies) {
  replicate_ = false;  // the standby keeps nothing: it rebuilds
  TrainUnderA();
  // A's host is lost: the process and its disk.
  a_.process.Signal(SIGKILL);
  a_.process.WaitOrKill(30);
  fs::remove_all(a_.out + "/state");
  const auto lost = std::chrono::steady_clock::now();
  ASSERT_TRUE(AwaitFor([&] { return b_.Leads(); }, 60, std::chrono::milliseconds(20))) << b_.Log();
  const double takeover_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - lost).count();
  std::printf("standby leads %.2f s after the leader's loss (lease 2 s)\n", takeover_s);
  EXPECT_NE(b_.Log().find("taking over the run"), std::string::npos) << b_.Log();
  std::this_thread::sleep_for(std::chrono::seconds(1));  // any pull from A in flight has failed by now
  const std::map<int, Held> newest = NewestCopies();
  // B had no state: it adopts the newest copy of every fragment the learners hold, bit for bit —
  // every version a learner held is in the new leader's history.
  const std::string metrics = b_.out + "/metrics-syncer.jsonl";
  std::map<int, nlohmann::json> adopted;
  auto all_adopted = [&] {
    for (const auto& l : MetricLines(metrics)) {
      if (l.value("reason", "") == "adopted") adopted[l["fragment"].get<int>()] = l;
    }
    for (const auto& [p, h] : newest) {
      if (adopted.count(p) == 0 || adopted[p]["version"].get<int64_t>() < h.version) return false;
    }
    return true;
  };
  ASSERT_TRUE(AwaitFor(all_adopted, 120, std::chrono::milliseconds(100))) << b_.Log();
  for (const auto& [p, h] : newest) {
    EXPECT_EQ(adopted[p]["version"].get<int64_t>(), h.version) << "fragment " << p;
    EXPECT_EQ(adopted[p]["theta_checksum"].get<std::string>(), ChecksumHex(h.checksum)) << "fragment " << p;
  }
  // Rounds go on under B, and no learner exited.
  EXPECT_TRUE(AwaitFor([&] { return ClosedARound(b_); }, 120, std::chrono::milliseconds(100))) << b_.Log();
  for (auto& l : learners_) EXPECT_TRUE(l.running()) << "a learner exited during the takeover";
  FinishUnder(b_);
  // The summary reports the takeover.
  auto summary = ReadFile(b_.out + "/syncer-summary.json");
  ASSERT_TRUE(summary.ok()) << summary.status();
  const nlohmann::json leadership = nlohmann::json::parse(*summary)["leadership"];
  EXPECT_EQ(leadership["candidate"], "b") << leadership.dump();
  EXPECT_TRUE(leadership["took_over"].get<bool>()) << leadership.dump();
  EXPECT_FALSE(leadership["from_replica"].get<bool>()) << leadership.dump();
  EXPECT_GT(leadership["epoch"].get<uint64_t>(), 0u) << leadership.dump();
}

TEST_F(SyncerStandby, ALostLeaderHostIsReplacedByAStandbyThatHeldEveryCommit) {
  TrainUnderA();
  // B follows A's commits and is in the replica set A recorded: A publishes no round B lacks.
  ASSERT_TRUE(AwaitFor([&] { return InReplicaSet("b"); }, 120, std::chrono::milliseconds(100))) << b_.Log();
  EXPECT_NE(b_.Log().find("following leader a"), std::string::npos) << b_.Log();
  // A's host is lost mid-run: the process, then its disk.
  a_.process.Signal(SIGKILL);
  a_.process.WaitOrKill(30);
  fs::remove_all(a_.out + "/state");
  const auto lost = std::chrono::steady_clock::now();
  ASSERT_TRUE(AwaitFor([&] { return b_.Leads(); }, 60, std::chrono::milliseconds(20))) << b_.Log();
  std::printf("standby leads %.2f s after the leader's loss (lease 2 s)\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - lost).count());
  EXPECT_NE(b_.Log().find("from the leader's commits it followed"), std::string::npos) << b_.Log();
  // B resumed its own folder: no rebuild, and every version a learner held (every published round)
  // is there — the same version with the same values, or a newer one.
  const std::string metrics = b_.out + "/metrics-syncer.jsonl";
  nlohmann::json resumed;
  ASSERT_TRUE(AwaitFor(
      [&] {
        for (const auto& l : MetricLines(metrics)) {
          if (l.value("kind", "") == "resumed") resumed = l;
        }
        return !resumed.is_null();
      },
      120, std::chrono::milliseconds(100)))
      << b_.Log();
  EXPECT_EQ(b_.Log().find("syncer: rebuild:"), std::string::npos) << b_.Log();
  std::this_thread::sleep_for(std::chrono::seconds(1));  // a pull from A in flight has ended by now
  for (const auto& [p, h] : NewestCopies()) {
    const int64_t v = resumed["versions"][p].get<int64_t>();
    EXPECT_GE(v, h.version) << "fragment " << p << ": a published round was lost";
    if (v == h.version) {
      EXPECT_EQ(resumed["public_checksums"][p].get<std::string>(), ChecksumHex(h.checksum)) << "fragment " << p;
    }
  }
  EXPECT_TRUE(AwaitFor([&] { return ClosedARound(b_); }, 120, std::chrono::milliseconds(100))) << b_.Log();
  for (auto& l : learners_) EXPECT_TRUE(l.running()) << "a learner exited during the takeover";
  FinishUnder(b_);
  auto summary = ReadFile(b_.out + "/syncer-summary.json");
  ASSERT_TRUE(summary.ok()) << summary.status();
  const nlohmann::json doc = nlohmann::json::parse(*summary);
  EXPECT_TRUE(doc["leadership"]["took_over"].get<bool>()) << doc["leadership"].dump();
  EXPECT_TRUE(doc["leadership"]["from_replica"].get<bool>()) << doc["leadership"].dump();
  EXPECT_GT(doc["replication"]["commits"].get<int64_t>(), 0) << doc["replication"].dump();
}

TEST_F(SyncerStandby, APausedLeaderComesBackFencedAndTheRunGoesOnUnderTheNewOne) {
  TrainUnderA();
  a_.process.Signal(SIGSTOP);  // past its 2 s lease
  ASSERT_TRUE(AwaitFor([&] { return b_.Leads(); }, 60, std::chrono::milliseconds(20))) << b_.Log();
  a_.process.Signal(SIGCONT);
  // A sees its lease lapsed: it answers nothing more (every call UNAVAILABLE, its rounds held) and
  // exits 3.
  EXPECT_EQ(a_.process.WaitOrKill(60), 3) << a_.Log();
  EXPECT_NE(a_.Log().find("leadership lapsed"), std::string::npos) << a_.Log();
  // The run goes on under B (from the commits it followed, or rebuilt from the learners), and no
  // learner exited.
  EXPECT_TRUE(AwaitFor([&] { return ClosedARound(b_); }, 120, std::chrono::milliseconds(100))) << b_.Log();
  for (auto& l : learners_) EXPECT_TRUE(l.running()) << "a learner exited";
  // A started again on its own disk is a standby; it never resumes the state it left (B led since):
  // following B it moves that folder aside. Here B finishes the run first, so A has nothing to serve.
  StartCandidate(a_, "a");
  ASSERT_TRUE(AwaitFor([&] { return a_.Log().find("waiting for the leadership") != std::string::npos; }, 60,
                       std::chrono::milliseconds(50)))
      << a_.Log();
  EXPECT_FALSE(a_.Leads()) << a_.Log();
  b_.process.Signal(SIGTERM);
  EXPECT_EQ(b_.process.WaitOrKill(120), 0) << b_.Log();
  for (auto& l : learners_) EXPECT_EQ(l.WaitOrKill(120), 0);
  EXPECT_EQ(a_.process.WaitOrKill(60), 0) << a_.Log();
  EXPECT_NE(a_.Log().find("the run already finished"), std::string::npos) << a_.Log();
}

TEST_F(SyncerStandby, BadLeadershipInputsAreRefusedClearly) {
  std::string common = "syncer";
  for (const auto& f : Flags(dir_ + "/bad")) common += " " + f;
  // etcd unreachable.
  auto none = testing::RunAtoll(common + " --etcd unix:" + dir_ + "/no-etcd.sock", 120);
  EXPECT_EQ(none.exit_code, 1) << none.output;
  EXPECT_NE(none.output.find("did not answer"), std::string::npos) << none.output;
  // Endpoints and leases that cannot be right.
  for (const char* bad : {"--etcd https://127.0.0.1:2379", "--etcd ,", "--lease-ttl 0", "--lease-ttl 1.5",
                          "--lease-ttl 61", "--replica-timeout 0", "--replica-timeout 61"}) {
    const std::string etcd = std::string(bad).rfind("--etcd", 0) == 0 ? "" : " --etcd " + etcd_->endpoint();
    auto r = testing::RunAtoll(common + etcd + " " + bad, 60);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.output;
    EXPECT_NE(r.output.find("error"), std::string::npos) << bad << ": " << r.output;
  }
  auto maybe = testing::RunAtoll(common + " --etcd " + etcd_->endpoint() + " --replicate maybe", 60);
  EXPECT_NE(maybe.exit_code, 0) << maybe.output;
  EXPECT_NE(maybe.output.find("--replicate"), std::string::npos) << maybe.output;
  EXPECT_FALSE(fs::exists(dir_ + "/bad/state")) << "a refused start wrote no state";
  // Two candidates configured with the same id: the second is refused while the first lives.
  StartCandidate(a_, "same");
  ASSERT_TRUE(AwaitFor([&] { return a_.Leads(); }, 120, std::chrono::milliseconds(50))) << a_.Log();
  auto twin = testing::RunAtoll(common + " --etcd " + etcd_->endpoint() + " --candidate-id same", 60);
  EXPECT_EQ(twin.exit_code, 2) << twin.output;
  EXPECT_NE(twin.output.find("another syncer is running as candidate"), std::string::npos) << twin.output;
  EXPECT_TRUE(a_.process.running()) << a_.Log();
}

}  // namespace
}  // namespace atl
