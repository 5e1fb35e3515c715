// AwaitFor: the one bounded wait of the tests that watch a process or a server they cannot join
// (a file appearing, a count reaching a value). Polls `done` every `every` on the real clock until
// it holds or `seconds` pass, and returns whether it held. The bound is only where a broken
// program stops being waited for: a test asserts the result, never the time it took.
#pragma once

#include <chrono>
#include <thread>

namespace atl::testing {

template <typename Done>
bool AwaitFor(Done&& done, double seconds, std::chrono::milliseconds every = std::chrono::milliseconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(every);
  }
}

}  // namespace atl::testing
