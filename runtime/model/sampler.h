// Next-token choice from logits: logit bias and repetition penalties, then greedy at temperature 0,
// otherwise temperature, top-k, top-p, min-p and typical-p filtering and a draw from a seeded
// generator, so a seed reproduces a run exactly. Also the log-probabilities OpenAI reports.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

namespace moestream {

struct LogitBias {
  int id;
  float bias;  // added to the logit; kLogitBan (-100, OpenAI's "ban") removes the token outright
};
inline constexpr float kLogitBan = -100.0f;

// Order of operations in Sampler::sample (each step sees the previous one's output):
//  1. logit_bias: logit += bias, or -inf for a bias of -100;
//  2. repeat_penalty over the distinct tokens of the last repeat_last_n tokens (prompt and output,
//     llama.cpp's rule): a positive logit is divided by the penalty, a negative one multiplied;
//  3. presence/frequency (OpenAI's rule, over the generated tokens only, as vLLM):
//     logit -= frequency_penalty * count + presence_penalty * (count > 0);
//  4. temperature 0: the largest logit (Sampler::argmax) and nothing below applies;
//  5. softmax at the temperature, then, each over the tokens the previous one kept: top_k (the k
//     most likely), top_p (the smallest most-likely set holding p of the mass), min_p (tokens with
//     p >= min_p x the most likely one's), typical_p (the smallest set, in order of
//     |-log p - entropy|, holding typical_p of the mass; Meister et al., as Hugging Face);
//  6. a draw from what is left, in proportion to the weights.
// Defaults (min_p 0, typical_p 1, repeat_penalty 1, penalties 0, no bias) leave a step out.
struct SamplerParams {
  float temperature = 0.8f;  // 0 = greedy
  int top_k = 40;            // 0 = no limit
  float top_p = 0.95f;       // 1 = no limit
  uint64_t seed = 0;
  float min_p = 0.0f;        // 0 = off
  float typical_p = 1.0f;    // 1 = off
  float repeat_penalty = 1.0f;  // 1 = off
  int repeat_last_n = 64;       // the penalty's window; -1 = every token seen, 0 = off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<LogitBias> logit_bias{};
};

struct TopLogprob {
  int id;
  float logprob;
};
struct TokenLogprobs {
  float logprob = 0;             // the chosen token's
  std::vector<TopLogprob> top;   // the most likely tokens, most likely first (ties: lower id)
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p);  // throws ConfigError for out-of-range parameters
  // The prompt's tokens, for the repeat penalty's window (llama.cpp counts them too). Call before
  // the first sample().
  void add_prompt(std::span<const int> prompt);
  // Chooses the next token and records it for the penalties. Throws ConfigError when logit_bias
  // names a token outside the vocabulary or bans every token.
  int sample(std::span<const float> logits);
  // sample() in two halves, for a caller that may refuse the choice and draw again from other
  // logits (constrained decoding, runtime/grammar): draw() chooses without recording, record()
  // records the token kept.
  int draw(std::span<const float> logits);
  void record(int id);
  // True when steps 5's filters (top_k, top_p, min_p, typical_p) may cut the distribution at
  // temperature > 0: then removing tokens from the logits first changes what the filters keep.
  bool filters() const {
    return p_.temperature != 0 && (p_.top_k > 0 || p_.top_p < 1 || p_.min_p > 0 || p_.typical_p < 1);
  }
  // True when sample() is argmax() of the logits as given (temperature 0, no bias or penalty), so
  // a caller may let the forward pass pick the token (Model::forward_argmax) instead of copying
  // the logits out.
  bool greedy() const { return p_.temperature == 0 && !changes_logits(); }
  // Index of the largest logit; the lowest index wins a tie; NaN never wins (all NaN: 0). The
  // GPU's gpu::argmax follows the same rule.
  static int argmax(std::span<const float> logits);
  // log softmax(logits)[id], and the n_top largest entries: the model's own distribution, before
  // any bias, penalty, temperature or filter (what OpenAI's logprobs report).
  static TokenLogprobs logprobs(std::span<const float> logits, int id, int n_top);

 private:
  struct Candidate {
    int id;
    float p;  // weight: exp((logit - the largest) / temperature)
  };
  template <class Before>
  int nucleus_to_front(int n, double target, const Before& before);
  bool changes_logits() const { return !p_.logit_bias.empty() || penalized(); }
  bool penalized() const {
    return (p_.repeat_penalty != 1 && p_.repeat_last_n != 0) || p_.presence_penalty != 0 ||
           p_.frequency_penalty != 0;
  }
  std::span<const float> adjusted(std::span<const float> logits);  // steps 1-3
  int min_p_to_front(int n);
  int typical_to_front(int n, double sum);
  void remember(int id, bool output);

  SamplerParams p_;
  std::mt19937_64 rng_;
  std::vector<int> ids_;         // top-k's ids (reused across calls)
  std::vector<Candidate> cand_;  // the candidates and their weights (reused across calls)
  std::vector<float> adjusted_;  // the logits after steps 1-3 (reused across calls)
  std::deque<int> window_;       // the repeat penalty's last tokens
  std::unordered_map<int, int> in_window_;  // token -> occurrences in window_
  std::unordered_map<int, int> generated_;  // token -> times sampled
};

}  // namespace moestream
