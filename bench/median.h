// The median the benchmarks report of repeated timings: one slow run (a page fault, a scheduler
// tick) does not move it as it moves a mean. Header-only.
#pragma once

#include <algorithm>
#include <vector>

namespace moestream::bench {

// The middle value after sorting (of an even count, the upper of the two); 0 for none.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace moestream::bench
