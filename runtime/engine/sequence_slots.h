// The sequences of Model's batch API (Model::create_sequence, forward_batch): which slots are in
// use, each one's position, and the checks that turn a caller's batch into a ForwardBatch.
#pragma once

#include <span>
#include <vector>

#include "runtime/engine/sequence_input.h"
#include "runtime/engine/sliding_kv_horizon.h"
#include "runtime/model/forward_pass.h"

namespace moestream {

class SequenceSlots {
 public:
  SequenceSlots(int max_sequences, int max_context, int max_batch, int vocab_size);

  int max_sequences() const { return int(n_past_.size()); }
  int live() const;
  // The lowest free slot (a freed slot is reused, KV memory included); ConfigError when all are in use.
  int create();
  void free(int seq);
  int n_past(int seq) const;
  // Keeps the first n_tokens (prefix reuse), or none where a sliding-window ring no longer holds
  // the window before them (SlidingKvHorizon; n_past(seq) says what was kept).
  void truncate(int seq, int n_tokens);
  // Every slot's rewind bound (gpt-oss's sliding rings); without it, any rewind keeps its prefix.
  void set_horizon(const SlidingKvHorizon& h) { horizons_.assign(n_past_.size(), h); }

  // Checks `batch` (non-empty, live distinct sequences, tokens in the vocabulary, room in the
  // context and in max_batch, logits buffers large enough) and fills `entries` for the pass.
  // Throws ConfigError naming the sequence and the problem; nothing changes on error.
  ForwardBatch plan(std::span<const SequenceInput> batch, std::vector<BatchEntry>& entries) const;
  // After the pass ran `batch`: each sequence's position moves past its tokens.
  void advance(std::span<const SequenceInput> batch);

 private:
  void check_live(int seq, const char* what) const;
  std::vector<int> n_past_;   // by slot
  std::vector<bool> in_use_;  // by slot
  std::vector<SlidingKvHorizon> horizons_;  // by slot; empty: no sliding ring
  int max_context_, max_batch_, vocab_;
};

}  // namespace moestream
