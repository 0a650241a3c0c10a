// Placeholder of the legacy family while its kernels are written on a branch: computes nothing.
#include "kernels/cpu/ggml_kernels.h"

namespace moestream::detail {

const GgmlKernels* ggml_legacy_kernels(GgmlType) { return nullptr; }

}  // namespace moestream::detail
