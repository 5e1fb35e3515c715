// What a push is credited with (its tokens in tokens_merged and the round's share, the steps its
// weight counts) is bounded by what the syncer saw: the time since the learner's previous push of
// the fragment at a bounded multiple of the other learners' step rate, and their rate per step
// (docs/security.md). Honest learners — faster, slower, with a bigger batch, back from an outage,
// after a syncer restart — are credited exactly what they claim.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <unistd.h>

#include "atoll/core/clock.h"
#include "atoll/syncer/durable_state.h"
#include "testing/small_core.h"

namespace atl::syncer {
namespace {

using testing::Fp32Values;
using testing::SmallCore;
using testing::SmallHeader;
using testing::SmallJoin;
using testing::SmallOptions;

constexpr int kP = 2;  // SmallCore's fragments: a token counts 1/P per fragment
constexpr int64_t kHuge = int64_t{1} << 40;

// A learner that pushes fragment 0 every H of its steps, claiming what it trained since its
// previous push (or a claim of the test's choosing).
struct Member {
  double step_s = 1.0;   // seconds per inner step
  int64_t tps = 100;     // tokens per step
  double last_push = 0;  // when it last pushed (its steps since then are its claim)
  double next_push = 0;
  double claimed = 0;  // Σ c_tokens of its accepted pushes
  double start = 0;    // when it joined: its heartbeats count its steps from there
  // From fast_from on (seconds on the test's clock) a step takes fast_step_s instead.
  double fast_from = std::numeric_limits<double>::infinity(), fast_step_s = 0;
  double heartbeat_lag_s = 0;  // its heartbeats carry its steps of this long ago (a loaded host)
  // Its steps since it joined, at time t, and the time at which it has made n of them.
  double StepsAt(double t) const {
    return (std::min(t, fast_from) - start) / step_s + (t > fast_from ? (t - fast_from) / fast_step_s : 0.0);
  }
  double TimeOf(double n) const {
    const double slow = (fast_from - start) / step_s;
    return n <= slow ? start + n * step_s : fast_from + (n - slow) * fast_step_s;
  }
};

class Fleet {
 public:
  explicit Fleet(SyncerOptions o = SmallOptions()) : core_(SmallCore(o)) {}

  void Add(int id, double step_s, int64_t tps) {
    ASSERT_TRUE(core_.Join(SmallJoin(id), clock_.Now()).ok());
    members_[id] = {step_s, tps, Seconds(), Seconds() + core_.options().H * step_s, 0, Seconds()};
  }
  // Members send heartbeats every 0.5 s with the steps and tokens they trained (their pace), pushing
  // or not.
  bool heartbeats_ = false;
  double next_heartbeat_ = 0.5;
  void Heartbeats() {
    for (auto& [id, m] : members_) {
      LearnerProgress p;
      p.step = static_cast<int64_t>(m.StepsAt(std::max(m.start, Seconds() - m.heartbeat_lag_s)));
      p.tokens = p.step * m.tps;
      ASSERT_TRUE(core_.Heartbeat(id, p, clock_.Now()).ok());
    }
  }
  double Seconds() const { return ToSeconds(clock_.Now()); }
  // Runs every member's pushes due until `until` (simulated seconds), in time order.
  void RunUntil(double until, const std::map<int, bool>& silent = {}) {
    for (;;) {
      auto next = members_.end();
      for (auto it = members_.begin(); it != members_.end(); ++it) {
        if (silent.count(it->first) == 0 && (next == members_.end() || it->second.next_push < next->second.next_push))
          next = it;
      }
      if (heartbeats_ && next_heartbeat_ <= until &&
          (next == members_.end() || next_heartbeat_ < next->second.next_push)) {
        clock_.Set(TimePoint{} + FromSeconds(next_heartbeat_));
        Heartbeats();
        next_heartbeat_ += 0.5;
        continue;
      }
      if (next == members_.end() || next->second.next_push > until) break;
      clock_.Set(TimePoint{} + FromSeconds(next->second.next_push));
      auto r = PushHonest(next->first);
      ASSERT_TRUE(r.ok()) << "learner " << next->first << ": " << r.status();
    }
    clock_.Set(TimePoint{} + FromSeconds(until));
  }
  // Member `id` pushes now what it trained since its previous push.
  StatusOr<PushResult> PushHonest(int id) {
    Member& m = members_.at(id);
    const auto steps = static_cast<int64_t>(std::llround(m.StepsAt(Seconds()) - m.StepsAt(m.last_push)));
    auto r = Push(id, steps, steps * m.tps);
    m.last_push = Seconds();
    m.next_push = m.TimeOf(m.StepsAt(Seconds()) + core_.options().H);
    return r;
  }
  StatusOr<PushResult> Push(int id, int64_t c_steps, int64_t c_tokens) {
    PushHeaderData h = SmallHeader(core_, id, 0, core_.version(0));
    h.c_steps = c_steps;
    h.c_tokens = c_tokens;
    auto r = core_.Push(h, Fp32Values(0.01f), clock_.Now());
    if (r.ok()) members_.at(id).claimed += static_cast<double>(c_tokens);
    last_rounds_ = core_.Poll(clock_.Now(), clock_);
    return r;
  }
  void Rejoin(int id) {
    JoinRequestData j = SmallJoin(id);
    j.rejoin = true;
    ASSERT_TRUE(core_.Join(j, clock_.Now()).ok());
  }
  // Tokens the syncer credited to `id`, and what its accepted pushes claimed (per fragment: 1/P).
  double Credited(int id) const { return core_.learners().at(id).tokens_merged; }
  double Claimed(int id) const { return members_.at(id).claimed / kP; }

  ManualClock clock_;
  SyncerCore core_;
  std::map<int, Member> members_;
  std::vector<RoundReport> last_rounds_;
};

TEST(PushCredit, HonestLearnersAreCreditedExactlyWhatTheyClaim) {
  Fleet f;
  f.Add(0, 1.0, 100);
  f.Add(1, 0.4, 100);  // 2.5x faster hardware
  f.Add(2, 2.0, 100);  // 2x slower
  f.Add(3, 1.0, 200);  // a unit of two ranks: twice the batch
  f.RunUntil(120);
  for (int id = 0; id < 4; ++id) {
    EXPECT_GT(f.Claimed(id), 0) << "learner " << id;
    EXPECT_DOUBLE_EQ(f.Credited(id), f.Claimed(id)) << "learner " << id;
  }
  // Back from a 40 s outage (it trained all along, rejoined, then pushed all of it): every step.
  f.RunUntil(160, {{0, true}});
  f.Rejoin(0);
  auto back = f.PushHonest(0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->note.find("credited"), std::string::npos) << back->note;
  f.RunUntil(200);
  for (int id = 0; id < 4; ++id) EXPECT_DOUBLE_EQ(f.Credited(id), f.Claimed(id)) << "learner " << id;
}

TEST(PushCredit, ALearnersOwnPaceBoundsWhatItClaimsAtTheOthersRate) {
  Fleet f;
  f.heartbeats_ = true;
  for (int id = 0; id < 4; ++id) f.Add(id, 1.0, 100);
  f.RunUntil(30, {{3, true}});
  // Its heartbeats say one step a second (as the others'), its pushes claim eight: it is credited
  // at most pace_slack (2) x its pace since it joined, not the 4x of the others' rate a learner
  // without heartbeats may be.
  for (int i = 0; i < 30; ++i) {
    f.RunUntil(f.Seconds() + 2, {{3, true}});
    ASSERT_TRUE(f.Push(3, 16, 1600).ok());
  }
  EXPECT_LE(f.Credited(3), (SyncerOptions{}.pace_slack * f.Seconds() + 2) * 100 / kP);
  EXPECT_LT(f.Credited(3), 0.5 * f.Claimed(3));
  for (int id = 0; id < 3; ++id) EXPECT_DOUBLE_EQ(f.Credited(id), f.Claimed(id)) << "learner " << id;
}

TEST(PushCredit, HonestPacesAreCreditedInFull) {
  Fleet f;
  f.heartbeats_ = true;
  f.Add(0, 1.0, 100);
  f.Add(1, 0.4, 100);
  f.Add(2, 2.0, 100);
  f.Add(3, 1.0, 200);
  f.RunUntil(120);
  for (int id = 0; id < 4; ++id) {
    EXPECT_GT(f.core_.learners().at(id).pace.step_rate, 0) << "learner " << id;
    EXPECT_DOUBLE_EQ(f.Credited(id), f.Claimed(id)) << "learner " << id;
  }
}

TEST(PushCredit, AnHonestLearnerThatSpeedsUpIsCreditedEveryStepAtOnce) {
  // Learner 0 makes one step a second for 4 s, then six (its neighbours on the host finished and
  // freed their cores); the others make two. Bounded by a rate of its own measured over 2 s
  // windows (an EMA), the speed-up outran the measurement: its pushes were cut for seconds.
  // Bounded by the steps its heartbeats counted, every step it made is credited.
  Fleet f;
  f.heartbeats_ = true;
  f.Add(0, 1.0, 100);
  for (int id = 1; id < 4; ++id) f.Add(id, 0.5, 100);
  f.members_.at(0).fast_from = 4.0;
  f.members_.at(0).fast_step_s = 1.0 / 6;
  f.RunUntil(16);
  EXPECT_GT(f.Claimed(0), 60 * 100 / kP);
  for (int id = 0; id < 4; ++id) EXPECT_DOUBLE_EQ(f.Credited(id), f.Claimed(id)) << "learner " << id;
}

// The syncer of fleet f restarted from its durable state: a new process on f's clock.
std::unique_ptr<Fleet> Restarted(Fleet& f, const std::string& name) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("atoll-" + name + "-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  DurableState state(dir);
  EXPECT_TRUE(state.SaveAll(f.core_).ok());
  SyncerOptions o = SmallOptions();
  o.incarnation = 2;
  auto g = std::make_unique<Fleet>(o);
  g->clock_.Set(f.clock_.Now());
  EXPECT_TRUE(state.Restore(g->core_, g->clock_.Now()).ok());
  std::filesystem::remove_all(dir);
  return g;
}

// Four learners of one step a second for 12 s; learner 3's heartbeats carry its steps of 6 s ago.
void RunWithLateHeartbeats(Fleet& f) {
  f.heartbeats_ = true;
  for (int id = 0; id < 4; ++id) f.Add(id, 1.0, 100);
  f.members_.at(3).heartbeat_lag_s = 6;
  f.RunUntil(12);
}

TEST(PushCredit, StepsItsHeartbeatsHaveNotCountedYetAreHeldAndCreditedWhenTheyAre) {
  // Learner 3's heartbeats carry its steps of 6 s ago (a loaded host delays them): its pushes claim
  // steps its latest heartbeat has not counted. Dropped, they cost a never-killed learner of a
  // loaded chaos run up to 8,576 of its 30,720 tokens; held, they are credited once counted.
  Fleet f;
  RunWithLateHeartbeats(f);
  const LearnerRecord& l = f.core_.learners().at(3);
  ASSERT_FALSE(l.held.empty());
  EXPECT_GT(l.held[0].steps, 0);
  EXPECT_LT(f.Credited(3), f.Claimed(3));
  f.RunUntil(60);
  // Its last progress, as a learner sends it before it leaves: every step it claimed is counted.
  f.members_.at(3).heartbeat_lag_s = 0;
  f.Heartbeats();
  EXPECT_DOUBLE_EQ(l.held[0].steps, 0);
  for (int id = 0; id < 4; ++id) EXPECT_DOUBLE_EQ(f.Credited(id), f.Claimed(id)) << "learner " << id;
}

TEST(PushCredit, HeldStepsSurviveARestart) {
  Fleet f;
  RunWithLateHeartbeats(f);
  const LearnerRecord::Held held = f.core_.learners().at(3).held.at(0);
  ASSERT_GT(held.steps, 0);
  auto restarted = Restarted(f, "held");
  const Fleet& g = *restarted;
  const LearnerRecord& l = g.core_.learners().at(3);
  ASSERT_EQ(l.held.size(), f.core_.learners().at(3).held.size());
  EXPECT_DOUBLE_EQ(l.held[0].steps, held.steps);
  EXPECT_DOUBLE_EQ(l.held[0].tokens, held.tokens);
  EXPECT_DOUBLE_EQ(g.Credited(3), f.Credited(3));
}

TEST(PushCredit, APaceIsMeasuredOverWindowsAndStartsAgainWithARestartedProcess) {
  LearnerRecord l;
  LearnerProgress p;
  for (int i = 0; i <= 10; ++i) {  // two steps a second, 50 tokens each, heartbeats every 0.5 s
    p.step = i;
    p.tokens = 50 * i;
    SyncerCore::UpdatePace(l, p, TimePoint{} + FromSeconds(0.5 * i));
  }
  EXPECT_DOUBLE_EQ(l.pace.step_rate, 2.0);
  EXPECT_DOUBLE_EQ(l.pace.tokens_per_step, 50.0);
  p.step = 1;  // a new process counts from its own start: no sample, a new window
  p.tokens = 50;
  SyncerCore::UpdatePace(l, p, TimePoint{} + FromSeconds(6));
  EXPECT_DOUBLE_EQ(l.pace.step_rate, 2.0);
  EXPECT_EQ(l.pace.step, 1);
}

TEST(PushCredit, StepsClaimedBeyondTheTimeThatPassedAreNotCredited) {
  Fleet f;
  for (int id = 0; id < 3; ++id) f.Add(id, 1.0, 100);
  f.Add(3, 1.0, 100);
  f.RunUntil(4, {{3, true}});
  // Every 2 s the attacker claims 2^40 steps at the others' rate per step.
  for (int i = 0; i < 45; ++i) {
    f.RunUntil(f.Seconds() + 2, {{3, true}});
    auto r = f.Push(3, kHuge, 100 * kHuge);
    ASSERT_TRUE(r.ok()) << r.status();
    if (i == 0) {
      EXPECT_NE(r->note.find("the time since its previous push allows no more"), std::string::npos) << r->note;
    }
  }
  // At most 4x the others' step rate over its 100 s, plus one push's worth (H steps) carried.
  const double bound = (4 * 1.0 * 100 + 2) * 100 / kP;
  EXPECT_LE(f.Credited(3), bound);
  EXPECT_LE(f.Credited(3), 4.05 * f.Credited(0));
  for (int id = 0; id < 3; ++id) EXPECT_DOUBLE_EQ(f.Credited(id), f.Claimed(id)) << "learner " << id;
}

TEST(PushCredit, PushesMoreOftenThanStepsAllowGetNoMoreCredit) {
  Fleet f;
  for (int id = 0; id < 3; ++id) f.Add(id, 1.0, 100);
  f.Add(3, 1.0, 100);
  f.RunUntil(4, {{3, true}});
  // H = 2 steps claimed every 25 ms: 80 steps per second claimed, the time allows 4.
  int64_t pushes = 0;
  while (f.Seconds() < 60) {
    f.RunUntil(f.Seconds() + 0.025, {{3, true}});
    ASSERT_TRUE(f.Push(3, 2, 200).ok());
    ++pushes;
  }
  EXPECT_GT(f.Claimed(3), 15 * f.Credited(3)) << pushes << " pushes";
  EXPECT_LE(f.Credited(3), (4 * 1.0 * 60 + 2) * 100 / kP);
}

TEST(PushCredit, ARatePerStepClaimedBeforeAnyOtherPushIsJudgedWhenItsRoundCloses) {
  SyncerOptions o = SmallOptions();
  o.round.quorum = 4;  // the round closes once all four pushed
  Fleet f(o);
  for (int id = 0; id < 4; ++id) f.Add(id, 1.0, 100);
  f.clock_.AdvanceSeconds(2);
  ASSERT_TRUE(f.Push(3, 2, kHuge).ok());  // first: nothing to judge its rate by yet
  for (int id = 0; id < 3; ++id) ASSERT_TRUE(f.Push(id, 2, 200).ok());
  ASSERT_EQ(f.last_rounds_.size(), 1u);
  EXPECT_DOUBLE_EQ(f.Credited(3), 4 * 200.0 / kP);  // 4x the others' rate per step
  EXPECT_DOUBLE_EQ(f.core_.tokens_merged(), (3 * 200 + 800) / double{kP});
}

TEST(PushCredit, OneRateNobodyCouldJudgeCannotShrinkEveryOtherRoundsShare) {
  Fleet f;
  for (int id = 0; id < 4; ++id) f.Add(id, 1.0, 100);
  f.clock_.AdvanceSeconds(2);
  // The very first push of the run, alone in its round: its claim stands (no other learner has
  // pushed anything to judge it by); it must not make a full round so large that honest rounds
  // move Θ by nothing.
  ASSERT_TRUE(f.Push(3, 1, int64_t{1} << 50).ok());
  ASSERT_TRUE(f.Push(0, 2, 200).ok());
  ASSERT_EQ(f.last_rounds_.size(), 1u);
  // A full round: the live learners' rates per step, each counted as at most the members' upper
  // median (100): the honest push holds one of four learners' H steps.
  EXPECT_DOUBLE_EQ(f.last_rounds_[0].token_share, 0.25);
  // Once two others have a rate, what its claim exceeded of 4x theirs is taken back.
  ASSERT_TRUE(f.Push(1, 2, 200).ok());
  f.core_.Poll(f.clock_.Now(), f.clock_);
  EXPECT_DOUBLE_EQ(f.Credited(3), 4 * 100.0 / kP);
}

TEST(PushCredit, AfterARestartTheFirstPushesAreCreditedAndClaimsStayBounded) {
  Fleet f;
  for (int id = 0; id < 4; ++id) f.Add(id, 1.0, 100);
  f.RunUntil(30);
  auto restarted = Restarted(f, "credit");
  Fleet& g = *restarted;
  g.members_ = f.members_;
  for (auto& [id, m] : g.members_) m.claimed = 0;
  for (int id = 0; id < 4; ++id) g.Rejoin(id);
  // 100 ms after the restart, a learner pushes the H steps it trained meanwhile: all credited.
  g.clock_.AdvanceSeconds(0.1);
  auto first = g.Push(0, 2, 200);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->note.find("credited"), std::string::npos) << first->note;
  // The others' rates were saved with the learner table: a claim of 2^40 steps is bounded at once.
  auto huge = g.Push(3, kHuge, 100 * kHuge);
  ASSERT_TRUE(huge.ok()) << huge.status();
  EXPECT_NE(huge->note.find("credited"), std::string::npos) << huge->note;
  EXPECT_LT(g.Credited(3) - f.Credited(3), 100.0 * 100);
}

}  // namespace
}  // namespace atl::syncer
