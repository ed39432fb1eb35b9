// pool GPU suite: the device pool holds bit for bit what the CPU pool holds after the same
// sequence (pinned images and the staging path), slot ids reach the device behind the event, and
// an upload never overwrites a slot before the consumer's earlier work finished with it.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "gpu_test_util.h"
#include "pool_test_util.h"

namespace molora {
namespace {

using pooltest::Model;
using pooltest::Spec;

class PoolGpu : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    MOLORA_SKIP_WITHOUT_GPU();
    root = pooltest::temp_dir("gpu");
    ASSERT_FALSE(root.empty());
    m.L = 2;
    m.E = 4;
    m.H = 64;
    m.I = 32;
    m.r_max = 16;
    const char* dts[] = {"F32", "BF16", "F16"};
    for (int i = 0; i < 5; ++i) {
      Spec s;
      s.seed = 10 + i;
      s.r = 4 + 4 * (i % 3);
      s.dtype = dts[i % 3];
      s.fused = i == 4;
      specs.push_back(s);
      dirs.push_back(pooltest::write_adapter(root, "g" + std::to_string(i), m, s));
    }
  }
  void TearDown() override {
    if (!root.empty()) std::system(("rm -rf '" + root + "'").c_str());
  }
  std::unique_ptr<AdapterPool> make(int device, int slots) {
    PoolConfig c = pooltest::pool_config(m, slots, DType::kBF16, device);
    c.pinned_images = GetParam();
    c.staging_bytes = 8192;  // several chunks per region: exercises the staging ring
    std::unique_ptr<AdapterPool> p;
    Status s = AdapterPool::create(c, &p);
    EXPECT_TRUE(s.ok()) << s.to_string();
    for (size_t i = 0; i < dirs.size() && p; ++i) {
      int32_t id;
      s = p->load("g" + std::to_string(i), dirs[i], &id);
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
    return p;
  }
  std::string root;
  Model m;
  std::vector<Spec> specs;
  std::vector<std::string> dirs;
};

TEST_P(PoolGpu, DeviceSlotsMatchTheCpuPoolBitForBit) {
  MOLORA_SKIP_WITHOUT_GPU();
  auto gpu = make(0, 3), cpu = make(-1, 3);
  ASSERT_TRUE(gpu && cpu);
  std::mt19937 rng(std::random_device{}());
  const unsigned seed = rng();
  std::printf("seed %u\n", seed);
  rng.seed(seed);
  int32_t* dslots = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dslots), 64 * sizeof(int32_t)), cudaSuccess);
  cudaStream_t consumer;
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  for (int step = 0; step < 12; ++step) {
    int n = 1 + rng() % 64;
    std::vector<int32_t> ids(n), sg(n, 99), sc(n, 99), back(n, 98);
    std::vector<int> pick(3);
    for (auto& p : pick) p = static_cast<int>(rng() % 6) - 1;  // −1 or an adapter
    for (auto& x : ids) x = pick[rng() % 3];
    cudaEvent_t ready = nullptr;
    Status s1 = gpu->prepare(ids.data(), n, sg.data(), dslots, consumer, &ready);
    Status s2 = cpu->prepare(ids.data(), n, sc.data());
    ASSERT_TRUE(s1.ok()) << s1.to_string();
    ASSERT_TRUE(s2.ok()) << s2.to_string();
    ASSERT_NE(ready, nullptr);
    EXPECT_EQ(sg, sc);
    ASSERT_TRUE(gpu->wait_ready(consumer).ok());
    ASSERT_EQ(cudaMemcpyAsync(back.data(), dslots, n * 4, cudaMemcpyDeviceToHost, consumer),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
    EXPECT_EQ(back, sg);
  }
  for (int s = 0; s < 3; ++s) {
    ASSERT_EQ(gpu->slot_adapter(s), cpu->slot_adapter(s));
    if (gpu->slot_adapter(s) >= 0) pooltest::expect_slot(*gpu, m, s, specs[gpu->slot_adapter(s)]);
  }
  for (int l = 0; l < m.L; ++l) {  // every byte of the slot storage, rank and scale
    PoolLayerTensors tg, tc;
    ASSERT_TRUE(gpu->layer_tensors(l, &tg).ok());
    ASSERT_TRUE(cpu->layer_tensors(l, &tc).ok());
    ASSERT_EQ(check_device_pointer(tg.a_gate_up, 1, "a_gate_up").ok(), true);
    const size_t layer_bytes = gpu->stats().device_bytes / m.L;
    std::vector<uint8_t> a(layer_bytes);
    ASSERT_TRUE(gpu->read_back(tg.a_gate_up, layer_bytes, a.data()).ok());
    EXPECT_EQ(std::memcmp(a.data(), tc.a_gate_up, layer_bytes), 0) << "layer " << l;
    std::vector<int32_t> r(9);
    std::vector<float> sc(9);
    ASSERT_TRUE(gpu->read_back(tg.rank, 36, r.data()).ok());
    ASSERT_TRUE(gpu->read_back(tg.scale, 36, sc.data()).ok());
    EXPECT_EQ(std::memcmp(r.data(), tc.rank, 36), 0);
    EXPECT_EQ(std::memcmp(sc.data(), tc.scale, 36), 0);
  }
  EXPECT_EQ(gpu->stats().bytes_uploaded, cpu->stats().bytes_uploaded);
  cudaFree(dslots);
  cudaStreamDestroy(consumer);
}

void CUDART_CB sleep_100ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }

TEST_P(PoolGpu, UploadWaitsForTheConsumersEarlierWork) {
  MOLORA_SKIP_WITHOUT_GPU();
  auto gpu = make(0, 1);
  ASSERT_TRUE(gpu);
  cudaStream_t consumer;
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  int32_t id0 = 0, id1 = 1, slot;
  ASSERT_TRUE(gpu->prepare(&id0, 1, &slot, nullptr, consumer).ok());
  ASSERT_TRUE(gpu->wait_ready(consumer).ok());
  PoolLayerTensors t;
  ASSERT_TRUE(gpu->layer_tensors(0, &t).ok());
  const size_t bytes = gpu->stats().device_bytes / m.L;
  std::vector<uint8_t> before(bytes), snap(bytes);
  ASSERT_TRUE(gpu->read_back(t.a_gate_up, bytes, before.data()).ok());
  // The "kernel" of batch 0 reads slot 0 late (after 100 ms) on the consumer stream.
  void* copy = nullptr;
  ASSERT_EQ(cudaMalloc(&copy, bytes), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(consumer, sleep_100ms, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(copy, t.a_gate_up, bytes, cudaMemcpyDeviceToDevice, consumer),
            cudaSuccess);
  // Batch 1 evicts adapter 0 from the only slot while that read is still queued.
  ASSERT_TRUE(gpu->prepare(&id1, 1, &slot, nullptr, consumer).ok());
  ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  ASSERT_TRUE(gpu->synchronize().ok());
  ASSERT_EQ(cudaMemcpy(snap.data(), copy, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(snap.data(), before.data(), bytes), 0)
      << "the upload overwrote the slot before the consumer read it";
  pooltest::expect_slot(*gpu, m, 0, specs[1]);
  cudaFree(copy);
  cudaStreamDestroy(consumer);
}

TEST_P(PoolGpu, ErrorsLeaveTheDevicePoolUnchanged) {
  MOLORA_SKIP_WITHOUT_GPU();
  auto gpu = make(0, 2);
  ASSERT_TRUE(gpu);
  int32_t ids[3] = {0, 1, 2}, slots[3];
  ASSERT_TRUE(gpu->prepare(ids, 2, slots).ok());
  EXPECT_EQ(gpu->prepare(ids, 3, slots).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(gpu->slot_adapter(0), 0);
  EXPECT_EQ(gpu->slot_adapter(1), 1);
  pooltest::expect_slot(*gpu, m, 0, specs[0]);
  EXPECT_EQ(gpu->unload(5).code(), StatusCode::kNotFound);
  ASSERT_TRUE(gpu->unload(1).ok());  // frees slot 1; its rank goes to 0 at the next prepare
  ASSERT_TRUE(gpu->prepare(ids, 1, slots).ok());
  PoolLayerTensors t;
  ASSERT_TRUE(gpu->layer_tensors(0, &t).ok());
  int32_t r[6];
  ASSERT_TRUE(gpu->read_back(t.rank, sizeof(r), r).ok());
  for (int mod = 0; mod < 3; ++mod) EXPECT_EQ(r[mod * 2 + 1], 0);
}

INSTANTIATE_TEST_SUITE_P(Images, PoolGpu, ::testing::Values(true, false),
                         [](const auto& i) { return i.param ? "pinned" : "staged"; });

}  // namespace
}  // namespace molora
