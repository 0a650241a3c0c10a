// `moestream-server --replay-routing LOG|DIR` (issue 22): every request replays one request of a
// routing log on its own sequence (RoutingReplay's per-request view), so concurrent streams over a
// synthetic model carry the real routing traffic of a trained one, each stream its own.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>

#include "runtime/engine/model.h"
#include "runtime/engine/routing_replay.h"
#include "runtime/server/job.h"

namespace moestream {

class RequestReplays {
 public:
  explicit RequestReplays(std::shared_ptr<const RoutingReplay> replay);

  size_t n_requests() const { return replay_->n_requests(); }
  const RoutingReplay& replay() const { return *replay_; }
  // The log request a starting job replays: its JobParams::replay_request when given (checked
  // against n_requests() when the request was parsed), else the next in turn (start order,
  // wrapping).
  size_t pick(const JobParams& p);
  // Makes `sequence` (-1: Model::forward's) replay log request `request`; returns it.
  size_t install(Model& model, int sequence, const JobParams& p);

 private:
  std::shared_ptr<const RoutingReplay> replay_;
  std::atomic<size_t> next_{0};
};

}  // namespace moestream
