// Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) on the GPU: the latent KV cache append,
// the absorbed query, the attention over latents and the value up-projection, each the device
// twin of a step of runtime/model/mla_attention.cpp (docs/mla.md). Plain C++; all pointers are
// device pointers. Names: H heads, n qk_nope_head_dim, r qk_rope_head_dim (even), v v_head_dim,
// C kv_lora_rank; a latent cache row is C + r floats (the normalised latent, then the rotated
// RoPE key every head shares).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/gpu_ops.h"

namespace moestream::gpu {

// The widest cache row (C + r) the attention kernel takes: each lane of a warp keeps its
// C + r / 32 values of a key row in registers.
inline constexpr int kMlaMaxLatent = 1024;

// Whether the wkv_b kernels below read a matrix of type q directly (f32 and ggml's F32, F16,
// BF16, which a pack's f16/bf16 are); any other type is first dequantised to f32 by the caller.
bool mla_reads_type(QuantType q);

// Appends T positions to one layer's cache: rows[t] ([C + r] each, contiguous: the cache row of
// position pos0 + t) = RMSNorm(kv[t][0, C)) * norm (eps inside the root), then kv[t][C, C + r)
// rotated in the rotate-half layout by cos/sin [T, r/2] (Rope::fill's tables). kv: [T, C + r].
void mla_cache_append(const float* kv, const float* norm, float eps, const float* cos, const float* sin, int T, int C,
                      int r, float* rows, Stream s);

// The absorbed query of T tokens: q [T, H, n + r] (the RoPE part not yet rotated), wkv_b
// [H * (n + v), C] rows in type wt (per head n key rows W_UK then v value rows W_UV) ->
// q_abs [T, H, C + r]: q_abs[t][h][c] = sum_i q[t][h][i] * W_UK,h[i][c] for c < C, then the
// head's RoPE part rotated by cos/sin [T, r/2].
void mla_absorb_q(const float* q, QuantType wt, const uint8_t* wkv_b, int T, int H, int n, int r, int v, int C,
                  const float* cos, const float* sin, float* q_abs, Stream s);

// Causal attention of T query tokens at positions pos0.. over one layer's cache [max_ctx][C + r]
// that holds positions [0, pos0 + T): for each (t, h), scores scale * q_abs[t][h] . cache[j]
// over j <= pos0 + t, softmax, ctx[t][h] = sum_j p_j cache[j][0, C) ([T, H, C]). The keys are
// split across blocks (flash-decoding) and merged in split order: deterministic. `partial`:
// scratch of mla_attention_partial_floats(T, H, C) floats.
void mla_attention(const float* q_abs, const float* cache, int T, int pos0, int H, int C, int r, float scale,
                   float* partial, float* ctx, Stream s);
size_t mla_attention_partial_floats(int T, int H, int C);

// The value up-projection: o[t][h * v + k] = W_UV,h[k] . ctx[t][h] ([T, H * v]).
void mla_value_out(const float* ctx, QuantType wt, const uint8_t* wkv_b, int T, int H, int n, int v, int C,
                   float* o, Stream s);

}  // namespace moestream::gpu
