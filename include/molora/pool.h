// molora/pool.h — the adapter slot pool: PEFT LoRA adapters of a MoE model's routed experts,
// loaded from safetensors and placed in S slots that the lora kernels read.
//
// Layout (what the lora part consumes), per layer l, in the pool's dtype, row-major:
//   a_gate_up [2, S, E, r_max, H]   slice 0 = gate_proj, 1 = up_proj   (shrink, K = H)
//   b_gate_up [2, S, E, I, r_max]                                      (expand, N = I)
//   a_down    [S, E, r_max, I]                                         (shrink, K = I)
//   b_down    [S, E, H, r_max]                                         (expand, N = H)
//   rank      [3, S] int32   module 0 gate, 1 up, 2 down; 0 = slot empty or module not adapted
//   scale     [3, S] float   alpha / r, or alpha / sqrt(r) with use_rslora
// Rows r..r_max of A and columns r..r_max of B are zero, as are the experts and modules an
// adapter does not carry, so a kernel that reads r_max is still exact.
//
// A token's slot id is −1 when it carries no adapter (the base model): −1 never takes a slot
// and costs nothing. Slots are given to the adapters of a batch in prepare(); an adapter that is
// not resident is uploaded into a free slot, else into the least recently used unpinned slot.
//
// Backends: device = −1 keeps the slots in host memory (the CPU reference path, uploads are
// memcpy); device ≥ 0 keeps them in that GPU's memory and uploads from pinned host memory on a
// stream of the pool's; prepare() returns an event that the consumer's stream must wait on.
// The object is not thread-safe: one engine thread calls it (the scheduler, once per batch).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "molora/common.h"
#include "molora/status.h"

namespace molora {

enum PoolModule : int { kPoolGate = 0, kPoolUp = 1, kPoolDown = 2 };
constexpr int kPoolModules = 3;
const char* pool_module_name(int module) noexcept;  // "gate_proj", "up_proj", "down_proj"

struct PoolConfig {
  int num_slots = 8;           // S
  int num_layers = 1;          // L: model layer ids 0..L−1 (layers without experts stay empty)
  int num_experts = 8;         // E: routed experts per layer
  int64_t hidden = 0;          // H
  int64_t intermediate = 0;    // I: the expert intermediate size (per expert, per TP rank)
  int r_max = 16;              // largest rank a slot holds
  DType dtype = DType::kBF16;  // pool dtype: kBF16, kF16 or kF32
  int device = -1;             // −1: host memory (CPU backend); ≥ 0: CUDA device
  // Device pool only: keep each loaded adapter's converted image in pinned host memory (upload
  // is a straight DMA, fastest) instead of pageable memory copied through the pool's pinned
  // staging buffers (less pinned memory).
  bool pinned_images = true;
  int64_t staging_bytes = 32ll << 20;  // size of each of the 2 staging buffers
};

// One loaded adapter as the pool sees it.
struct AdapterInfo {
  std::string name, path;
  int32_t id = -1;
  int slot = -1;  // −1 when not resident
  bool pinned = false;
  int r = 0;              // adapter_config.json "r"
  double lora_alpha = 0;  // adapter_config.json "lora_alpha"
  bool use_rslora = false;
  int max_rank = 0;     // largest rank over its modules
  int64_t tensors = 0;  // expert LoRA tensors placed
  int64_t ignored_tensors =
      0;                   // tensors that are not routed-expert LoRA (attention, shared experts...)
  int64_t file_bytes = 0;  // bytes of tensor data read
  int64_t image_bytes = 0;    // bytes of one slot (what an upload moves)
  std::vector<int32_t> rank;  // [L, 3]
  std::vector<float> scale;   // [L, 3]
};

struct PoolStats {
  int num_slots = 0, resident = 0, pinned = 0, adapters = 0;
  int64_t prepares = 0;   // prepare() calls that succeeded
  int64_t hits = 0;       // distinct adapters of a batch already resident
  int64_t uploads = 0;    // adapters placed into a slot
  int64_t evictions = 0;  // resident adapters displaced
  int64_t rejected = 0;   // prepare() calls refused (pool unchanged)
  int64_t bytes_uploaded = 0;
  int64_t host_image_bytes = 0;  // host memory held by loaded adapters' images
  int64_t slot_bytes = 0;        // bytes of one slot
  int64_t device_bytes = 0;      // memory of the slot tensors (host memory for the CPU backend)
};

// Pointers of one layer's slot tensors (device pointers for a device pool). Strides are in
// elements; see the layout at the top of this file.
struct PoolLayerTensors {
  void* a_gate_up = nullptr;
  void* b_gate_up = nullptr;
  void* a_down = nullptr;
  void* b_down = nullptr;
  int32_t* rank = nullptr;                                         // [3, S]
  float* scale = nullptr;                                          // [3, S]
  int64_t a_gate_up_slice_stride = 0, b_gate_up_slice_stride = 0;  // S·E·r_max·H, S·E·I·r_max
  int64_t a_slot_stride[kPoolModules] = {0, 0, 0};                 // E·r_max·K of module m
  int64_t b_slot_stride[kPoolModules] = {0, 0, 0};                 // E·N·r_max of module m
  int64_t k[kPoolModules] = {0, 0, 0};                             // K (A's inner dim) of module m
  int64_t n[kPoolModules] = {0, 0, 0};                             // N (B's rows) of module m
};

class AdapterPool {
 public:
  // Allocates the slots (zeroed). InvalidArgument for a bad config, Unavailable for device ≥ 0
  // without CUDA, CudaError when the allocation fails.
  static Status create(const PoolConfig& config, std::unique_ptr<AdapterPool>* out);
  ~AdapterPool();
  AdapterPool(const AdapterPool&) = delete;
  AdapterPool& operator=(const AdapterPool&) = delete;

  const PoolConfig& config() const;

  // Reads a PEFT adapter from `path` (a directory with adapter_config.json and
  // adapter_model.safetensors), validates it against the model and converts it to the pool's
  // layout and dtype in host memory. Does not take a slot (prepare does). Sets *id (≥ 0).
  // Errors (ParseError / InvalidArgument / NotFound / IoError, naming file and tensor) leave
  // the pool unchanged. A name already loaded is InvalidArgument.
  Status load(const std::string& name, const std::string& path, int32_t* id);
  // Forgets an adapter (its slot, if any, becomes free). InvalidArgument when pinned.
  Status unload(int32_t id);
  // Id of a loaded adapter by name (NotFound otherwise).
  Status find(const std::string& name, int32_t* id) const;
  // A pinned adapter is never evicted (pinning does not load it; prepare does). Pins do not
  // nest: pin twice, unpin once → unpinned.
  Status pin(int32_t id);
  Status unpin(int32_t id);

  // For each of the n tokens of a batch, adapter_ids[i] is a loaded adapter id or −1 (base
  // model). Makes every adapter of the batch resident (uploading the missing ones, evicting
  // least recently used unpinned adapters not in the batch) and writes slot_ids[i] (host
  // memory; −1 for −1). slot_ids_device (optional, device pool only) receives the same ids on
  // the device. ResourceExhausted (more distinct adapters than slots, or not enough unpinned
  // slots) or NotFound (unknown id) leave the pool unchanged.
  //
  // Device pool: the uploads run on the pool's stream after the work already enqueued on
  // `consumer` (the stream that runs the kernels that read the slots) finished with the slots
  // they overwrite; *ready (optional) receives an event recorded after the uploads and the
  // slot-id copy — cudaStreamWaitEvent(consumer, *ready) before the kernels (wait_ready does
  // it). The event stays valid until the next prepare. CPU pool: *ready = nullptr.
  Status prepare(const int32_t* adapter_ids, int64_t n, int32_t* slot_ids,
                 int32_t* slot_ids_device = nullptr, cudaStream_t consumer = nullptr,
                 cudaEvent_t* ready = nullptr);
  // cudaStreamWaitEvent(consumer, last prepare's event); no-op for the CPU pool.
  Status wait_ready(cudaStream_t consumer);
  // Blocks until every upload finished.
  Status synchronize();

  // The slot tensors of layer `layer`.
  Status layer_tensors(int layer, PoolLayerTensors* out) const;
  // What the pool knows of a loaded adapter (NotFound for an unknown id).
  Status info(int32_t id, AdapterInfo* out) const;
  std::vector<AdapterInfo> adapters() const;  // every loaded adapter, by id
  int slot_adapter(int slot) const;           // id of the adapter in `slot`, −1 if empty
  PoolStats stats() const;

  // Copies `bytes` of slot tensor memory at `src` (a pointer from layer_tensors) into host
  // memory `dst` (cudaMemcpy on a device pool): for tests and views.
  Status read_back(const void* src, size_t bytes, void* dst) const;

  struct Impl;

 private:
  explicit AdapterPool(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace molora
