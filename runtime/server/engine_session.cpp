// Implementation of runtime/server/engine_session.h.
#include "common/timing.h"
#include "runtime/server/engine_session.h"

#include <algorithm>
#include <chrono>

#include "runtime/server/stop_matcher.h"

namespace moestream {

namespace {

// The model's counters run across requests (like its residency); a request's share is the
// difference of two snapshots.
CacheAwareStats minus(const CacheAwareStats& a, const CacheAwareStats& b) {
  CacheAwareStats d;
  d.routings = a.routings - b.routings;
  d.slots = a.slots - b.slots;
  d.slots_unchanged = a.slots_unchanged - b.slots_unchanged;
  d.substitutions = a.substitutions - b.substitutions;
  d.layer_chunks = a.layer_chunks - b.layer_chunks;
  d.misses_before = a.misses_before - b.misses_before;
  d.misses_after = a.misses_after - b.misses_after;
  return d;
}
}  // namespace

int EngineSession::prefill(const std::vector<int>& prompt) {
  logits_.resize(size_t(model_.config().vocab_size));
  size_t lcp = 0;
  if (prefix_reuse_) {
    const size_t n = std::min(cached_.size(), prompt.size());
    while (lcp < n && cached_[lcp] == prompt[lcp]) ++lcp;
    // The last prompt token always runs: its logits choose the first new token.
    lcp = std::min(lcp, prompt.size() - 1);
  }
  model_.truncate(int(lcp));
  lcp = size_t(model_.n_past());  // less where a sliding-window ring lost the prefix's window
  cached_.resize(lcp);
  model_.forward(std::span<const int>(prompt).subspan(lcp), logits_);
  cached_ = prompt;
  return int(lcp);
}

void EngineSession::run(Job& job) {
  const JobParams& p = job.params();
  JobResult r;
  r.prompt_tokens = int(p.prompt.size());
  r.queue_s = seconds_since(job.created());
  try {
    Sampler sampler(p.sampler);
    sampler.add_prompt(p.prompt);
    const CacheAwareStats ca0 = model_.cache_aware_stats();
    if (on_start_) r.routing_request_id = on_start_(-1, int(p.prompt.size()));
    // A replay is kept after the request (the next one replaces it): the KV cache the next
    // prompt may reuse was computed with it.
    if (replays_) r.replay_request = replays_->install(model_, -1, p);
    auto t0 = std::chrono::steady_clock::now();
    try {
      r.prompt_tokens_reused = prefill(p.prompt);
    } catch (...) {
      cached_.clear();  // the cache holds an unknown part of the prompt
      model_.reset();
      throw;
    }
    r.prefill_s = seconds_since(t0);
    auto t1 = std::chrono::steady_clock::now();
    std::optional<StreamDecoder> decoder;
    if (tok_) decoder.emplace(*tok_, /*skip_special_tokens=*/!p.keep_special_tokens);
    StopMatcher stop(p.stop);
    std::optional<ConstraintMatcher> constraint;
    if (p.constraint) constraint.emplace(p.constraint);
    r.finish_reason = "length";
    for (int i = 0; i < p.max_tokens; ++i) {
      if (job.cancelled()) {
        r.finish_reason = "cancelled";
        break;
      }
      const int id = p.pick(sampler, logits_, i, constraint ? &*constraint : nullptr);
      ++r.completion_tokens;
      if (std::find(p.stop_ids.begin(), p.stop_ids.end(), id) != p.stop_ids.end()) {
        r.finish_reason = "stop";
        break;
      }
      job.push_logprobs(logits_, id);
      if (decoder) job.push_text(stop.feed(decoder->push(id)));
      else job.push_token_id(id);
      if (stop.stopped()) {
        r.finish_reason = "stop";
        r.stop_string = stop.matched();
        break;
      }
      if (i + 1 == p.max_tokens) break;  // the last token needs no forward pass
      model_.forward(std::span<const int>(&id, 1), logits_);
      cached_.push_back(id);
    }
    if (decoder && r.finish_reason != "cancelled" && !stop.stopped())
      job.push_text(stop.feed(decoder->flush()) + stop.flush());
    r.decode_s = seconds_since(t1);
    if (model_.cache_aware().enabled) r.cache_aware = minus(model_.cache_aware_stats(), ca0);
    metrics_.request_done(r, model_.expert_stats());
    metrics_.forward_times(model_.times());
    job.finish(r);
  } catch (const std::exception& e) {
    cached_.clear();
    model_.reset();
    metrics_.request_failed();
    job.fail(internal_error("engine_error", std::string("generation failed: ") + e.what()));
  }
}

}  // namespace moestream
