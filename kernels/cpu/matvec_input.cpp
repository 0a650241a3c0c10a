// Implementation of kernels/cpu/matvec_input.h: the rounding each kernel family does on its own
// (quant.cpp, ggml_legacy.cpp, ggml_kquants.cpp), done once into buffers owned here, and the
// products that read it.
#include "kernels/cpu/matvec_input.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/ggml_kernels.h"
#include "kernels/cpu/ggml_kquants_kernels.h"
#include "kernels/cpu/ggml_legacy_kernels.h"
#include "kernels/cpu/ggml_quant.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_kernels.h"

namespace moestream {

struct MatvecInput::Impl {
  MatvecInputKind kind = MatvecInputKind::kNone;
  size_t cols = 0;
  std::vector<float> x;                   // kFloat
  detail::GgmlActivationBuffers blocks;   // kPackInt8 and kGgmlBlocks
  detail::GgmlActivations ggml;           // kGgmlBlocks: the view of `blocks`
  detail::QuantizedActivations pack;      // kPackInt8: the view of `blocks`
  detail::KActivationBuffers super;       // kGgmlSuper
  detail::KActivations kview;
};

namespace {

constexpr size_t kBlock = 32;

bool plain_ggml(GgmlType t) { return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16; }

size_t block_stride(size_t cols) { return ((cols + kBlock - 1) / kBlock + 7) / 8 * 8; }

}  // namespace

MatvecInputKind matvec_input_kind(QuantType q) {
  if (const auto g = quant_ggml_type(q)) {
    if (plain_ggml(*g)) return MatvecInputKind::kFloat;
    if (detail::ggml_legacy_kernels(*g) != nullptr) return MatvecInputKind::kGgmlBlocks;
    if (detail::ggml_kquant_kernels(*g) != nullptr) return MatvecInputKind::kGgmlSuper;
    throw ConfigError("ggml type " + std::string(ggml_type_name(*g)) + " is not supported by this build");
  }
  switch (q) {
    case QuantType::kF32:
    case QuantType::kBF16: return MatvecInputKind::kFloat;
    case QuantType::kQ8:
    case QuantType::kQ4: return MatvecInputKind::kPackInt8;
  }
  throw ConfigError("unknown quant type " + std::to_string(static_cast<uint32_t>(q)));
}

MatvecInput::MatvecInput() : impl_(std::make_unique<Impl>()) {}
MatvecInput::~MatvecInput() = default;
MatvecInput::MatvecInput(MatvecInput&&) noexcept = default;
MatvecInput& MatvecInput::operator=(MatvecInput&&) noexcept = default;

void MatvecInput::reserve(size_t max_cols) {
  Impl& m = *impl_;
  if (m.x.size() < max_cols) m.x.resize(max_cols);
  m.blocks.fit(block_stride(max_cols), 1);
  m.super.fit((max_cols + detail::kSuperBlock - 1) / detail::kSuperBlock * detail::kSuperBlock, 1);
}

void MatvecInput::round(QuantType q, const float* x, size_t cols) {
  Impl& m = *impl_;
  const MatvecInputKind kind = matvec_input_kind(q);
  const bool avx2 = detail::avx2_usable();
  m.kind = MatvecInputKind::kNone;  // until the rounding below has succeeded
  switch (kind) {
    case MatvecInputKind::kFloat:
      if (m.x.size() < cols) m.x.resize(cols);
      std::copy(x, x + cols, m.x.begin());
      break;
    case MatvecInputKind::kPackInt8: {
      m.blocks.fit(block_stride(cols), 1);
      auto quantize = avx2 ? detail::quantize_activations_avx2 : detail::quantize_activations;
      quantize(x, cols, m.blocks.d.data(), m.blocks.qs.data(), m.blocks.abs_qs.data(), m.blocks.sum8.data(),
               m.blocks.pairs.data());
      m.pack = {m.blocks.d.data(), m.blocks.qs.data(), m.blocks.abs_qs.data(), m.blocks.sum8.data(),
                m.blocks.pairs.data()};
      break;
    }
    case MatvecInputKind::kGgmlBlocks:
      m.ggml = detail::ggml_round_activations_into(m.blocks, x, cols, 1, avx2);
      break;
    case MatvecInputKind::kGgmlSuper:
      m.kview = detail::kquant_round_into(m.super, x, cols, 1, avx2);
      break;
    case MatvecInputKind::kNone: MOE_ASSERT(false, "no input kind");
  }
  m.kind = kind;
  m.cols = cols;
}

bool MatvecInput::serves(QuantType q, size_t cols) const {
  return impl_->kind != MatvecInputKind::kNone && impl_->cols == cols && matvec_input_kind(q) == impl_->kind;
}

MatvecInputKind MatvecInput::kind() const { return impl_->kind; }
size_t MatvecInput::cols() const { return impl_->cols; }

void quant_matvec(QuantType q, const uint8_t* w, size_t cols, const MatvecInput& x, float* y, size_t row_begin,
                  size_t row_end) {
  if (row_begin >= row_end) return;
  const MatvecInput::Impl& m = *x.impl_;
  MOE_ASSERT(x.serves(q, cols), "a matvec input rounded for another type or width (" + std::to_string(m.cols) +
                                    " columns, " + std::to_string(cols) + " asked)");
  const bool avx2 = detail::avx2_usable();
  switch (m.kind) {
    case MatvecInputKind::kFloat:  // nothing is rounded: the float product itself
      quant_matvec(q, w, cols, m.x.data(), y, row_begin, row_end);
      return;
    case MatvecInputKind::kPackInt8:
      if (avx2) detail::matvec_avx2(q, w, cols, nullptr, m.pack, y, row_begin, row_end);
      else detail::matvec_scalar(q, w, cols, nullptr, m.pack, y, row_begin, row_end);
      return;
    case MatvecInputKind::kGgmlBlocks: {
      const detail::GgmlKernels& k = *detail::ggml_legacy_kernels(*quant_ggml_type(q));
      const auto fn = (avx2 && k.rounded_matvec_avx2 != nullptr) ? k.rounded_matvec_avx2 : k.rounded_matvec_scalar;
      fn(w, m.ggml, 0, y, row_begin, row_end);
      return;
    }
    case MatvecInputKind::kGgmlSuper:
      if (avx2) detail::kquant_rows_avx2(*quant_ggml_type(q), w, cols, m.kview, 1, y, 0, row_begin, row_end);
      else detail::kquant_rows_scalar(*quant_ggml_type(q), w, cols, m.kview, 1, y, 0, row_begin, row_end);
      return;
    case MatvecInputKind::kNone: break;
  }
  MOE_ASSERT(false, "matvec input not rounded");
}

}  // namespace moestream
