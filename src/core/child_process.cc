#include "atoll/core/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

namespace atl {

ChildProcess::~ChildProcess() { Kill(); }

ChildProcess::ChildProcess(ChildProcess&& o) noexcept : pid_(o.pid_), group_(o.group_), exit_code_(o.exit_code_) {
  o.pid_ = -1;
}

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    Kill();
    pid_ = o.pid_;
    group_ = o.group_;
    exit_code_ = o.exit_code_;
    o.pid_ = -1;
  }
  return *this;
}

void ChildProcess::Kill() {
  if (pid_ <= 0 || !running()) return;
  Signal(SIGCONT);  // a stopped child must run to die
  Signal(SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  exit_code_ = -SIGKILL;
}

StatusOr<ChildProcess> ChildProcess::Start(const std::vector<std::string>& argv, const std::string& log_path,
                                           ChildOptions options) {
  if (argv.empty()) return InvalidArgumentError("no program to start");
  int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return InternalError("open " + log_path + ": " + std::strerror(errno));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    return InternalError(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    if (options.own_process_group) ::setpgid(0, 0);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  // Also from the parent, so that a signal sent right after Start reaches the group.
  if (options.own_process_group) ::setpgid(pid, pid);
  ::close(fd);
  ChildProcess c;
  c.pid_ = pid;
  c.group_ = options.own_process_group;
  return c;
}

bool ChildProcess::running() {
  if (pid_ <= 0 || exit_code_) return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  if (r == pid_) {
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  } else {
    exit_code_ = -1;
  }
  return false;
}

void ChildProcess::Signal(int sig) {
  if (pid_ > 0 && !exit_code_) ::kill(group_ ? -pid_ : pid_, sig);
}

namespace {
// Polls `p.running()` until it is false or `seconds` have passed; true when it exited.
bool WaitExit(ChildProcess& p, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (p.running()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}
}  // namespace

int ChildProcess::WaitOrKill(double seconds) { return WaitThenStop(seconds, 0); }

int ChildProcess::WaitThenStop(double seconds, double term_grace_s, bool* stopped) {
  if (stopped) *stopped = false;
  if (WaitExit(*this, seconds)) return exit_code_.value_or(-1);
  if (stopped) *stopped = true;
  if (term_grace_s > 0) {
    Signal(SIGCONT);
    Signal(SIGTERM);
    if (WaitExit(*this, term_grace_s)) return exit_code_.value_or(-1);
  }
  Kill();
  return exit_code_.value_or(-1);
}

std::string SelfExecutable() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "atoll";
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace atl
