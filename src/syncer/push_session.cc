// Push sessions (docs/decisions/019): every join gets a session no other join of any syncer
// process gets, and a push is judged only once in it — a replay of a captured push, a duplicate
// delivery or a push sent before the learner's latest join is refused, never merged or counted.
#include <fmt/format.h>

#include "atoll/core/checksum.h"
#include "atoll/syncer/syncer_core.h"

namespace atl::syncer {

uint64_t SyncerCore::NewPushSession(int id) {
  // Unique within this process through the counter, across processes through the incarnation
  // (a new value at every start): a push captured in an earlier session never matches a later one.
  sessions_issued_ += 1;
  const uint64_t parts[3] = {options_.incarnation, static_cast<uint64_t>(id), sessions_issued_};
  const uint64_t session = Checksum64(parts, sizeof(parts));
  return session != 0 ? session : 1;
}

Status SyncerCore::CheckPushSession(const LearnerRecord& l, const PushHeaderData& h) const {
  if (l.push_session == 0 || h.push_session != l.push_session) {
    return NotFoundError(
        fmt::format("push from learner {} in push session {:016x}, which is not the session of its "
                    "latest join with this syncer: join again first",
                    l.id, h.push_session));
  }
  if (h.push_seq <= l.push_seq) {
    return AlreadyExistsError(
        fmt::format("push from learner {}: sequence number {} of its session was already used "
                    "(the syncer has judged up to {}): a replay, refused",
                    l.id, h.push_seq, l.push_seq));
  }
  return Status::Ok();
}

}  // namespace atl::syncer
