// An input vector rounded once for every product that multiplies it. quant_matvec on a float
// vector rounds it as the matrix type's kernel needs (int8 blocks for the quantised types) on
// every call; a decode step calls it per thread and per row slice of every matrix, so the same
// vector was rounded dozens of times per layer (the q/k/v projections, the gate and up matrices
// of every selected expert, each slice of the lm_head). Rounded here once, the products read it
// from any thread and give the same bits as quant_matvec on the float vector.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "loader/format/expert_file.h"

namespace moestream {

// How a type's kernels take their input.
enum class MatvecInputKind {
  kNone,        // nothing rounded yet
  kFloat,       // as is: f32, bf16 and ggml's F32, F16, BF16
  kPackInt8,    // the q8/q4 pack types: int8 per 32 columns, float32 scales
  kGgmlBlocks,  // ggml's 32-element block types (Q4_0..Q8_0, IQ4_NL, MXFP4) and NVFP4: float16-rounded scales
  kGgmlSuper,   // ggml's 256-element super-block types (Q2_K..Q6_K, IQ4_XS, the lattice and TQ types)
};

// The kind of input quant type q's products take; ConfigError for a type no kernel computes.
MatvecInputKind matvec_input_kind(QuantType q);

class MatvecInput {
 public:
  MatvecInput();
  ~MatvecInput();
  MatvecInput(MatvecInput&&) noexcept;
  MatvecInput& operator=(MatvecInput&&) noexcept;

  // Sizes the buffers for inputs of up to max_cols columns of any kind, so that round() never
  // allocates afterwards.
  void reserve(size_t max_cols);
  // Rounds x (cols floats) as the products with matrices of type q take it (a copy for the float
  // kinds). Allocates only for an input wider than any reserved or rounded before. Not
  // thread-safe; the products that read it afterwards may run on any threads.
  void round(QuantType q, const float* x, size_t cols);
  // True when the last round() serves products with type q over cols columns (the same kind).
  bool serves(QuantType q, size_t cols) const;
  MatvecInputKind kind() const;
  size_t cols() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  friend void quant_matvec(QuantType, const uint8_t*, size_t, const MatvecInput&, float*, size_t, size_t);
};

// y[r] = W[r] . x for r in [row_begin, row_end): equal bit for bit to quant_matvec with the float
// vector x was rounded from. x must serve q over cols columns (asserted).
void quant_matvec(QuantType q, const uint8_t* w, size_t cols, const MatvecInput& x, float* y,
                  size_t row_begin, size_t row_end);

}  // namespace moestream
