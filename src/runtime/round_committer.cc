#include "round_committer.h"

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

namespace atl::runtime {

void RoundCommitter::Commit(const syncer::SyncerCore& sc, const syncer::RoundReport& r, TimePoint now) {
  if (!r.refused) {
    // The descriptors kept for commits are free while it writes (the gate made sure there was
    // room on the disk before this round closed).
    const auto released = headroom_.ReleaseForCommit();
    // The accounting counters this round moved (tokens merged, rounds joined per learner) are
    // part of the committed state: a restart must not forget merged work. Written just before
    // Θ_p: a crash in between counts a round that is then not in Θ_p, whose learners send that
    // work again (at least once, never lost).
    if (Status st = durable_.SaveLearners(sc); !st.ok()) {
      std::fprintf(stderr, "syncer: warning: cannot persist the learner table: %s\n", st.ToString().c_str());
    }
    if (Status st = durable_.SaveFragment(sc, r.fragment); !st.ok()) {
      std::fprintf(stderr, "syncer: FATAL: cannot persist fragment %d: %s\n", r.fragment, st.ToString().c_str());
      std::abort();  // never publish a version that is not durable
    }
    if (replicator_ != nullptr) {
      replicator_->Committed({"learners.json", syncer::DurableState::FragmentFileName(r.fragment)});
    }
  }
  log_.Round(sc, r);
  // Counted here, not from rounds_closed(): one Poll may close several rounds before their commits.
  if (!r.refused && checkpoint_every_ > 0 && ++commits_since_checkpoint_ >= checkpoint_every_ && !finishing_) {
    commits_since_checkpoint_ = 0;
    if (CheckpointFits()) checkpoints_.Offer(ThetaOf(sc), summary_.Of(sc, now));
  }
}

bool RoundCommitter::CheckpointFits() const {
  const uint64_t model_bytes = static_cast<uint64_t>(plan_.total_numel) * sizeof(float) + headroom_.commit_bytes();
  auto free = syncer::CommitHeadroom::FileSystemFreeBytes(out_);
  if (free.ok() && *free >= model_bytes) return true;
  std::fprintf(
      stderr, "syncer: warning: the periodic model write is skipped: %s\n",
      free.ok() ? fmt::format("{} bytes free in {}, it and the next commits need {}", *free, out_, model_bytes).c_str()
                : free.status().ToString().c_str());
  return false;
}

}  // namespace atl::runtime
