// Implementation of runtime/gpu/gpu_weights.h: the CPU pass's DenseWeights (mapped, checked)
// sized once, one device allocation, then each tensor copied in pieces.
#include "runtime/gpu/gpu_weights.h"

#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.cuh"
#include "runtime/model/dense_weights.h"

namespace moestream {

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMalloc(&p_, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state so later checks see their own
    p_ = nullptr;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    char buf[160];
    std::snprintf(buf, sizeof buf, "GPU: cannot allocate %.1f MiB (%.1f MiB free of %.1f MiB): ",
                  double(bytes) / (1 << 20), double(free_b) / (1 << 20), double(total_b) / (1 << 20));
    throw Error(std::string(buf) + cudaGetErrorString(e));
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}

PinnedBuffer::PinnedBuffer(size_t bytes) {
  if (bytes > 0) MOE_CUDA_CHECK(cudaMallocHost(&p_, bytes));
}

PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
}

namespace {

constexpr size_t kAlign = 256;                // every tensor starts 256-byte aligned
constexpr size_t kPiece = size_t(64) << 20;   // bytes per host-to-device copy
size_t padded(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// One tensor of the host weights: its bytes and where its device pointer goes.
struct Upload {
  const uint8_t* src = nullptr;
  size_t bytes = 0;
  GpuMatrix* matrix = nullptr;  // a matrix in its stored type, or
  const float** vec = nullptr;  // a float32 norm or router
};

// Drops [p, p + n) from this process's page tables when it lies in one of `host`'s read-only
// file mappings: the pages stay in the page cache, but a load of a large model does not hold
// every dense page mapped at once. Owned copies (de-interleaved Q/K) are never touched.
void unmap_copied(const DenseWeights& host, const uint8_t* p, size_t n) {
  for (const auto& m : host.maps) {
    if (m->size() == 0) continue;
    const uint8_t* base = m->range(0, m->size(), "mapping");
    if (p < base || p + n > base + m->size()) continue;
    const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t a = (uintptr_t(p) + page - 1) / page * page, b = (uintptr_t(p) + n) / page * page;
    if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);  // advisory: failure is harmless
    return;
  }
}

GpuMatrix shape_of(const DenseMatrix& m, const std::string& name) {
  if (m.rows > size_t(INT_MAX) || m.cols > size_t(INT_MAX))
    throw ConfigError("dense tensor '" + name + "': " + std::to_string(m.rows) + " x " + std::to_string(m.cols) +
                      " is too large for the GPU pass");
  return GpuMatrix{m.type, nullptr, int(m.rows), int(m.cols)};
}

}  // namespace

GpuDenseWeights GpuDenseWeights::load(const ModelConfig& cfg, const std::filesystem::path& path) {
  const DenseWeights host = DenseWeights::load(path, cfg);
  return upload(cfg, host);
}

GpuDenseWeights GpuDenseWeights::upload(const ModelConfig& cfg, const DenseWeights& host) {
  MOE_ASSERT(host.layers.size() == size_t(cfg.n_layers), "dense weights of another model");
  GpuDenseWeights g;
  g.layers.resize(size_t(cfg.n_layers));
  std::vector<Upload> ups;
  auto matrix = [&](const DenseMatrix& m, GpuMatrix& dst, const std::string& name) {
    dst = shape_of(m, name);
    ups.push_back({m.data, m.bytes(), &dst, nullptr});
  };
  auto vec = [&](const float* data, size_t n, const float*& dst) {
    ups.push_back({reinterpret_cast<const uint8_t*>(data), n * sizeof(float), nullptr, &dst});
  };
  matrix(host.embed, g.embed, "embed");
  if (!host.lm_head.empty()) matrix(host.lm_head, g.lm_head, "lm_head");
  vec(host.final_norm.data(), size_t(host.final_norm.size()), g.final_norm);
  for (size_t l = 0; l < host.layers.size(); ++l) {
    const LayerWeights& h = host.layers[l];
    GpuLayerWeights& d = g.layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    vec(h.attn_norm.data(), size_t(h.attn_norm.size()), d.attn_norm);
    if (!h.wq.empty()) matrix(h.wq, d.wq, p + "wq");  // MLA with q LoRA: none
    if (!h.wk.empty()) matrix(h.wk, d.wk, p + "wk");  // MLA: none
    if (!h.wv.empty()) matrix(h.wv, d.wv, p + "wv");
    matrix(h.wo, d.wo, p + "wo");
    if (cfg.has_mla()) {  // DeepSeek-V2/V3's latent attention (gpu_mla.h)
      if (!h.wq_a.empty()) {
        matrix(h.wq_a, d.wq_a, p + "wq_a");
        matrix(h.wq_b, d.wq_b, p + "wq_b");
        vec(h.q_a_norm.data(), size_t(h.q_a_norm.size()), d.q_a_norm);
      }
      matrix(h.wkv_a, d.wkv_a, p + "wkv_a");
      matrix(h.wkv_b, d.wkv_b, p + "wkv_b");
      vec(h.kv_a_norm.data(), size_t(h.kv_a_norm.size()), d.kv_a_norm);
    }
    if (h.q_norm.size() > 0) vec(h.q_norm.data(), size_t(h.q_norm.size()), d.q_norm);
    if (h.k_norm.size() > 0) vec(h.k_norm.data(), size_t(h.k_norm.size()), d.k_norm);
    vec(h.ffn_norm.data(), size_t(h.ffn_norm.size()), d.ffn_norm);
    if (h.router.size() > 0) vec(h.router.data(), size_t(h.router.size()), d.router);
    d.router_bias.assign(h.router_bias.data(), h.router_bias.data() + h.router_bias.size());
    if (h.router_bias.size() > 0) vec(h.router_bias.data(), size_t(h.router_bias.size()), d.router_bias_dev);
    if (!h.mlp_gate.empty()) {  // a dense first layer (GLM-4.5 / DeepSeek-V3)
      matrix(h.mlp_gate, d.mlp_gate, p + "mlp_gate");
      matrix(h.mlp_up, d.mlp_up, p + "mlp_up");
      matrix(h.mlp_down, d.mlp_down, p + "mlp_down");
    }
    if (h.bq.size() > 0) {
      vec(h.bq.data(), size_t(h.bq.size()), d.bq);
      vec(h.bk.data(), size_t(h.bk.size()), d.bk);
      vec(h.bv.data(), size_t(h.bv.size()), d.bv);
    }
    if (!h.shared_gate.empty()) {
      matrix(h.shared_gate, d.shared_gate, p + "shared_gate");
      matrix(h.shared_up, d.shared_up, p + "shared_up");
      matrix(h.shared_down, d.shared_down, p + "shared_down");
      if (h.shared_expert_gate.size() > 0)  // ungated (GLM-4.5): none
        vec(h.shared_expert_gate.data(), size_t(h.shared_expert_gate.size()), d.shared_expert_gate);
    }
    if (h.bo.size() > 0) vec(h.bo.data(), size_t(h.bo.size()), d.bo);
    if (h.sinks.size() > 0) vec(h.sinks.data(), size_t(h.sinks.size()), d.sinks);
  }
  size_t total = 0;
  for (const Upload& u : ups) total += padded(u.bytes);
  g.memory = DeviceBuffer(total);
  uint8_t* dst = g.memory.as<uint8_t>();
  for (const Upload& u : ups) {
    for (size_t first = 0; first < u.bytes; first += kPiece) {
      const size_t n = std::min(kPiece, u.bytes - first);
      MOE_CUDA_CHECK(cudaMemcpy(dst + first, u.src + first, n, cudaMemcpyHostToDevice));
      unmap_copied(host, u.src + first, n);
    }
    if (u.matrix != nullptr) u.matrix->data = dst;
    else *u.vec = reinterpret_cast<const float*>(dst);
    dst += padded(u.bytes);
  }
  if (g.lm_head.data == nullptr) g.lm_head = g.embed;  // tie_word_embeddings
  const bool qk = cfg.qk_norm != QkNorm::kNone;
  for (size_t l = 0; l < g.layers.size(); ++l) {
    const GpuLayerWeights& d = g.layers[l];
    const bool moe = cfg.is_moe_layer(int(l));
    const bool mla_ok = cfg.q_lora_rank > 0 ? (d.wq_a.data && d.wq_b.data && d.q_a_norm) : d.wq.data != nullptr;
    const bool attn_ok = cfg.has_mla() ? (mla_ok && d.wkv_a.data && d.wkv_b.data && d.kv_a_norm)
                                       : (d.wq.data && d.wk.data && d.wv.data);
    MOE_ASSERT(attn_ok && d.wo.data && d.attn_norm && d.ffn_norm &&
                   (!qk || (d.q_norm && d.k_norm)) && (!cfg.qkv_bias || (d.bq && d.bk && d.bv)) &&
                   (moe ? d.router != nullptr : (d.mlp_gate.data && d.mlp_up.data && d.mlp_down.data)) &&
                   (!moe || (cfg.router_scoring != RouterScoring::kSigmoid && !cfg.router_bias) ||
                    (d.router_bias.size() == size_t(cfg.n_experts) && d.router_bias_dev)) &&
                   (!moe || !cfg.has_shared_expert() ||
                    (d.shared_gate.data && d.shared_up.data && d.shared_down.data &&
                     (!cfg.shared_expert_gated || d.shared_expert_gate))) &&
                   (!cfg.o_bias || d.bo) && (!cfg.attention_sinks || d.sinks),
               "dense weights missing a tensor after upload");
  }
  return g;
}

}  // namespace moestream
