// ChildProcess: exit codes, logs, bounded waits that escalate SIGTERM → SIGKILL, process groups.
#include "atoll/core/child_process.h"

#include "atoll/core/file.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include "testing/scratch.h"

namespace atl {
namespace {

std::string TempLog(const std::string& name) {
  static const std::string dir = testing::ScratchDir("child_test");
  return dir + "/" + name;
}

std::string Read(const std::string& path) {
  auto text = ReadFile(path);
  return text.ok() ? *text : std::string();
}

TEST(ChildProcess, ReportsTheExitCodeAndAppendsOutputToTheLog) {
  const std::string log = TempLog("exit.log");
  std::filesystem::remove(log);
  auto p = ChildProcess::Start({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, log);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->WaitOrKill(30), 3);
  EXPECT_FALSE(p->running());
  EXPECT_EQ(p->exit_code(), 3);
  const std::string text = Read(log);
  EXPECT_NE(text.find("out"), std::string::npos);
  EXPECT_NE(text.find("err"), std::string::npos);
}

TEST(ChildProcess, AProgramThatCannotBeExecutedExitsWith127) {
  auto p = ChildProcess::Start({"/nonexistent/atoll-no-such-program"}, TempLog("missing.log"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->WaitOrKill(30), 127);
  EXPECT_NE(Read(TempLog("missing.log")).find("exec /nonexistent/atoll-no-such-program"), std::string::npos);
}

TEST(ChildProcess, BadInputsAreErrors) {
  EXPECT_EQ(ChildProcess::Start({}, TempLog("none.log")).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ChildProcess::Start({"/bin/true"}, "/nonexistent-dir/x.log").status().code(), StatusCode::kInternal);
}

TEST(ChildProcess, WaitThenStopSendsSigtermThenWaits) {
  // The shell traps SIGTERM and exits 7: the grace period lets it exit cleanly.
  auto p = ChildProcess::Start({"/bin/sh", "-c", "trap 'exit 7' TERM; while :; do sleep 0.05; done"},
                               TempLog("term.log"), {.own_process_group = true});
  ASSERT_TRUE(p.ok()) << p.status();
  bool stopped = false;
  EXPECT_EQ(p->WaitThenStop(0.2, 30, &stopped), 7);
  EXPECT_TRUE(stopped);
}

TEST(ChildProcess, WaitOrKillKillsAStoppedChild) {
  auto p = ChildProcess::Start({"/bin/sh", "-c", "while :; do sleep 0.05; done"}, TempLog("kill.log"));
  ASSERT_TRUE(p.ok()) << p.status();
  p->Signal(SIGSTOP);
  EXPECT_EQ(p->WaitOrKill(0.1), -SIGKILL);
  EXPECT_FALSE(p->running());
}

TEST(ChildProcess, DestroyingARunningChildKillsIt) {
  pid_t pid;
  {
    auto p = ChildProcess::Start({"/bin/sh", "-c", "while :; do sleep 0.05; done"}, TempLog("dtor.log"));
    ASSERT_TRUE(p.ok()) << p.status();
    pid = p->pid();
  }
  EXPECT_NE(::kill(pid, 0), 0);  // reaped: no such process
}

}  // namespace
}  // namespace atl
