// Helpers of the GPU halves of the test suites.
#pragma once

#include <gtest/gtest.h>

#include "core/cuda_util.h"

// Skips the current test, with the reason, when no CUDA device is usable (CI has none).
#define MOLORA_SKIP_WITHOUT_GPU()                                    \
  do {                                                               \
    ::molora::Status gpu_status_ = ::molora::require_gpu();          \
    if (!gpu_status_.ok()) {                                         \
      GTEST_SKIP() << "GPU test skipped: " << gpu_status_.message(); \
    }                                                                \
  } while (0)
