// Wall-clock timing for phase counters and progress lines: one steady clock for the whole engine.
#pragma once

#include <chrono>

namespace moestream {

using Clock = std::chrono::steady_clock;

// Seconds elapsed since t0 on the steady clock.
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace moestream
