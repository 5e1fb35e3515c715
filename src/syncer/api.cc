#include "atoll/syncer/api.h"

namespace atl::syncer {

const char* LearnerStateName(LearnerState s) {
  switch (s) {
    case LearnerState::kJoining: return "joining";
    case LearnerState::kTraining: return "training";
    case LearnerState::kDone: return "done";
  }
  return "?";
}

std::optional<LearnerState> ParseLearnerState(std::string_view s) {
  for (LearnerState x : {LearnerState::kJoining, LearnerState::kTraining, LearnerState::kDone}) {
    if (s == LearnerStateName(x)) return x;
  }
  return std::nullopt;
}

}  // namespace atl::syncer
