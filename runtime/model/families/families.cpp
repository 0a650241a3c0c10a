// The list of runtime/model/families/families.h.
#include "runtime/model/families/families.h"

namespace moestream::families {

std::span<const FamilyDescription* const> all() {
  static const FamilyDescription* const list[] = {&kQwen3Moe, &kOlmoe,      &kMixtral,    &kQwen2Moe,
                                                  &kGlm4Moe,  &kDeepseekV3, &kDeepseekV2, &kGptOss,
                                                  &kMinimaxM2};
  return list;
}

}  // namespace moestream::families
