// The engine side of `moestream-server --parallel N`: continuous batching. Up to N requests run
// at once, each in its own sequence slot of the Model (Model::forward_batch); a request joins the
// running batch between steps and leaves it when done, cancelled or failed. Every step carries one
// decode token per decoding request, then prefill chunks of joining ones. Sampling, stop ids, stop
// strings, streaming and cancellation stay per request, as in EngineSession.
//
// A prompt is prefilled in chunks of prefill_chunk() tokens from its reused prefix on, whatever
// else runs, so at temperature 0 a request gets the tokens (and logits, bitwise) of its run with
// nothing beside it: a cancelled or failing request never changes another's output.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "runtime/engine/model.h"
#include "runtime/server/request_replay.h"
#include "runtime/server/server_metrics.h"
#include "runtime/server/waiting_jobs.h"
#include "runtime/tokenizer/tokenizer.h"

namespace moestream {

class BatchScheduler final : public QueuedRunner {
 public:
  // capacity: jobs that may wait while all `parallel` slots run. The model needs max_sequences >=
  // parallel and max_batch >= parallel (ConfigError otherwise). tok may be null (token ids out).
  // prefix_reuse: a request takes the free slot whose KV cache shares the longest prefix with its
  // prompt (ties: the one holding the fewest tokens) and runs only the rest.
  BatchScheduler(Model& model, const Tokenizer* tok, ServerMetrics& metrics, size_t capacity,
                 int parallel, bool prefix_reuse);
  ~BatchScheduler() override;  // shutdown()

  bool running() const override;
  size_t running_count() const override;

  int parallel() const { return parallel_; }
  // max_batch - (parallel - 1): a chunk always fits beside every other slot's decode token.
  int prefill_chunk() const { return chunk_; }
  // --collect-routing: (the model sequence, prompt length) -> the request's routing log id,
  // called on the worker thread as a request takes its slot. Set before the first submit().
  void set_request_start_hook(std::function<uint64_t(int, int)> hook) { on_start_ = std::move(hook); }
  // --replay-routing: every request replays a log request on its slot's sequence (null = none).
  // Set before the first submit().
  void set_replays(RequestReplays* replays) { replays_ = replays; }

 private:
  struct Active;  // one running request (batch_scheduler.cpp)
  size_t free_slots() const override { return size_t(parallel_ - n_active_); }
  void loop();
  void start(std::shared_ptr<Job> job);  // into a free slot (worker thread)
  bool step();                           // one forward_batch; false when nothing ran
  void finish(int slot, const char* reason);
  void fail(int slot, const std::string& why);
  void release(int slot);

  Model& model_;
  const Tokenizer* tok_;
  ServerMetrics& metrics_;
  const int parallel_;
  const bool prefix_reuse_;
  int chunk_ = 1;
  std::vector<int> seqs_;                        // the model's sequence per slot, held for good
  std::vector<std::vector<int>> cached_;         // per slot: tokens whose KV rows are in it
  std::vector<std::unique_ptr<Active>> active_;  // per slot; null = free (worker thread only)
  int n_active_ = 0;                       // slots in use, under mu_
  std::function<uint64_t(int, int)> on_start_;
  RequestReplays* replays_ = nullptr;
};

}  // namespace moestream
