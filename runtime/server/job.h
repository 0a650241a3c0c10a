// One generation request as the engine worker and the HTTP thread share it: the worker pushes
// text and the result, the HTTP thread waits for them and may cancel (client gone).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine/generate.h"  // SamplerParams
#include "runtime/engine/model.h"     // CacheAwareOptions
#include "runtime/grammar/output_constraint.h"
#include "runtime/server/api_error.h"

namespace moestream {

struct JobParams {
  std::vector<int> prompt;
  int max_tokens = 16;
  SamplerParams sampler;
  std::vector<int> stop_ids;          // sampling one of these ends generation (not shown)
  std::vector<std::string> stop;      // stop strings
  int logprobs = -1;                  // >= 0: report each shown token's logprob and this many top ones
  // `replay_routing`: the log request this one replays (the body's replay_request); none = the
  // next in turn (runtime/server/request_replay.h).
  std::optional<size_t> replay_request;
  // response_format / grammar / forced tool_choice: each sequence masks its logits with its own
  // ConstraintMatcher.
  std::shared_ptr<const CompiledConstraint> constraint;
  // Special tokens stay in the text (a chat format's markup, e.g. harmony's <|channel|>, which the
  // reply parser takes apart); false: skipped, as the tokenizer's decode(skip_special_tokens).
  bool keep_special_tokens = false;
  // Test hook (`test_forced_output`): token i of the reply is forced[i] instead of a sample;
  // the logits are still computed step by step. Forced tokens do not advance a constraint.
  std::vector<int> forced;
  // The token of `step`: forced, else drawn by `sampler` (through `constraint`, the sequence's
  // matcher of `constraint` above, when there is one).
  int pick(Sampler& sampler, std::span<const float> logits, int step, ConstraintMatcher* matcher) const {
    if (size_t(step) < forced.size()) return forced[size_t(step)];
    return matcher ? matcher->sample(sampler, logits) : sampler.sample(logits);
  }
};

// A generated token with its log-probabilities (JobParams::logprobs).
struct SampledToken {
  int id;
  TokenLogprobs lp;
};

struct JobResult {
  std::string finish_reason;          // "stop", "length" or "cancelled"
  std::string stop_string;            // the stop string the text was cut at ("" for none)
  int prompt_tokens = 0;
  int prompt_tokens_reused = 0;       // served from the KV cache of the previous request
  int completion_tokens = 0;
  double queue_s = 0, prefill_s = 0, decode_s = 0;
  // This request's share of the cache-aware routing counters (prefill and decode); absent when
  // the server runs without `cache_aware`.
  std::optional<CacheAwareStats> cache_aware{};
  std::optional<uint64_t> routing_request_id{};  // `collect_routing`: this request's id in the log
  std::optional<uint64_t> replay_request{};      // `replay_routing`: the log request it replayed
};

class Job {
 public:
  explicit Job(JobParams p) : params_(std::move(p)), created_(std::chrono::steady_clock::now()) {}
  const JobParams& params() const { return params_; }
  std::chrono::steady_clock::time_point created() const { return created_; }

  // Worker side.
  // Also wakes the reader for logprobs pushed before it, so a token's entry and its text come in
  // one update (text held back by the decoder or a stop string comes later).
  void push_text(const std::string& text) {
    std::lock_guard<std::mutex> lk(mu_);
    if (text.empty() && tokens_.empty()) return;
    text_ += text;
    cv_.notify_all();
  }
  // A model served without a tokenizer answers token ids instead of text.
  void push_token_id(int id) {
    std::lock_guard<std::mutex> lk(mu_);
    ids_.push_back(id);
    cv_.notify_all();
  }
  // Before the token's text (push_text or push_token_id, which wake the reader), when
  // params().logprobs >= 0; `logits` are the raw ones the token was sampled from.
  void push_logprobs(std::span<const float> logits, int id) {
    if (params_.logprobs < 0) return;
    SampledToken t{id, Sampler::logprobs(logits, id, params_.logprobs)};
    std::lock_guard<std::mutex> lk(mu_);
    tokens_.push_back(std::move(t));
  }
  void finish(const JobResult& r) {
    std::lock_guard<std::mutex> lk(mu_);
    result_ = r;
    done_ = true;
    cv_.notify_all();
  }
  void fail(const ApiError& e) {
    std::lock_guard<std::mutex> lk(mu_);
    error_.emplace(e);
    done_ = true;
    cv_.notify_all();
  }
  bool cancelled() const {
    std::lock_guard<std::mutex> lk(mu_);
    return cancelled_;
  }

  // Client side.
  void cancel() {
    std::lock_guard<std::mutex> lk(mu_);
    cancelled_ = true;
  }
  struct Update {
    std::string text;      // new since the previous wait()
    std::vector<int> ids;  // new token ids since the previous wait() (only without a tokenizer)
    std::vector<SampledToken> tokens;  // new logprobs since the previous wait() (JobParams::logprobs)
    bool done = false;
  };
  Update wait(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, timeout, [&] { return done_ || !text_.empty() || !ids_.empty() || !tokens_.empty(); });
    Update u;
    u.text.swap(text_);
    u.ids.swap(ids_);
    u.tokens.swap(tokens_);
    u.done = done_;
    return u;
  }
  std::optional<JobResult> result() const {
    std::lock_guard<std::mutex> lk(mu_);
    return result_;
  }
  std::optional<ApiError> error() const {
    std::lock_guard<std::mutex> lk(mu_);
    return error_;
  }

 private:
  JobParams params_;
  std::chrono::steady_clock::time_point created_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;
  std::vector<int> ids_;
  std::vector<SampledToken> tokens_;
  bool done_ = false, cancelled_ = false;
  std::optional<JobResult> result_;
  std::optional<ApiError> error_;
};

}  // namespace moestream
