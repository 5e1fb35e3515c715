// ChildProcess: a process started with fork + exec, its output appended to a log file, with the
// signals chaos and shutdown need (SIGKILL, SIGSTOP/SIGCONT, SIGTERM), a non-blocking exit check
// and bounded waits. Used by `atoll run` for its syncer and learners and by the bench drivers for
// whole runs. Thread-safety: one owner thread.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "atoll/core/status.h"

namespace atl {

struct ChildOptions {
  // Start the child in a process group of its own; signals then go to the whole group (a shell
  // and everything it started).
  bool own_process_group = false;
};

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();  // kills a child that is still running (no orphans)
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts `argv` (argv[0] is the program path) with stdout and stderr appended to `log_path`.
  static StatusOr<ChildProcess> Start(const std::vector<std::string>& argv, const std::string& log_path,
                                      ChildOptions options = {});

  pid_t pid() const { return pid_; }
  bool running();                                              // reaps the child when it has exited
  std::optional<int> exit_code() const { return exit_code_; }  // -signal when killed
  void Signal(int sig);                                        // to the child, or to its group when it has its own
  // Waits up to `seconds` for exit; then SIGKILLs. Returns the exit code.
  int WaitOrKill(double seconds);
  // Waits up to `seconds`; then SIGTERM, up to `term_grace_s` more for a clean exit, then
  // SIGKILL. Sets `*stopped` when it had to signal. Returns the exit code.
  int WaitThenStop(double seconds, double term_grace_s, bool* stopped = nullptr);

 private:
  void Kill();
  pid_t pid_ = -1;
  bool group_ = false;
  std::optional<int> exit_code_;
};

// The path of the running executable (/proc/self/exe).
std::string SelfExecutable();

}  // namespace atl
