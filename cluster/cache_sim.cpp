// Implementation of cluster/cache_sim.h. Belady keeps residents ordered by next use in a std::set,
// so a 1M-access trace replays in well under a second.
#include "cluster/cache_sim.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <list>
#include <set>
#include <string>
#include <utility>

#include "common/error.h"
#include "loader/store/lfu_policy.h"

namespace moestream {

size_t CacheTrace::n_steps() const {
  return size_t(std::count(step_begins.begin(), step_begins.end(), uint8_t{1}));
}

CacheTrace make_cache_trace(const RoutingLog& log, bool decode_only) {
  CacheTrace t;
  t.n_layers = int(log.header.n_layers);
  t.n_experts = int(log.header.n_experts);
  bool have_prev = false;
  uint64_t prev_req = 0;
  uint32_t prev_pos = 0;
  for (const RoutingRecord& r : log.records) {
    if (decode_only && r.phase != RoutingPhase::kDecode) continue;
    const bool new_step = !have_prev || r.request_id != prev_req || r.position != prev_pos;
    have_prev = true, prev_req = r.request_id, prev_pos = r.position;
    t.group_begin.push_back(uint32_t(t.keys.size()));
    t.step_begins.push_back(new_step);
    for (uint16_t id : r.ids) t.keys.push_back(int(r.layer) * t.n_experts + int(id));
  }
  if (t.keys.empty())
    throw ConfigError(std::string("routing log has no ") + (decode_only ? "decode " : "") +
                      "records to replay");
  t.group_begin.push_back(uint32_t(t.keys.size()));
  return t;
}

namespace {

void check_capacity(const CacheTrace& t, int capacity) {
  uint32_t widest = 0;
  for (size_t g = 0; g < t.n_groups(); ++g)
    widest = std::max(widest, t.group_begin[g + 1] - t.group_begin[g]);
  if (capacity < int(widest))
    throw ConfigError("cache capacity " + std::to_string(capacity) + " experts is below the " +
                      std::to_string(widest) + " experts one layer needs at once");
}

}  // namespace

CacheSimResult simulate_lru(const CacheTrace& t, int capacity) {
  check_capacity(t, capacity);
  CacheSimResult r;
  std::list<int> order;  // most recent first
  std::vector<std::list<int>::iterator> where(size_t(t.n_layers) * size_t(t.n_experts), order.end());
  for (int key : t.keys) {
    ++r.accesses;
    auto& w = where[size_t(key)];
    if (w != order.end()) {
      ++r.hits;
      order.splice(order.begin(), order, w);
      continue;
    }
    // The least recent is never of the current group while capacity >= the group's width.
    if (int(order.size()) == capacity) {
      where[size_t(order.back())] = order.end();
      order.pop_back();
    }
    order.push_front(key);
    w = order.begin();
  }
  return r;
}

CacheSimResult simulate_policy(const CacheTrace& t, CachePolicy& policy,
                               const std::function<void(size_t group)>& before_group) {
  CacheSimResult r;
  std::vector<int> pinned;
  for (size_t g = 0; g < t.n_groups(); ++g) {
    if (t.step_begins[g] && g > 0) policy.advance_step();
    if (before_group) before_group(g);
    for (uint32_t i = t.group_begin[g]; i < t.group_begin[g + 1]; ++i) {
      const int key = t.keys[i];
      const CacheAccess a =
          policy.access(ExpertKey{key / t.n_experts, key % t.n_experts}, CacheFill::kDemand);
      ++r.accesses;
      r.hits += a.outcome == CacheOutcome::kHit;
      if (a.slot >= 0) {
        policy.pin(a.slot);
        pinned.push_back(a.slot);
      }
    }
    for (int s : pinned) policy.unpin(s);
    pinned.clear();
  }
  return r;
}

CacheSimResult simulate_lfu(const CacheTrace& t, int capacity, uint64_t aging_period) {
  check_capacity(t, capacity);
  LfuPolicy policy(uint32_t(capacity), aging_period);
  return simulate_policy(t, policy);
}

CacheSimResult simulate_belady(const CacheTrace& t, int capacity, bool bypass) {
  check_capacity(t, capacity);
  const size_t n = t.keys.size();
  const size_t n_keys = size_t(t.n_layers) * size_t(t.n_experts);
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  std::vector<uint64_t> next_use(n);
  {
    std::vector<uint64_t> seen(n_keys, kNever);
    for (size_t i = n; i-- > 0;) {
      next_use[i] = seen[size_t(t.keys[i])];
      seen[size_t(t.keys[i])] = i;
    }
  }
  CacheSimResult r;
  std::set<std::pair<uint64_t, int>> resident;  // (next use, key); never-used-again ties by key
  std::vector<uint64_t> cur(n_keys, 0);
  std::vector<uint8_t> is_res(n_keys, 0);
  std::vector<size_t> group_stamp(n_keys, size_t(-1));
  for (size_t g = 0; g < t.n_groups(); ++g) {
    for (uint32_t i = t.group_begin[g]; i < t.group_begin[g + 1]; ++i) {
      const int key = t.keys[i];
      ++r.accesses;
      if (is_res[size_t(key)]) {
        ++r.hits;
        resident.erase({cur[size_t(key)], key});
      } else {
        if (int(resident.size()) == capacity) {
          auto v = resident.end();
          do --v; while (group_stamp[size_t(v->second)] == g);  // the layer needs its experts
          if (bypass && next_use[i] >= v->first) {
            group_stamp[size_t(key)] = g;
            continue;  // served from scratch, the residents stay
          }
          is_res[size_t(v->second)] = 0;
          resident.erase(v);
        }
        is_res[size_t(key)] = 1;
      }
      cur[size_t(key)] = next_use[i];
      resident.insert({next_use[i], key});
      group_stamp[size_t(key)] = g;
    }
  }
  return r;
}

CacheSimResult simulate_lfru(const CacheTrace& t, int capacity, LfruPolicyOptions options) {
  check_capacity(t, capacity);
  // Every expert one byte: the budget in bytes is the capacity in experts.
  LfruPolicy policy(size_t(capacity), t.n_experts, std::vector<size_t>(size_t(t.n_layers), 1), options);
  return simulate_policy(t, policy);
}

CacheSimResult simulate_lrfu(const CacheTrace& t, int capacity, double half_life_steps,
                             bool admission) {
  check_capacity(t, capacity);
  const size_t n_keys = size_t(t.n_layers) * size_t(t.n_experts);
  // Per key: score at step `at`; aged to step s by 2^(-(s - at) / half_life).
  std::vector<double> score(n_keys, 0);
  std::vector<uint64_t> at(n_keys, 0);
  const double k = half_life_steps > 0 ? std::log(2.0) / half_life_steps : 0.0;
  auto aged = [&](int key, uint64_t step) { return score[size_t(key)] * std::exp(-k * double(step - at[size_t(key)])); };
  std::vector<int> resident;
  std::vector<uint8_t> is_res(n_keys, 0);
  std::vector<size_t> group_stamp(n_keys, size_t(-1));
  CacheSimResult r;
  uint64_t step = 0;
  for (size_t g = 0; g < t.n_groups(); ++g) {
    if (t.step_begins[g] && g > 0) ++step;
    for (uint32_t i = t.group_begin[g]; i < t.group_begin[g + 1]; ++i) {
      const int key = t.keys[i];
      ++r.accesses;
      score[size_t(key)] = aged(key, step) + 1;
      at[size_t(key)] = step;
      group_stamp[size_t(key)] = g;
      if (is_res[size_t(key)]) {
        ++r.hits;
        continue;
      }
      if (int(resident.size()) == capacity) {
        size_t victim = resident.size();
        double lowest = std::numeric_limits<double>::infinity();
        for (size_t j = 0; j < resident.size(); ++j) {
          if (group_stamp[size_t(resident[j])] == g) continue;
          if (const double sc = aged(resident[j], step); sc < lowest) lowest = sc, victim = j;
        }
        if (admission && score[size_t(key)] < lowest) continue;  // served from scratch
        is_res[size_t(resident[victim])] = 0;
        resident[victim] = resident.back();
        resident.pop_back();
      }
      resident.push_back(key);
      is_res[size_t(key)] = 1;
    }
  }
  return r;
}

CacheSimResult simulate_static_top(const CacheTrace& t, int capacity) {
  check_capacity(t, capacity);
  std::vector<uint64_t> count(size_t(t.n_layers) * size_t(t.n_experts), 0);
  for (int key : t.keys) ++count[size_t(key)];
  std::sort(count.begin(), count.end(), std::greater<>());
  CacheSimResult r;
  r.accesses = t.keys.size();
  for (size_t i = 0; i < count.size() && i < size_t(capacity); ++i) r.hits += count[i];
  return r;
}

}  // namespace moestream
