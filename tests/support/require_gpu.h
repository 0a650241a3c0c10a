// REQUIRE_GPU(): skips the calling test when no CUDA device is usable, naming the driver's reason.
#pragma once

#include <gtest/gtest.h>

#include "kernels/cuda/gpu_ops.h"

#define REQUIRE_GPU()                                                                      \
  do {                                                                                     \
    const char* why_ = "";                                                                 \
    if (moestream::gpu::device_count(&why_) <= 0)                                          \
      GTEST_SKIP() << "no usable CUDA device: " << why_;                                   \
  } while (0)
