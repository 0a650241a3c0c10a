// A decode step allocates no heap memory once the model is warm: malloc and friends are
// interposed in this test binary and counted while a window is open.
#include <gtest/gtest.h>

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <vector>

#include <cstring>

#include "common/file_util.h"
#include "kernels/cpu/ggml_quant.h"
#include "loader/format/gguf_model.h"
#include "loader/store/expert_store.h"
#include "runtime/engine/model.h"
#include "runtime/model/sampler.h"
#include "runtime/convert/synthetic_model.h"
#include "tests/support/gguf_builder.h"
#include "tests/support/test_model.h"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocs{0};
void count() {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

// glibc resolves these in the executable first, so every allocation of the process passes here.
extern "C" void* malloc(size_t n) {
  count();
  return __libc_malloc(n);
}
extern "C" void* calloc(size_t a, size_t b) {
  count();
  return __libc_calloc(a, b);
}
extern "C" void* realloc(void* p, size_t n) {
  count();
  return __libc_realloc(p, n);
}
extern "C" void* aligned_alloc(size_t align, size_t n) {
  count();
  return __libc_memalign(align, n);
}
extern "C" int posix_memalign(void** out, size_t align, size_t n) {
  count();
  *out = __libc_memalign(align, n);
  return *out ? 0 : 12;  // ENOMEM
}

using namespace moestream;

// Heap allocations of 16 warm decode steps of m, after a prompt and `warm_up` decode steps.
long warm_decode_allocations(Model& m, int warm_up = 4) {
  std::vector<float> logits(size_t(m.config().vocab_size));
  std::vector<int> prompt{5, 6, 7, 8};
  m.forward(prompt, logits);
  int tok = Sampler::argmax(logits);
  for (int i = 0; i < warm_up; ++i) {  // buffers of the store and kernels reach their size
    m.forward(std::span<const int>(&tok, 1), logits);
    tok = Sampler::argmax(logits);
  }
  g_allocs = 0;
  g_counting = true;
  for (int i = 0; i < 16; ++i) {
    m.forward(std::span<const int>(&tok, 1), logits);
    tok = Sampler::argmax(logits);
  }
  g_counting = false;
  return g_allocs.load();
}

// A pack's decode, with its dense matrices in f32 (Eigen) and in bf16 (computed as stored by
// the ggml BF16 kernel), a Qwen2-MoE one (QKV biases, a shared expert wider than the rest) and a
// GLM-4.5 one (grouped sigmoid routing, an ungated shared expert, a dense first layer) and a
// DeepSeek-V3 one (the same with MLA attention).
TEST(DecodeAllocations, WarmDecodeStepsAllocateNothing) {
  for (const std::string dense : {"f32", "bf16", "bf16+shared", "bf16+glm", "bf16+mla"}) {
    TempDir d("alloc");
    ModelConfig c = test::tiny_moe_config({.vocab = 301, .hidden = 96, .head_dim = 24, .intermediate = 70,
                                           .experts = 16, .top_k = 4, .quant = QuantType::kQ4});
    c.dense_dtype = dense.substr(0, dense.find('+'));
    if (dense == "bf16+shared") test::as_qwen2_moe(c, 150);
    // grouped sigmoid routing, a dense first layer, partial rotary
    if (dense == "bf16+glm") test::as_glm4_moe(c, {.shared = 70, .dense_intermediate = 130, .rotary_dim = 12});
    if (dense == "bf16+mla")  // DeepSeek-V3: MLA (head_dim 24 = nope 16 + rope 8) over GLM-4.5's routing
      test::as_deepseek_v3(c, {.q_lora = 40, .kv_lora = 36, .nope = 16, .rope = 8, .v = 20, .shared = 70,
                               .dense_intermediate = 90});
    write_synthetic_model(d.path(), c, 77);
    ModelOptions o;
    o.n_threads = 2;
    // The pread store, explicitly: Model::load's default (the read engine, as infer) still
    // allocates per batch (its read plan and requests, ~11 allocations per layer fetch), which
    // this test does not cover; it holds the forward pass and the simple store to zero.
    auto m = Model::load(d.path(), o, open_pread_expert_store(d.path(), ModelConfig::load(d.path())));
    EXPECT_EQ(warm_decode_allocations(*m), 0) << "heap allocations during 16 warm decode steps, dense " << dense;
  }
  // The counter works: a vector allocation inside the window is seen.
  g_allocs = 0;
  g_counting = true;
  std::vector<int>* v = new std::vector<int>(1000);
  g_counting = false;
  delete v;
  EXPECT_GE(g_allocs.load(), 1);
}

namespace {

// Every expert of a GGUF copied into memory once, in the engine's payload layout: a store that
// allocates nothing per fetch, so the test sees the forward pass alone (the engine store, the
// only one that reads GGUFs, allocates per batch; see above).
class InMemoryGgufStore : public ExpertStore {
 public:
  InMemoryGgufStore(const std::filesystem::path& path, const ModelConfig& cfg) : cfg_(cfg) {
    const GgufModel g(path);
    for (int l = 0; l < cfg.n_layers; ++l) {
      const ExpertLayout lay = cfg.expert_layout(l);
      const GgufLayerExperts& x = g.experts()[size_t(l)];
      std::vector<std::vector<uint8_t>> layer;
      const std::vector<uint8_t> gate = g.read_tensor(g.files().tensor("blk." + std::to_string(l) + ".ffn_gate_exps.weight"));
      const std::vector<uint8_t> up = g.read_tensor(g.files().tensor("blk." + std::to_string(l) + ".ffn_up_exps.weight"));
      const std::vector<uint8_t> down = g.read_tensor(g.files().tensor("blk." + std::to_string(l) + ".ffn_down_exps.weight"));
      for (int e = 0; e < cfg.n_experts; ++e) {
        std::vector<uint8_t> p(lay.bytes);
        std::memcpy(p.data() + lay.gate_offset, gate.data() + e * x.gate.expert_bytes, x.gate.expert_bytes);
        std::memcpy(p.data() + lay.up_offset, up.data() + e * x.up.expert_bytes, x.up.expert_bytes);
        std::memcpy(p.data() + lay.down_offset, down.data() + e * x.down.expert_bytes, x.down.expert_bytes);
        layer.push_back(std::move(p));
      }
      experts_.push_back(std::move(layer));
      layouts_.push_back(lay);
    }
  }
  void begin_fetch(int layer, std::span<const int> ids, FetchForm form) override {
    (void)form;  // always payloads
    layer_ = layer;
    ids_.assign(ids.begin(), ids.end());
    next_ = 0;
  }
  bool next_ready(size_t* index, ExpertMatrices* m, bool wait) override {
    (void)wait;  // everything is in memory
    if (next_ >= ids_.size()) return false;
    *index = next_;
    *m = ExpertMatrices::of_payload(experts_.at(size_t(layer_)).at(size_t(ids_[next_])).data(),
                                    layouts_[size_t(layer_)]);
    ++next_;
    return true;
  }
  ExpertStoreStats stats() const override { return {}; }

 private:
  ModelConfig cfg_;
  std::vector<ExpertLayout> layouts_;
  int layer_ = 0;
  std::vector<int> ids_;  // the current fetch's, handed out from next_
  size_t next_ = 0;
  std::vector<std::vector<std::vector<uint8_t>>> experts_;
};

}  // namespace

// A GGUF whose dense matrices are Q8_0 (computed as stored: int8-rounded inputs in the ggml
// kernels' per-thread scratch, which the forward pass reserves up front) allocates nothing
// either. Tensor bytes are the builder's filler (a distinct byte per tensor): finite, tiny values.
TEST(DecodeAllocations, WarmDecodeOfQ8_0DenseGgufAllocatesNothing) {
  constexpr uint32_t kF32 = 0, kQ8_0 = 8, kGgufF32 = 6;
  const uint64_t D = 64, V = 96, H = 4, KV = 2, hd = 16, F = 32, E = 4, L = 2;
  test::GgufBuilder b;
  float eps = 1e-6f;
  b.kv_string("general.architecture", "qwen3moe")
      .kv_u32("qwen3moe.block_count", L)
      .kv_u32("qwen3moe.context_length", 128)
      .kv_u32("qwen3moe.embedding_length", D)
      .kv_u32("qwen3moe.attention.head_count", H)
      .kv_u32("qwen3moe.attention.head_count_kv", KV)
      .kv_u32("qwen3moe.attention.key_length", hd)
      .kv_u32("qwen3moe.expert_count", E)
      .kv_u32("qwen3moe.expert_used_count", 2)
      .kv_u32("qwen3moe.expert_feed_forward_length", F)
      .kv("qwen3moe.attention.layer_norm_rms_epsilon", kGgufF32, std::string(reinterpret_cast<const char*>(&eps), 4))
      .tensor("token_embd.weight", {D, V}, kQ8_0)
      .tensor("output.weight", {D, V}, kQ8_0)
      .tensor("output_norm.weight", {D}, kF32);
  for (uint64_t l = 0; l < L; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    b.tensor(p + "attn_norm.weight", {D}, kF32)
        .tensor(p + "attn_q.weight", {D, H * hd}, kQ8_0)
        .tensor(p + "attn_k.weight", {D, KV * hd}, kQ8_0)
        .tensor(p + "attn_v.weight", {D, KV * hd}, kQ8_0)
        .tensor(p + "attn_output.weight", {H * hd, D}, kQ8_0)
        .tensor(p + "attn_q_norm.weight", {hd}, kF32)
        .tensor(p + "attn_k_norm.weight", {hd}, kF32)
        .tensor(p + "ffn_norm.weight", {D}, kF32)
        .tensor(p + "ffn_gate_inp.weight", {D, E}, kF32)
        .tensor(p + "ffn_gate_exps.weight", {D, F, E}, kQ8_0)
        .tensor(p + "ffn_up_exps.weight", {D, F, E}, kQ8_0)
        .tensor(p + "ffn_down_exps.weight", {F, D, E}, kQ8_0);
  }
  TempDir d("alloc_gguf");
  const std::filesystem::path path = d.path() / "model.gguf";
  b.write(path);
  const ModelConfig c = ModelConfig::load(path);
  ASSERT_EQ(c.format, ModelFormat::kGguf);
  ModelOptions o;
  o.n_threads = 2;
  auto m = Model::load(path, o, std::make_unique<InMemoryGgufStore>(path, c));
  // No warm-up steps: the store allocates nothing, and the pass sized every pool thread's kernel
  // scratch at load, so the decode steps right after the prompt allocate nothing either.
  EXPECT_EQ(warm_decode_allocations(*m, 0), 0) << "heap allocations during 16 decode steps of a Q8_0 GGUF";
}

// The ggml kernels (kernels/cpu/ggml_quant.h) round their inputs into per-thread scratch that
// ggml_reserve_scratch sizes: after it, products of that size or smaller allocate nothing.
TEST(DecodeAllocations, GgmlKernelsAllocateNothingAfterReserve) {
  const size_t rows = 8, cols = 512, n = 5;
  std::vector<float> x(n * cols, 0.5f), y(n * rows);
  std::vector<std::pair<GgmlType, std::vector<uint8_t>>> mats;
  for (GgmlType t : {GgmlType::kF32, GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                     GgmlType::kMXFP4}) {
    if (!ggml_type_computable(t)) continue;
    mats.emplace_back(t, std::vector<uint8_t>(*ggml_row_bytes(t, cols) * rows, 0x11));
  }
  ASSERT_FALSE(mats.empty());
  ggml_reserve_scratch(cols, n);
  g_allocs = 0;
  g_counting = true;
  for (auto& [t, w] : mats) {
    ggml_matvec(t, w.data(), cols, x.data(), y.data(), 0, rows);
    ggml_matmul(t, w.data(), cols, x.data(), n, y.data(), rows, 0, rows);
    ggml_matvec(t, w.data(), cols / 2, x.data(), y.data(), 0, rows);  // narrower: the same scratch
  }
  g_counting = false;
  EXPECT_EQ(g_allocs.load(), 0) << "heap allocations in ggml products after ggml_reserve_scratch";
}
