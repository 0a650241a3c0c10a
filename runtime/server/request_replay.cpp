// Implementation of runtime/server/request_replay.h.
#include "runtime/server/request_replay.h"

#include "common/error.h"

namespace moestream {

RequestReplays::RequestReplays(std::shared_ptr<const RoutingReplay> replay) : replay_(std::move(replay)) {
  MOE_ASSERT(replay_ != nullptr && replay_->n_requests() > 0, "a replay without requests");
}

size_t RequestReplays::pick(const JobParams& p) {
  if (p.replay_request) {
    MOE_ASSERT(*p.replay_request < n_requests(), "replay_request was checked when parsed");
    return *p.replay_request;
  }
  return next_.fetch_add(1) % n_requests();
}

size_t RequestReplays::install(Model& model, int sequence, const JobParams& p) {
  const size_t request = pick(p);
  const RoutingReplay* r = replay_.get();  // the server keeps it alive while requests run
  model.set_sequence_routing(sequence, [r, request](int layer, uint64_t position, int n, int* ids, float* w) {
    r->route_request(request, layer, position, n, ids, w);
  });
  return request;
}

}  // namespace moestream
