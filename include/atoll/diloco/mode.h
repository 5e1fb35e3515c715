// The three ways a run exchanges work, one enum for every layer (syncer, learner, runtime).
//   kDecoupled  Decoupled DiLoCo: staggered fragments, quorum K, grace window, sweep outer step.
//   kDiloco     synchronous DiLoCo: every fragment at the end of each H-step period, K = M.
//   kDdp        synchronous data-parallel through a parameter server (docs/decisions/006).
// Thread-safety: values and pure functions.
#pragma once

#include <optional>
#include <string_view>

namespace atl::diloco {

enum class Mode { kDecoupled, kDiloco, kDdp };

inline const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kDecoupled: return "decoupled";
    case Mode::kDiloco: return "diloco";
    case Mode::kDdp: return "ddp";
  }
  return "?";
}

// nullopt for anything but the three names.
inline std::optional<Mode> ParseMode(std::string_view s) {
  for (Mode m : {Mode::kDecoupled, Mode::kDiloco, Mode::kDdp}) {
    if (s == ModeName(m)) return m;
  }
  return std::nullopt;
}

// Synchronous modes wait for every learner at every round.
inline bool IsSynchronous(Mode m) { return m != Mode::kDecoupled; }

}  // namespace atl::diloco
