// Implementation of runtime/engine/sequence_slots.h.
#include "runtime/engine/sequence_slots.h"

#include <string>

#include "common/error.h"
#include "common/option_ref.h"

namespace moestream {

SequenceSlots::SequenceSlots(int max_sequences, int max_context, int max_batch, int vocab_size)
    : n_past_(size_t(max_sequences), 0), in_use_(size_t(max_sequences), false),
      max_context_(max_context), max_batch_(max_batch), vocab_(vocab_size) {}

int SequenceSlots::live() const {
  int n = 0;
  for (bool u : in_use_) n += u;
  return n;
}

int SequenceSlots::create() {
  for (size_t s = 0; s < in_use_.size(); ++s)
    if (!in_use_[s]) {
      in_use_[s] = true;
      n_past_[s] = 0;
      if (!horizons_.empty()) horizons_[s].truncated(0);
      return int(s);
    }
  throw ConfigError("all " + std::to_string(in_use_.size()) +
                    " sequence slots are in use (free one, or raise ModelOptions.max_sequences)");
}

void SequenceSlots::check_live(int seq, const char* what) const {
  if (seq < 0 || size_t(seq) >= in_use_.size() || !in_use_[size_t(seq)])
    throw ConfigError(std::string(what) + ": sequence " + std::to_string(seq) +
                      " is not a live sequence (create_sequence() gives ids in [0, " +
                      std::to_string(in_use_.size()) + "))");
}

void SequenceSlots::free(int seq) {
  check_live(seq, "free_sequence");
  in_use_[size_t(seq)] = false;
}

int SequenceSlots::n_past(int seq) const {
  check_live(seq, "sequence_n_past");
  return n_past_[size_t(seq)];
}

void SequenceSlots::truncate(int seq, int n_tokens) {
  check_live(seq, "truncate_sequence");
  if (n_tokens < 0 || n_tokens > n_past_[size_t(seq)])
    throw ConfigError("truncate_sequence: " + std::to_string(n_tokens) + " is outside [0, n_past=" +
                      std::to_string(n_past_[size_t(seq)]) + "] of sequence " + std::to_string(seq));
  if (!horizons_.empty()) {  // a sliding ring that lost the window before n_tokens: start over
    n_tokens = horizons_[size_t(seq)].keepable(n_tokens);
    horizons_[size_t(seq)].truncated(n_tokens);
  }
  n_past_[size_t(seq)] = n_tokens;  // later steps overwrite the KV rows past n_tokens
}

ForwardBatch SequenceSlots::plan(std::span<const SequenceInput> batch, std::vector<BatchEntry>& entries) const {
  if (batch.empty()) throw ConfigError("forward_batch: empty batch (give at least one sequence)");
  std::vector<bool> seen(in_use_.size(), false);
  size_t total = 0;
  entries.clear();
  for (const SequenceInput& in : batch) {
    check_live(in.sequence, "forward_batch");
    const std::string who = "forward_batch: sequence " + std::to_string(in.sequence);
    if (seen[size_t(in.sequence)]) throw ConfigError(who + " appears twice in one batch");
    seen[size_t(in.sequence)] = true;
    if (in.tokens.empty()) throw ConfigError(who + " has no tokens");
    for (int id : in.tokens)
      if (id < 0 || id >= vocab_)
        throw ConfigError(who + ": token id " + std::to_string(id) + " outside the vocabulary [0, " +
                          std::to_string(vocab_) + ")");
    const int past = n_past_[size_t(in.sequence)];
    if (size_t(past) + in.tokens.size() > size_t(max_context_))
      throw ConfigError(who + ": context full: " + std::to_string(past) + " + " +
                        std::to_string(in.tokens.size()) + " tokens exceed the context of " +
                        std::to_string(max_context_) + " (raise " + option_ref("ctx") + ")");
    const size_t need = in.all_logits ? in.tokens.size() * size_t(vocab_) : size_t(vocab_);
    if (!in.logits.empty() && in.logits.size() < need)
      throw ConfigError(who + ": logits buffer too small (" + std::to_string(in.logits.size()) +
                        " floats, " + std::to_string(need) + " needed)");
    total += in.tokens.size();
    BatchEntry e;
    e.slot = in.sequence;
    e.chunk.tokens = in.tokens.data();
    e.chunk.n_tokens = int(in.tokens.size());
    e.chunk.n_past = past;
    e.chunk.logits = in.logits.empty() ? nullptr : in.logits.data();
    e.chunk.all_logits = in.all_logits;
    e.chunk.prefill = past == 0;
    entries.push_back(e);
  }
  if (total > size_t(max_batch_))
    throw ConfigError("forward_batch: " + std::to_string(total) + " tokens in one step exceed max_batch " +
                      std::to_string(max_batch_) + " (split prefills into chunks over several steps)");
  return ForwardBatch{entries.data(), int(entries.size())};
}

void SequenceSlots::advance(std::span<const SequenceInput> batch) {
  for (const SequenceInput& in : batch) {
    if (!horizons_.empty()) horizons_[size_t(in.sequence)].wrote(n_past_[size_t(in.sequence)], int(in.tokens.size()));
    n_past_[size_t(in.sequence)] += int(in.tokens.size());
  }
}

}  // namespace moestream
