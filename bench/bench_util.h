// Shared plumbing of the benchmark drivers (bench_runtime, bench_chaos): they spawn the `atoll`
// binary (and the PyTorch anchor), wait for it, and read the summary.json files it leaves in run
// folders. Everything here is header-only and torch-free; single-threaded (the drivers run one
// cluster at a time, except where a driver starts a fixed set of processes together on purpose).
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/child_process.h"

#ifndef ATOLL_BIN
#define ATOLL_BIN "atoll"
#endif

namespace bench {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using atl::ChildProcess;

// Common flags of every driver.
struct CommonArgs {
  bool quick = false;
  std::string only;  // "" = every part
  std::string out;   // run folders; "" = runs/bench-<name>-<timestamp>
  std::string data = "data";
};

inline std::string Timestamp() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

inline std::string Today() {
  std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", std::localtime(&t));
  return buf;
}

// Parses --quick, --only NAME, --out DIR, --data DIR; exits 2 on anything else (after the usage).
inline CommonArgs ParseCommon(int argc, char** argv, const std::string& name, const std::vector<std::string>& parts,
                              const char* usage) {
  CommonArgs a;
  auto die = [&](const std::string& msg) {
    std::fprintf(stderr, "bench_%s: %s\n%s", name.c_str(), msg.c_str(), usage);
    std::exit(2);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die(k + " needs a value");
      return argv[++i];
    };
    if (k == "--quick") a.quick = true;
    else if (k == "--only") a.only = next();
    else if (k == "--out") a.out = next();
    else if (k == "--data") a.data = next();
    else if (k == "-h" || k == "--help") {
      std::printf("%s", usage);
      std::exit(0);
    } else {
      die("unknown flag " + k);
    }
  }
  if (!a.only.empty() && std::find(parts.begin(), parts.end(), a.only) == parts.end()) {
    std::string known;
    for (const auto& p : parts) known += (known.empty() ? "" : ", ") + p;
    die("--only " + a.only + ": unknown part (known: " + known + ")");
  }
  if (a.out.empty()) a.out = "runs/bench-" + name + "-" + Timestamp();
  std::error_code ec;
  fs::create_directories(a.out, ec);
  if (ec) die("cannot create " + a.out + ": " + ec.message());
  a.out = fs::absolute(a.out).lexically_normal().string();
  a.data = fs::absolute(a.data).lexically_normal().string();
  return a;
}

// The atoll binary: $ATOLL_BIN when set (e.g. an installed copy), else the one CMake built.
inline std::string AtollBin() {
  const char* env = std::getenv("ATOLL_BIN");
  return env != nullptr && *env != '\0' ? env : ATOLL_BIN;
}

inline std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline void Progress(const std::string& name, const std::string& line) {
  std::printf("[bench_%s %s] %s\n", name.c_str(), Timestamp().substr(9).c_str(), line.c_str());
  std::fflush(stdout);
}

// A child started with /bin/sh -c in its own process group, stdout+stderr to `log` (truncated).
struct Child {
  ChildProcess process;
  double started = 0;
  std::string log;
  bool timed_out = false;  // set by Wait when it had to stop the child
};

inline Child Spawn(const std::string& cmd, const std::string& log, const std::string& env = "") {
  Child c;
  c.log = log;
  c.started = Now();
  std::ofstream(log, std::ios::trunc).close();
  auto p = ChildProcess::Start({"/bin/sh", "-c", env + " exec " + cmd}, log, {.own_process_group = true});
  if (!p.ok()) {
    std::fprintf(stderr, "bench: cannot start %s: %s\n", cmd.c_str(), p.status().ToString().c_str());
  } else {
    c.process = std::move(*p);
  }
  return c;
}

// Waits for the child; after `timeout_s` sends SIGTERM to its group (atoll run then stops its
// learners and still reports), SIGKILL 60 s later. Returns the exit code (128+signal if killed;
// 127 when it could not be started).
inline int Wait(Child& c, double timeout_s) {
  if (c.process.pid() <= 0) return 127;
  const int rc = c.process.WaitThenStop(std::max(0.0, timeout_s - (Now() - c.started)), 60, &c.timed_out);
  if (c.timed_out) {
    std::fprintf(stderr, "bench: timeout after %.0f s, stopped (log: %s)\n", timeout_s, c.log.c_str());
  }
  return rc < 0 ? 128 - rc : rc;
}

inline int RunAndWait(const std::string& cmd, const std::string& log, double timeout_s, const std::string& env = "") {
  Child c = Spawn(cmd, log, env);
  return Wait(c, timeout_s);
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The parsed file, or null when missing or not JSON.
inline Json ReadJson(const std::string& path) {
  auto j = Json::parse(ReadText(path), nullptr, false);
  return j.is_discarded() ? Json(nullptr) : j;
}

inline std::vector<Json> ReadJsonl(const std::string& path) {
  std::vector<Json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = Json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

inline std::string Tail(const std::string& path, int lines) {
  std::string t = ReadText(path);
  size_t pos = t.size();
  for (int n = 0; n <= lines && pos > 0;) {
    pos = t.rfind('\n', pos - 1);
    if (pos == std::string::npos) return t;
    ++n;
  }
  return t.substr(pos + 1);
}

// The last line of a log that says "error" (the reason a run failed), "" if none.
inline std::string LastErrorLine(const std::string& path) {
  std::ifstream in(path);
  std::string last;
  for (std::string line; std::getline(in, line);)
    if (line.find("error") != std::string::npos) last = line;
  return last.size() > 160 ? last.substr(0, 160) + "..." : last;
}

inline double Num(const Json& j, const char* key, double fallback = NAN) {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

inline double Median(std::vector<double> v) {
  std::erase_if(v, [](double x) { return !std::isfinite(x); });
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double Ratio(double a, double b) { return std::isfinite(a) && std::isfinite(b) && b != 0 ? a / b : NAN; }

// JSON number, or null for NaN/inf (JSON has no NaN).
inline Json J(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

inline std::string Fmt(double v, const char* f = "%.4g") {
  if (!std::isfinite(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

// The training loop's window from per-step metric lines: from the start of the first step to the
// end of the last. `t_key` is a timestamp taken at the end of each step, `dt_key` the step's own
// duration; lines with a "kind" other than "train" are skipped. Start-up, joins and the final
// evaluation fall outside the window, so `atoll run` learners and `atoll train` compare alike.
// `skip` leaves out a process's first steps (in file order): the window then starts at the end
// of the last skipped step.
struct LoopWindow {
  double start = INFINITY, end = -INFINITY;
  int64_t steps = 0;
  double tokens = 0;  // Σ of `tokens_key` over the steps in the window (when given)
  double seconds() const { return end > start ? end - start : NAN; }
};

inline LoopWindow LoopWindowOf(const std::vector<Json>& lines, const char* t_key, const char* dt_key, int skip = 0,
                               const char* tokens_key = nullptr) {
  LoopWindow w;
  for (const auto& l : lines) {
    if (!l.contains(dt_key) || !l.contains(t_key) || l.value("kind", "train") != "train") continue;
    const double t = Num(l, t_key), dt = Num(l, dt_key);
    if (!std::isfinite(t) || !std::isfinite(dt)) continue;
    if (skip > 0) {
      --skip;
      if (skip == 0) w.start = t;
      continue;
    }
    w.start = std::min(w.start, t - dt);
    w.end = std::max(w.end, t);
    ++w.steps;
    if (tokens_key != nullptr) w.tokens += Num(l, tokens_key, 0);
  }
  return w;
}

// The result of one spawned `atoll` command that writes a run folder.
struct Result {
  int rc = -1;
  Json summary;  // the run folder's summary.json; null when the run left none
  std::string dir;
  double seconds = 0;
  bool timed_out = false;  // stopped by the driver (SIGTERM) after its time limit
  bool ok() const { return rc == 0 && summary.is_object(); }
};

// Starts `atoll <sub> --out <out>/<name> <args>` (console log in <out>/<name>.log) and counts the
// runs that fail. One Runner per driver; not thread-safe.
class Runner {
 public:
  Runner(std::string bench_name, std::string out) : bench_(std::move(bench_name)), out_(std::move(out)) {}

  void Log(const std::string& line) const { Progress(bench_, line); }
  int failures() const { return failures_; }
  void CountFailure() { ++failures_; }
  const std::string& out() const { return out_; }

  // Resumable runs: a run whose folder holds a summary.json and whose <name>.cmd names the same
  // command is not run again (its result is read back); any other folder of that name (a run cut
  // off before its end) is removed before the run starts. Off by default.
  void SetResume(bool on) { resume_ = on; }
  // Before each run, wait while this file exists (checked every 2 minutes); "" = never.
  void SetWaitWhile(std::string path) { wait_while_ = std::move(path); }

  std::string Command(const std::string& name, const std::string& sub, const std::string& args) const {
    return Quote(AtollBin()) + " " + sub + " --out " + Quote(out_ + "/" + name) + " " + args +
           (sub == "run" ? " --no-live" : "");
  }

  Child Start(const std::string& name, const std::string& sub, const std::string& args,
              const std::string& env = "") const {
    const std::string dir = out_ + "/" + name;
    Log(name + ": atoll " + sub + args + "  (log " + dir + ".log)");
    return Spawn(Command(name, sub, args), dir + ".log", env);
  }

  // Waits for a child from Start; a run without exit 0 and summary.json counts as failed unless
  // `expect_ok` is false.
  Result Finish(const std::string& name, Child& c, double timeout_s, bool expect_ok = true) {
    Result r;
    r.dir = out_ + "/" + name;
    r.rc = Wait(c, timeout_s);
    r.seconds = Now() - c.started;
    r.timed_out = c.timed_out;
    r.summary = ReadJson(r.dir + "/summary.json");
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%.0f", r.seconds);
    Log(name + ": exit " + std::to_string(r.rc) + " after " + secs + " s" +
        (r.summary.is_object() ? "" : " (no summary.json)"));
    if (!r.ok() && expect_ok) {
      ++failures_;
      std::fprintf(stderr, "bench_%s: %s failed; %s.log ends with:\n%s\n", bench_.c_str(), name.c_str(), r.dir.c_str(),
                   Tail(r.dir + ".log", 12).c_str());
    }
    return r;
  }

  Result Atoll(const std::string& name, const std::string& sub, const std::string& args, double timeout_s,
               bool expect_ok = true) {
    const std::string dir = out_ + "/" + name, cmd = Command(name, sub, args);
    if (resume_) {
      Result done;
      done.dir = dir;
      done.summary = ReadJson(dir + "/summary.json");
      if (done.summary.is_object() && ReadText(dir + ".cmd") == cmd) {
        done.rc = 0;
        Log(name + ": already done (" + dir + "/summary.json), not run again");
        return done;
      }
      std::error_code ec;
      fs::remove_all(dir, ec);
      std::ofstream(dir + ".cmd", std::ios::trunc) << cmd;
    }
    for (bool said = false; !wait_while_.empty() && fs::exists(wait_while_); said = true) {
      if (!said) Log("waiting while " + wait_while_ + " exists");
      std::this_thread::sleep_for(std::chrono::seconds(120));
    }
    Child c = Start(name, sub, args);
    return Finish(name, c, timeout_s, expect_ok);
  }

 private:
  std::string bench_, out_;
  int failures_ = 0;
  bool resume_ = false;
  std::string wait_while_;
};

// Whether a `--mode ddp` run really moved data-parallel traffic: its payload must be at least a
// quarter of the analytic 4 · params bytes per learner-step (an older binary that accepts the
// flag but trains decoupled moves ~90x less).
inline bool DdpMovedDataParallelTraffic(const Json& s, double tokens_per_learner_step) {
  const double tokens = Num(s, "tokens_trained"), params = Num(s, "params");
  const double payload = Num(s, "payload_bytes_up") + Num(s, "payload_bytes_down");
  return tokens > 0 && params > 0 && payload / tokens > 0.25 * 4 * params / tokens_per_learner_step;
}

// Count of fault-log entries of this kind ("kill", "pause", ...).
inline int CountFaults(const Json& s, const std::string& kind) {
  int n = 0;
  for (const auto& f : s.value("faults", Json::array())) n += f.value("kind", "") == kind ? 1 : 0;
  return n;
}

// A plain text table: the first row is the header.
inline void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  if (rows.empty()) return;
  std::vector<size_t> w(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  for (size_t k = 0; k < rows.size(); ++k) {
    std::string line;
    for (size_t i = 0; i < rows[k].size() && i < w.size(); ++i) {
      line += rows[k][i] + std::string(w[i] - rows[k][i].size() + 2, ' ');
    }
    std::printf("  %s\n", line.c_str());
    if (k == 0) {
      size_t total = 0;
      for (size_t x : w) total += x + 2;
      std::printf("  %s\n", std::string(total, '-').c_str());
    }
  }
  std::fflush(stdout);
}

// The common end of a driver: stamps `j` with what ran, prints the closing line and the one JSON
// line, and returns the exit code (0 when no run failed).
inline int Finish(const std::string& name, const CommonArgs& a, double t0, int failures, Json& j) {
  j["bench"] = name;
  j["quick"] = a.quick;
  j["date"] = Today();
  j["out"] = a.out;
  j["seconds"] = Now() - t0;
  j["failures"] = failures;
  std::printf("\nbench_%s: %.0f s, %d failed run(s); run folders in %s\n", name.c_str(), Now() - t0, failures,
              a.out.c_str());
  std::printf("%s\n", j.dump().c_str());
  return failures == 0 ? 0 : 1;
}

}  // namespace bench
