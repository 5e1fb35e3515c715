// ChildProcess: a process started from this binary (fork + exec), its output appended to a log
// file, with the signals chaos and shutdown need (SIGKILL, SIGSTOP/SIGCONT, SIGTERM) and a
// non-blocking exit check. Thread-safety: one owner thread.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "atoll/core/status.h"

namespace atl::runtime {

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();  // kills a child that is still running (no orphans)
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts `argv` (argv[0] is the program path) with stdout and stderr appended to `log_path`.
  static StatusOr<ChildProcess> Start(const std::vector<std::string>& argv, const std::string& log_path);

  pid_t pid() const { return pid_; }
  bool running();                       // reaps the child when it has exited
  std::optional<int> exit_code() const { return exit_code_; }  // -signal when killed
  void Signal(int sig);
  // Waits up to `seconds` for exit; then SIGKILLs. Returns the exit code.
  int WaitOrKill(double seconds);

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

// The path of the running executable (/proc/self/exe).
std::string SelfExecutable();

}  // namespace atl::runtime
