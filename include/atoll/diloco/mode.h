// The three ways a run exchanges work, one enum for every layer (syncer, learner, runtime).
//   kDecoupled  Decoupled DiLoCo: staggered fragments, quorum K, grace window, sweep outer step.
//   kDiloco     synchronous DiLoCo: every fragment at the end of each H-step period, K = M.
//   kDdp        synchronous data-parallel through a parameter server (docs/decisions/006).
// Thread-safety: values and pure functions.
#pragma once

#include <string_view>

#include "atoll/core/enum_names.h"

namespace atl::diloco {

enum class Mode { kDecoupled, kDiloco, kDdp };
inline constexpr EnumNames<Mode, 3> kModeNames{
    "mode", {{{Mode::kDecoupled, "decoupled"}, {Mode::kDiloco, "diloco"}, {Mode::kDdp, "ddp"}}}};
constexpr const auto& NamesOf(Mode) { return kModeNames; }
inline const char* ModeName(Mode m) { return kModeNames.Name(m); }
// InvalidArgument for anything but the three names.
inline StatusOr<Mode> ParseMode(std::string_view s) { return kModeNames.Parse(s); }

// Synchronous modes wait for every learner at every round.
inline bool IsSynchronous(Mode m) { return m != Mode::kDecoupled; }

}  // namespace atl::diloco
