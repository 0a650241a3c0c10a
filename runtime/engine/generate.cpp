// Implementation of runtime/engine/generate.h.
#include "runtime/engine/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "common/error.h"
#include "common/option_ref.h"
#include "common/timing.h"

namespace moestream {

namespace {

// Runs prompt[n_keep..] after the first n_keep tokens already in the KV cache, then decodes.
GenerateStats run_from(Model& model, std::span<const int> prompt, size_t n_keep, const GenerateOptions& opts,
                       Sampler& sampler, const std::function<void(int)>& on_token, std::vector<int>* generated,
                       std::vector<int>* fed) {
  if (prompt.empty()) throw ConfigError("the prompt is empty: give at least one token");
  if (opts.n_new < 0) throw ConfigError(option_ref("max_tokens") + " must be >= 0, got " + std::to_string(opts.n_new));
  if (prompt.size() + size_t(opts.n_new) > size_t(model.max_context()))
    throw ConfigError("prompt (" + std::to_string(prompt.size()) + " tokens) + " + option_ref("max_tokens") + " " +
                      std::to_string(opts.n_new) + " exceed the context of " +
                      std::to_string(model.max_context()) + " (raise " + option_ref("ctx") + ")");
  MOE_ASSERT(n_keep < prompt.size() && int(n_keep) <= model.n_past(), "kept prefix out of range");
  GenerateStats st;
  // Greedy: the pass picks each token (on the GPU, only the id comes back); else the sampler
  // reads the logits.
  const bool greedy = sampler.greedy();
  sampler.add_prompt(prompt);
  std::vector<float> logits(greedy ? 0 : size_t(model.config().vocab_size));
  if (n_keep == 0) model.reset();
  else model.truncate(int(n_keep));
  model.reset_times();
  model.reset_cache_aware_stats();
  const GpuForwardStats gpu0 = model.gpu_stats();
  int next = -1;
  const auto step = [&](std::span<const int> tokens) {
    if (greedy) next = model.forward_argmax(tokens);
    else model.forward(tokens, logits);
    if (fed) fed->insert(fed->end(), tokens.begin(), tokens.end());
  };
  auto t0 = std::chrono::steady_clock::now();
  step(prompt.subspan(n_keep));
  st.prefill.seconds = seconds_since(t0);
  st.prefill.tokens = int(prompt.size() - n_keep);
  st.prefill.times = model.times();
  st.prefill.routing = model.cache_aware_stats();
  st.experts_after_prefill = model.expert_stats();
  const GpuForwardStats gpu1 = model.gpu_stats();
  st.prefill.gpu = gpu1 - gpu0;
  model.reset_times();
  model.reset_cache_aware_stats();

  auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < opts.n_new; ++i) {
    if (opts.interrupted && opts.interrupted()) break;
    const int id = greedy ? next : sampler.sample(logits);
    if (generated) generated->push_back(id);
    if (on_token) on_token(id);
    if (opts.stop_token && id == *opts.stop_token) break;
    if (std::find(opts.end_tokens.begin(), opts.end_tokens.end(), id) != opts.end_tokens.end()) break;
    if (i + 1 == opts.n_new) break;  // the last token needs no forward pass
    step(std::span<const int>(&id, 1));
    ++st.decode.tokens;
  }
  st.decode.seconds = seconds_since(t1);
  st.decode.times = model.times();
  st.decode.routing = model.cache_aware_stats();
  st.experts = model.expert_stats();
  st.decode.gpu = model.gpu_stats() - gpu1;
  return st;
}

}  // namespace

GenerateStats generate(Model& model, std::span<const int> prompt, const GenerateOptions& opts,
                       Sampler& sampler, const std::function<void(int)>& on_token,
                       std::vector<int>* generated) {
  return run_from(model, prompt, 0, opts, sampler, on_token, generated, nullptr);
}

GenerateStats generate_continued(Model& model, std::span<const int> prompt, std::vector<int>& cached,
                                 const GenerateOptions& opts, Sampler& sampler,
                                 const std::function<void(int)>& on_token, std::vector<int>* generated) {
  MOE_ASSERT(cached.size() == size_t(model.n_past()), "cached tokens differ from the KV cache");
  size_t keep = 0;
  while (keep < cached.size() && keep < prompt.size() && cached[keep] == prompt[keep]) ++keep;
  if (!prompt.empty() && keep == prompt.size()) --keep;  // the last prompt token gives the logits
  cached.resize(keep);
  try {
    return run_from(model, prompt, keep, opts, sampler, on_token, generated, &cached);
  } catch (...) {  // the cache's contents are unknown: the next turn starts afresh
    model.reset();
    cached.clear();
    throw;
  }
}

namespace {
// -log softmax(row)[target], in double.
double nll_of(const float* row, size_t V, int target) {
  const float m = *std::max_element(row, row + V);
  double s = 0;
  for (size_t v = 0; v < V; ++v) s += std::exp(double(row[v]) - m);
  return (m + std::log(s)) - row[size_t(target)];
}

void check_perplexity_input(const Model& model, std::span<const int> tokens, int ctx) {
  if (tokens.size() < 2) throw ConfigError("perplexity needs at least 2 tokens of text");
  if (ctx < 2 || ctx > model.max_context())
    throw ConfigError(option_ref("ctx") + " for perplexity must be in [2, " + std::to_string(model.max_context()) +
                      "], got " + std::to_string(ctx));
}

// The run's counters and the score, from the summed NLL.
void finish_perplexity(Model& model, PerplexityResult& r, double nll, std::chrono::steady_clock::time_point t0,
                       const GpuForwardStats& gpu0) {
  r.seconds = seconds_since(t0);
  r.times = model.times();
  r.routing = model.cache_aware_stats();
  r.gpu = model.gpu_stats() - gpu0;
  r.mean_nll = nll / double(r.n_scored);
  r.perplexity = std::exp(r.mean_nll);
}
}  // namespace

PerplexityResult perplexity(Model& model, std::span<const int> tokens, int ctx, int stride,
                            const std::function<void(size_t done, size_t total)>& progress) {
  check_perplexity_input(model, tokens, ctx);
  if (stride < 1 || stride > ctx)
    throw ConfigError("perplexity stride must be in [1, ctx=" + std::to_string(ctx) + "], got " +
                      std::to_string(stride));
  const size_t V = size_t(model.config().vocab_size), N = tokens.size();
  // Logits for a chunk of 64 positions at a time keep memory at 64*V floats whatever ctx is.
  const size_t chunk = 64;
  std::vector<float> logits(chunk * V);
  PerplexityResult r;
  r.ctx = ctx;
  r.stride = stride;
  double nll = 0;
  size_t prev_end = 1;  // tokens [1, prev_end) are scored; token 0 never is
  model.reset_times();
  model.reset_cache_aware_stats();
  const GpuForwardStats gpu0 = model.gpu_stats();
  auto t0 = std::chrono::steady_clock::now();
  for (size_t begin = 0; prev_end < N; begin += size_t(stride)) {
    const size_t end = std::min(begin + size_t(ctx), N);
    model.reset();
    ++r.n_windows;
    // Position p (absolute) predicts token p+1; score targets in [prev_end, end).
    for (size_t c0 = begin; c0 + 1 < end; c0 += chunk) {
      const size_t c1 = std::min(c0 + chunk, end - 1);  // the window's last token predicts nothing
      model.forward(tokens.subspan(c0, c1 - c0), logits, true);
      r.tokens_run += c1 - c0;
      for (size_t p = c0; p < c1; ++p) {
        if (p + 1 < prev_end) continue;
        nll += nll_of(logits.data() + (p - c0) * V, V, tokens[p + 1]);
        ++r.n_scored;
      }
    }
    prev_end = end;
    if (progress) progress(prev_end, N);
  }
  finish_perplexity(model, r, nll, t0, gpu0);
  return r;
}

PerplexityResult perplexity_batched(Model& model, std::span<const int> tokens, int ctx, int n_parallel,
                                    const std::function<void(size_t done, size_t total)>& progress) {
  check_perplexity_input(model, tokens, ctx);
  if (n_parallel < 1 || n_parallel > model.max_sequences() || n_parallel > model.max_batch())
    throw ConfigError("perplexity over a batch: " + option_ref("parallel") + " must be in [1, " +
                      std::to_string(std::min(model.max_sequences(), model.max_batch())) + "], got " +
                      std::to_string(n_parallel));
  const size_t V = size_t(model.config().vocab_size), N = tokens.size(), W = size_t(ctx);
  const size_t n_windows = (N - 1 + W - 1) / W;  // windows of at least 2 tokens
  PerplexityResult r;
  r.ctx = r.stride = ctx;
  double nll = 0;
  model.reset_times();
  model.reset_cache_aware_stats();
  const GpuForwardStats gpu0 = model.gpu_stats();
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<float>> logits(static_cast<size_t>(n_parallel), std::vector<float>(V));
  std::vector<int> seqs;
  struct Free {  // the group's sequences go back even when a step throws
    Model& m;
    std::vector<int>& s;
    ~Free() {
      for (int q : s) m.free_sequence(q);
    }
  } free_all{model, seqs};
  std::vector<SequenceInput> batch;
  for (size_t g = 0; g < n_windows; g += size_t(n_parallel)) {
    const size_t n = std::min(size_t(n_parallel), n_windows - g);
    for (size_t i = 0; i < n; ++i) seqs.push_back(model.create_sequence());
    r.n_windows += int(n);
    // Step t feeds token begin + t of every window still running and scores begin + t + 1.
    for (size_t t = 0;; ++t) {
      batch.clear();
      for (size_t i = 0; i < n; ++i) {
        const size_t begin = (g + i) * W, end = std::min(begin + W, N);
        if (begin + t + 1 >= end) continue;
        batch.push_back({seqs[i], tokens.subspan(begin + t, 1), logits[i]});
      }
      if (batch.empty()) break;
      model.forward_batch(batch);
      r.tokens_run += batch.size();
      for (size_t i = 0; i < n; ++i) {
        const size_t begin = (g + i) * W, end = std::min(begin + W, N);
        if (begin + t + 1 >= end) continue;
        nll += nll_of(logits[i].data(), V, tokens[begin + t + 1]);
        ++r.n_scored;
      }
    }
    for (int q : seqs) model.free_sequence(q);
    seqs.clear();
    if (progress) progress(std::min((g + n) * W, N), N);
  }
  finish_perplexity(model, r, nll, t0, gpu0);
  return r;
}

}  // namespace moestream
