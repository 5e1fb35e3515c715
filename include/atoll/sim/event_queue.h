// EventQueue: the time-ordered queue at the heart of the fleet simulator.
//
// Events pop in order of time; events at the same time pop in the order they were pushed, so a
// simulation replays identically for a given seed (no dependence on heap layout or pointer
// values). Cost: O(log n) per push and pop. Thread-safety: none; one queue per simulation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <queue>
#include <vector>

namespace atl::sim {

struct Event {
  double time = 0;   // simulated seconds
  uint64_t seq = 0;  // push order; the tie-break for equal times
  int kind = 0;      // meaning is up to the owner of the queue
  int64_t a = 0;     // payload (e.g. learner id)
  uint64_t b = 0;    // payload (e.g. a generation counter that marks stale timers)
};

class EventQueue {
 public:
  void Push(double time, int kind, int64_t a = 0, uint64_t b = 0) { heap_.push(Event{time, next_seq_++, kind, a, b}); }
  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  // The earliest event; the queue must not be empty.
  const Event& Top() const { return heap_.top(); }
  Event Pop() {
    Event e = heap_.top();
    heap_.pop();
    return e;
  }

 private:
  struct Later {
    bool operator()(const Event& x, const Event& y) const { return x.time != y.time ? x.time > y.time : x.seq > y.seq; }
  };
  std::priority_queue<Event, std::vector<Event>, Later> heap_;
  uint64_t next_seq_ = 0;
};

}  // namespace atl::sim
