// EtcdServer: a real single-member etcd (/usr/bin/etcd, installed by scripts/setup) for one test,
// listening on unix sockets in a scratch folder (etcd cannot bind port 0): its client socket is
// `<dir>/localhost:1`, reached as `endpoint()` = "unix:<dir>/localhost:1". Its election timeout is
// short (100 ms) so that it elects itself at once and grants leases as short as 1 s. Start waits
// (bounded) until etcd answers a read through etcdctl; Stop sends SIGTERM, then SIGKILL.
// etcd is a test dependency (scripts/setup installs it): without it Start fails, and so does the
// test, saying so.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "atoll/core/child_process.h"
#include "atoll/core/status.h"
#include "testing/await.h"
#include "testing/scratch.h"

namespace atl::testing {

class EtcdServer {
 public:
  static constexpr const char* kEtcd = "/usr/bin/etcd";
  static constexpr const char* kEtcdctl = "/usr/bin/etcdctl";
  static constexpr const char* kMissing = "etcd is not installed (/usr/bin/etcd; scripts/setup installs it)";

  // A fresh etcd in the scratch folder `name`, answering within `seconds`.
  static StatusOr<std::unique_ptr<EtcdServer>> Start(const std::string& name, double seconds = 30) {
    if (::access(kEtcd, X_OK) != 0 || ::access(kEtcdctl, X_OK) != 0) return FailedPreconditionError(kMissing);
    std::unique_ptr<EtcdServer> s(new EtcdServer());
    s->dir_ = ScratchDir(name);
    Status st = s->Launch(seconds);
    if (!st.ok()) return st;
    return s;
  }

  // Stops etcd and starts it again on the same data (its keys and leases survive).
  Status Restart(double seconds = 30) {
    Stop();
    return Launch(seconds);
  }

  ~EtcdServer() { Stop(); }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  std::string endpoint() const { return "unix:" + dir_ + "/localhost:1"; }
  const std::string& dir() const { return dir_; }
  std::string log() const { return dir_ + "/etcd.log"; }
  ChildProcess& process() { return process_; }  // e.g. SIGSTOP / SIGCONT

  // The value of the first key under `prefix` whose name ends with `suffix` (etcdctl get --prefix),
  // "" when there is none.
  StatusOr<std::string> ValueEndingWith(const std::string& prefix, const std::string& suffix) const {
    const std::string out = dir_ + "/etcdctl-get.out";
    auto ctl = InDir(
        std::string(kEtcdctl) + " --endpoints unix://localhost:1 --command-timeout 2s get --prefix '" + prefix + "'",
        out);
    if (!ctl.ok()) return ctl.status();
    if (ctl->WaitOrKill(10) != 0) return UnavailableError("etcdctl get failed (see " + out + ")");
    std::ifstream in(out);
    for (std::string key, value; std::getline(in, key) && std::getline(in, value);) {
      if (key.size() >= suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) {
        return value;
      }
    }
    return std::string();
  }

  // SIGTERM, up to `seconds` for etcd to exit, then SIGKILL.
  void Stop(double seconds = 10) {
    if (!process_.running()) return;
    process_.Signal(SIGCONT);
    process_.Signal(SIGTERM);
    process_.WaitOrKill(seconds);
  }

 private:
  EtcdServer() = default;

  // Runs `command` (a shell command line) from the scratch folder, which etcd's unix socket names
  // are relative to; `exec` keeps the child's pid, so signals reach etcd itself.
  StatusOr<ChildProcess> InDir(const std::string& command, const std::string& log_path) const {
    return ChildProcess::Start({"/bin/sh", "-c", "cd '" + dir_ + "' && exec " + command}, log_path);
  }

  Status Launch(double seconds) {
    // Sockets a killed etcd left behind would make the new one fail to listen.
    std::filesystem::remove(dir_ + "/localhost:1");
    std::filesystem::remove(dir_ + "/localhost:2");
    auto p = InDir(std::string(kEtcd) +
                       " --name t --data-dir d --listen-client-urls unix://localhost:1"
                       " --advertise-client-urls unix://localhost:1 --listen-peer-urls unix://localhost:2"
                       " --initial-advertise-peer-urls unix://localhost:2 --initial-cluster t=unix://localhost:2"
                       " --heartbeat-interval 10 --election-timeout 100",
                   log());
    if (!p.ok()) return p.status();
    process_ = std::move(*p);
    const bool up = AwaitFor([&] { return !process_.running() || Answers(); }, seconds, std::chrono::milliseconds(100));
    if (!up || !process_.running()) return UnavailableError("etcd in " + dir_ + " did not answer (see " + log() + ")");
    return Status::Ok();
  }

  // One read through etcdctl.
  bool Answers() const {
    auto ctl = InDir(std::string(kEtcdctl) + " --endpoints unix://localhost:1 --command-timeout 2s get /atoll/probe",
                     dir_ + "/etcdctl.log");
    return ctl.ok() && ctl->WaitOrKill(5) == 0;
  }

  std::string dir_;
  ChildProcess process_;
};

}  // namespace atl::testing
