// How far back a sequence may be rewound when sliding-window layers (gpt-oss) keep their KV cache
// as a ring of window + max_batch - 1 positions (runtime/model/attention.h, the GPU pass alike):
// writing position p overwrites position p - rows, so after a rewind the positions the next chunk
// needs (the window before it) may be gone. Model and SequenceSlots consult it on truncate.
#pragma once

#include <algorithm>
#include <cstdint>

#include "loader/format/model_config.h"

namespace moestream {

class SlidingKvHorizon {
 public:
  SlidingKvHorizon() = default;
  SlidingKvHorizon(const ModelConfig& cfg, int max_context, int max_batch) {
    for (int l = 0; l < cfg.n_layers; ++l) {
      const int w = cfg.window_of(l);
      if (w <= 0) continue;
      const int rows = int(std::min<int64_t>(max_context, int64_t(w) + max_batch - 1));
      if (rows >= max_context) continue;  // never wraps: holds every position
      window_ = std::max(window_, w);
      rows_ = rows_ == 0 ? rows : std::min(rows_, rows);
    }
  }
  // Positions [n_past, n_past + T) were written.
  void wrote(int n_past, int T) {
    if (rows_ > 0) lo_ = std::max(lo_, n_past + T - rows_);
  }
  // What a rewind to n_tokens can keep: n_tokens when every ring still holds the window before it
  // (positions [n_tokens + 1 - window, n_tokens)), else 0 (the sequence starts over).
  int keepable(int n_tokens) const {
    if (rows_ == 0 || n_tokens == 0) return n_tokens;
    return lo_ <= std::max(0, n_tokens + 1 - window_) ? n_tokens : 0;
  }
  // The sequence now holds n_tokens (the result of keepable).
  void truncated(int n_tokens) {
    if (n_tokens == 0) lo_ = 0;
  }

 private:
  int window_ = 0;  // the widest sliding window
  int rows_ = 0;    // the smallest ring; 0: no ring wraps
  int lo_ = 0;      // positions [lo_, n_past) are intact in every ring
};

}  // namespace moestream
