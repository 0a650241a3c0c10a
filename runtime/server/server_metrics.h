// Counters the server keeps across requests and their Prometheus text exposition (/metrics):
// requests, tokens, tokens/s, expert hits per tier, bytes read, queue length, cache-aware routing.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "runtime/model/cache_aware_router.h"
#include "loader/store/expert_store.h"
#include "runtime/server/job.h"

namespace moestream {

class ServerMetrics {
 public:
  void request_done(const JobResult& r, const ExpertStoreStats& experts);
  // Turns on the cache-aware routing metrics (the server runs with --cache-aware).
  void set_cache_aware(const CacheAwareOptions& opts);
  // A request whose client left while it waited in the queue (it never ran).
  void request_cancelled_waiting();
  void request_rejected() { rejected_++; }   // 503: queue full
  void request_failed() { failed_++; }       // 5xx from the engine
  void client_error() { client_errors_++; }  // 4xx
  // Prometheus text format 0.0.4.
  std::string prometheus(size_t queue_waiting, bool running, size_t queue_capacity) const;

 private:
  std::atomic<uint64_t> rejected_{0}, failed_{0}, client_errors_{0};
  mutable std::mutex mu_;
  uint64_t completed_ = 0, cancelled_ = 0;
  uint64_t prompt_tokens_ = 0, prompt_reused_ = 0, completion_tokens_ = 0;
  double prefill_s_ = 0, decode_s_ = 0, queue_s_ = 0;
  double last_decode_tps_ = 0, last_prefill_tps_ = 0;
  ExpertStoreStats experts_;
  CacheAwareOptions cache_aware_opts_;
  CacheAwareStats cache_aware_;  // summed over requests (each JobResult carries its own share)
};

}  // namespace moestream
