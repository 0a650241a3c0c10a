// One sequence's part of a batch step, as the engine's callers hand it to Model::forward_batch.
#pragma once

#include <span>

namespace moestream {

// One sequence's part of a batch step (Model::forward_batch).
struct SequenceInput {
  int sequence = -1;            // a live id from Model::create_sequence()
  std::span<const int> tokens;  // appended at the sequence's position (at least one)
  // The last token's logits (vocab_size floats) or, with all_logits, every token's; empty = none.
  std::span<float> logits;
  bool all_logits = false;
};

}  // namespace moestream
