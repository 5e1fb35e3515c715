// CommitHeadroom: whether the syncer's state folder can take its next commit (issue 32;
// docs/failure-semantics.md, "Holding rounds"). Before the syncer closes any round its loop
// asks Check(): free space on the folder's file system for one commit (the largest fragment
// file and a margin) and a reserve of file descriptors held for commits.
// When either is short the rounds are held — they stay open, pushes keep joining them, learners
// keep pulling the last committed state — and the check runs again at the next tick, instead of
// a commit that fails and aborts the syncer. A learner therefore never sees a version that is
// not durable, and a full disk or a descriptor flood costs progress, not the process.
// The commit itself runs with the reserve handed back to the process (ReleaseForCommit), so
// it finds descriptors free whatever else holds them.
// Thread-safety: the syncer's loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "atoll/core/status.h"
#include "atoll/diloco/fragment_plan.h"

namespace atl::syncer {

class CommitHeadroom {
 public:
  // Free bytes for an unprivileged writer on the file system of `dir` (statvfs); tests inject
  // their own to fill a disk without one.
  using FreeBytes = std::function<StatusOr<uint64_t>(const std::string& dir)>;
  static StatusOr<uint64_t> FileSystemFreeBytes(const std::string& dir);

  // `commit_bytes`: what one commit may need free (CommitBytes). Opens `reserve_fds` descriptors
  // (of /dev/null) at once; as many as can be opened.
  CommitHeadroom(std::string dir, uint64_t commit_bytes, int reserve_fds, FreeBytes free_bytes = FileSystemFreeBytes);
  ~CommitHeadroom();
  CommitHeadroom(const CommitHeadroom&) = delete;
  CommitHeadroom& operator=(const CommitHeadroom&) = delete;

  // OK when a commit can go ahead; otherwise why not, to hold rounds with: ResourceExhausted
  // for too little free space or descriptors (it says how much there is and how much is needed),
  // Unavailable when the free space cannot be measured. Takes back reserve descriptors first.
  Status Check();

  // While alive, the reserve is closed (its descriptors free for the commit's files); taken
  // back when it ends.
  class Released {
   public:
    explicit Released(CommitHeadroom* h) : h_(h) {}
    Released(Released&& o) noexcept : h_(o.h_) { o.h_ = nullptr; }
    Released(const Released&) = delete;
    Released& operator=(const Released&) = delete;
    Released& operator=(Released&&) = delete;
    ~Released() {
      if (h_) h_->Refill();
    }

   private:
    CommitHeadroom* h_;
  };
  [[nodiscard]] Released ReleaseForCommit();

  int reserved() const { return static_cast<int>(reserve_.size()); }
  uint64_t commit_bytes() const { return commit_bytes_; }

 private:
  void Refill();
  std::string dir_;
  uint64_t commit_bytes_;
  int want_fds_;
  FreeBytes free_bytes_;
  std::vector<int> reserve_;
};

// The free space one commit of `plan` may need: the largest fragment file (written beside the
// one it replaces) plus `margin_bytes` for the learner table, metrics and whatever else shares
// the file system.
uint64_t CommitBytes(const diloco::FragmentPlan& plan, uint64_t margin_bytes);

}  // namespace atl::syncer
