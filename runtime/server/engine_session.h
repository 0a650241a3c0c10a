// The engine side of the server: one Model and its KV cache kept across requests. A request
// reuses the longest common prefix with the tokens already in the cache and runs only the rest.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "runtime/engine/model.h"
#include "runtime/server/job.h"
#include "runtime/server/request_replay.h"
#include "runtime/server/server_metrics.h"
#include "runtime/tokenizer/tokenizer.h"

namespace moestream {

class EngineSession {
 public:
  // tok may be null (a model without a tokenizer): the job then gets token ids, not text.
  EngineSession(Model& model, const Tokenizer* tok, ServerMetrics& metrics, bool prefix_reuse)
      : model_(model), tok_(tok), metrics_(metrics), prefix_reuse_(prefix_reuse) {
    metrics_.set_cache_aware(model_.cache_aware());
  }

  // Runs one job to its end on the calling (worker) thread: prefill, sample, stream text.
  // Never throws: engine errors become Job::fail(500).
  void run(Job& job);
  // --collect-routing: (sequence -1, prompt length) -> the request's routing log id.
  void set_request_start_hook(std::function<uint64_t(int, int)> hook) { on_start_ = std::move(hook); }
  // --replay-routing: every request replays a log request on forward()'s sequence (null = none).
  void set_replays(RequestReplays* replays) { replays_ = replays; }

 private:
  // Makes the KV cache hold `prompt` and leaves the last token's logits; returns tokens reused.
  int prefill(const std::vector<int>& prompt);

  Model& model_;
  const Tokenizer* tok_;
  ServerMetrics& metrics_;
  bool prefix_reuse_;
  std::vector<int> cached_;   // tokens whose keys and values are in the model's KV cache
  std::vector<float> logits_;
  std::function<uint64_t(int, int)> on_start_;
  RequestReplays* replays_ = nullptr;
};

}  // namespace moestream
