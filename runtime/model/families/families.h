// The family descriptions (one file each in this folder) and the list plan_layers searches.
// Adding a family: a file defining its FamilyDescription, one line here and in all().
#pragma once

#include <span>

#include "runtime/model/layer_plan.h"

namespace moestream::families {

extern const FamilyDescription kQwen3Moe, kOlmoe, kMixtral, kQwen2Moe, kGlm4Moe, kDeepseekV3, kDeepseekV2,
    kGptOss, kMinimaxM2;

std::span<const FamilyDescription* const> all();

}  // namespace moestream::families
