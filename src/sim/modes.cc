// The four training modes as event-driven models over a shared FailureTrace.
//
// The driver merges the trace's slice events with each model's own timers (pause ends, round
// completions, barrier ends) in one time order. Between two consecutive events a model's state
// is constant, so useful chip-seconds and advancing time are integrated exactly; the cost is
// proportional to the number of events, never to chips × time.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "atoll/sim/event_queue.h"
#include "atoll/sim/goodput.h"

namespace atl::sim {
namespace {

enum TimerKind : int { kPauseEnd = 1, kRoundDone = 2, kBarrierEnd = 3 };

// End of a pause of `pause` triggered at t when the current one ends at `end`: a pause under way
// (end > t) is extended to at least t + min(detect, pause), a new one lasts `pause`.
double ExtendPause(double end, double t, double pause, double detect) {
  if (end <= t) return t + pause;
  return std::max(end, t + std::min(detect, pause));
}

class ModeModel {
 public:
  virtual ~ModeModel() = default;
  virtual void OnSlice(double t, const SliceEvent& e, EventQueue& q) = 0;
  virtual void OnTimer(double t, const Event& e, EventQueue& q) = 0;
  // Chips doing useful work now, and whether the global model advances now.
  virtual double UsefulChips() const = 0;
  virtual bool Advancing() const = 0;
  // Useful chip-seconds already counted that turned out to be lost (rolled back).
  double lost_chip_seconds() const { return lost_; }

 protected:
  double lost_ = 0;
};

// Data-parallel without elasticity. The job holds J = slices − spares slices; the others form its
// spare pool. A failure of a job slice stalls the job: a healthy spare takes the slot and the job
// restarts (restart_s); with no healthy spare the slot stays empty until a slice returns from
// repair, and the restart begins once every slot is filled. Failures of spares only shrink the
// pool; returning slices refill empty slots first, then the pool.
class DataParallel final : public ModeModel {
 public:
  DataParallel(const GoodputParams& p, const FailureTrace& tr)
      : slice_chips_(tr.slice_chips),
        restart_s_(p.restart_s),
        detect_s_(p.detect_s),
        checkpoint_s_(p.checkpoint_s),
        in_job_(tr.slice_chips.size(), 0),
        pool_pos_(tr.slice_chips.size(), kNone) {
    const int64_t job_slices = static_cast<int64_t>(tr.slice_chips.size()) - SpareSlices(p);
    int64_t taken = 0;
    for (size_t s = 0; s < tr.slice_chips.size(); ++s) {
      if (tr.down_at_start[s]) continue;
      if (taken < job_slices) {
        in_job_[s] = 1;
        job_chips_ += tr.slice_chips[s];
        ++taken;
      } else {
        AddToPool(static_cast<int32_t>(s));
      }
    }
    missing_ = job_slices - taken;
    running_ = missing_ == 0;
  }

  void OnSlice(double t, const SliceEvent& e, EventQueue& q) override {
    const auto s = static_cast<size_t>(e.slice);
    if (e.up) {
      if (missing_ == 0) {
        AddToPool(e.slice);
        return;
      }
      Join(s);
      if (--missing_ == 0) Restart(t, q);
      return;
    }
    if (!in_job_[s]) {
      RemoveFromPool(e.slice);
      return;
    }
    if (running_) {
      // Progress since the last checkpoint is rolled back.
      if (checkpoint_s_ > 0) {
        lost_ += std::fmod(t - run_start_, checkpoint_s_) * static_cast<double>(job_chips_);
      }
      running_ = false;
    }
    in_job_[s] = 0;
    job_chips_ -= slice_chips_[s];
    ++gen_;  // a pending restart is superseded
    if (!pool_.empty()) {
      const int32_t spare = pool_.back();
      RemoveFromPool(spare);
      Join(static_cast<size_t>(spare));
      if (missing_ == 0) Restart(t, q);
    } else {
      ++missing_;
    }
  }

  void OnTimer(double t, const Event& e, EventQueue&) override {
    if (e.b != gen_ || missing_ > 0) return;
    running_ = true;
    run_start_ = t;
  }
  double UsefulChips() const override { return running_ ? static_cast<double>(job_chips_) : 0.0; }
  bool Advancing() const override { return running_; }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);

  // A restart already under way takes the new slice in once its failure is detected.
  void Restart(double t, EventQueue& q) {
    stalled_until_ = ExtendPause(stalled_until_, t, restart_s_, detect_s_);
    q.Push(stalled_until_, kPauseEnd, 0, ++gen_);
  }
  void Join(size_t s) {
    in_job_[s] = 1;
    job_chips_ += slice_chips_[s];
  }
  void AddToPool(int32_t s) {
    pool_pos_[static_cast<size_t>(s)] = pool_.size();
    pool_.push_back(s);
  }
  void RemoveFromPool(int32_t s) {
    const size_t k = pool_pos_[static_cast<size_t>(s)];
    pool_[k] = pool_.back();
    pool_pos_[static_cast<size_t>(pool_[k])] = k;
    pool_.pop_back();
    pool_pos_[static_cast<size_t>(s)] = kNone;
  }

  const std::vector<int64_t>& slice_chips_;
  double restart_s_, detect_s_, checkpoint_s_;
  std::vector<uint8_t> in_job_;
  std::vector<int32_t> pool_;     // healthy spares
  std::vector<size_t> pool_pos_;  // index of a slice in pool_, or kNone
  int64_t job_chips_ = 0;
  int64_t missing_ = 0;  // job slots without a slice
  bool running_ = true;
  double run_start_ = 0, stalled_until_ = 0;
  uint64_t gen_ = 0;
};

// M elastic islands (learners) over the slices dealt round-robin. A slice failure pauses its
// island for shrink_s, a return for grow_s. With rounds on (sync DiLoCo) an island also needs
// work left in the current round, and all islands meet at a barrier when every one is done.
// Elastic data-parallel is one island; Decoupled DiLoCo is M islands with a quorum.
class Islands final : public ModeModel {
 public:
  enum class Rule { kAny, kQuorum, kAll };

  Islands(const GoodputParams& p, const FailureTrace& tr, int m, Rule rule, bool rounds)
      : slice_chips_(tr.slice_chips),
        shrink_s_(p.shrink_s),
        grow_s_(p.grow_s),
        detect_s_(p.detect_s),
        barrier_s_(p.barrier_s),
        round_work_s_(static_cast<double>(p.inner_steps) * p.step_s),
        rounds_(rounds),
        need_(rule == Rule::kAll      ? m
              : rule == Rule::kQuorum ? p.quorum
                                      : 1),
        isl_(static_cast<size_t>(m)) {
    for (size_t s = 0; s < tr.slice_chips.size(); ++s) {
      if (!tr.down_at_start[s]) isl_[s % isl_.size()].healthy += tr.slice_chips[s];
    }
    for (auto& is : isl_) is.work_left = round_work_s_;
  }

  // Must be called once before the first event (schedules the first round completions).
  void Start(EventQueue& q) {
    for (size_t i = 0; i < isl_.size(); ++i) Refresh(0, i, q);
  }

  void OnSlice(double t, const SliceEvent& e, EventQueue& q) override {
    const size_t i = static_cast<size_t>(e.slice) % isl_.size();
    Island& is = isl_[i];
    Settle(t, is);
    const int64_t c = slice_chips_[static_cast<size_t>(e.slice)];
    is.healthy += e.up ? c : -c;
    is.paused = true;
    is.pause_end = ExtendPause(is.pause_end, t, e.up ? grow_s_ : shrink_s_, detect_s_);
    q.Push(is.pause_end, kPauseEnd, static_cast<int64_t>(i), ++is.pause_gen);
    Refresh(t, i, q);
  }

  void OnTimer(double t, const Event& e, EventQueue& q) override {
    if (e.kind == kBarrierEnd) {
      StartRound(t, q);
      return;
    }
    const size_t i = static_cast<size_t>(e.a);
    Island& is = isl_[i];
    if (e.kind == kPauseEnd) {
      if (e.b != is.pause_gen) return;
      Settle(t, is);
      is.paused = false;
      Refresh(t, i, q);
      return;
    }
    // kRoundDone
    if (e.b != is.work_gen || !is.training) return;
    is.timer_armed = false;
    Settle(t, is);
    is.work_left = 0;
    Refresh(t, i, q);
  }

  double UsefulChips() const override { return useful_chips_; }
  bool Advancing() const override { return training_count_ >= need_; }

 private:
  struct Island {
    int64_t healthy = 0;
    bool paused = false;
    bool training = false;
    double pause_end = 0;
    uint64_t pause_gen = 0;
    double work_left = 0;  // seconds of training left in this round (rounds only)
    double since = 0;      // when work_left was last brought up to date
    uint64_t work_gen = 0;
    double counted = 0;        // chips this island contributes to useful_chips_ (0 unless training)
    bool arrived = false;      // rounds only: done with this round, waiting at the barrier
    bool timer_armed = false;  // rounds only: a valid round-done timer is in the queue
  };

  void Settle(double t, Island& is) {
    if (rounds_ && is.training) is.work_left -= t - is.since;
    is.since = t;
  }

  // Rounds only: an island whose work is done (to rounding) waits at the barrier; the last one
  // to arrive starts the barrier. Checked on every refresh, so an island that reaches its work
  // at the same instant as a slice event (processed first) cannot be missed.
  void MaybeArrive(double t, Island& is, EventQueue& q) {
    if (!rounds_ || in_barrier_ || is.arrived || is.work_left > 1e-9) return;
    is.work_left = 0;
    is.arrived = true;
    if (++arrived_ < static_cast<int>(isl_.size())) return;
    in_barrier_ = true;
    if (barrier_s_ > 0) {
      q.Push(t + barrier_s_, kBarrierEnd);
    } else {
      StartRound(t, q);
    }
  }

  // Recomputes island i's training state and keeps the totals and round timer consistent.
  void Refresh(double t, size_t i, EventQueue& q) {
    Island& is = isl_[i];
    MaybeArrive(t, is, q);
    const bool now = !is.paused && is.healthy > 0 && (!rounds_ || (!in_barrier_ && is.work_left > 0));
    if (now != is.training) {
      // Every slice event pauses its island, so healthy never changes while an island trains
      // and `counted` is exactly what this island added when it started training.
      useful_chips_ -= is.counted;
      is.counted = now ? static_cast<double>(is.healthy) : 0.0;
      useful_chips_ += is.counted;
      training_count_ += now ? 1 : -1;
      is.training = now;
    }
    if (!rounds_) return;
    if (!now) {
      ++is.work_gen;  // any pending round-done timer is stale
      is.timer_armed = false;
    } else if (!is.timer_armed) {
      q.Push(t + is.work_left, kRoundDone, static_cast<int64_t>(i), ++is.work_gen);
      is.timer_armed = true;
    }
  }

  void StartRound(double t, EventQueue& q) {
    in_barrier_ = false;
    arrived_ = 0;
    for (auto& is : isl_) {
      is.work_left = round_work_s_;
      is.since = t;
      is.arrived = false;
    }
    for (size_t i = 0; i < isl_.size(); ++i) Refresh(t, i, q);
  }

  const std::vector<int64_t>& slice_chips_;
  double shrink_s_, grow_s_, detect_s_, barrier_s_, round_work_s_;
  bool rounds_;
  int need_;
  std::vector<Island> isl_;
  bool in_barrier_ = false;
  int arrived_ = 0;
  int training_count_ = 0;
  double useful_chips_ = 0;
};

// Replays the trace and the model's timers in time order up to the trace's duration.
RunResult Drive(ModeModel& model, EventQueue& q, const FailureTrace& tr) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double t = 0, useful = 0, advancing = 0;
  size_t k = 0;
  while (true) {
    const double next_slice = k < tr.events.size() ? tr.events[k].time : kInf;
    const double next_timer = q.empty() ? kInf : q.Top().time;
    const double next = std::min({next_slice, next_timer, tr.duration_s});
    useful += model.UsefulChips() * (next - t);
    if (model.Advancing()) advancing += next - t;
    t = next;
    if (next_slice > tr.duration_s && next_timer > tr.duration_s) break;
    // Slice events first at equal times: a failure at the instant a pause ends extends it.
    if (next_slice <= next_timer) {
      model.OnSlice(t, tr.events[k++], q);
    } else {
      model.OnTimer(t, q.Pop(), q);
    }
  }
  RunResult r;
  r.goodput = (useful - model.lost_chip_seconds()) / (static_cast<double>(tr.chips()) * tr.duration_s);
  r.uptime = advancing / tr.duration_s;
  r.failures = tr.failures;
  return r;
}

}  // namespace

RunResult SimulateMode(FleetMode mode, const GoodputParams& p, const FailureTrace& trace) {
  EventQueue q;
  switch (mode) {
    case FleetMode::kDataParallel: {
      DataParallel dp(p, trace);
      return Drive(dp, q, trace);
    }
    case FleetMode::kElasticDataParallel: {
      Islands m(p, trace, 1, Islands::Rule::kAny, /*rounds=*/false);
      m.Start(q);
      return Drive(m, q, trace);
    }
    case FleetMode::kSyncDiloco: {
      Islands m(p, trace, p.learners, Islands::Rule::kAll, /*rounds=*/true);
      m.Start(q);
      return Drive(m, q, trace);
    }
    case FleetMode::kDecoupledDiloco: {
      Islands m(p, trace, p.learners, Islands::Rule::kQuorum, /*rounds=*/false);
      m.Start(q);
      return Drive(m, q, trace);
    }
  }
  return {};
}

}  // namespace atl::sim
