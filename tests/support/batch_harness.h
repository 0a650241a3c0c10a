// The batch harness of the CPU and GPU batch tests: requests that join a running batch at a step,
// prefill in chunks beside the others' decode tokens and leave when done, against the same
// requests run alone through Model::forward.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "loader/format/routing_log.h"
#include "runtime/engine/model.h"
#include "runtime/engine/routing_replay.h"

namespace moestream::test {

std::vector<int> random_tokens(std::mt19937& rng, int n, int vocab);

// One new sequence per prompt, each prefilled alone; their ids in the prompts' order.
std::vector<int> prefill_each(Model& m, const std::vector<std::vector<int>>& prompts);

// What a decode step of several sequences routed: each MoE layer's experts (the union over the
// sequences) and the sequences that routed. record() installs m's routing callback, which also
// checks that each event is one decode token at its sequence's position.
struct StepUnion {
  std::vector<std::set<int>> per_layer;
  std::set<int> sequences;

  void record(Model& m);
  size_t experts() const;  // summed over the layers
};

// A request: its prompt, the step it joins at, what it decodes, and the logits of every call that
// produced some (the prompt's last chunk, then each decode token). It decodes `decode` when given
// (fixed inputs, so the batch and the run alone see the same tokens even where a near tie would
// pick another argmax), else n_new greedy tokens.
struct BatchRequest {
  std::vector<int> prompt;
  int join_step = 0;
  int n_new = 0;
  std::vector<int> decode;
  std::vector<std::vector<float>> logits;

  int decode_tokens() const { return decode.empty() ? n_new : int(decode.size()); }
};

// Four requests of different prompt lengths (5, 19, 1 and 9 tokens: one longer than two chunks of
// 8, one of a single token) joining at steps 0, 1, 1 and 8; the fourth joins after the first
// left, in its freed slot. Greedy (n_new 6, 5, 7, 4), or with fixed decode tokens of those counts.
std::vector<BatchRequest> four_requests(unsigned seed, int vocab, bool fixed_decode = false);

// Alone: the prompt through forward() (chunks of the model's max_batch), then each decode token.
void run_alone(Model& m, BatchRequest& r);

// All requests through forward_batch: each joins at its step, prefills `chunk` tokens per step
// beside the others' decode tokens, and leaves (freeing its slot) after its last token.
// on_create(i, sequence): request i got its sequence (e.g. to give it its routing replay).
void run_batched(Model& m, std::vector<BatchRequest>& rs, int chunk,
                 const std::function<void(size_t, int)>& on_create = {});

// A routing log of `requests` requests x `positions` tokens over c's counts, ids drawn at random
// (distinct per token), weights normalised: traffic unlike any router's.
RoutingLog random_log(const ModelConfig& c, int requests, int positions, unsigned seed);

// Request `request` of a replay as a routing override (Model::set_sequence_routing); r must
// outlive it.
RoutingOverrideFn replaying(const RoutingReplay& r, size_t request);

// Each request i of rs replays log request request_of[i] of `replay`: alone on `solo` (through
// set_sequence_routing(-1)), then batched on `batched` (each sequence its own replay), which
// fills rs. Returns the runs alone, the first request run alone on the router (the replay must
// change it, or a test of it could not fail), and how many routing events of the batch carried
// ids other than the replay's at their sequence's positions.
struct ReplayedRuns {
  std::vector<BatchRequest> alone;
  BatchRequest first_on_router;
  int events = 0, mismatched = 0;
};
ReplayedRuns run_replayed(Model& solo, Model& batched, std::vector<BatchRequest>& rs, const RoutingReplay& replay,
                          const std::vector<size_t>& request_of, int chunk);

}  // namespace moestream::test
