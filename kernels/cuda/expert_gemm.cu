// The weight-matrix ops over the tile loop of expert_gemm.cuh: the grouped expert GEMM, the dense
// GEMM (one matrix, stored precision) and dequantize_rows. They check shapes and dispatch on the
// matrix's QuantType to the per-encoding launchers: expert_gemm_{q8,q4,bf16}.cu for the pack
// types, expert_gemm_ggml_*.cu for ggml's types; single token rows of the shapes decode_gemv.cuh
// takes go to its wide-load GEMV instead.
#include <algorithm>
#include <string>

#include "kernels/cuda/decode_gemv.cuh"
#include "kernels/cuda/expert_gemm.cuh"
#include "kernels/cuda/gpu_ops.h"

namespace moestream::gpu {
namespace {

// q8/q4 rows are whole 32-wide blocks on the GPU: each lane's 16-byte activation load stays
// inside the row.
void check_pack_block_cols(QuantType q, int cols, const char* op, const std::string& shape) {
  if (cols % kQuantBlock != 0)
    throw ConfigError(std::string(op) + ": " + std::string(quant_name(q)) +
                      " needs cols to be a multiple of " + std::to_string(kQuantBlock) + " (" +
                      shape + ")");
}

[[noreturn]] void throw_no_kernel(QuantType q, const char* op) {
  throw ConfigError(std::string(op) + ": quant type '" + std::string(quant_name(q)) +
                    "' has no GPU kernel here (bf16, q8, q4 and the ggml types F32, F16, BF16, "
                    "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ1_S, IQ1_M, "
                    "IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4, "
                    "NVFP4 do)");
}

bool ggml_type_has_kernel(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: case GgmlType::kF16: case GgmlType::kBF16: case GgmlType::kQ8_0:
    case GgmlType::kQ4_0: case GgmlType::kQ4_1: case GgmlType::kQ5_0: case GgmlType::kQ5_1:
    case GgmlType::kQ2_K: case GgmlType::kQ3_K: case GgmlType::kQ4_K: case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: case GgmlType::kIQ4_NL: case GgmlType::kIQ4_XS: case GgmlType::kMXFP4:
    case GgmlType::kIQ2_XXS: case GgmlType::kIQ2_XS: case GgmlType::kIQ2_S: case GgmlType::kIQ3_XXS:
    case GgmlType::kIQ3_S: case GgmlType::kIQ1_S: case GgmlType::kIQ1_M: case GgmlType::kTQ1_0:
    case GgmlType::kTQ2_0: case GgmlType::kNVFP4:
      return true;
    default: return false;
  }
}

// The ggml type of q when it has a kernel here and cols are whole blocks; ConfigError naming the
// type otherwise.
GgmlType checked_ggml_type(QuantType q, int cols, const char* op, const std::string& shape) {
  const auto t = quant_ggml_type(q);
  if (!t || !ggml_type_has_kernel(*t)) throw_no_kernel(q, op);
  const auto info = ggml_type_info(uint32_t(*t));
  if (!info) throw_no_kernel(q, op);
  if (uint32_t(cols) % info->block_elems != 0)
    throw ConfigError(std::string(op) + ": " + std::string(quant_name(q)) +
                      " needs cols to be a multiple of its block of " +
                      std::to_string(info->block_elems) + " (" + shape + ")");
  return *t;
}

// ggml's types by family; BF16 rows are the pack's bf16 rows.
bool ggml_gemm_cuda(GgmlType t, const GemmArgs& a, int n_groups, int max_rows, cudaStream_t s) {
  if (t == GgmlType::kBF16) {
    expert_gemm_bf16_cuda(a, n_groups, max_rows, s);
    return true;
  }
  return gemm_plain_cuda(t, a, n_groups, max_rows, s) ||
         gemm_ggml_legacy_cuda(t, a, n_groups, max_rows, s) ||
         gemm_ggml_kquant_cuda(t, a, n_groups, max_rows, s) ||
         gemm_ggml_iquant_cuda(t, a, n_groups, max_rows, s);
}

bool ggml_dequantize_rows_cuda(GgmlType t, const DequantArgs& a, cudaStream_t s) {
  if (t == GgmlType::kBF16) {
    dequantize_rows_bf16_cuda(a, s);
    return true;
  }
  return dequantize_rows_plain_cuda(t, a, s) || dequantize_rows_ggml_legacy_cuda(t, a, s) ||
         dequantize_rows_ggml_kquant_cuda(t, a, s) || dequantize_rows_ggml_iquant_cuda(t, a, s);
}

// Launches the GEMM of a, or throws ConfigError when q has no kernel.
void gemm_dispatch(QuantType q, const GemmArgs& a, int n_groups, int max_rows, const char* op,
                   const std::string& shape, GemmKernel kernel, cudaStream_t s) {
  if (kernel == GemmKernel::kInt8Mma) {
    if (!gemm_q8_mma_fits(q, a.cols))
      throw Error(std::string(op) + ": the int8 tensor-core product takes the pack's q8 and ggml's "
                  "Q8_0 with cols % 128 == 0 on compute capability 8.0 and later, not " +
                  std::string(quant_name(q)) + " " + shape);
    return gemm_q8_mma_cuda(q, a, n_groups, max_rows, s);
  }
  switch (q) {
    case QuantType::kQ8:
      check_pack_block_cols(q, a.cols, op, shape);
      return expert_gemm_q8_cuda(a, n_groups, max_rows, s);
    case QuantType::kQ4:
      check_pack_block_cols(q, a.cols, op, shape);
      return expert_gemm_q4_cuda(a, n_groups, max_rows, s);
    case QuantType::kBF16: return expert_gemm_bf16_cuda(a, n_groups, max_rows, s);
    case QuantType::kF32: throw_no_kernel(q, op);  // f32 experts: convert (ggml F32 has one)
  }
  const GgmlType t = checked_ggml_type(q, a.cols, op, shape);
  if (!ggml_gemm_cuda(t, a, n_groups, max_rows, s)) throw_no_kernel(q, op);
}

std::string gemm_shape(int rows, int cols) {
  return "rows=" + std::to_string(rows) + " cols=" + std::to_string(cols);
}

}  // namespace

namespace {

std::string expert_gemm_shape(int n_groups, int max_rows_per_group, int rows, int cols) {
  return "n_groups=" + std::to_string(n_groups) + " max_rows_per_group=" +
         std::to_string(max_rows_per_group) + " " + gemm_shape(rows, cols);
}

// expert_gemm's checks, for each of its (offset, x, y) matrices. Messages are built only on a
// failure: a decode step makes thousands of these calls.
void check_expert_gemm(const uint8_t* const* w, const int* row_start, int n_groups,
                       int max_rows_per_group, int rows, int cols, size_t matrix_offset,
                       const float* x, float* y) {
  if (n_groups <= 0 || n_groups > 65535 || max_rows_per_group <= 0 || rows <= 0 || cols <= 0)
    throw Error("gpu::expert_gemm: bad shape " +
                expert_gemm_shape(n_groups, max_rows_per_group, rows, cols));
  if (!w || !row_start || !x || !y) throw Error("gpu::expert_gemm: null device pointer");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(y) % 4 != 0)
    throw Error("gpu::expert_gemm: x must be 16-byte aligned and y 4-byte aligned");
  if (matrix_offset % 16 != 0)
    throw Error("gpu::expert_gemm: matrix_offset " + std::to_string(matrix_offset) +
                " is not 16-byte aligned (loader/format/expert_file.h aligns matrices to 64)");
}

// The grouped GEMV's arguments, matrices to be set by the caller.
GemvArgs grouped_gemv(const uint8_t* const* w, const int* row_start, int n_groups, int cols) {
  GemvArgs a;
  a.cols = cols;
  a.w = w;
  a.row_start = row_start;
  a.n_groups = n_groups;
  return a;
}

// Groups of one token row (decode) in a shape the GEMV takes, for the types where it measured
// faster (bf16, ggml Q8_0). Its q8/q4 forms (tested in gpu_decode_gemv_test) measured slower on the H200 than the
// grouped GEMM's one-row path (bench_gpu_kernels, 8 experts x 1 row: q8 gate 913 against 1137
// GB/s, q8 down 901 against 1230, q4 367 against 803; docs/results.md), so q8 and q4 experts keep
// the grouped GEMM until that kernel is tuned.
bool takes_decode_gemv(QuantType q, int max_rows_per_group, int cols) {
  return max_rows_per_group <= 1 && q != QuantType::kQ8 && q != QuantType::kQ4 &&
         decode_gemv_fits(q, cols);
}

}  // namespace

void expert_gemm(QuantType q, const uint8_t* const* w, size_t matrix_offset, const int* row_start,
                 int n_groups, int max_rows_per_group, int rows, int cols, const float* x, float* y,
                 Stream s, GemmKernel kernel) {
  check_expert_gemm(w, row_start, n_groups, max_rows_per_group, rows, cols, matrix_offset, x, y);
  if (takes_decode_gemv(q, max_rows_per_group, cols)) {
    GemvArgs a = grouped_gemv(w, row_start, n_groups, cols);
    a.mat[0] = GemvMat{nullptr, matrix_offset, rows, x, y};
    a.n_mats = 1;
    return decode_gemv_cuda(q, a, s);
  }
  const GemmArgs a{w, matrix_offset, row_start, rows, cols, x, y};
  gemm_dispatch(q, a, n_groups, max_rows_per_group, "gpu::expert_gemm",
                expert_gemm_shape(n_groups, max_rows_per_group, rows, cols), kernel, s);
}

void expert_gemm_gate_up(QuantType q, const uint8_t* const* w, size_t gate_offset,
                         size_t up_offset, const int* row_start, int n_groups,
                         int max_rows_per_group, int rows, int cols, const float* x_gate,
                         const float* x_up, float* y_gate, float* y_up, Stream s) {
  if (!takes_decode_gemv(q, max_rows_per_group, cols)) {
    expert_gemm(q, w, gate_offset, row_start, n_groups, max_rows_per_group, rows, cols, x_gate,
                y_gate, s);
    expert_gemm(q, w, up_offset, row_start, n_groups, max_rows_per_group, rows, cols, x_up, y_up,
                s);
    return;
  }
  check_expert_gemm(w, row_start, n_groups, max_rows_per_group, rows, cols, gate_offset, x_gate,
                    y_gate);
  check_expert_gemm(w, row_start, n_groups, max_rows_per_group, rows, cols, up_offset, x_up, y_up);
  GemvArgs a = grouped_gemv(w, row_start, n_groups, cols);
  a.mat[0] = GemvMat{nullptr, gate_offset, rows, x_gate, y_gate};
  a.mat[1] = GemvMat{nullptr, up_offset, rows, x_up, y_up};
  a.n_mats = 2;
  decode_gemv_cuda(q, a, s);
}

namespace {

std::string dense_gemm_shape(int rows, int cols, int n_tokens) {
  return gemm_shape(rows, cols) + " n_tokens=" + std::to_string(n_tokens);
}

// dense_gemm's checks (messages built only on a failure, as check_expert_gemm's).
void check_dense_gemm(const uint8_t* w, int rows, int cols, const float* x, int n_tokens,
                      float* y) {
  if (rows <= 0 || cols <= 0 || n_tokens <= 0)
    throw Error("gpu::dense_gemm: bad shape " + dense_gemm_shape(rows, cols, n_tokens));
  const int n_chunks = (n_tokens + kDenseTokenChunk - 1) / kDenseTokenChunk;
  if (n_chunks > 65535)
    throw Error("gpu::dense_gemm: too many tokens for one launch: " +
                dense_gemm_shape(rows, cols, n_tokens));
  if (!w || !x || !y) throw Error("gpu::dense_gemm: null device pointer");
  if (reinterpret_cast<uintptr_t>(w) % 16 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(y) % 4 != 0)
    throw Error("gpu::dense_gemm: w and x must be 16-byte aligned and y 4-byte aligned");
}

}  // namespace

bool dense_gemv_takes(QuantType q, int cols) { return decode_gemv_fits(q, cols); }

bool gemv_rounds_input(QuantType q, int cols) {
  const auto t = quant_ggml_type(q);
  return t && *t == GgmlType::kQ8_0 && decode_gemv_fits(q, cols);
}

void dense_gemm_shared_input(QuantType q, const DenseOut* outs, int n_outs, int cols,
                             const float* x, int n_tokens, Stream s) {
  if (n_outs < 1 || n_outs > kGemvMaxMats || !outs)
    throw Error("gpu::dense_gemm_shared_input: " + std::to_string(n_outs) +
                " matrices (1 to " + std::to_string(kGemvMaxMats) + ")");
  if (n_tokens != 1 || !decode_gemv_fits(q, cols)) {
    for (int i = 0; i < n_outs; ++i)
      if (outs[i].add)
        throw Error("gpu::dense_gemm_shared_input: add needs one token and a shape the decode GEMV "
                    "takes (dense_gemv_takes), got " + gemm_shape(outs[i].rows, cols) +
                    " n_tokens=" + std::to_string(n_tokens));
    for (int i = 0; i < n_outs; ++i)
      dense_gemm(q, outs[i].w, outs[i].rows, cols, x, n_tokens, outs[i].y, s);
    return;
  }
  GemvArgs a;
  for (int i = 0; i < n_outs; ++i) {
    const DenseOut& o = outs[i];
    check_dense_gemm(o.w, o.rows, cols, x, 1, o.y);
    a.mat[i] = GemvMat{o.w, 0, o.rows, x, o.y, o.add};
  }
  a.n_mats = n_outs;
  a.cols = cols;
  decode_gemv_cuda(q, a, s);
}

void dense_gemm(QuantType q, const uint8_t* w, int rows, int cols, const float* x, int n_tokens,
                float* y, Stream s, GemmKernel kernel) {
  check_dense_gemm(w, rows, cols, x, n_tokens, y);
  if (n_tokens == 1 && decode_gemv_fits(q, cols)) {
    const DenseOut o{w, rows, y, false};
    return dense_gemm_shared_input(q, &o, 1, cols, x, 1, s);
  }
  const int n_chunks = (n_tokens + kDenseTokenChunk - 1) / kDenseTokenChunk;
  GemmArgs a{nullptr, 0, nullptr, rows, cols, x, y};
  a.matrix = w;
  a.n_tokens = n_tokens;
  a.dense_chunk = kDenseTokenChunk;
  gemm_dispatch(q, a, n_chunks, std::min(n_tokens, kDenseTokenChunk), "gpu::dense_gemm",
                dense_gemm_shape(rows, cols, n_tokens), kernel, s);
}

void dequantize_rows(QuantType q, const uint8_t* w, int cols, const int* ids, int n, float* out,
                     Stream s) {
  const std::string shape = "cols=" + std::to_string(cols) + " n=" + std::to_string(n);
  if (cols <= 0 || n <= 0) throw Error("gpu::dequantize_rows: bad shape " + shape);
  if (!w || !ids || !out) throw Error("gpu::dequantize_rows: null device pointer");
  if (reinterpret_cast<uintptr_t>(w) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 4 != 0)
    throw Error("gpu::dequantize_rows: w must be 16-byte aligned and out 4-byte aligned");
  const DequantArgs a{w, cols, ids, n, out};
  const char* op = "gpu::dequantize_rows";
  switch (q) {
    case QuantType::kQ8:
      check_pack_block_cols(q, cols, op, shape);
      return dequantize_rows_q8_cuda(a, s);
    case QuantType::kQ4:
      check_pack_block_cols(q, cols, op, shape);
      return dequantize_rows_q4_cuda(a, s);
    case QuantType::kBF16: return dequantize_rows_bf16_cuda(a, s);
    case QuantType::kF32:
      if (!ggml_dequantize_rows_cuda(GgmlType::kF32, a, s)) throw_no_kernel(q, op);
      return;
  }
  const GgmlType t = checked_ggml_type(q, cols, op, shape);
  if (!ggml_dequantize_rows_cuda(t, a, s)) throw_no_kernel(q, op);
}

}  // namespace moestream::gpu
