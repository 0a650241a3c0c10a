// Text generation and perplexity over a Model: the prefill/decode loop with per-phase timing,
// and sliding-window perplexity of a token sequence.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "runtime/engine/model.h"
#include "runtime/model/sampler.h"

namespace moestream {

struct PhaseStats {
  int tokens = 0;
  double seconds = 0;
  ForwardTimes times;
  CacheAwareStats routing;  // cache-aware routing counters of this phase (zero when off)
  GpuForwardStats gpu;      // GPU expert cache and look-ahead counters of this phase (zero on CPU)
  double tokens_per_s() const { return seconds > 0 ? tokens / seconds : 0; }
};

struct GenerateStats {
  PhaseStats prefill, decode;
  ExpertStoreStats experts;  // store counters at the end of the run
  ExpertStoreStats experts_after_prefill;  // store counters when prefill ended (decode = difference)
};

struct GenerateOptions {
  int n_new = 64;                // tokens to generate
  std::optional<int> stop_token; // stop after sampling this id (EOS), unless unset
  std::vector<int> end_tokens;   // also stop after sampling any of these (a chat template's end of turn)
  // Polled before each sampled token: true ends the reply there (Ctrl-C in infer's chat).
  std::function<bool()> interrupted;
};

// Resets the model, runs the prompt (prefill), then samples up to n_new tokens, feeding each back
// (decode). The prompt goes to the sampler's repeat-penalty window (Sampler::add_prompt) first.
// on_token is called with every sampled id as soon as it is chosen.
GenerateStats generate(Model& model, std::span<const int> prompt, const GenerateOptions& opts,
                       Sampler& sampler, const std::function<void(int)>& on_token,
                       std::vector<int>* generated = nullptr);

// generate() for a conversation: `cached` holds the tokens now in the model's KV cache (the last
// turn's prompt and reply). The longest prefix that `prompt` shares with it is kept (at least one
// prompt token is run), the rest of the cache dropped (Model::truncate) and only the new tokens
// run; stats.prefill.tokens counts those recomputed. On return `cached` holds what the KV cache
// holds: the prompt and the reply's tokens that were fed back (not the last one sampled).
GenerateStats generate_continued(Model& model, std::span<const int> prompt, std::vector<int>& cached,
                                 const GenerateOptions& opts, Sampler& sampler,
                                 const std::function<void(int)>& on_token, std::vector<int>* generated = nullptr);

struct PerplexityResult {
  double perplexity = 0;
  double mean_nll = 0;     // nats per scored token
  size_t n_scored = 0;     // tokens predicted
  int n_windows = 0;
  int ctx = 0, stride = 0;
  size_t tokens_run = 0;   // forward-pass tokens over all windows (overlaps count again)
  double seconds = 0;
  ForwardTimes times;
  CacheAwareStats routing;  // cache-aware routing counters over all windows (zero when off)
  GpuForwardStats gpu;      // GPU expert cache counters over all windows (zero on CPU)
};

// Sliding-window perplexity (the Hugging Face recipe): windows of `ctx` tokens start every
// `stride` tokens; each window is run from an empty cache and scores only the tokens not scored
// by an earlier window: each scored token is predicted once, with at least ctx - stride tokens
// of context (except in the first window). With stride == ctx the windows are disjoint and the
// first token of each window is not scored. Throws ConfigError when
// stride is not in [1, ctx], ctx exceeds the model's context, or fewer than 2 tokens are given.
// `progress` (optional) is called after each window with (tokens covered so far, all tokens).
PerplexityResult perplexity(Model& model, std::span<const int> tokens, int ctx, int stride,
                            const std::function<void(size_t done, size_t total)>& progress = {});

// The same score over disjoint windows (stride == ctx) run `n_parallel` at a time as sequences of
// one batch (Model::forward_batch), one token per window per step, as N concurrent decoding
// streams route: what cache-aware routing's union rule (CacheAwareOptions::batch_union) does to
// quality. Each window's logits are those of its run alone token by token when routing does not
// depend on the batch (no cache-aware routing, or tolerance 0), so the perplexity then equals
// perplexity(tokens, ctx, ctx) with max_batch 1 up to the order of the sum. Throws ConfigError as
// perplexity() does, and when n_parallel is not in [1, model.max_sequences()].
PerplexityResult perplexity_batched(Model& model, std::span<const int> tokens, int ctx, int n_parallel,
                                    const std::function<void(size_t done, size_t total)>& progress = {});

}  // namespace moestream
