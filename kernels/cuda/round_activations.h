// Activation rounding for quantised expert matrices on the GPU: the int8-per-32-block rounding the
// CPU's quant_matvec applies to its input, so both backends compute the same function. Plain C++.
#pragma once

#include "kernels/cuda/gpu_ops.h"

namespace moestream::gpu {

// In place, for each of `rows` rows of `cols` floats and each 32-wide block of a row (the last one
// short when cols % 32 != 0): d = amax/127, x = clamp(rint(x * (127/amax)), -127, 127) * d, the
// exact arithmetic of kernels/cpu/quant.cpp quantize_activations (a block of zeros stays zero).
void round_activations_q8(float* x, int rows, int cols, Stream s);

}  // namespace moestream::gpu
