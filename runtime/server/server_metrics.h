// Counters the server keeps across requests and their Prometheus text exposition (/metrics):
// requests, tokens, tokens/s, expert hits per tier, bytes read, queue length, cache-aware routing.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "runtime/engine/model.h"  // CacheAwareStats, ForwardTimes, ExpertStoreStats
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

  // Engine figures for benchmarks (issue 22, bench/server/bench_streams.py). A batch step
  // (--parallel): its sequences and tokens, and the model's cumulative phase times and expert
  // counters after it, so /metrics is live while requests run; with --cache-aware the model's
  // counters since load become the cache-aware totals (a batch's requests share each layer's
  // substitutions, so there is no per-request share). The one-at-a-time path reports the phase
  // times at each request's end (forward_times).
  void batch_step(int sequences, int tokens, const ForwardTimes& times, const ExpertStoreStats& experts,
                  const CacheAwareStats& cache_aware_since_load);
  void forward_times(const ForwardTimes& times);
  // The running-batch gauge (sequences generating now), the batch step counters and the phase
  // times; appended to prometheus() by the HTTP API.
  std::string prometheus_engine(size_t running_sequences) const;

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
  uint64_t batch_steps_ = 0, batch_sequences_ = 0, batch_tokens_ = 0;  // issue 22
  ForwardTimes times_;
};

}  // namespace moestream
