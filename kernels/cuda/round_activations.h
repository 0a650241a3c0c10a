// Activation rounding for quantised expert matrices on the GPU: the int8-per-32-block rounding the
// CPU's quant_matvec applies to its input, so both backends compute the same function. Plain C++.
#pragma once

#include "kernels/cuda/gpu_ops.h"

namespace moestream::gpu {

// In place, for each of `rows` rows of `cols` floats and each 32-wide block of a row (the last one
// short when cols % 32 != 0): d = amax/127, x = clamp(rint(x * (127/amax)), -127, 127) * d, the
// exact arithmetic of kernels/cpu/quant.cpp quantize_activations (a block of zeros stays zero).
void round_activations_q8(float* x, int rows, int cols, Stream s);

// out = x rounded as the CPU's kernel for a matrix of type q rounds its input (so both
// backends compute the same function, and the GPU gives llama.cpp's tokens where the CPU does):
//   pack q8/q4: round_activations_q8;
//   ggml Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4: 32-wide blocks as above, then the block scale
//     rounded to float16 before it multiplies the int8 values (llama.cpp's q8_0 activations);
//   ggml Q2_K..Q6_K, IQ4_XS: 256-wide blocks, float32 scale amax/127 (llama.cpp's q8_K);
//   f32, bf16 and ggml F32/F16/BF16: inputs stay as they are (returns false, nothing launched).
// out may be x (in place). Returns true when it rounded; when it returns false nothing was written
// to out. ConfigError when cols is not a whole number of the type's blocks
// (ggml types only; a pack's last block may be short).
bool round_activations(QuantType q, const float* x, float* out, int rows, int cols, Stream s);

// out = swiglu(gate, up) rounded for a matrix of type q (the input of the experts' down):
// for the pack q8/q4 rounding one launch, the bits of swiglu then round_activations; other types
// those two launches. out may be gate or up.
void swiglu_rounded(QuantType q, const float* gate, const float* up, int rows, int cols,
                    float* out, Stream s);

// out row i = src row idx[i] rounded for type q, in one launch (gather_rows then
// round_activations, the same bits), where q takes the pack q8/q4 rounding; returns false and
// launches nothing otherwise. out must not alias src.
bool gather_rounded(QuantType q, const float* src, const int* idx, int n, int cols, float* out,
                    Stream s);

// Which rounding round_activations applies for q: inputs of two matrices whose types share a
// class can share one rounded copy.
enum class ActivationRounding { kNone, kPackQ8, kBlock32F16, kBlock256 };
ActivationRounding activation_rounding(QuantType q);

}  // namespace moestream::gpu
