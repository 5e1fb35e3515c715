// One closed round as a JSON line: the syncer's metrics-syncer.jsonl (`kind` "round") and
// `atoll simulate`'s rounds.jsonl write the same fields (docs/observability.md).
#pragma once

#include <nlohmann/json.hpp>

#include "atoll/syncer/syncer_core.h"

namespace atl::runtime {

inline nlohmann::json RoundFields(const syncer::RoundReport& r) {
  if (r.refused) {
    return {{"kind", "round_refused"}, {"fragment", r.fragment},         {"round", r.round},
            {"version", r.version},    {"contributors", r.contributors}, {"refusal", r.refusal}};
  }
  return {{"kind", "round"},
          {"fragment", r.fragment},
          {"round", r.round},
          {"version", r.version},
          {"contributors", r.contributors},
          {"weights", r.weights},
          {"late", r.late},
          {"grace_s", r.grace_seconds},
          {"merged_norm", r.merged_norm},
          {"tokens_merged", r.tokens_merged},
          {"token_share", r.token_share},
          {"sweep", r.sweep_completed},
          {"step_norm", r.step_norm},
          {"close_s", r.close_seconds},
          {"reason", r.reason}};
}

}  // namespace atl::runtime
