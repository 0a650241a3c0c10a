// Resident decode (issue 19; docs/gpu.md "Resident decode"): a decode step whose experts are
// all in VRAM runs every layer with no host synchronisation. The router's top-k stays on the
// device; moe_plan_decode turns it into the expert GEMMs' plan and payload pointers through a
// device table of the GPU cache's resident experts, so the host enqueues the whole token (every
// layer, lm_head) and waits once. A layer whose expert the table lacks is flagged; the host then
// restores the residual saved before that layer's MoE and finishes the token from there through
// the synced path (moe_layer), which reads the miss. The step is tried only after a decode step
// that read nothing, and only where every choice is the router's own (no override, no
// cache-aware substitution, no routing log, no look-ahead). Dense layers (first_k_dense_replace) run
// their MLP; experts, the table and the cache are numbered by MoE layer. gpt-oss: the router's
// logit bias and softmax over the top-k (route_on_device), the experts' biases from their payloads
// and the clamped SwiGLU, as moe() launches them.
#include <algorithm>
#include <chrono>
#include <functional>

#include "common/timing.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/round_activations.h"
#include "runtime/gpu/gpu_forward_impl.h"

namespace moestream::detail {

void CudaForward::init_resident() {
  resident_capable = opts.resident_decode && N == 0;
  for (const ExpertLayout& lay : layouts) resident_capable = resident_capable && expert_gemm_takes(lay);
  if (!resident_capable) return;
  const size_t L = size_t(cfg.n_layers);
  table_dev = DeviceBuffer(size_t(cfg.n_moe_layers()) * size_t(E) * sizeof(const uint8_t*));
  table_host = PinnedBuffer(table_dev.bytes());
  resident_dev = DeviceBuffer((2 * L * size_t(K) + L) * sizeof(int));
  resident_host = PinnedBuffer(resident_dev.bytes());
  // A dense layer never writes its flag: zero from the start.
  MOE_CUDA_CHECK(cudaMemset(resident_dev.get(), 0, resident_dev.bytes()));
  snapshot = DeviceBuffer(L * size_t(D) * sizeof(float));
  fallback_expert = DeviceBuffer(cfg.max_expert_bytes());
  MOE_CUDA_CHECK(cudaMemset(fallback_expert.get(), 0, fallback_expert.bytes()));
  if (opts.graphs) graphs = std::make_unique<GpuGraphSegments>();
  MOE_CUDA_CHECK(cudaEventCreate(&step_begin));
  MOE_CUDA_CHECK(cudaEventCreate(&step_end));
}

bool CudaForward::resident_step_allowed(const ForwardChunk& c) const {
  return resident_capable && resident_next && c.n_tokens == 1 && !routing_step.observed() &&
         routing_step.router_only();
}

// Layer l of a resident step: attention, then the MoE on the device's own routing (or the
// dense MLP). Enqueued only: no host synchronisation, nothing read back.
void CudaForward::resident_layer(int l, const ForwardChunk& c, ForwardTimes& times) {
  const int L = cfg.n_layers;
  const size_t pairs = size_t(B) * size_t(K);
  int* ids_d = resident_dev.as<int>();
  float* wts_d = reinterpret_cast<float*>(ids_d + size_t(L) * K);
  int* missed_d = ids_d + 2 * size_t(L) * K;
  int* plan = plan_dev.as<int>();
  auto* const* table_d = table_dev.as<const uint8_t* const>();
  attention_layer(l, 1, c.n_past, times);
  auto tm = std::chrono::steady_clock::now();
  const GpuLayerWeights& lw = w.layers[size_t(l)];
  const FfnSpec& ffn = this->plan[size_t(l)].ffn;  // `plan` below is the device's expert plan
  if (ffn.kind == FfnKind::kDense) {
    gpu::rms_norm(x, lw.ffn_norm, 1, D, eps, h, stream);
    dense_mlp(lw, 1);
    times.expert_compute_s += seconds_since(tm);
    return;
  }
  const int m = ffn.moe_layer;
  const ExpertLayout& lay = layouts[size_t(m)];
  int* ids_l = ids_d + size_t(l) * K;
  float* wts_l = wts_d + size_t(l) * K;
  gpu::rms_norm(x, lw.ffn_norm, 1, D, eps, h, stream);
  linear_f32(h, lw.router, 1, D, E, rlog);
  route_on_device(ffn.router, lw, 1, ids_l, wts_l);
  gpu::moe_plan_decode(ids_l, K, table_d + size_t(m) * E, E, fallback_expert.as<const uint8_t>(),
                       plan, plan + pairs, plan + 2 * pairs, ptr_dev.as<const uint8_t*>(),
                       missed_d + l, x, snapshot.as<float>() + size_t(l) * D, D, stream);
  const bool shared = ffn.shared != SharedExpertKind::kNone;
  if (shared) shared_expert(ffn.shared, lw, 1);
  // The kernels moe() launches for an all-hit token, on the same plan: the same bits.
  const float* x_up = gather_expert_inputs(lay, plan, K, true);
  expert_gate_up(lay, 0, K, 1, x_up);
  const uint8_t* const* ptrs_d = ptr_dev.as<const uint8_t*>();
  const int* row_start_d = plan + 2 * pairs;  // groups [0, K), one row each
  if (lay.types.bias) {  // gpt-oss
    gpu::expert_bias_add(gate, F, row_start_d, 0, K, 0, K, ptrs_d, lay.bias_offset, stream);
    gpu::expert_bias_add(up, F, row_start_d, 0, K, 0, K, ptrs_d, lay.bias_offset + size_t(F) * 4, stream);
  }
  expert_swiglu(lay, gate, up, K, swi, true);
  expert_matmul(lay.types.down, lay.down_offset, 0, K, 1, D, F, swi, y);
  if (lay.types.bias)
    gpu::expert_bias_add(y, D, row_start_d, 0, K, 0, K, ptrs_d, lay.bias_offset + 2 * size_t(F) * 4, stream);
  // The norm that starts the next layer (or lm_head) joins the combine in one launch, unless a
  // shared expert's output comes between them.
  const float* next_norm = l + 1 < L ? w.layers[size_t(l) + 1].attn_norm : c.logits ? w.final_norm : nullptr;
  if (!shared && next_norm != nullptr && K <= gpu::kMaxFusedCombineK) {
    gpu::moe_combine_add_norm(y, plan + pairs, wts_l, K, D, x, next_norm, eps, h, stream);
    h_normed = true;
  } else {
    gpu::moe_combine_add(y, plan + pairs, wts_l, 1, K, D, x, stream);
    add_shared_expert(ffn.shared, 1);
  }
  times.expert_compute_s += seconds_since(tm);
}

// Runs the decode token c through every layer and lm_head on the device, then syncs once.
// Returns n_layers when every expert was resident (logits written, step ended), else the first
// layer that missed one, with x restored to that layer's residual before its MoE. With graphs,
// each layer (and lm_head with the read-back of the routing) is one captured graph: the host
// captures the next while the device runs the last.
int CudaForward::resident_step(const ForwardChunk& c, ForwardTimes& times) {
  const int L = cfg.n_layers;
  auto t0 = std::chrono::steady_clock::now();
  auto** table_h = table_host.as<const uint8_t*>();
  if (table_stale) {  // what the cache holds now, with its bytes in place
    for (int m = 0; m < cfg.n_moe_layers(); ++m)
      for (int e = 0; e < E; ++e) table_h[size_t(m) * E + e] = cache->resident_payload(m, e);
    MOE_CUDA_CHECK(cudaMemcpyAsync(table_dev.get(), table_h, table_dev.bytes(),
                                   cudaMemcpyHostToDevice, stream));
    table_stale = false;
  }
  times.router_s += seconds_since(t0);
  const auto segment = [&](size_t i, const std::function<void()>& enqueue) {
    if (graphs) graphs->run(i, stream, enqueue, resident_stats.graphs);
    else enqueue();
  };
  MOE_CUDA_CHECK(cudaEventRecord(step_begin, stream));
  for (int l = 0; l < L; ++l) segment(size_t(l), [&] { resident_layer(l, c, times); });
  auto tl = std::chrono::steady_clock::now();
  segment(size_t(L), [&] {
    enqueue_lm_head(c);
    if (c.argmax != nullptr) enqueue_argmax(c);  // into pinned memory: a graph may copy there
    MOE_CUDA_CHECK(cudaMemcpyAsync(resident_host.as<void>(), resident_dev.get(), resident_dev.bytes(),
                                   cudaMemcpyDeviceToHost, stream));
  });
  // Outside the graph: c.logits may be pageable memory, and moves between calls.
  MOE_CUDA_CHECK(cudaEventRecord(step_end, stream));
  if (c.logits != nullptr && c.argmax == nullptr)
    MOE_CUDA_CHECK(cudaMemcpyAsync(c.logits, logits, size_t(V) * 4, cudaMemcpyDeviceToHost, stream));
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  float device_ms = 0;
  MOE_CUDA_CHECK(cudaEventElapsedTime(&device_ms, step_begin, step_end));
  resident_stats.device_s += 1e-3 * device_ms;
  // (A step that missed a layer picks again when forward_chunk finishes it.)
  if (c.argmax != nullptr) *c.argmax = *argmax_host.as<const int>();
  times.other_s += seconds_since(tl);

  auto ta = std::chrono::steady_clock::now();
  ++resident_stats.steps;
  const int* ids_h = resident_host.as<int>();
  const int* missed_h = ids_h + 2 * size_t(L) * K;
  const int l0 = int(std::find(missed_h, missed_h + L, 1) - missed_h);
  // The cache's policy and telemetry see the layers before l0 as the hits they were (heat,
  // recency); nothing is read, nothing waits.
  auto** ptr_h = ptr_host.as<const uint8_t*>();
  for (int l = 0; l < l0; ++l) {
    if (plan[size_t(l)].ffn.kind != FfnKind::kRouted) continue;
    unique_ids.assign(ids_h + size_t(l) * K, ids_h + size_t(l + 1) * K);
    std::sort(unique_ids.begin(), unique_ids.end());
    cache->acquire(plan[size_t(l)].ffn.moe_layer, unique_ids, CacheFill::kDemand, std::span<const uint8_t*>(ptr_h, size_t(K)));
    cache->kernels_enqueued();
  }
  if (l0 < L) {
    ++resident_stats.redone;
    MOE_CUDA_CHECK(cudaMemcpyAsync(x, snapshot.as<float>() + size_t(l0) * D, size_t(D) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream));
  } else {
    cache->end_step();
  }
  times.expert_io_s += seconds_since(ta);
  resident_stats.wall_s += seconds_since(t0);
  return l0;
}

}  // namespace moestream::detail
