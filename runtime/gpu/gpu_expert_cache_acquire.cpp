// The acquire and prefetch paths of GpuExpertCache::Impl (gpu_expert_cache_impl.h): each
// expert's policy placement, reads of the misses through the staging ring, and predictions
// handed to the prefetch worker (stolen back, cancelled or awaited when demand catches up).
#include <cuda_runtime.h>

#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/cuda_check.cuh"
#include "runtime/gpu/gpu_expert_cache_impl.h"

namespace moestream {

// ---- predictions --------------------------------------------------------------------------
// A read error of the worker reaches the caller on its next call, after a flush (the slots
// the policy holds for the failed predictions have no bytes).
void GpuExpertCache::Impl::check_worker_error() {
  if (!worker) return;
  std::exception_ptr e = worker->take_error();
  if (!e) return;
  flush();
  std::rethrow_exception(e);
}

// The demanded expert of `j` is on its way; compute waits for its copy.
void GpuExpertCache::Impl::await_prediction(const JobPtr& j) {
  if (worker->wait_issued(*j, tel.prefetch_waits, tel.prefetch_wait_s) == JobState::kFailed) {
    check_worker_error();
    throw Error("gpu cache: a prefetch failed without an error");  // not reached
  }
  if (!gpu_event_done(j->done)) MOE_CUDA_CHECK(cudaStreamWaitEvent(compute, j->done, 0));
}

// Predictions of `layer` that demand did not ask for and that the worker has not begun
// copying are cancelled; their slots keep their place in the policy but are marked invalid,
// so a later demand reads them like a miss.
void GpuExpertCache::Impl::cancel_unasked(int layer, const std::vector<int>& asked) {
  if (!worker) return;
  worker->cancel_unasked(layer, asked, [&](Job& j) {
    slots[size_t(j.slot)].valid = false;
    ++tel.prefetch_cancelled;
  });
}

// A prediction's ids in range, each once; the others are counted as ignored.
std::vector<int> GpuExpertCache::Impl::prediction_ids(std::span<const int> ids) {
  std::vector<int> uniq;
  for (int id : ids) {
    if (id < 0 || id >= cfg.n_experts) {
      ++tel.prefetch_ignored;
      continue;
    }
    if (std::find(uniq.begin(), uniq.end(), id) == uniq.end()) uniq.push_back(id);
  }
  return uniq;
}

// Inside a with_vram_retry op: speculative placements under the eviction guard; each placed
// slot (expert, slot) is pinned at once, so a later fill of the same call cannot take it.
void GpuExpertCache::Impl::place_predictions(int layer, const std::vector<int>& uniq,
                                             std::vector<std::pair<int, int>>& placed, uint64_t& again) {
  const int cls = policy->class_of_layer(layer);
  for (int id : uniq) {
    CacheAccess r = policy->access({layer, id}, CacheFill::kSpeculative);
    for (int s : r.released_slots) release_slot(s);
    if (r.outcome == CacheOutcome::kFilled) {
      if (r.slot_allocated) assign_slot(r.slot, cls);
    } else if (r.outcome == CacheOutcome::kHit && !slots[size_t(r.slot)].valid &&
               !slots[size_t(r.slot)].job) {
      ++again;  // predicted again after a cancellation: the bytes are still to be read
    } else {
      continue;
    }
    policy->pin(r.slot);
    placed.emplace_back(id, r.slot);
  }
}

// The placed predictions as one group for the worker (it reads them with one begin_fetch).
void GpuExpertCache::Impl::queue_predictions(int layer, const std::vector<std::pair<int, int>>& placed) {
  if (placed.empty()) return;
  const size_t b = layer_bytes[size_t(layer)];
  std::vector<JobPtr> group;
  for (const auto& [id, slot] : placed) {
    SlotState& m = slots[size_t(slot)];
    JobPtr j = worker->make_job(layer, id, slot, slot_dev(slot), b);
    m.job = j;
    m.valid = true;
    group.push_back(std::move(j));
  }
  worker->submit(std::move(group));
}

// ---- operations ---------------------------------------------------------------------------
// pf_layer >= 0: after this call's own placements (pinned, so a prediction cannot evict
// them) and before its reads, predictions pf_ids of pf_layer go to the worker.
void GpuExpertCache::Impl::begin_acquire(int layer, std::span<const int> ids, CacheFill kind,
                                         std::span<const uint8_t*> dev_out, std::span<uint8_t> ready,
                                         int pf_layer, std::span<const int> pf_ids) {
  require_idle("begin_acquire");
  check_layer(layer, "acquire");
  if (pf_layer >= 0) {
    check_layer(pf_layer, "prefetch");
    require_worker();
  }
  if (kind == CacheFill::kSpeculative)
    throw ConfigError("gpu cache: acquire takes kDemand or kPrefill; predictions go to prefetch()");
  if (dev_out.size() != ids.size())
    throw ConfigError("gpu cache: acquire of " + std::to_string(ids.size()) + " experts with " +
                      std::to_string(dev_out.size()) + " output pointers");
  if (ready.size() != ids.size())
    throw ConfigError("gpu cache: begin_acquire of " + std::to_string(ids.size()) +
                      " experts with " + std::to_string(ready.size()) + " ready flags");
  for (int id : ids)
    if (id < 0 || id >= cfg.n_experts)
      throw ConfigError("gpu cache: acquire of expert " + std::to_string(id) + " of layer " +
                        std::to_string(layer) + " outside 0.." + std::to_string(cfg.n_experts - 1));
  check_worker_error();
  // A new acquire means the kernels of the previous one are enqueued by now.
  close_kernel_group();
  poll();

  // Unique ids, first occurrence first: heat counts an expert once per call.
  std::vector<int> uniq;
  std::vector<int> first(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = std::find(uniq.begin(), uniq.end(), ids[i]);
    first[i] = int(it - uniq.begin());
    if (it == uniq.end()) uniq.push_back(ids[i]);
  }
  const size_t b = layer_bytes[size_t(layer)];
  const int cls = policy->class_of_layer(layer);
  std::vector<const uint8_t*> dev(uniq.size());
  std::vector<uint8_t> now(uniq.size());  // usable by compute once wait_seq is waited for
  std::vector<int>& miss_ids = pending.miss_ids;
  std::vector<GpuCopy>& cs = pending.cs;
  uint64_t wait_seq = 0;
  cancel_unasked(layer, uniq);
  std::vector<JobPtr>& predicted = pending.predicted;
  std::vector<size_t> predicted_u;  // predicted[k] is uniq[predicted_u[k]]
  uint64_t& refills = pending.refills;
  const std::vector<int> pf_uniq = pf_layer >= 0 ? prediction_ids(pf_ids) : std::vector<int>{};
  std::vector<std::pair<int, int>> pf_placed;
  uint64_t pf_again = 0;

  with_vram_retry([&] {
    miss_ids.clear();
    cs.clear();
    wait_seq = 0;
    predicted.clear();
    predicted_u.clear();
    refills = 0;
    std::fill(now.begin(), now.end(), 0);
    std::vector<size_t> to_scratch;  // indices into uniq
    for (size_t u = 0; u < uniq.size(); ++u) {
      CacheAccess r = policy->access({layer, uniq[u]}, kind);
      for (int s : r.released_slots) release_slot(s);
      switch (r.outcome) {
        case CacheOutcome::kHit: {
          policy->pin(r.slot);
          current_pins.push_back(r.slot);
          SlotState& m = slots[size_t(r.slot)];
          dev[u] = slot_dev(r.slot);
          if (m.job && worker->steal(*m.job)) {  // still queued: read it here, the worker won't
            ++refills;
            miss_ids.push_back(uniq[u]);
            cs.push_back(slot_copy(r.slot, b));
          } else if (m.job) {  // its prediction is being read or copied: never read twice
            predicted.push_back(m.job);
            predicted_u.push_back(u);
          } else if (!m.valid) {  // a cancelled prediction: read it now
            m.valid = true;
            ++refills;
            miss_ids.push_back(uniq[u]);
            cs.push_back(slot_copy(r.slot, b));
          } else {
            now[u] = 1;
            if (m.fill_seq > ring->completed_seq())  // a demand copy may still be in flight
              wait_seq = std::max(wait_seq, m.fill_seq);
          }
          break;
        }
        case CacheOutcome::kFilled:
          if (r.slot_allocated) assign_slot(r.slot, cls);
          policy->pin(r.slot);
          current_pins.push_back(r.slot);
          slots[size_t(r.slot)].valid = true;
          dev[u] = slot_dev(r.slot);
          miss_ids.push_back(uniq[u]);
          cs.push_back(slot_copy(r.slot, b));
          break;
        case CacheOutcome::kNoRoom:
          to_scratch.push_back(u);
          break;
        case CacheOutcome::kDropped:
          MOE_ASSERT(false, "a demand or prefill fill was dropped");
      }
    }
    if (!to_scratch.empty()) {
      const size_t stride = layer_slot_bytes[size_t(layer)];  // aligned as a slot is
      uint8_t* scratch = ensure_scratch(to_scratch.size() * stride);
      for (size_t k = 0; k < to_scratch.size(); ++k) {
        const size_t u = to_scratch[k];
        dev[u] = scratch + k * stride;
        miss_ids.push_back(uniq[u]);
        cs.push_back(GpuCopy{scratch + k * stride, nullptr, b, -1, 0, scratch});
      }
      current_scratch = true;
      tel.scratch_uses += to_scratch.size();
    }
    pf_placed.clear();
    pf_again = 0;
    if (!pf_uniq.empty()) place_predictions(pf_layer, pf_uniq, pf_placed, pf_again);
  });
  requeued += pf_again;
  queue_predictions(pf_layer, pf_placed);  // the worker reads them while we read ours

  // Predictions whose copy the worker has issued are usable now too (a compute wait on the
  // job's event, no host wait); the others are awaited in finish_acquire().
  for (size_t k = 0; k < predicted.size();) {
    if (!worker->issued(*predicted[k])) {
      ++k;
      continue;
    }
    await_prediction(predicted[k]);
    now[predicted_u[k]] = 1;
    predicted.erase(predicted.begin() + ptrdiff_t(k));
    predicted_u.erase(predicted_u.begin() + ptrdiff_t(k));
  }
  // Hits usable now: their in-flight copies (earlier calls) are already issued, a stream wait.
  if (wait_seq > ring->completed_seq())
    MOE_CUDA_CHECK(cudaStreamWaitEvent(compute, ring->event_of(wait_seq), 0));
  for (size_t i = 0; i < ids.size(); ++i) {
    dev_out[i] = dev[size_t(first[i])];
    ready[i] = now[size_t(first[i])];
  }
  pending.active = true;
  pending.layer = layer;
  pending.kind = kind;
}

void GpuExpertCache::Impl::finish_acquire() {
  if (!pending.active) throw ConfigError("gpu cache: finish_acquire without begin_acquire");
  pending.active = false;
  uint64_t wait_seq = 0;
  if (!pending.cs.empty()) {
    flush_on_error([&] {
      // Scratch is rewritten: kernels of an earlier call that read it must be done first.
      if (current_scratch && scratch_recorded) MOE_CUDA_CHECK(cudaStreamWaitEvent(copy, scratch_free, 0));
      wait_seq = ring->read_and_upload(store, pending.layer, pending.miss_ids, pending.cs,
                                       layer_parts[size_t(pending.layer)], pinned.get(), tel,
                                       [&](const GpuCopy& c) {
                                         if (c.slot >= 0) slots[size_t(c.slot)].fill_seq = c.seq;
                                       });
    });
  }
  (pending.kind == CacheFill::kDemand ? refills_demand : refills_prefill) += pending.refills;
  tel.prefetch_refills += pending.refills;
  if (wait_seq > ring->completed_seq())
    MOE_CUDA_CHECK(cudaStreamWaitEvent(compute, ring->event_of(wait_seq), 0));
  std::vector<JobPtr> predicted = std::move(pending.predicted);
  pending.predicted.clear();
  for (const JobPtr& j : predicted) await_prediction(j);
}

void GpuExpertCache::Impl::acquire(int layer, std::span<const int> ids, CacheFill kind, std::span<const uint8_t*> dev_out,
                                   int pf_layer, std::span<const int> pf_ids) {
  std::vector<uint8_t> ready(ids.size());
  begin_acquire(layer, ids, kind, dev_out, ready, pf_layer, pf_ids);
  finish_acquire();
}

void GpuExpertCache::Impl::prefetch(int layer, std::span<const int> ids) {
  require_idle("prefetch");
  check_layer(layer, "prefetch");
  require_worker();
  check_worker_error();
  poll();
  const std::vector<int> uniq = prediction_ids(ids);
  std::vector<std::pair<int, int>> placed;  // (expert, slot), pinned
  uint64_t again = 0;
  with_vram_retry([&] {
    placed.clear();
    again = 0;
    place_predictions(layer, uniq, placed, again);
  });
  requeued += again;
  queue_predictions(layer, placed);
}

}  // namespace moestream
