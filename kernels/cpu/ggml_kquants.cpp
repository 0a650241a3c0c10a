// Placeholder of the kquant family while its kernels are written on a branch: computes nothing.
#include "kernels/cpu/ggml_kernels.h"

namespace moestream::detail {

const GgmlKernels* ggml_kquant_kernels(GgmlType) { return nullptr; }

}  // namespace moestream::detail
