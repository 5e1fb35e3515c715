// One compromised learner among four, with only its own credential, against the real syncer code:
// `atoll simulate` (SyncerCore in SyncerLoop, real LearnerAgents and models on simulated time,
// deterministic) with learner 3's pushes rewritten by an AdversarialSyncerApi (learner/adversary.h)
// under each attack. The global model's eval loss at the end stays within 5 % of the same run
// without the attack, and every fragment keeps advancing (docs/security.md).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "atoll/learner/adversary.h"
#include "atoll/model/data.h"
#include "atoll/runtime/simulate.h"
#include "test_util.h"

namespace atl::runtime {
namespace {

constexpr int kAttacker = 3;

const std::string& DataDir() { return model::testing::TinyByteData("adversary", 60000); }

RunConfig Fleet() {
  RunConfig c;
  c.learners = 4;
  c.steps = 64;
  c.seq = 32;
  c.batch = 4;
  c.fragments = 4;
  c.H = 4;
  c.tau = 1;
  c.warmup = 4;
  c.eval_batches = 8;
  c.eval_every = 0;
  c.data = DataDir();
  c.run_id = "adversary";
  return c;
}

SimulateResult RunUnder(learner::Attack attack) {
  SimulateOptions o;
  o.step_seconds = 1.0;
  o.spread = 0.1;
  o.jitter = 0.2;
  o.connect = [attack](int m, syncer::SyncerApi& syncer, Clock&) -> std::unique_ptr<syncer::SyncerApi> {
    if (m != kAttacker) return nullptr;
    return std::make_unique<learner::AdversarialSyncerApi>(syncer, attack);
  };
  auto r = Simulate(Fleet(), o);
  EXPECT_TRUE(r.ok()) << learner::AttackName(attack) << ": " << r.status();
  return r.ok() ? std::move(*r) : SimulateResult{};
}

// The simulated time of each fragment's last merged round.
std::map<int, double> LastAdvance(const SimulateResult& r) {
  std::map<int, double> last;
  for (const auto& line : r.round_log) {
    if (line.value("kind", "") != "round") continue;
    const int p = line.value("fragment", -1);
    last[p] = std::max(last[p], line.value("t", 0.0));
  }
  return last;
}

TEST(Adversary, OneCompromisedLearnerAmongFourCannotWreckOrFreezeTheModel) {
  const SimulateResult clean = RunUnder(learner::Attack::kNone);
  ASSERT_GT(clean.rounds, 0);
  const double clean_loss = clean.eval_loss;
  std::printf("%-13s %10s %8s %13s %14s\n", "attack", "eval loss", "ratio", "min version", "tokens merged");
  std::printf("%-13s %10.4f %8.4f %13lld %14.0f\n", "none", clean_loss, 1.0,
              static_cast<long long>(*std::min_element(clean.fragment_versions.begin(), clean.fragment_versions.end())),
              clean.tokens_merged);
  for (learner::Attack attack : learner::AllAttacks()) {
    const SimulateResult r = RunUnder(attack);
    ASSERT_EQ(r.fragment_versions.size(), 4u) << learner::AttackName(attack);
    const int64_t min_version = *std::min_element(r.fragment_versions.begin(), r.fragment_versions.end());
    const double ratio = r.eval_loss / clean_loss;
    std::printf("%-13s %10.4f %8.4f %13lld %14.0f\n", learner::AttackName(attack), r.eval_loss, ratio,
                static_cast<long long>(min_version), r.tokens_merged);
    std::fflush(stdout);
    EXPECT_LE(ratio, 1.05) << learner::AttackName(attack);
    // No fragment stops advancing: each merged a round in the last quarter of the run.
    const auto last = LastAdvance(r);
    for (int p = 0; p < 4; ++p) {
      EXPECT_GE(last.count(p) ? last.at(p) : 0.0, 0.75 * r.simulated_seconds)
          << learner::AttackName(attack) << ": fragment " << p << " stopped advancing";
    }
  }
}

}  // namespace
}  // namespace atl::runtime
