// Internal to runtime/gpu/gpu_forward*.cpp: the CUDA implementation of GpuForward
// (runtime/gpu/gpu_forward.h). gpu_forward.cpp holds its setup and the forward pass,
// gpu_forward_ops.cpp its matrix products (dense weights and experts in their stored types, inputs
// rounded as the CPU rounds them), the logits (lm_head, greedy decoding's argmax) and the load-time
// warm-up.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <filesystem>
#include <memory>
#include <vector>

#include "runtime/gpu/gpu_cache_common.h"
#include "runtime/gpu/gpu_forward.h"
#include "runtime/gpu/gpu_graphs.h"
#include "runtime/gpu/gpu_attention.h"
#include "runtime/gpu/gpu_weights.h"
#include "runtime/model/expert_compute.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/rope.h"
#include "runtime/model/routing.h"
#include "runtime/model/routing_step.h"

namespace moestream::detail {

// Throws Error naming the cuBLAS call when st is not success.
void cublas_check(cublasStatus_t st, const char* what);

// The CUDA implementation of GpuForward.
struct CudaForward final : GpuForward {
  const ModelConfig& cfg;
  GpuForwardOptions opts;
  ExpertStore& store;
  int D, H, KV, hd, half, E, K, F, V, N, B;  // N: look-ahead width, B: max tokens per chunk
                                             // half: RoPE pairs per head (rotary_dim / 2)
  int hd_p;      // head_dim rounded up to 4 (the attention kernel's float4 loads)
  bool padded;   // hd_p != hd: heads are copied into zero-padded rows around attention
  float eps, scale;
  std::vector<ExpertLayout> layouts;  // by layer: a GGUF's expert types may differ per layer and matrix
  Rope rope;
  // The layers' block kinds and options (runtime/model/layer_plan.h), as the CPU pass builds them:
  // every per-layer choice below reads its layer's spec, never a model-wide flag.
  std::vector<LayerSpec> plan;
  GpuForwardInfo info_;

  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  GpuDenseWeights w;
  DeviceBuffer act;
  float *x = nullptr, *h = nullptr, *tmp = nullptr, *qraw = nullptr, *q = nullptr,
        *kraw = nullptr, *attn = nullptr, *k_tok = nullptr, *v_tok = nullptr, *q_pad = nullptr,
        *attn_pad = nullptr, *rlog = nullptr, *la_log = nullptr, *cos_d = nullptr,
        *sin_d = nullptr, *xg = nullptr, *gate = nullptr, *up = nullptr, *swi = nullptr,
        *y = nullptr, *logits = nullptr, *proj = nullptr;
  // Inputs rounded as the CPU's kernels round them (kernels/cuda/round_activations.h): xr for a
  // dense matrix of a rounded type; xg_up for up when its rounding differs from gate's (a mixed
  // GGUF; unallocated otherwise).
  float *xr = nullptr, *xg_up = nullptr;
  bool gate_up_round_apart = false;
  // Qwen2-MoE: the shared expert's gate/up/SwiGLU rows [B, Fs], its output [B, D] and gate logit
  // [B] (unallocated without one); `ones` [B] (all 1) adds the QKV biases through cuBLAS.
  int Fs = 0;
  float *sh_gate = nullptr, *sh_up = nullptr, *sh_act = nullptr, *sh_y = nullptr, *sh_logit = nullptr;
  DeviceBuffer ones;
  // Dense-MLP layers (FfnKind::kDense: GLM-4.5's and DeepSeek's first ones): gate/up/SwiGLU rows
  // [B, I] (unallocated without one).
  int I = 0;
  float *mlp_g = nullptr, *mlp_u = nullptr, *mlp_a = nullptr;
  // Router outputs, one block so that one D2H brings all: ids [B*K] | weights [B*K] |
  // look-ahead ids [N] | look-ahead weights [N].
  DeviceBuffer route_dev;
  PinnedBuffer route_host;
  // Inputs of a chunk: tokens [B] | cos [B*half] | sin [B*half] (one H2D).
  DeviceBuffer in_dev;
  PinnedBuffer in_host;
  // MoE plan of a layer: gather_idx [B*K] | pair_row [B*K] | row_start [B*K+1], then the expert
  // payload pointers [B*K] (uploaded per acquire).
  DeviceBuffer plan_dev, ptr_dev;
  PinnedBuffer plan_host, ptr_host;
  std::unique_ptr<ExpertStore> prefetch_store;  // the cache's prefetch worker reads through it
  std::unique_ptr<GpuExpertCache> cache;

  // Host-side routing and planning scratch (sized once: the decode step allocates nothing).
  std::vector<int> unique_ids, count_of_expert, first_row_of_expert;
  std::vector<uint8_t> ready;               // begin_acquire's flags, by unique_ids position
  std::vector<int> order_ids;               // unique_ids, ready experts first
  std::vector<const uint8_t*> order_ptrs;   // their payload pointers
  std::vector<float> router_inputs;
  std::vector<int> predicted;  // look-ahead ids made during layer predicted_layer - 1
  int predicted_layer = -1;
  std::vector<uint8_t> in_prediction;  // [E]
  GpuLookaheadStats la_stats;
  // Cache-aware routing: the router's logits [B*E] on the host.
  PinnedBuffer logits_host;
  // Greedy decoding (ForwardChunk::argmax): the last token's id, picked on the device.
  DeviceBuffer argmax_dev;  // gpu::ArgmaxState, zeroed at construction
  PinnedBuffer argmax_host;
  std::vector<ExpertTier> tiers;   // [E]: the store's (host) tiers
  // The chunk's routing step (override, id check, cache-aware substitution, events), begun by
  // forward_chunk and forward_batch; residency: the GPU cache or a host tier (the constructor).
  RoutingStep routing_step;
  ResidencyFn residency;
  // Resident decode (gpu_forward_resident.cpp, docs/gpu.md): a decode step whose experts were
  // all resident last step runs every layer without a host sync, reading this table.
  bool resident_capable = false;  // every expert matrix takes the grouped GEMM (device pointers)
  bool resident_next = false;     // the last decode step read no expert: try this one resident
  bool table_stale = true;        // the cache may have changed since table_dev was written
  int step_misses = 0;            // acquires of the current step that had to read an expert
  DeviceBuffer table_dev;         // [n_layers][E] payload pointers, nullptr = not resident
  PinnedBuffer table_host;
  DeviceBuffer resident_dev;      // per layer: ids [L*K] | weights [L*K] | missed [L]
  PinnedBuffer resident_host;
  DeviceBuffer snapshot;          // [L][D]: x before each layer's MoE (a redo starts from it)
  DeviceBuffer fallback_expert;   // a zero payload the plan points a missing expert at
  GpuResidentStats resident_stats;
  cudaEvent_t step_begin = nullptr, step_end = nullptr;  // a resident step's span on the device
  // h already holds the norm the next layer (or lm_head) starts with: a resident layer ended
  // with moe_combine_add_norm. Set only while enqueueing a resident step; consumed by the next
  // norm_into_h or enqueue_lm_head; cleared at each chunk's start and before a redo.
  bool h_normed = false;
  // Its kernels as CUDA graphs, one segment per layer and one for lm_head (opts.graphs).
  std::unique_ptr<GpuGraphSegments> graphs;
  void resident_layer(int l, const ForwardChunk& c, ForwardTimes& times);
  // --gpu-cpu-misses (gpu_cpu_misses.cpp): decode experts the cache lacks, computed on the CPU.
  // The token's normalised row comes back with the router's ids (h_host); the outputs go up from
  // y_host into their rows of y before the combine.
  std::unique_ptr<ExpertCompute> cpu_experts;  // null: the option is off
  PinnedBuffer h_host, y_host;                  // [D], [K][D]
  std::vector<ExpertMatrices> miss_payloads;
  std::vector<int> miss_ready, miss_tokens;
  GpuCpuMissStats cpu_miss_stats;
  void init_cpu_misses();
  // Groups [g0, g1) of MoE layer `layer`'s plan (unique_ids; one row each, from row y_row0).
  void cpu_misses(int layer, int g0, int g1, int y_row0, ForwardTimes& times);
  // The attention blocks (gpu_attention.h), one per kind the layers take, each with its device
  // state: grouped-query attention's KV caches (gpu_gqa_attention.h), DeepSeek-V2/V3's latent
  // cache (gpu_mla.h). attention_of(l) is layer l's, by its spec.
  std::unique_ptr<GpuAttention> gqa_attention, mla_attention;
  GpuAttention& attention_of(int l) {
    return plan[size_t(l)].attention.kind == AttentionKind::kMla ? *mla_attention : *gqa_attention;
  }

  CudaForward(const ModelConfig& c, const std::filesystem::path& dense_path, ExpertStore& s,
              const GpuForwardOptions& o);
  ~CudaForward() override;
  void linear(const float* xin, const GpuMatrix& W, int T, float* yout, bool accumulate = false);
  // q, k and v of the layer from xin: one launch where the three share type and width and T is
  // 1 (gpu::dense_gemm_shared_input), else three linear() calls; the same bits either way.
  void linear_qkv(const float* xin, const GpuLayerWeights& lw, int T, float* yq, float* yk,
                  float* yv);
  void linear_f32(const float* xin, const float* W, int T, int in, int out, float* yout,
                  float beta = 0.0f);
  void embed(int T);
  // one_token: the chunk is one token (each group one row), so a GEMV that rounds its own input
  // (gpu::gemv_rounds_input) takes the rows unrounded.
  const float* gather_expert_inputs(const ExpertLayout& lay, const int* gather_idx, int n_rows, bool one_token);
  // SwiGLU of `rows` gate/up rows into out (gpt-oss: clamped), rounded for down's type unless
  // down's one-token GEMV rounds its input itself; the same bits either way.
  void expert_swiglu(const ExpertLayout& lay, const float* g, const float* u, int rows, float* out, bool one_token);
  void expert_matmul(QuantType q, size_t offset, int g0, int g1, int max_rows, int rows, int cols,
                     const float* xin, float* yout);
  // The experts' gate (from xg) and up (from x_up) of groups [g0, g1) into gate/up: one launch
  // where both share a type and take the grouped GEMM (gpu::expert_gemm_gate_up), else two
  // expert_matmul calls; the same bits either way.
  void expert_gate_up(const ExpertLayout& lay, int g0, int g1, int max_rows, const float* x_up);
  void forward_chunk(const ForwardChunk& chunk, const RoutingControl& routing, ForwardTimes& times,
                     CacheAwareStats& cache_aware) override;
  GpuForwardStats stats() const override {
    return GpuForwardStats{cache->telemetry(), la_stats, resident_stats, cpu_miss_stats};
  }
  void reset_stats() override {
    cache->reset_telemetry();
    la_stats = {};
    resident_stats = {};
    cpu_miss_stats = {};
  }
  const GpuForwardInfo& info() const override { return info_; }
  void moe(int layer, int T, bool lookahead, ForwardTimes& times);
  void attention_layer(int l, int T, int n_past, ForwardTimes& times);
  void moe_layer(const ForwardChunk& c, int l, ForwardTimes& times);
  void enqueue_logits(const ForwardChunk& c);
  // enqueue_logits without the copy to c.logits: final norm and lm_head into `logits`.
  void enqueue_lm_head(const ForwardChunk& c);
  void norm_into_h(const float* weight, int rows, int first = 0);
  void enqueue_argmax(const ForwardChunk& c);
  bool expert_gemm_takes(const ExpertLayout& lay) const;
  void init_resident();
  void preload_experts();
  bool resident_step_allowed(const ForwardChunk& c) const;
  int resident_step(const ForwardChunk& c, ForwardTimes& times);
  void add_bias(const float* bias, int T, int n, float* yout);
  void shared_expert(SharedExpertKind kind, const GpuLayerWeights& lw, int T);
  // The shared expert's output added to x after the routed sum, as the CPU (gated or not).
  void add_shared_expert(SharedExpertKind kind, int T);
  void dense_mlp(const GpuLayerWeights& lw, int T);
  void route_on_device(const RouterSpec& router, const GpuLayerWeights& lw, int T, int* ids_d, float* wts_d);
  void warm_up();

  // Batches of sequences (gpu_forward_batch.cpp; docs/gpu.md "Batches of sequences"): each slot's
  // attention state is its attention block's; the step's rows in the shared scratch, entry i at
  // rows batch_splits[i]..batch_splits[i+1].
  std::vector<int> batch_splits;
  std::vector<RoutingSequence> batch_sequences;  // the entries as the routing step sees them
  // Set by forward_batch while its layers run. batch_step: moe_layer predicts nothing (no
  // look-ahead) and moe(), with more experts than one acquire takes, acquires the resident ones
  // first so their kernels run while the misses are read. batch_demand: the union is a demand
  // (kDemand) when the step decodes a token, else a prefill fill.
  bool batch_step = false;
  bool batch_demand = false;
  // While set, linear_f32 runs over each sequence's rows apart (row boundaries, entry i at
  // [split[i], split[i+1])): cuBLAS picks its algorithm by row count (gemv for one row), so a
  // sequence's f32 products then sum as in its run alone. Our kernels compute each row alone.
  const std::vector<int>* split_rows = nullptr;
  std::vector<int> logit_splits;  // the lm_head rows' boundaries
  bool linear_f32_per_sequence(const float* xin, const float* W, int T, int in, int out, float* yout,
                               float beta);
  void forward_batch(const ForwardBatch& batch, const RoutingControl& routing, ForwardTimes& times,
                     CacheAwareStats& cache_aware) override;
  void batch_attention_layer(const ForwardBatch& b, int l, ForwardTimes& times);
};

}  // namespace moestream::detail
