// Implementation of runtime/gpu/gpu_forward.h: one CUDA stream carries the whole pass; the host
// syncs once per layer to read the router's top-k ids (the expert cache needs them on the host).
#include "runtime/gpu/gpu_forward.h"
#include "runtime/gpu/gpu_forward_impl.h"
#include "runtime/gpu/gpu_gqa_attention.h"
#include "runtime/gpu/gpu_mla.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "common/timing.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/round_activations.h"
#include "runtime/gpu/gpu_cache_common.h"
#include "runtime/gpu/gpu_weights.h"
#include "runtime/model/rope.h"

namespace moestream {

namespace {

// At most this many distinct experts per acquire(): bounds the cache's scratch area when a
// prefill chunk routes to most of a layer's experts and the budget is full (the CPU path
// fetches 16 at a time for the same reason). Decode (top-k <= 8) is always one acquire.
constexpr int kMaxExpertsPerAcquire = 16;
// A batch step's union (gpu_forward_batch.cpp) takes up to this many experts per acquire, so the
// misses of a decode step of several sequences are one read batch behind the hits' kernels;
// only where the cache holds four times as many experts (its scratch then stays rare and small).
constexpr int kMaxBatchExpertsPerAcquire = 64;
// Share of free VRAM the automatic expert-cache budget may take: the rest is headroom for the
// cache's staging/scratch buffers, cuBLAS workspaces and other processes.
constexpr double kAutoBudgetShare = 0.8;

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1 << 20));
  return buf;
}

}  // namespace

namespace detail {

CudaForward::CudaForward(const ModelConfig& c, const std::filesystem::path& dense_path,
                         ExpertStore& s, const GpuForwardOptions& o)
    : cfg(c), opts(o), store(s), D(c.hidden_size), H(c.n_heads), KV(c.n_kv_heads),
      hd(c.head_dim), half((c.has_mla() ? c.qk_rope_head_dim : c.rope_dim()) / 2), E(c.n_experts), K(c.n_experts_per_tok),
      F(c.moe_intermediate_size), V(c.vocab_size), N(o.moe_lookahead), B(o.max_batch),
      hd_p((c.head_dim + 3) / 4 * 4), padded(hd_p != c.head_dim),
      eps(float(c.rms_norm_eps)), scale(1.0f / std::sqrt(float(c.head_dim))),
      rope(c), plan(plan_layers(c)), Fs(c.shared_expert_intermediate_size), routing_step(c) {
  I = any_ffn(plan, FfnKind::kDense) ? c.intermediate_size : 0;
  // Cache-aware routing's residency: an expert whose bytes the GPU cache holds in place or,
  // below it, a host tier of the store, as the CPU pass counts its tiers. Sampled once per layer
  // per chunk, before the chunk's acquire (so a prefill chunk sees one snapshot, as on the CPU).
  // A look-ahead prediction counts as resident only once its copy completed, so with
  // --moe-lookahead the substitutions may vary from run to run.
  residency = [this](int layer, std::span<uint8_t> resident) {
    store.residency(layer, std::span<ExpertTier>(tiers));
    for (int e = 0; e < E; ++e)
      resident[size_t(e)] = tiers[size_t(e)] != ExpertTier::kStorage || cache->resident_payload(layer, e) != nullptr;
  };
  const char* why = "";
  if (gpu::device_count(&why) <= 0)
    throw ConfigError(std::string("--gpu: no usable CUDA device (") + why + ")");
  // warm_up() checks that the kernels take each layer's types; a pack's f32 experts (not a GGUF's
  // ggml F32) have none and are refused before the slow load, with the way out.
  for (int l = 0; l < c.n_moe_layers(); ++l) {  // by MoE layer index (model_config.h)
    layouts.push_back(c.expert_layout(l));
    const ExpertTypes& t = layouts.back().types;
    if (t.gate == QuantType::kF32 || t.up == QuantType::kF32 || t.down == QuantType::kF32)
      throw ConfigError("--gpu: experts are f32, which has no GPU kernel; convert the model with "
                        "--quant q8, q4 or bf16");
    gate_up_round_apart |= gpu::activation_rounding(t.gate) != gpu::activation_rounding(t.up);
  }
  if (opts.max_context <= 0 || B <= 0 || B > opts.max_context)
    throw ConfigError("--gpu: bad context " + std::to_string(opts.max_context) + " or batch " +
                      std::to_string(B));
  if (N < 0 || N > E)
    throw ConfigError("--moe-lookahead " + std::to_string(N) + " is outside [0, n_experts=" +
                      std::to_string(E) + "]");
  MOE_CUDA_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  MOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  info_.device = prop.name;
  info_.moe_lookahead = N;
  MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublas_check(cublasCreate(&blas), "cublasCreate");
  cublas_check(cublasSetStream(blas, stream), "cublasSetStream");
  // Full f32 products (no TF32): logits stay close to the CPU path.
  cublas_check(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");

  w = GpuDenseWeights::load(cfg, dense_path);
  info_.dense_bytes = w.bytes();
  // Each attention kind the layers take, with its device state (gpu_attention.h).
  if (any_attention(plan, AttentionKind::kGqa)) gqa_attention = std::make_unique<GpuGqaAttention>(*this, plan);
  if (any_attention(plan, AttentionKind::kMla))
    mla_attention = std::make_unique<GpuMla>(cfg, w, opts.max_context, B);
  size_t attention_scratch = 0;
  for (GpuAttention* a : {gqa_attention.get(), mla_attention.get()})
    if (a != nullptr) {
      info_.kv_bytes += a->state_bytes();
      attention_scratch += a->scratch_bytes();
    }

  // Activations, one allocation carved into arrays.
  const size_t b = size_t(B), pairs = size_t(B) * size_t(K);
  const size_t n_floats[] = {b * D, b * D, b * D, b * H * hd, b * H * hd, b * KV * hd,
                             b * H * hd, b * E, size_t(E), pairs * D, pairs * F, pairs * F,
                             pairs * F, pairs * D, b * V, b * KV * hd, b * KV * hd,
                             b * H * hd_p, b * H * hd_p, b * D, b * std::max({D, H * hd, Fs, I, GpuMla::max_input_width(c)}),
                             gate_up_round_apart ? pairs * D : 0, b * Fs, b * Fs, b * Fs, Fs > 0 ? b * D : 0,
                             Fs > 0 ? b : 0, b * I, b * I, b * I};
  float** dst[] = {&x, &h, &tmp, &qraw, &q, &kraw, &attn, &rlog, &la_log, &xg, &gate, &up, &swi,
                   &y, &logits, &k_tok, &v_tok, &q_pad, &attn_pad, &proj, &xr, &xg_up,
                   &sh_gate, &sh_up, &sh_act, &sh_y, &sh_logit, &mlp_g, &mlp_u, &mlp_a};
  size_t total = 0;
  for (size_t n : n_floats) total += (n + 63) / 64 * 64;  // 256-byte aligned arrays
  act = DeviceBuffer(total * sizeof(float));
  float* p = act.as<float>();
  for (size_t i = 0; i < std::size(n_floats); ++i) {
    *dst[i] = p;
    p += (n_floats[i] + 63) / 64 * 64;
  }
  info_.scratch_bytes = act.bytes() + attention_scratch;
  if (cfg.qkv_bias || cfg.o_bias || cfg.router_bias) {
    const std::vector<float> ones_h(b, 1.0f);
    ones = DeviceBuffer(b * sizeof(float));
    MOE_CUDA_CHECK(cudaMemcpy(ones.get(), ones_h.data(), b * sizeof(float), cudaMemcpyHostToDevice));
  }
  if (padded) MOE_CUDA_CHECK(cudaMemset(act.get(), 0, act.bytes()));  // q_pad's pad columns

  const size_t route_bytes = (2 * pairs + 2 * size_t(std::max(N, 1))) * 4;
  route_dev = DeviceBuffer(route_bytes);
  route_host = PinnedBuffer(route_bytes);
  const size_t in_bytes = (b + 2 * b * size_t(half)) * 4;
  in_dev = DeviceBuffer(in_bytes);
  in_host = PinnedBuffer(in_bytes);
  cos_d = reinterpret_cast<float*>(in_dev.as<int>() + b);
  sin_d = cos_d + b * size_t(half);
  const size_t plan_bytes = (3 * pairs + 1) * sizeof(int);
  plan_dev = DeviceBuffer(plan_bytes);
  plan_host = PinnedBuffer(plan_bytes);
  ptr_dev = DeviceBuffer(pairs * sizeof(const uint8_t*));
  ptr_host = PinnedBuffer(pairs * sizeof(const uint8_t*));
  logits_host = PinnedBuffer(b * size_t(E) * sizeof(float));
  argmax_dev = DeviceBuffer(sizeof(gpu::ArgmaxState));
  MOE_CUDA_CHECK(cudaMemset(argmax_dev.get(), 0, argmax_dev.bytes()));  // argmax's state starts zeroed
  argmax_host = PinnedBuffer(sizeof(int));

  unique_ids.reserve(size_t(E));
  ready.reserve(size_t(kMaxExpertsPerAcquire));
  order_ids.reserve(size_t(kMaxExpertsPerAcquire));
  order_ptrs.reserve(size_t(kMaxExpertsPerAcquire));
  count_of_expert.assign(size_t(E), 0);
  first_row_of_expert.assign(size_t(E), 0);
  predicted.reserve(size_t(std::max(N, 1)));
  in_prediction.assign(size_t(E), 0);
  tiers.resize(size_t(E));

  // The expert cache's budget (issue 8): as asked, else everything when it fits, else 80%.
  size_t free_b = 0, total_b = 0;
  MOE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  info_.free_bytes_before_cache = free_b;
  for (const ExpertLayout& lay : layouts) info_.expert_bytes_total += size_t(E) * lay.bytes;
  size_t slot_total = 0;  // the cache's slots for every expert (payloads rounded up to 16 bytes)
  for (const ExpertLayout& lay : layouts) slot_total += size_t(E) * gpu_slot_bytes(lay.bytes);
  const size_t share = size_t(double(free_b) * kAutoBudgetShare);
  if (opts.cache_mb > 0) {
    info_.cache_bytes = opts.cache_mb << 20;
    info_.cache_rule = "--gpu-cache-mb; " + mib(info_.expert_bytes_total) + " of experts, " +
                       mib(free_b) + " free";
  } else if (slot_total <= share) {
    info_.cache_bytes = slot_total;
    info_.cache_rule = "the whole model's experts fit in 80% of the " + mib(free_b) + " free";
  } else {
    info_.cache_bytes = share;
    info_.cache_rule = "80% of the " + mib(free_b) + " free; the model's experts need " +
                       mib(info_.expert_bytes_total);
  }
  GpuExpertCacheOptions co;
  if (N > 0) {  // look-ahead reads on the cache's worker thread, through a store of its own
    prefetch_store = store.reopen();
    if (!prefetch_store)
      throw ConfigError("--moe-lookahead: the expert store (" + store.describe() +
                        ") cannot open a second instance for the prefetch worker");
    co.prefetch_store = prefetch_store.get();
  }
  co.pin_page_cache = opts.pin_page_cache;
  cache = std::make_unique<GpuExpertCache>(cfg, store, info_.cache_bytes, stream, co);
  info_.pinned_bytes = cache->pinned_bytes();
  info_.pinned_s = cache->pinned_seconds();
  if (opts.preload) preload_experts();
  init_resident();
  init_cpu_misses();
  warm_up();
}

void CudaForward::forward_chunk(const ForwardChunk& c, const RoutingControl& routing,
                                ForwardTimes& times, CacheAwareStats& ca_stats) {
  const int* tokens = c.tokens;
  const int T = c.n_tokens, n_past = c.n_past;
  MOE_ASSERT(T > 0 && T <= B && n_past + T <= opts.max_context);
  auto t0 = std::chrono::steady_clock::now();
  const size_t b = size_t(B);
  int* tok_h = in_host.as<int>();
  float* cos_h = reinterpret_cast<float*>(tok_h + b);
  float* sin_h = cos_h + b * size_t(half);
  std::copy(tokens, tokens + T, tok_h);
  rope.fill(n_past, T, cos_h, sin_h);
  // Copy only the used prefix of each part (the three parts sit at fixed offsets).
  MOE_CUDA_CHECK(cudaMemcpyAsync(in_dev.get(), tok_h, size_t(T) * 4, cudaMemcpyHostToDevice, stream));
  MOE_CUDA_CHECK(cudaMemcpyAsync(cos_d, cos_h, size_t(T) * half * 4, cudaMemcpyHostToDevice, stream));
  MOE_CUDA_CHECK(cudaMemcpyAsync(sin_d, sin_h, size_t(T) * half * 4, cudaMemcpyHostToDevice, stream));
  embed(T);
  times.other_s += seconds_since(t0);

  const bool decode = T == 1;
  int first = 0;             // the first layer the synced loop runs
  bool skip_attention = false;  // ... from its MoE on (a resident step met a miss there)
  step_misses = 0;
  h_normed = false;
  routing_step.begin_chunk(routing, c, ca_stats);
  if (resident_step_allowed(c)) {
    first = resident_step(c, times);
    if (first == cfg.n_layers) return;  // all hits: logits are in place
    skip_attention = true;
    h_normed = false;  // the redo starts at a MoE, from x restored
  }
  for (int l = first; l < cfg.n_layers; ++l) {
    if (!(skip_attention && l == first)) attention_layer(l, T, n_past, times);
    moe_layer(c, l, times);
  }
  // The next decode step tries the resident path when this one read nothing.
  resident_next = decode && step_misses == 0;
  if (decode) cache->end_step();

  auto tl = std::chrono::steady_clock::now();
  enqueue_logits(c);
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (c.argmax != nullptr) *c.argmax = *argmax_host.as<const int>();
  times.other_s += seconds_since(tl);
}

// Layer l's attention block for the chunk's T rows at n_past: norm, QKV (biases, QK-norm), RoPE,
// KV rows appended, attention, o_proj added to the residual x.
// h = rms_norm(x, weight) for the rows [first, first + rows) of x, unless the last layer's end
// already wrote it (a resident step's moe_combine_add_norm, for this weight: one row).
void CudaForward::norm_into_h(const float* weight, int rows, int first) {
  if (std::exchange(h_normed, false)) {
    MOE_ASSERT(rows == 1, "norm_into_h: a fused norm covers one token");
    return;
  }
  gpu::rms_norm(x + size_t(first) * D, weight, rows, D, eps, h, stream);
}

void CudaForward::attention_layer(int l, int T, int n_past, ForwardTimes& times) {
  auto ta = std::chrono::steady_clock::now();
  norm_into_h(w.layers[size_t(l)].attn_norm, T);
  attention_of(l).layer(*this, l, T, n_past);
  times.attention_s += seconds_since(ta);
}

// Layer l's sparse MLP through the host: the router's top-k comes back (one sync), the routing
// step (override, id check, cache-aware substitution, events) sees it, the expert cache acquires
// the experts, then the expert kernels, the shared expert and the residual add.
void CudaForward::moe_layer(const ForwardChunk& c, int l, ForwardTimes& times) {
  const int T = c.n_tokens;
  const bool decode = T == 1;
  const size_t pairs = size_t(B) * size_t(K);
  const GpuLayerWeights& lw = w.layers[size_t(l)];
  const FfnSpec& ffn = plan[size_t(l)].ffn;
  if (ffn.kind == FfnKind::kDense) {  // GLM-4.5 / DeepSeek-V3's dense first layers: no routing
    const auto tm = std::chrono::steady_clock::now();
    gpu::rms_norm(x, lw.ffn_norm, T, D, eps, h, stream);
    dense_mlp(lw, T);
    times.expert_compute_s += seconds_since(tm);
    return;
  }
  const int moe_l = ffn.moe_layer;  // experts, cache, logs and overrides number MoE layers
  // Router of this layer and, for decode with look-ahead, layer l+1's router on the same
  // normalised row: both top-k lists come back in the layer's one D2H.
  auto tr = std::chrono::steady_clock::now();
  gpu::rms_norm(x, lw.ffn_norm, T, D, eps, h, stream);
  linear_f32(h, lw.router, T, D, E, rlog);
  int* ids_d = route_dev.as<int>();
  float* wts_d = reinterpret_cast<float*>(ids_d + pairs);
  int* la_ids_d = ids_d + 2 * pairs;
  float* la_w_d = reinterpret_cast<float*>(la_ids_d + std::max(N, 1));
  route_on_device(ffn.router, lw, T, ids_d, wts_d);
  const bool lookahead = decode && N > 0 && l + 1 < cfg.n_layers && !batch_step &&
                         plan[size_t(l) + 1].ffn.kind == FfnKind::kRouted;
  if (lookahead) {
    linear_f32(h, w.layers[size_t(l) + 1].router, 1, D, E, la_log);
    if (plan[size_t(l) + 1].ffn.router.logit_bias)  // gpt-oss
      add_bias(w.layers[size_t(l) + 1].router_bias_dev, 1, E, la_log);
    gpu::router_topk(la_log, 1, E, N, false, la_ids_d, la_w_d, stream);
  }
  // The look-ahead's ranking is by logits (softmax top-N; gpt-oss's logit bias added) for every
  // router: a prediction changes what is prefetched, never the output.
  const size_t route_bytes = (2 * pairs + (lookahead ? size_t(N) : 0)) * 4;
  MOE_CUDA_CHECK(cudaMemcpyAsync(route_host.as<int>(), ids_d, route_bytes,
                                 cudaMemcpyDeviceToHost, stream));
  if (routing_step.substitutes())
    MOE_CUDA_CHECK(cudaMemcpyAsync(logits_host.as<float>(), rlog, size_t(T) * E * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream));
  if (cpu_experts && decode && !batch_step)  // the row the CPU computes misses on (cpu_misses)
    MOE_CUDA_CHECK(cudaMemcpyAsync(h_host.as<float>(), h, size_t(D) * sizeof(float), cudaMemcpyDeviceToHost, stream));
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  int* ids_h = route_host.as<int>();
  float* wts_h = reinterpret_cast<float*>(ids_h + pairs);
  // Weights the host wrote (an override, a substitution) go back to the device once; the ids stay
  // on the host (moe() plans from them).
  if (routing_step.decide(moe_l, ids_h, wts_h, logits_host.as<const float>(),
                          ffn.router.params.scoring == RouterScoring::kSigmoid ? lw.router_bias.data() : nullptr,
                          residency))
    MOE_CUDA_CHECK(cudaMemcpyAsync(wts_d, wts_h, size_t(T) * K * sizeof(float),
                                   cudaMemcpyHostToDevice, stream));
  if (routing_step.observed()) {
    router_inputs.resize(size_t(T) * D);
    MOE_CUDA_CHECK(cudaMemcpy(router_inputs.data(), h, router_inputs.size() * 4,
                              cudaMemcpyDeviceToHost));
    routing_step.publish(moe_l, ids_h, wts_h, router_inputs.data());
  }
  times.router_s += seconds_since(tr);

  // Recall of the prediction made during layer l-1: share of this token's experts it named.
  if (decode && predicted_layer == l) {
    ++la_stats.layers;
    la_stats.demanded += uint64_t(K);
    for (int j = 0; j < K; ++j) la_stats.demanded_predicted += in_prediction[size_t(ids_h[j])];
    predicted_layer = -1;
  }
  // Look-ahead ids of layer l+1 came with this layer's ids; moe() hands them to the cache's
  // worker in this layer's acquire (after its own placements, before its reads), so their
  // reads and copies overlap this layer's demand reads, its expert kernels and the next
  // layer's attention.
  if (lookahead) {
    const int* la_ids = ids_h + 2 * pairs;
    for (int e : predicted)
      if (e >= 0 && e < E) in_prediction[size_t(e)] = 0;
    predicted.assign(la_ids, la_ids + N);
    for (int e : predicted)
      if (e >= 0 && e < E) in_prediction[size_t(e)] = 1;
    predicted_layer = l + 1;
    la_stats.predicted += uint64_t(N);
  }
  // The shared expert's kernels go on the stream now: they run while moe() reads the misses.
  if (ffn.shared != SharedExpertKind::kNone) {
    const auto ts = std::chrono::steady_clock::now();
    shared_expert(ffn.shared, lw, T);
    times.expert_compute_s += seconds_since(ts);
  }
  moe(moe_l, T, lookahead, times);
  add_shared_expert(ffn.shared, T);
}

// The sparse MLP of layer `layer` for the T routed rows in h: rows grouped by expert, experts
// acquired at most kMaxExpertsPerAcquire at a time, grouped GEMMs gate/up -> SwiGLU -> down per
// acquire, then the weighted sum in top-k order. With one acquire (decode; prefill of at most
// 16 experts) it is split in two: the experts the cache has ready come first in the plan and
// their kernels are enqueued before the misses are read, the misses' kernels after; otherwise
// groups are in ascending ids (as the CPU fetches). Each group's rows, the GEMM token tile (the
// max rows of the whole acquire) and the combine order are the same either way, so the split
// changes no bit of the result.
void CudaForward::moe(int layer, int T, bool lookahead, ForwardTimes& times) {
  auto t0 = std::chrono::steady_clock::now();
  const size_t pairs = size_t(B) * size_t(K);
  const int* ids_h = route_host.as<int>();
  const float* wts_d = reinterpret_cast<const float*>(route_dev.as<int>() + pairs);
  unique_ids.clear();
  for (int i = 0; i < T * K; ++i)
    if (count_of_expert[size_t(ids_h[i])]++ == 0) unique_ids.push_back(ids_h[i]);
  std::sort(unique_ids.begin(), unique_ids.end());
  const CacheFill kind = T > 1 && !batch_demand ? CacheFill::kPrefill : CacheFill::kDemand;
  const int n_groups = int(unique_ids.size());
  auto** ptr_h = ptr_host.as<const uint8_t*>();
  int per_acquire = kMaxExpertsPerAcquire;
  if (batch_step)
    per_acquire = int(std::clamp<size_t>(info_.cache_bytes / (4 * std::max<size_t>(1, cfg.max_expert_bytes())),
                                         size_t(kMaxExpertsPerAcquire), size_t(kMaxBatchExpertsPerAcquire)));
  const bool split = n_groups <= per_acquire;
  if (!split && batch_step)  // a batch's union: resident experts' acquires first (gpu_forward_batch.cpp)
    std::stable_partition(unique_ids.begin(), unique_ids.end(),
                          [&](int e) { return cache->resident_payload(layer, e) != nullptr; });
  int n_ready = 0;
  // Decode with --gpu-cpu-misses: the experts the cache holds now are acquired (no reads) and
  // computed here; the others on the CPU (cpu_misses), nothing placed or copied for them.
  const bool on_cpu = cpu_experts != nullptr && T == 1 && !batch_step && split;
  if (on_cpu) {
    auto ti = std::chrono::steady_clock::now();
    const auto misses = std::stable_partition(unique_ids.begin(), unique_ids.end(),
                                              [&](int e) { return cache->resident_payload(layer, e) != nullptr; });
    n_ready = int(misses - unique_ids.begin());
    ready.resize(size_t(n_ready));
    cache->begin_acquire(layer, std::span<const int>(unique_ids.data(), size_t(n_ready)), kind,
                         std::span<const uint8_t*>(ptr_h, size_t(n_ready)), ready, lookahead ? layer + 1 : -1,
                         lookahead ? std::span<const int>(predicted) : std::span<const int>{});
    times.expert_io_s += seconds_since(ti);
  } else if (split) {
    auto ti = std::chrono::steady_clock::now();
    ready.resize(size_t(n_groups));
    cache->begin_acquire(layer, unique_ids, kind, std::span<const uint8_t*>(ptr_h, size_t(n_groups)),
                         ready, lookahead ? layer + 1 : -1,
                         lookahead ? std::span<const int>(predicted) : std::span<const int>{});
    // Ready experts first, each part in ascending ids (stable), their pointers along.
    order_ids.clear();
    order_ptrs.clear();
    for (int pass = 1; pass >= 0; --pass)
      for (int g = 0; g < n_groups; ++g)
        if (ready[size_t(g)] == pass) {
          order_ids.push_back(unique_ids[size_t(g)]);
          order_ptrs.push_back(ptr_h[g]);
        }
    n_ready = int(std::count(ready.begin(), ready.end(), uint8_t{1}));
    std::copy(order_ids.begin(), order_ids.end(), unique_ids.begin());
    std::copy(order_ptrs.begin(), order_ptrs.end(), ptr_h);
    times.expert_io_s += seconds_since(ti);
  }
  // Plan: rows grouped by expert in unique_ids order; pair (t, j) -> its row.
  int* gather_idx = plan_host.as<int>();
  int* pair_row = gather_idx + pairs;
  int* row_start = pair_row + pairs;
  int row = 0;
  for (size_t g = 0; g < unique_ids.size(); ++g) {
    const size_t e = size_t(unique_ids[g]);
    row_start[g] = row;
    first_row_of_expert[e] = row;
    row += count_of_expert[e];
  }
  row_start[unique_ids.size()] = row;
  const int n_rows = row;
  MOE_ASSERT(n_rows == T * K);
  for (int i = 0; i < T * K; ++i) {  // token-major order keeps each group's rows in token order
    const size_t e = size_t(ids_h[i]);
    const int r = first_row_of_expert[e]++;
    gather_idx[r] = i / K;
    pair_row[i] = r;
  }
  for (int e : unique_ids) count_of_expert[size_t(e)] = 0;
  // An acquire that read or placed an expert changes what the resident table must say.
  if (!split || n_ready < n_groups) {
    ++step_misses;
    table_stale = true;
  }
  int* plan_d = plan_dev.as<int>();
  // gather_idx and pair_row of n_rows each, row_start of n_groups + 1; one copy of the block.
  MOE_CUDA_CHECK(cudaMemcpyAsync(plan_d, plan_host.as<int>(),
                                 (2 * pairs + unique_ids.size() + 1) * sizeof(int),
                                 cudaMemcpyHostToDevice, stream));
  const ExpertLayout& lay = layouts[size_t(layer)];
  const float* x_up = gather_expert_inputs(lay, plan_d, n_rows, T == 1);
  times.router_s += seconds_since(t0);

  auto upload_ptrs = [&](int g0, int g1) {
    MOE_CUDA_CHECK(cudaMemcpyAsync(ptr_dev.as<const uint8_t*>() + g0, ptr_h + g0,
                                   size_t(g1 - g0) * sizeof(const uint8_t*),
                                   cudaMemcpyHostToDevice, stream));
  };
  auto max_rows_of = [&](int g0, int g1) {
    int m = 0;
    for (int g = g0; g < g1; ++g) m = std::max(m, row_start[g + 1] - row_start[g]);
    return m;
  };
  // Expert kernels of groups [g0, g1); max_rows picks the GEMM's token tile (the acquire's).
  auto launch = [&](int g0, int g1, int max_rows) {
    if (g0 == g1) return;
    const int r0 = row_start[g0], r1 = row_start[g1];
    // Each matrix in its own type (a GGUF's gate, up and down may differ).
    expert_gate_up(lay, g0, g1, max_rows, x_up);
    const uint8_t* const* ptrs_d = ptr_dev.as<const uint8_t*>();
    const int* row_start_d = plan_dev.as<int>() + 2 * pairs;
    if (lay.types.bias) {  // gpt-oss: each expert's gate and up biases, from its payload
      gpu::expert_bias_add(gate, F, row_start_d, g0, g1, r0, r1, ptrs_d, lay.bias_offset, stream);
      gpu::expert_bias_add(up, F, row_start_d, g0, g1, r0, r1, ptrs_d, lay.bias_offset + size_t(F) * 4, stream);
    }
    // SwiGLU and down's input rounding (one launch for the pack types: swiglu_rounded).
    expert_swiglu(lay, gate + size_t(r0) * F, up + size_t(r0) * F, r1 - r0, swi + size_t(r0) * F, T == 1);
    expert_matmul(lay.types.down, lay.down_offset, g0, g1, max_rows, D, F, swi, y);
    if (lay.types.bias)
      gpu::expert_bias_add(y, D, row_start_d, g0, g1, r0, r1, ptrs_d, lay.bias_offset + 2 * size_t(F) * 4, stream);
  };
  if (on_cpu) {
    auto tc = std::chrono::steady_clock::now();
    upload_ptrs(0, n_ready);
    launch(0, n_ready, 1);  // the hits run while the host computes the misses
    cache->finish_acquire();
    cache->kernels_enqueued();
    times.expert_compute_s += seconds_since(tc);
    cpu_misses(layer, n_ready, n_groups, row_start[n_ready], times);
  } else if (split) {
    auto tc = std::chrono::steady_clock::now();
    upload_ptrs(0, n_groups);
    const int max_rows = max_rows_of(0, n_groups);
    launch(0, n_ready, max_rows);  // runs while the host reads the misses
    times.expert_compute_s += seconds_since(tc);
    auto ti = std::chrono::steady_clock::now();
    cache->finish_acquire();
    times.expert_io_s += seconds_since(ti);
    tc = std::chrono::steady_clock::now();
    launch(n_ready, n_groups, max_rows);
    cache->kernels_enqueued();
    times.expert_compute_s += seconds_since(tc);
  } else {
    for (int g0 = 0; g0 < n_groups; g0 += per_acquire) {
      const int g1 = std::min(n_groups, g0 + per_acquire);
      auto ti = std::chrono::steady_clock::now();
      const std::span<const int> group(unique_ids.data() + g0, size_t(g1 - g0));
      const std::span<const uint8_t*> group_ptrs(ptr_h + g0, size_t(g1 - g0));
      if (lookahead && g0 == 0)  // more than 16 experts in one decode step (top-k > 16)
        cache->acquire_and_prefetch(layer, group, kind, group_ptrs, layer + 1, predicted);
      else
        cache->acquire(layer, group, kind, group_ptrs);
      times.expert_io_s += seconds_since(ti);
      auto tc = std::chrono::steady_clock::now();
      upload_ptrs(g0, g1);
      launch(g0, g1, max_rows_of(g0, g1));
      cache->kernels_enqueued();
      times.expert_compute_s += seconds_since(tc);
    }
  }
  auto tc = std::chrono::steady_clock::now();
  gpu::moe_combine_add(y, plan_d + pairs, wts_d, T, K, D, x, stream);
  times.expert_compute_s += seconds_since(tc);
}

// y[T, n] += bias[n] on every row: a rank-1 product ones[T] x bias[n] accumulated by cuBLAS.
void CudaForward::add_bias(const float* bias, int T, int n, float* yout) {
  linear_f32(ones.as<float>(), bias, T, 1, n, yout, 1.0f);
}

// Qwen2-MoE's shared expert on the normalised rows h: sh_y = down(silu(gate h) * up h) and its
// gate logit sh_logit = shared_expert_gate . h (the sigmoid is applied by gated_add).
void CudaForward::shared_expert(SharedExpertKind kind, const GpuLayerWeights& lw, int T) {
  linear(h, lw.shared_gate, T, sh_gate);
  linear(h, lw.shared_up, T, sh_up);
  gpu::swiglu(sh_gate, sh_up, size_t(T) * Fs, sh_act, stream);
  linear(sh_act, lw.shared_down, T, sh_y);
  if (kind == SharedExpertKind::kGated) linear_f32(h, lw.shared_expert_gate, T, D, 1, sh_logit);
}

void CudaForward::add_shared_expert(SharedExpertKind kind, int T) {
  if (kind == SharedExpertKind::kGated) gpu::gated_add(x, sh_y, sh_logit, T, D, stream);
  if (kind == SharedExpertKind::kUngated) gpu::add_inplace(x, sh_y, size_t(T) * D, stream);  // GLM-4.5
}

// The layer's router on the device: softmax top-k, the grouped sigmoid router with the layer's
// correction bias (GLM-4.5, DeepSeek-V3), or gpt-oss's softmax over the top-k of the logits plus
// their bias (added into rlog, which cache-aware routing would copy back), from the logits in rlog.
void CudaForward::route_on_device(const RouterSpec& router, const GpuLayerWeights& lw, int T, int* ids_d,
                                  float* wts_d) {
  const RouterParams& router_params = router.params;
  if (router.logit_bias) add_bias(lw.router_bias_dev, T, E, rlog);  // gpt-oss
  if (router.softmax_of_top_k)
    gpu::router_topk_softmax(rlog, T, E, K, ids_d, wts_d, stream);
  else if (router_params.scoring == RouterScoring::kSigmoid)
    gpu::router_grouped(rlog, lw.router_bias_dev, T, E, K, router_params.n_group,
                        router_params.topk_group, router_params.normalize, router_params.scaling,
                        ids_d, wts_d, stream);
  else if (router_params.n_group > 1 || router_params.scaling != 1.0f)  // DeepSeek-V2 (issue 20)
    gpu::router_grouped_softmax(rlog, T, E, K, router_params.n_group, router_params.topk_group,
                                router_params.normalize, router_params.scaling, ids_d, wts_d, stream);
  else
    gpu::router_topk(rlog, T, E, K, router_params.normalize, ids_d, wts_d, stream);
}

// A dense first layer's SwiGLU MLP on the normalised rows h, added to the residual x.
void CudaForward::dense_mlp(const GpuLayerWeights& lw, int T) {
  linear(h, lw.mlp_gate, T, mlp_g);
  linear(h, lw.mlp_up, T, mlp_u);
  gpu::swiglu(mlp_g, mlp_u, size_t(T) * I, mlp_a, stream);
  linear(mlp_a, lw.mlp_down, T, x, true);
}

}  // namespace detail

std::string gpu_unavailable_reason() {
  const char* why = "";
  if (gpu::device_count(&why) > 0) return "";
  return std::string("no usable CUDA device (") + why + ")";
}

std::unique_ptr<GpuForward> GpuForward::create(const ModelConfig& cfg,
                                               const std::filesystem::path& dense_path,
                                               ExpertStore& store, const GpuForwardOptions& opts) {
  return std::make_unique<detail::CudaForward>(cfg, dense_path, store, opts);
}

}  // namespace moestream
