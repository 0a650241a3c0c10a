// runtime/gpu/gpu_forward.h in a build without the CUDA tier (chosen in CMakeLists.txt instead of
// gpu_forward.cpp): the GPU pass cannot exist, and every attempt says why.
#include <string>

#include "common/error.h"
#include "common/option_ref.h"
#include "runtime/gpu/gpu_forward.h"

namespace moestream {

std::string gpu_unavailable_reason() {
  return "this build has no CUDA tier (configure with nvcc present and -DMOESTREAM_CUDA=ON)";
}

std::unique_ptr<GpuForward> GpuForward::create(const ModelConfig&, const std::filesystem::path&,
                                               ExpertStore&, const GpuForwardOptions&) {
  throw ConfigError(option_ref("gpu") + ": " + gpu_unavailable_reason());
}

}  // namespace moestream
