// Implementation of runtime/server/batch_scheduler.h.
#include "runtime/server/batch_scheduler.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include "common/error.h"
#include "common/timing.h"
#include "runtime/engine/generate.h"  // Sampler
#include "runtime/server/stop_matcher.h"

namespace moestream {

struct BatchScheduler::Active {
  std::shared_ptr<Job> job;
  Sampler sampler;
  StopMatcher stop;
  std::optional<StreamDecoder> decoder;
  std::optional<ConstraintMatcher> constraint;  // this sequence's place in its response_format/grammar
  JobResult r;
  size_t fed = 0;          // prompt tokens in the slot's KV cache
  int token = -1;          // the sampled token the next step feeds
  std::vector<float> logits;
  std::chrono::steady_clock::time_point t_start, t_decode;

  Active(std::shared_ptr<Job> j, const Tokenizer* tok, int vocab)
      : job(std::move(j)), sampler(job->params().sampler), stop(job->params().stop),
        logits(size_t(vocab)), t_start(std::chrono::steady_clock::now()) {
    if (tok) decoder.emplace(*tok, /*skip_special_tokens=*/!job->params().keep_special_tokens);
    if (job->params().constraint) constraint.emplace(job->params().constraint);
    sampler.add_prompt(job->params().prompt);
  }
  bool prefilling() const { return fed < job->params().prompt.size(); }
};

BatchScheduler::BatchScheduler(Model& model, const Tokenizer* tok, ServerMetrics& metrics, size_t capacity,
                               int parallel, bool prefix_reuse)
    : QueuedRunner(capacity, [&metrics](const Job&) { metrics.request_cancelled_waiting(); }), model_(model),
      tok_(tok), metrics_(metrics), parallel_(parallel), prefix_reuse_(prefix_reuse) {
  if (parallel < 1 || parallel > model.max_sequences())
    throw ConfigError("--parallel " + std::to_string(parallel) + " must be in [1, " +
                      std::to_string(model.max_sequences()) + "] (the model's sequence slots)");
  if (parallel > model.max_batch())
    throw ConfigError("--parallel " + std::to_string(parallel) + " exceeds the batch of " +
                      std::to_string(model.max_batch()) + " tokens per step");
  chunk_ = model.max_batch() - (parallel - 1);
  for (int i = 0; i < parallel; ++i) seqs_.push_back(model.create_sequence());
  cached_.resize(size_t(parallel));
  active_.resize(size_t(parallel));
  start_worker([this] { loop(); });
}

BatchScheduler::~BatchScheduler() {
  shutdown();
  for (int s : seqs_) model_.free_sequence(s);
}

bool BatchScheduler::running() const {
  std::lock_guard<std::mutex> lk(mu_);
  return n_active_ > 0;
}

size_t BatchScheduler::running_count() const {
  std::lock_guard<std::mutex> lk(mu_);
  return size_t(n_active_);
}

void BatchScheduler::loop() {
  while (true) {
    std::vector<std::shared_ptr<Job>> joining;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !jobs_.empty() || n_active_ > 0; });
      if (n_active_ == 0 && jobs_.empty()) return;  // stopping, nothing left to finish
      while (n_active_ < parallel_) {  // join between steps, in arrival order
        std::shared_ptr<Job> j = jobs_.pop();
        if (!j) break;
        ++n_active_;
        joining.push_back(std::move(j));
      }
    }
    for (auto& j : joining) start(std::move(j));
    step();
  }
}

void BatchScheduler::start(std::shared_ptr<Job> job) {
  int slot = -1;
  size_t best = 0;
  const std::vector<int>& prompt = job->params().prompt;
  for (int s = 0; s < parallel_; ++s) {
    if (active_[size_t(s)]) continue;
    size_t lcp = 0;
    const auto& c = cached_[size_t(s)];
    if (prefix_reuse_)
      while (lcp < std::min(c.size(), prompt.size()) && c[lcp] == prompt[lcp]) ++lcp;
    // Ties go to the slot with the least cached: another conversation's prefix stays longest.
    if (slot < 0 || lcp > best || (lcp == best && c.size() < cached_[size_t(slot)].size())) slot = s, best = lcp;
  }
  MOE_ASSERT(slot >= 0, "no free slot for a joining request");
  try {
    auto a = std::make_unique<Active>(job, tok_, model_.config().vocab_size);
    a->r.prompt_tokens = int(prompt.size());
    a->r.queue_s = seconds_since(job->created());
    if (prompt.empty()) throw ConfigError("the prompt is empty: give at least one token");
    for (int id : prompt)
      if (id < 0 || id >= model_.config().vocab_size)
        throw ConfigError("token id " + std::to_string(id) + " outside the vocabulary");
    // The last prompt token always runs: its logits choose the first new token.
    size_t lcp = std::min(best, prompt.size() - 1);
    model_.truncate_sequence(seqs_[size_t(slot)], int(lcp));
    lcp = size_t(model_.sequence_n_past(seqs_[size_t(slot)]));  // less where a sliding ring lost its window
    cached_[size_t(slot)].resize(lcp);
    a->fed = lcp;
    a->r.prompt_tokens_reused = int(lcp);
    if (on_start_) a->r.routing_request_id = on_start_(seqs_[size_t(slot)], int(prompt.size()));
    if (replays_) a->r.replay_request = replays_->install(model_, seqs_[size_t(slot)], job->params());
    active_[size_t(slot)] = std::move(a);
  } catch (const std::exception& e) {
    cached_[size_t(slot)].clear();
    metrics_.request_failed();
    {
      std::lock_guard<std::mutex> lk(mu_);
      --n_active_;
    }
    job->fail(internal_error("engine_error", std::string("generation failed: ") + e.what()));
  }
}

void BatchScheduler::release(int slot) {
  active_[size_t(slot)].reset();
  std::lock_guard<std::mutex> lk(mu_);
  --n_active_;
}

void BatchScheduler::finish(int slot, const char* reason) {
  Active& a = *active_[size_t(slot)];
  a.r.finish_reason = reason;
  a.r.stop_string = a.stop.matched();
  if (a.decoder && a.r.finish_reason != "cancelled" && !a.stop.stopped())
    a.job->push_text(a.stop.feed(a.decoder->flush()) + a.stop.flush());
  a.r.decode_s = a.prefilling() ? 0 : seconds_since(a.t_decode);
  // The model's cache-aware counters mix concurrent requests: no per-request share here (the
  // totals go to the metrics after every step).
  metrics_.request_done(a.r, model_.expert_stats());
  const std::shared_ptr<Job> job = a.job;
  const JobResult r = a.r;
  release(slot);  // before the client hears of the end: the slot is free when it does
  job->finish(r);
}

void BatchScheduler::fail(int slot, const std::string& why) {
  cached_[size_t(slot)].clear();  // the slot holds an unknown part of the request
  metrics_.request_failed();
  const std::shared_ptr<Job> job = active_[size_t(slot)]->job;
  release(slot);
  job->fail(internal_error("engine_error", "generation failed: " + why));
}

namespace {
int model_tokens(const std::vector<SequenceInput>& batch) {
  int n = 0;
  for (const SequenceInput& in : batch) n += int(in.tokens.size());
  return n;
}
}  // namespace

bool BatchScheduler::step() {
  const int ctx = model_.max_context();
  std::vector<SequenceInput> batch;
  std::vector<int> slots;
  int budget = model_.max_batch();
  // Decode tokens first, then prefill chunks (each whole, so a prompt's chunks never depend on
  // what else runs); the chunk size leaves room for every other slot's decode token.
  for (int pass = 0; pass < 2; ++pass)
    for (int s = 0; s < parallel_; ++s) {
      Active* a = active_[size_t(s)].get();
      if (!a || a->prefilling() != (pass == 1)) continue;
      if (a->job->cancelled()) {
        finish(s, "cancelled");
        continue;
      }
      const std::vector<int>& prompt = a->job->params().prompt;
      SequenceInput in;
      in.sequence = seqs_[size_t(s)];
      if (a->prefilling()) {
        const size_t n = std::min(prompt.size() - a->fed, size_t(chunk_));
        if (int(n) > budget) continue;  // waits for the next step
        in.tokens = std::span<const int>(prompt.data() + a->fed, n);
        if (a->fed + n == prompt.size()) in.logits = a->logits;
      } else {
        in.tokens = std::span<const int>(&a->token, 1);
        in.logits = a->logits;
      }
      const int past = model_.sequence_n_past(in.sequence);
      if (past + int(in.tokens.size()) > ctx) {
        fail(s, "context full: " + std::to_string(past) + " + " + std::to_string(in.tokens.size()) +
                    " tokens exceed the context of " + std::to_string(ctx) + " (raise --ctx)");
        continue;
      }
      budget -= int(in.tokens.size());
      batch.push_back(in);
      slots.push_back(s);
    }
  if (batch.empty()) return false;
  try {
    model_.forward_batch(batch);
    metrics_.batch_step(int(batch.size()), model_tokens(batch), model_.times(), model_.expert_stats(),
                        model_.cache_aware_stats());
  } catch (const std::exception& e) {  // an engine error (I/O, a corrupt expert): the step's requests fail
    for (int s : slots) fail(s, e.what());
    return true;
  }
  for (size_t b = 0; b < batch.size(); ++b) {
    const int s = slots[b];
    Active& a = *active_[size_t(s)];
    const JobParams& p = a.job->params();
    auto& cached = cached_[size_t(s)];
    cached.insert(cached.end(), batch[b].tokens.begin(), batch[b].tokens.end());
    if (a.prefilling()) {
      a.fed += batch[b].tokens.size();
      if (a.prefilling()) continue;
      a.r.prefill_s = seconds_since(a.t_start);
      a.t_decode = std::chrono::steady_clock::now();
      if (p.max_tokens <= 0) {
        finish(s, "length");
        continue;
      }
    }
    // As EngineSession: sample, stop ids, text through the stop strings, the length limit.
    int id = -1;
    try {  // a request's own failure (no finite logit left) fails that request, not the server
      id = p.pick(a.sampler, a.logits, a.r.completion_tokens, a.constraint ? &*a.constraint : nullptr);
    } catch (const Error& e) {
      fail(s, e.what());
      continue;
    }
    ++a.r.completion_tokens;
    if (std::find(p.stop_ids.begin(), p.stop_ids.end(), id) != p.stop_ids.end()) {
      finish(s, "stop");
      continue;
    }
    a.job->push_logprobs(a.logits, id);
    if (a.decoder) a.job->push_text(a.stop.feed(a.decoder->push(id)));
    else a.job->push_token_id(id);
    if (a.stop.stopped()) finish(s, "stop");
    else if (a.r.completion_tokens == p.max_tokens) finish(s, "length");
    else a.token = id;
  }
  return true;
}

}  // namespace moestream
