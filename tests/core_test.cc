#include <gtest/gtest.h>

#include <cstdlib>

#include "core/cuda_util.h"
#include "molora/common.h"
#include "molora/info.h"
#include "molora/settings.h"
#include "molora/status.h"
#include "molora/version.h"

namespace molora {

TEST(Status, OkAndError) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.to_string(), "ok");
  Status e = Status::InvalidArgument("topk_ids must be int32");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.to_string(), "invalid_argument: topk_ids must be int32");
}

static Status fails_then_not_reached(int* reached) {
  MOLORA_RETURN_IF_ERROR(Status::Timeout("rank 1 epoch 7"));
  *reached = 1;
  return Status::Ok();
}

TEST(Status, ReturnIfError) {
  int reached = 0;
  Status s = fails_then_not_reached(&reached);
  EXPECT_EQ(s.code(), StatusCode::kTimeout);
  EXPECT_EQ(reached, 0);
}

TEST(Status, CudaStatusNamesCallAndLocation) {
  Status s = cuda_status(2, "cudaMalloc(&p, n)", "x.cu", 12);
  EXPECT_EQ(s.code(), StatusCode::kCudaError);
  EXPECT_NE(s.message().find("cudaMalloc(&p, n)"), std::string::npos);
  EXPECT_NE(s.message().find("x.cu:12"), std::string::npos);
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_STREQ(dtype_name(DType::kF16), "f16");
}

TEST(Settings, EnvironmentIsReadWhenUsedAndApiOverrides) {
  ::unsetenv("MOLORA_COMM_TIMEOUT_MS");
  EXPECT_EQ(get_setting("MOLORA_COMM_TIMEOUT_MS"), "1000");
  EXPECT_EQ(setting_source("MOLORA_COMM_TIMEOUT_MS"), "default");
  ::setenv("MOLORA_COMM_TIMEOUT_MS", "250", 1);
  EXPECT_EQ(get_setting_int("MOLORA_COMM_TIMEOUT_MS", -1), 250);
  EXPECT_EQ(setting_source("MOLORA_COMM_TIMEOUT_MS"), "env");
  set_setting("MOLORA_COMM_TIMEOUT_MS", "42");
  EXPECT_EQ(get_setting_int("MOLORA_COMM_TIMEOUT_MS", -1), 42);
  EXPECT_EQ(setting_source("MOLORA_COMM_TIMEOUT_MS"), "api");
  set_setting("MOLORA_COMM_TIMEOUT_MS", std::nullopt);
  EXPECT_EQ(get_setting_int("MOLORA_COMM_TIMEOUT_MS", -1), 250);
  ::setenv("MOLORA_COMM_TIMEOUT_MS", "not-a-number", 1);
  EXPECT_EQ(get_setting_int("MOLORA_COMM_TIMEOUT_MS", -1), -1);
  ::unsetenv("MOLORA_COMM_TIMEOUT_MS");
}

TEST(Settings, LogCategories) {
  set_setting("MOLORA_LOG", "comm,plan");
  EXPECT_TRUE(log_enabled("plan"));
  EXPECT_TRUE(log_enabled("comm"));
  EXPECT_FALSE(log_enabled("pool"));
  set_setting("MOLORA_LOG", "all");
  EXPECT_TRUE(log_enabled("pool"));
  set_setting("MOLORA_LOG", std::nullopt);
}

TEST(Info, BuildInfoMatchesBuild) {
  BuildInfo b = build_info();
  EXPECT_EQ(b.version, std::string(version()));
#if MOLORA_HAVE_CUDA
  EXPECT_TRUE(b.cuda);
  EXPECT_FALSE(b.architectures.empty());
  for (const auto& a : b.architectures) EXPECT_EQ(a.rfind("sm_", 0), 0u) << a;
#else
  EXPECT_FALSE(b.cuda);
#endif
}

TEST(Info, RuntimeInfoNeverFailsAndIsConsistent) {
  RuntimeInfo r = runtime_info();
  EXPECT_EQ(r.gpus.size(), static_cast<size_t>(gpu_count()));
  if (r.gpus.empty()) {
    EXPECT_FALSE(r.gpu_error.empty());
  }
  ASSERT_EQ(r.peer_access.size(), r.gpus.size());
  for (size_t i = 0; i < r.peer_access.size(); ++i) EXPECT_EQ(r.peer_access[i][i], 1);
  std::string j = info_json();
  EXPECT_NE(j.find("\"schema\": \"molora.info/1\""), std::string::npos);
  EXPECT_NE(info_text().find("MOLORA_COMM_TIMEOUT_MS"), std::string::npos);
}

TEST(CudaUtil, HostPointerIsRejectedOnTheDevicePath) {
  int x = 0;
  Status s = check_device_pointer(&x, sizeof(x), "topk_ids");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("topk_ids"), std::string::npos);
  EXPECT_TRUE(check_device_pointer(nullptr, 0, "empty").ok() ||
              s.code() == StatusCode::kUnavailable);
  EXPECT_FALSE(check_device_pointer(nullptr, 4, "null").ok());
}

}  // namespace molora

#include "gpu_test_util.h"

namespace molora {
TEST(GpuCore, DeviceSelftestRunsLibraryCode) {
  MOLORA_SKIP_WITHOUT_GPU();
  Status s = device_selftest(0);
  EXPECT_TRUE(s.ok()) << s.to_string();
}
}  // namespace molora
