// Implementation of runtime/server/server_metrics.h.
#include "runtime/server/server_metrics.h"

#include <cstdio>

#include "common/option_ref.h"
#include "runtime/engine/options.h"

namespace moestream {

void ServerMetrics::request_done(const JobResult& r, const ExpertStoreStats& experts) {
  std::lock_guard<std::mutex> lk(mu_);
  ++completed_;
  cancelled_ += r.finish_reason == "cancelled";
  prompt_tokens_ += uint64_t(r.prompt_tokens);
  prompt_reused_ += uint64_t(r.prompt_tokens_reused);
  completion_tokens_ += uint64_t(r.completion_tokens);
  prefill_s_ += r.prefill_s;
  decode_s_ += r.decode_s;
  queue_s_ += r.queue_s;
  // Decode tokens/s counts forward passes after the first sampled token (as infer does).
  if (r.decode_s > 0 && r.completion_tokens > 1) last_decode_tps_ = (r.completion_tokens - 1) / r.decode_s;
  const int processed = r.prompt_tokens - r.prompt_tokens_reused;
  if (r.prefill_s > 0 && processed > 0) last_prefill_tps_ = processed / r.prefill_s;
  experts_ = experts;
  if (r.cache_aware) cache_aware_ += *r.cache_aware;
}

void ServerMetrics::request_cancelled_waiting() {
  std::lock_guard<std::mutex> lk(mu_);
  ++cancelled_;  // never ran: not in completed_, no tokens
}

void ServerMetrics::set_cache_aware(const CacheAwareOptions& opts) {
  std::lock_guard<std::mutex> lk(mu_);
  cache_aware_opts_ = opts;
}

namespace {
// help names the server's options with marks, spelled here as its flags.
void metric(std::string& out, const char* name, const char* type, const std::string& help, double v,
            const char* labels = "") {
  char buf[512];
  std::snprintf(buf, sizeof buf, "# HELP %s %s\n# TYPE %s %s\n%s%s %.17g\n", name,
                render_options(help, OptionCaller::kCli).c_str(), name, type, name, labels, v);
  out += buf;
}
void sample(std::string& out, const char* name, const char* labels, double v) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s%s %.17g\n", name, labels, v);
  out += buf;
}
}  // namespace

std::string ServerMetrics::prometheus(size_t queue_waiting, bool running, size_t queue_capacity) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string o;
  metric(o, "moestream_requests_completed_total", "counter", "Generation requests finished (cancelled included).", double(completed_));
  metric(o, "moestream_requests_cancelled_total", "counter", "Requests whose client disconnected before the end (while running or waiting).", double(cancelled_));
  metric(o, "moestream_requests_rejected_total", "counter", "Requests refused with 503: the job queue or the HTTP connection backlog was full.", double(rejected_));
  metric(o, "moestream_requests_failed_total", "counter", "Requests that failed inside the engine (5xx).", double(failed_));
  metric(o, "moestream_requests_invalid_total", "counter", "Requests refused with a 4xx error.", double(client_errors_));
  metric(o, "moestream_queue_length", "gauge", "Requests waiting for the engine.", double(queue_waiting));
  metric(o, "moestream_queue_capacity", "gauge", "Requests that may wait before 503.", double(queue_capacity));
  metric(o, "moestream_requests_running", "gauge", "Requests being generated now (0 or 1).", running ? 1 : 0);
  metric(o, "moestream_prompt_tokens_total", "counter", "Prompt tokens of all requests.", double(prompt_tokens_));
  metric(o, "moestream_prompt_tokens_reused_total", "counter", "Prompt tokens served from the previous request's KV cache.", double(prompt_reused_));
  metric(o, "moestream_prompt_tokens_processed_total", "counter", "Prompt tokens run through the model.", double(prompt_tokens_ - prompt_reused_));
  metric(o, "moestream_completion_tokens_total", "counter", "Generated tokens.", double(completion_tokens_));
  metric(o, "moestream_prefill_seconds_total", "counter", "Wall time in prompt processing.", prefill_s_);
  metric(o, "moestream_decode_seconds_total", "counter", "Wall time in token generation.", decode_s_);
  metric(o, "moestream_queue_seconds_total", "counter", "Wall time requests waited in the queue.", queue_s_);
  metric(o, "moestream_decode_tokens_per_second", "gauge", "Decode tokens/s of the last request.", last_decode_tps_);
  metric(o, "moestream_prefill_tokens_per_second", "gauge", "Prompt tokens/s of the last request.", last_prefill_tps_);
  const auto& e = experts_;
  metric(o, "moestream_expert_requests_total", "counter", "Experts asked of the expert store.", double(e.experts_requested));
  o += "# HELP moestream_expert_hits_total Requested experts by the tier that served them: host_cache (no read), page_cache (resident pages, copied or computed in place), storage (the rest: read or faulted in from the device).\n";
  o += "# TYPE moestream_expert_hits_total counter\n";
  // The tiers partition the requests. Storage is what neither host tier held; experts_read is no
  // measure of it: experts computed in place are not reads, and a look-ahead may read experts
  // nobody asks for.
  const double storage = double(e.experts_requested) - double(e.host_cache_hits) - double(e.page_cache_hits);
  sample(o, "moestream_expert_hits_total", "{tier=\"host_cache\"}", double(e.host_cache_hits));
  sample(o, "moestream_expert_hits_total", "{tier=\"page_cache\"}", double(e.page_cache_hits));
  sample(o, "moestream_expert_hits_total", "{tier=\"storage\"}", storage > 0 ? storage : 0);
  o += "# HELP moestream_expert_hit_ratio Share of requested experts served by each tier.\n";
  o += "# TYPE moestream_expert_hit_ratio gauge\n";
  const double req = e.experts_requested ? double(e.experts_requested) : 1;
  sample(o, "moestream_expert_hit_ratio", "{tier=\"host_cache\"}", double(e.host_cache_hits) / req);
  sample(o, "moestream_expert_hit_ratio", "{tier=\"page_cache\"}", double(e.page_cache_hits) / req);
  sample(o, "moestream_expert_hit_ratio", "{tier=\"storage\"}", (storage > 0 ? storage : 0) / req);
  metric(o, "moestream_expert_reads_total", "counter", "Experts read from files.", double(e.experts_read));
  metric(o, "moestream_expert_bytes_read_total", "counter", "Expert payload bytes read from files.", double(e.bytes_read));
  metric(o, "moestream_expert_io_wait_seconds_total", "counter", "Time the engine blocked on expert reads.", e.io_wait_seconds);
  metric(o, "moestream_cache_aware_enabled", "gauge", "1 when routing substitutes resident experts (" + option_ref("cache_aware") + ").", cache_aware_opts_.enabled ? 1 : 0);
  if (cache_aware_opts_.enabled) {
    const auto& c = cache_aware_;
    metric(o, "moestream_cache_aware_tolerance", "gauge", option_ref("cache_tolerance") + ": fraction of the top-k router logit range.", double(cache_aware_opts_.tolerance));
    metric(o, "moestream_cache_aware_union", "gauge", "1 when a batch step's earlier choices count as resident (" + option_ref("cache_aware_union") + ").", cache_aware_opts_.batch_union ? 1 : 0);
    metric(o, "moestream_cache_aware_routings_total", "counter", "(token, layer) routings under cache-aware routing.", double(c.routings));
    metric(o, "moestream_cache_aware_slots_total", "counter", "(token, layer, slot) expert choices.", double(c.slots));
    metric(o, "moestream_cache_aware_slots_unchanged_total", "counter", "Expert choices left as exact top-k chose them.", double(c.slots_unchanged));
    metric(o, "moestream_cache_aware_substitutions_total", "counter", "Expert choices replaced by a resident expert.", double(c.substitutions));
    metric(o, "moestream_cache_aware_misses_before_total", "counter", "Distinct non-resident experts per layer chunk that exact top-k would read.", double(c.misses_before));
    metric(o, "moestream_cache_aware_misses_after_total", "counter", "Distinct non-resident experts per layer chunk actually read.", double(c.misses_after));
    metric(o, "moestream_cache_aware_agreement", "gauge", "Share of expert choices unchanged, over all requests.", c.agreement());
  }
  return o;
}

void ServerMetrics::batch_step(int sequences, int tokens, const ForwardTimes& times,
                               const ExpertStoreStats& experts, const CacheAwareStats& cache_aware_since_load) {
  std::lock_guard<std::mutex> lk(mu_);
  ++batch_steps_;
  if (cache_aware_opts_.enabled) cache_aware_ = cache_aware_since_load;
  batch_sequences_ += uint64_t(sequences);
  batch_tokens_ += uint64_t(tokens);
  times_ = times;
  experts_ = experts;
}

void ServerMetrics::forward_times(const ForwardTimes& times) {
  std::lock_guard<std::mutex> lk(mu_);
  times_ = times;
}

std::string ServerMetrics::prometheus_engine(size_t running_sequences) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string o;
  metric(o, "moestream_sequences_running", "gauge", "Sequences in the running batch now (" + option_ref("parallel") + "; 0 or 1 without).", double(running_sequences));
  metric(o, "moestream_batch_steps_total", "counter", "Batch forward steps (" + option_ref("parallel") + " > 1).", double(batch_steps_));
  metric(o, "moestream_batch_sequences_total", "counter", "Sequences summed over batch steps (/ steps = mean batch size).", double(batch_sequences_));
  metric(o, "moestream_batch_tokens_total", "counter", "Tokens summed over batch steps (decode tokens and prefill chunks).", double(batch_tokens_));
  o += "# HELP moestream_forward_seconds_total Wall time of the model's forward passes per phase (expert_io: waiting for expert reads).\n";
  o += "# TYPE moestream_forward_seconds_total counter\n";
  sample(o, "moestream_forward_seconds_total", "{phase=\"attention\"}", times_.attention_s);
  sample(o, "moestream_forward_seconds_total", "{phase=\"router\"}", times_.router_s);
  sample(o, "moestream_forward_seconds_total", "{phase=\"expert_io\"}", times_.expert_io_s);
  sample(o, "moestream_forward_seconds_total", "{phase=\"expert_compute\"}", times_.expert_compute_s);
  sample(o, "moestream_forward_seconds_total", "{phase=\"other\"}", times_.other_s);
  return o;
}

}  // namespace moestream
