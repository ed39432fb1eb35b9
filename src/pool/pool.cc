// AdapterPool: slot policy (LRU with pins, −1 never takes a slot) and the two backends (host
// memory; CUDA device memory with uploads on the pool's stream).
#include "molora/pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "core/cuda_util.h"
#include "molora/settings.h"
#include "pool/peft.h"

namespace molora {

const char* pool_module_name(int module) noexcept {
  switch (module) {
    case kPoolGate:
      return "gate_proj";
    case kPoolUp:
      return "up_proj";
    case kPoolDown:
      return "down_proj";
  }
  return "?";
}

namespace {

struct Adapter {
  AdapterInfo info;
  uint8_t* image = nullptr;
  bool image_pinned = false;
  uint64_t last_use = 0;
  uint64_t batch_mark = 0;  // prepare call that last saw it (distinct-adapter detection)
};

#if MOLORA_HAVE_CUDA
// A few pinned host buffers used round-robin, each guarded by an event recorded after the copy
// that reads it, so a buffer is rewritten only when its previous copy finished.
struct PinnedRing {
  std::vector<uint8_t*> buf;
  std::vector<cudaEvent_t> ev;
  std::vector<bool> pending;
  size_t cap = 0;
  size_t next = 0;

  Status init(int n, size_t bytes) {
    buf.assign(n, nullptr);
    ev.assign(n, nullptr);
    pending.assign(n, false);
    cap = bytes;
    for (int i = 0; i < n; ++i) {
      MOLORA_CUDA_CHECK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
      if (bytes) MOLORA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&buf[i]), bytes, 0));
    }
    return Status::Ok();
  }
  // Next buffer of at least `bytes` (grows all buffers when needed), waiting for its last copy.
  Status acquire(size_t bytes, uint8_t** p, size_t* idx) {
    size_t i = next;
    next = (next + 1) % buf.size();
    if (pending[i]) MOLORA_CUDA_CHECK(cudaEventSynchronize(ev[i]));
    pending[i] = false;
    if (bytes > cap) {
      for (size_t j = 0; j < buf.size(); ++j) {
        if (pending[j]) MOLORA_CUDA_CHECK(cudaEventSynchronize(ev[j]));
        pending[j] = false;
        if (buf[j]) cudaFreeHost(buf[j]);
        buf[j] = nullptr;
      }
      cap = std::max(bytes, cap * 2);
      for (size_t j = 0; j < buf.size(); ++j)
        MOLORA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&buf[j]), cap, 0));
    }
    *p = buf[i];
    *idx = i;
    return Status::Ok();
  }
  Status release(size_t idx, cudaStream_t s) {
    MOLORA_CUDA_CHECK(cudaEventRecord(ev[idx], s));
    pending[idx] = true;
    return Status::Ok();
  }
  void destroy() {
    for (size_t i = 0; i < buf.size(); ++i) {
      if (pending[i]) cudaEventSynchronize(ev[i]);
      if (buf[i]) cudaFreeHost(buf[i]);
      if (ev[i]) cudaEventDestroy(ev[i]);
    }
    buf.clear();
    ev.clear();
  }
};
#endif

}  // namespace

struct AdapterPool::Impl {
  PoolConfig cfg;
  pool::ImageLayout layout;
  int64_t layer_storage = 0;  // S · layout.layer_bytes
  int64_t offA[kPoolModules] = {0, 0, 0}, offB[kPoolModules] = {0, 0, 0};  // in a layer
  bool dev = false;
  uint8_t* storage = nullptr;   // L · layer_storage bytes (device or host)
  int32_t* rank_dev = nullptr;  // [L, 3, S] (host arrays below for the CPU backend)
  float* scale_dev = nullptr;
  std::vector<int32_t> rank_host;
  std::vector<float> scale_host;
  bool meta_dirty = false;

  std::vector<std::unique_ptr<Adapter>> adapters;  // by id; null once unloaded
  std::unordered_map<std::string, int32_t> by_name;
  std::vector<int32_t> slot_owner;  // adapter id or −1
  std::vector<char> slot_used;      // a batch has referenced it (device: may still be read)
  uint64_t clock = 0, batch = 0;
  PoolStats st;

#if MOLORA_HAVE_CUDA
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr, consumer_mark = nullptr;
  PinnedRing staging, small;
#endif

  ~Impl() {
#if MOLORA_HAVE_CUDA
    if (dev) {
      int prev = 0;
      cudaGetDevice(&prev);
      cudaSetDevice(cfg.device);
      if (stream) cudaStreamSynchronize(stream);
      staging.destroy();
      small.destroy();
      for (auto& a : adapters)
        if (a) free_image(a.get());
      if (storage) cudaFree(storage);
      if (rank_dev) cudaFree(rank_dev);
      if (scale_dev) cudaFree(scale_dev);
      if (ready) cudaEventDestroy(ready);
      if (consumer_mark) cudaEventDestroy(consumer_mark);
      if (stream) cudaStreamDestroy(stream);
      cudaSetDevice(prev);
      return;
    }
#endif
    for (auto& a : adapters)
      if (a) free_image(a.get());
    std::free(storage);
  }

  void free_image(Adapter* a) {
    if (!a->image) return;
#if MOLORA_HAVE_CUDA
    if (a->image_pinned) {
      cudaFreeHost(a->image);
      a->image = nullptr;
      return;
    }
#endif
    std::free(a->image);
    a->image = nullptr;
  }

  Status alloc_image(size_t bytes, uint8_t** out, bool* pinned) {
    *pinned = false;
#if MOLORA_HAVE_CUDA
    if (dev && cfg.pinned_images) {
      void* p = nullptr;
      cudaError_t e = cudaHostAlloc(&p, bytes, 0);
      if (e != cudaSuccess) {
        cudaGetLastError();
        return Status::ResourceExhausted("cannot pin " + std::to_string(bytes) +
                                         " bytes of host memory for an adapter image: " +
                                         cudaGetErrorString(e) + " (PoolConfig::pinned_images)");
      }
      *out = static_cast<uint8_t*>(p);
      *pinned = true;
      return Status::Ok();
    }
#endif
    // 2 MiB aligned and advised huge: the one write pass over a fresh image would otherwise
    // spend most of its time in 4 KiB page faults.
    const size_t huge = size_t{2} << 20;
    void* p = std::aligned_alloc(huge, (bytes + huge - 1) / huge * huge);
    if (p) ::madvise(p, (bytes + huge - 1) / huge * huge, MADV_HUGEPAGE);
    if (!p)
      return Status::ResourceExhausted("cannot allocate " + std::to_string(bytes) +
                                       " bytes for an adapter image");
    *out = static_cast<uint8_t*>(p);
    return Status::Ok();
  }

  uint8_t* a_region(int l, int m, int slot) const {
    return storage + l * layer_storage + offA[m] + slot * layout.a_bytes[m];
  }
  uint8_t* b_region(int l, int m, int slot) const {
    return storage + l * layer_storage + offB[m] + slot * layout.b_bytes[m];
  }
  size_t meta_index(int l, int m, int slot) const {
    return (static_cast<size_t>(l) * kPoolModules + m) * cfg.num_slots + slot;
  }

  // Host → slot copy of `bytes` at `src` (an image region) to `dst` (a slot region).
  Status copy_in(uint8_t* dst, const uint8_t* src, size_t bytes, bool src_pinned) {
    if (!dev) {
      std::memcpy(dst, src, bytes);
      return Status::Ok();
    }
#if MOLORA_HAVE_CUDA
    if (src_pinned) {
      MOLORA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
      return Status::Ok();
    }
    for (size_t off = 0; off < bytes;) {
      size_t n = std::min(bytes - off, staging.cap);
      uint8_t* p = nullptr;
      size_t idx = 0;
      MOLORA_RETURN_IF_ERROR(staging.acquire(n, &p, &idx));
      std::memcpy(p, src + off, n);
      MOLORA_CUDA_CHECK(cudaMemcpyAsync(dst + off, p, n, cudaMemcpyHostToDevice, stream));
      MOLORA_RETURN_IF_ERROR(staging.release(idx, stream));
      off += n;
    }
    return Status::Ok();
#else
    (void)src_pinned;
    return Status::Internal("device pool without CUDA");
#endif
  }

  Status upload(Adapter* a, int slot) {
    for (int l = 0; l < cfg.num_layers; ++l)
      for (int m = 0; m < kPoolModules; ++m) {
        MOLORA_RETURN_IF_ERROR(copy_in(a_region(l, m, slot), a->image + layout.a_offset(l, m),
                                       layout.a_bytes[m], a->image_pinned));
        MOLORA_RETURN_IF_ERROR(copy_in(b_region(l, m, slot), a->image + layout.b_offset(l, m),
                                       layout.b_bytes[m], a->image_pinned));
        rank_host[meta_index(l, m, slot)] = a->info.rank[l * kPoolModules + m];
        scale_host[meta_index(l, m, slot)] = a->info.scale[l * kPoolModules + m];
      }
    meta_dirty = true;
    st.bytes_uploaded += layout.total_bytes;
    return Status::Ok();
  }

  void clear_meta(int slot) {
    for (int l = 0; l < cfg.num_layers; ++l)
      for (int m = 0; m < kPoolModules; ++m) {
        rank_host[meta_index(l, m, slot)] = 0;
        scale_host[meta_index(l, m, slot)] = 0.f;
      }
    meta_dirty = true;
  }

  Status push_meta() {
    if (!meta_dirty) return Status::Ok();
#if MOLORA_HAVE_CUDA
    if (dev) {
      const size_t rb = rank_host.size() * sizeof(int32_t), sb = scale_host.size() * sizeof(float);
      uint8_t* p = nullptr;
      size_t idx = 0;
      MOLORA_RETURN_IF_ERROR(small.acquire(rb + sb, &p, &idx));
      std::memcpy(p, rank_host.data(), rb);
      std::memcpy(p + rb, scale_host.data(), sb);
      MOLORA_CUDA_CHECK(cudaMemcpyAsync(rank_dev, p, rb, cudaMemcpyHostToDevice, stream));
      MOLORA_CUDA_CHECK(cudaMemcpyAsync(scale_dev, p + rb, sb, cudaMemcpyHostToDevice, stream));
      MOLORA_RETURN_IF_ERROR(small.release(idx, stream));
    }
#endif
    meta_dirty = false;
    return Status::Ok();
  }

  Adapter* get(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= adapters.size()) return nullptr;
    return adapters[id].get();
  }
};

AdapterPool::AdapterPool(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AdapterPool::~AdapterPool() = default;
const PoolConfig& AdapterPool::config() const { return impl_->cfg; }

Status AdapterPool::create(const PoolConfig& c, std::unique_ptr<AdapterPool>* out) {
  out->reset();
  if (c.num_slots < 1 || c.num_slots > 4096)
    return Status::InvalidArgument("num_slots must be in [1, 4096], got " +
                                   std::to_string(c.num_slots));
  if (c.num_layers < 1 || c.num_layers > 1024)
    return Status::InvalidArgument("num_layers must be in [1, 1024], got " +
                                   std::to_string(c.num_layers));
  if (c.num_experts < 1 || c.num_experts > 65536)
    return Status::InvalidArgument("num_experts must be in [1, 65536], got " +
                                   std::to_string(c.num_experts));
  if (c.hidden < 1 || c.hidden > (1 << 20) || c.intermediate < 1 || c.intermediate > (1 << 20))
    return Status::InvalidArgument("hidden and intermediate must be in [1, 2^20]");
  if (c.r_max < 1 || c.r_max > 1024)
    return Status::InvalidArgument("r_max must be in [1, 1024], got " + std::to_string(c.r_max));
  if (c.dtype != DType::kBF16 && c.dtype != DType::kF16 && c.dtype != DType::kF32)
    return Status::InvalidArgument(std::string("dtype must be bf16, f16 or f32, got ") +
                                   dtype_name(c.dtype));
  if (c.device < -1) return Status::InvalidArgument("device must be -1 (host) or a CUDA device");
  if (c.staging_bytes < 4096) return Status::InvalidArgument("staging_bytes must be >= 4096");
  auto im = std::make_unique<Impl>();
  im->cfg = c;
  im->dev = c.device >= 0;
  MOLORA_RETURN_IF_ERROR(pool::make_layout(c, &im->layout));
  const auto& lay = im->layout;
  const int S = c.num_slots;
  // The storage, S slots x L layers: each factor is within its limit, but the product of the
  // limits is not (2^63 past; it wrapped, and a pool of a few bytes was made for it).
  int64_t layer_storage = 0, total = 0;
  if (__builtin_mul_overflow(int64_t{S}, lay.layer_bytes, &layer_storage) ||
      __builtin_mul_overflow(layer_storage, int64_t{c.num_layers}, &total))
    return Status::ResourceExhausted("the pool's storage (num_slots " + std::to_string(S) +
                                     " x num_layers " + std::to_string(c.num_layers) + " x " +
                                     std::to_string(lay.layer_bytes) +
                                     " bytes per slot and layer) exceeds 2^63 bytes");
  im->layer_storage = layer_storage;
  // Storage order in a layer: A_gate, A_up, B_gate, B_up, A_down, B_down (each S slots).
  int64_t off = 0;
  im->offA[kPoolGate] = off, off += S * lay.a_bytes[kPoolGate];
  im->offA[kPoolUp] = off, off += S * lay.a_bytes[kPoolUp];
  im->offB[kPoolGate] = off, off += S * lay.b_bytes[kPoolGate];
  im->offB[kPoolUp] = off, off += S * lay.b_bytes[kPoolUp];
  im->offA[kPoolDown] = off, off += S * lay.a_bytes[kPoolDown];
  im->offB[kPoolDown] = off, off += S * lay.b_bytes[kPoolDown];
  const size_t nmeta = static_cast<size_t>(c.num_layers) * kPoolModules * S;
  im->rank_host.assign(nmeta, 0);
  im->scale_host.assign(nmeta, 0.f);
  im->slot_owner.assign(S, -1);
  im->slot_used.assign(S, 0);
  if (im->dev) {
#if MOLORA_HAVE_CUDA
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || c.device >= count) {
      cudaGetLastError();
      return Status::Unavailable("CUDA device " + std::to_string(c.device) + " is not available");
    }
    int prev = 0;
    MOLORA_CUDA_CHECK(cudaGetDevice(&prev));
    MOLORA_CUDA_CHECK(cudaSetDevice(c.device));
    Status s = [&]() -> Status {
      MOLORA_CUDA_CHECK(cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking));
      MOLORA_CUDA_CHECK(cudaEventCreateWithFlags(&im->ready, cudaEventDisableTiming));
      MOLORA_CUDA_CHECK(cudaEventCreateWithFlags(&im->consumer_mark, cudaEventDisableTiming));
      MOLORA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&im->storage), total));
      MOLORA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&im->rank_dev), nmeta * 4));
      MOLORA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&im->scale_dev), nmeta * 4));
      MOLORA_CUDA_CHECK(cudaMemsetAsync(im->storage, 0, total, im->stream));
      MOLORA_CUDA_CHECK(cudaMemsetAsync(im->rank_dev, 0, nmeta * 4, im->stream));
      MOLORA_CUDA_CHECK(cudaMemsetAsync(im->scale_dev, 0, nmeta * 4, im->stream));
      MOLORA_RETURN_IF_ERROR(
          im->staging.init(c.pinned_images ? 0 : 2, c.pinned_images ? 0 : c.staging_bytes));
      MOLORA_RETURN_IF_ERROR(im->small.init(4, 4096));
      MOLORA_CUDA_CHECK(cudaStreamSynchronize(im->stream));
      return Status::Ok();
    }();
    cudaSetDevice(prev);
    MOLORA_RETURN_IF_ERROR(s);
#else
    return Status::Unavailable("a device pool needs a CUDA build (this build has no CUDA)");
#endif
  } else {
    im->storage = static_cast<uint8_t*>(std::calloc(static_cast<size_t>(total), 1));
    if (!im->storage && total > 0)
      return Status::ResourceExhausted("cannot allocate " + std::to_string(total) +
                                       " bytes of slot storage");
    im->rank_dev = im->rank_host.data();
    im->scale_dev = im->scale_host.data();
  }
  im->st.num_slots = S;
  im->st.slot_bytes = lay.total_bytes;
  im->st.device_bytes = total;
  out->reset(new AdapterPool(std::move(im)));
  return Status::Ok();
}

Status AdapterPool::load(const std::string& name, const std::string& path, int32_t* id) {
  Impl& m = *impl_;
  if (name.empty()) return Status::InvalidArgument("adapter name must not be empty");
  if (m.by_name.count(name))
    return Status::InvalidArgument("adapter \"" + name + "\" is already loaded");
  bool pinned = false;
  pool::ImageAlloc alloc = [&](size_t bytes, uint8_t** out) {
    return m.alloc_image(bytes, out, &pinned);
  };
  auto a = std::make_unique<Adapter>();
  uint8_t* image = nullptr;
#if MOLORA_HAVE_CUDA
  int prev = 0;
  if (m.dev) {
    MOLORA_CUDA_CHECK(cudaGetDevice(&prev));
    MOLORA_CUDA_CHECK(cudaSetDevice(m.cfg.device));
  }
#endif
  Status s = pool::load_peft(m.cfg, m.layout, path, alloc, &image, &a->info);
#if MOLORA_HAVE_CUDA
  if (m.dev) cudaSetDevice(prev);
#endif
  MOLORA_RETURN_IF_ERROR(s);
  a->image = image;
  a->image_pinned = pinned;
  a->info.name = name;
  a->info.id = static_cast<int32_t>(m.adapters.size());
  *id = a->info.id;
  m.by_name[name] = a->info.id;
  m.st.host_image_bytes += a->info.image_bytes;
  m.adapters.push_back(std::move(a));
  ++m.st.adapters;
  log("pool", "loaded " + name + " from " + path + " as id " + std::to_string(*id));
  return Status::Ok();
}

Status AdapterPool::unload(int32_t id) {
  Impl& m = *impl_;
  Adapter* a = m.get(id);
  if (!a) return Status::NotFound("adapter id " + std::to_string(id) + " is not loaded");
  if (a->info.pinned)
    return Status::InvalidArgument("adapter \"" + a->info.name + "\" is pinned; unpin it first");
  if (a->info.slot >= 0) {
    m.slot_owner[a->info.slot] = -1;
    m.clear_meta(a->info.slot);
    --m.st.resident;
  }
#if MOLORA_HAVE_CUDA
  if (m.dev) MOLORA_CUDA_CHECK(cudaStreamSynchronize(m.stream));  // its image may be in flight
#endif
  m.st.host_image_bytes -= a->info.image_bytes;
  m.free_image(a);
  m.by_name.erase(a->info.name);
  m.adapters[id].reset();
  --m.st.adapters;
  return Status::Ok();
}

Status AdapterPool::find(const std::string& name, int32_t* id) const {
  auto it = impl_->by_name.find(name);
  if (it == impl_->by_name.end()) return Status::NotFound("adapter \"" + name + "\" is not loaded");
  *id = it->second;
  return Status::Ok();
}

Status AdapterPool::pin(int32_t id) {
  Adapter* a = impl_->get(id);
  if (!a) return Status::NotFound("adapter id " + std::to_string(id) + " is not loaded");
  if (!a->info.pinned) ++impl_->st.pinned;
  a->info.pinned = true;
  return Status::Ok();
}

Status AdapterPool::unpin(int32_t id) {
  Adapter* a = impl_->get(id);
  if (!a) return Status::NotFound("adapter id " + std::to_string(id) + " is not loaded");
  if (a->info.pinned) --impl_->st.pinned;
  a->info.pinned = false;
  return Status::Ok();
}

Status AdapterPool::prepare(const int32_t* ids, int64_t n, int32_t* slot_ids,
                            int32_t* slot_ids_device, cudaStream_t consumer, cudaEvent_t* ready) {
  Impl& m = *impl_;
#if !MOLORA_HAVE_CUDA
  (void)consumer;
#endif
  if (ready) *ready = nullptr;
  if (n < 0) return Status::InvalidArgument("n must be >= 0");
  if (n > 0 && (!ids || !slot_ids))
    return Status::InvalidArgument("adapter_ids and slot_ids must not be null");
  if (slot_ids_device && !m.dev)
    return Status::InvalidArgument("slot_ids_device needs a device pool");
  const int S = m.cfg.num_slots;
  // 1. The batch's distinct adapters, in order of first appearance. Nothing changes yet.
  const uint64_t mark = ++m.batch;
  std::vector<Adapter*> distinct;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    if (id == -1) continue;
    Adapter* a = m.get(id);
    if (!a) {
      ++m.st.rejected;
      return Status::NotFound("adapter_ids[" + std::to_string(i) + "] = " + std::to_string(id) +
                              " is not a loaded adapter (-1 = base model)");
    }
    if (a->batch_mark != mark) {
      a->batch_mark = mark;
      distinct.push_back(a);
    }
  }
  if (static_cast<int>(distinct.size()) > S) {
    ++m.st.rejected;
    return Status::ResourceExhausted("the batch needs " + std::to_string(distinct.size()) +
                                     " distinct adapters but the pool has " + std::to_string(S) +
                                     " slots (tokens without adapter do not count)");
  }
  // 2. Plan: free slots (lowest first), then LRU unpinned residents not in this batch.
  std::vector<Adapter*> missing;
  for (Adapter* a : distinct)
    if (a->info.slot < 0) missing.push_back(a);
  std::vector<int> free_slots, victims;
  for (int s = 0; s < S; ++s) {
    if (m.slot_owner[s] < 0) {
      free_slots.push_back(s);
    } else {
      Adapter* o = m.adapters[m.slot_owner[s]].get();
      if (!o->info.pinned && o->batch_mark != mark) victims.push_back(s);
    }
  }
  if (missing.size() > free_slots.size() + victims.size()) {
    ++m.st.rejected;
    return Status::ResourceExhausted(
        "the batch needs " + std::to_string(missing.size()) + " more slots but only " +
        std::to_string(free_slots.size()) + " are free and " + std::to_string(victims.size()) +
        " evictable (" + std::to_string(m.st.pinned) + " adapters pinned)");
  }
  std::sort(victims.begin(), victims.end(), [&](int x, int y) {
    return m.adapters[m.slot_owner[x]]->last_use < m.adapters[m.slot_owner[y]]->last_use;
  });
  std::vector<int> targets;
  for (size_t i = 0; i < missing.size(); ++i)
    targets.push_back(i < free_slots.size() ? free_slots[i] : victims[i - free_slots.size()]);

#if MOLORA_HAVE_CUDA
  int prev = 0;
  if (m.dev) {
    MOLORA_CUDA_CHECK(cudaGetDevice(&prev));
    MOLORA_CUDA_CHECK(cudaSetDevice(m.cfg.device));
  }
#endif
  Status s = [&]() -> Status {
#if MOLORA_HAVE_CUDA
    if (m.dev) {
      // Overwrite a slot (or the rank/scale arrays) only after the consumer's work so far.
      bool wait = m.meta_dirty;
      for (int t : targets) wait |= m.slot_used[t] != 0;
      if (wait || !targets.empty()) {
        MOLORA_CUDA_CHECK(cudaEventRecord(m.consumer_mark, consumer));
        MOLORA_CUDA_CHECK(cudaStreamWaitEvent(m.stream, m.consumer_mark, 0));
      }
    }
#endif
    // 3. Place the missing adapters.
    for (size_t i = 0; i < missing.size(); ++i) {
      const int slot = targets[i];
      if (m.slot_owner[slot] >= 0) {
        Adapter* old = m.adapters[m.slot_owner[slot]].get();
        old->info.slot = -1;
        ++m.st.evictions;
        --m.st.resident;
        log("pool", "evict " + old->info.name + " from slot " + std::to_string(slot));
      }
      m.slot_owner[slot] = missing[i]->info.id;
      missing[i]->info.slot = slot;
      ++m.st.resident;
      Status u = m.upload(missing[i], slot);
      if (!u.ok()) {  // the slot's contents are undefined now: leave it empty
        m.slot_owner[slot] = -1;
        missing[i]->info.slot = -1;
        --m.st.resident;
        m.clear_meta(slot);
        return u;
      }
      ++m.st.uploads;
      log("pool", "upload " + missing[i]->info.name + " to slot " + std::to_string(slot));
    }
    MOLORA_RETURN_IF_ERROR(m.push_meta());
    for (Adapter* a : distinct) {
      a->last_use = ++m.clock;
      m.slot_used[a->info.slot] = 1;
    }
    m.st.hits += static_cast<int64_t>(distinct.size() - missing.size());
    for (int64_t i = 0; i < n; ++i) slot_ids[i] = ids[i] == -1 ? -1 : m.adapters[ids[i]]->info.slot;
#if MOLORA_HAVE_CUDA
    if (m.dev) {
      if (slot_ids_device && n > 0) {
        uint8_t* p = nullptr;
        size_t idx = 0;
        MOLORA_RETURN_IF_ERROR(m.small.acquire(n * sizeof(int32_t), &p, &idx));
        std::memcpy(p, slot_ids, n * sizeof(int32_t));
        MOLORA_CUDA_CHECK(cudaMemcpyAsync(slot_ids_device, p, n * sizeof(int32_t),
                                          cudaMemcpyHostToDevice, m.stream));
        MOLORA_RETURN_IF_ERROR(m.small.release(idx, m.stream));
      }
      MOLORA_CUDA_CHECK(cudaEventRecord(m.ready, m.stream));
      if (ready) *ready = m.ready;
    }
#endif
    return Status::Ok();
  }();
#if MOLORA_HAVE_CUDA
  if (m.dev) cudaSetDevice(prev);
#endif
  MOLORA_RETURN_IF_ERROR(s);
  ++m.st.prepares;
  return Status::Ok();
}

Status AdapterPool::wait_ready(cudaStream_t consumer) {
#if MOLORA_HAVE_CUDA
  if (impl_->dev && impl_->st.prepares > 0)
    MOLORA_CUDA_CHECK(cudaStreamWaitEvent(consumer, impl_->ready, 0));
#else
  (void)consumer;
#endif
  return Status::Ok();
}

Status AdapterPool::synchronize() {
#if MOLORA_HAVE_CUDA
  if (impl_->dev) MOLORA_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
#endif
  return Status::Ok();
}

Status AdapterPool::layer_tensors(int layer, PoolLayerTensors* out) const {
  const Impl& m = *impl_;
  if (layer < 0 || layer >= m.cfg.num_layers)
    return Status::OutOfRange("layer " + std::to_string(layer) + " is not in [0, " +
                              std::to_string(m.cfg.num_layers) + ")");
  PoolLayerTensors t;
  const int64_t es = static_cast<int64_t>(dtype_size(m.cfg.dtype));
  t.a_gate_up = m.a_region(layer, kPoolGate, 0);
  t.b_gate_up = m.b_region(layer, kPoolGate, 0);
  t.a_down = m.a_region(layer, kPoolDown, 0);
  t.b_down = m.b_region(layer, kPoolDown, 0);
  t.rank = m.rank_dev + m.meta_index(layer, 0, 0);
  t.scale = m.scale_dev + m.meta_index(layer, 0, 0);
  t.a_gate_up_slice_stride = m.cfg.num_slots * m.layout.a_bytes[kPoolGate] / es;
  t.b_gate_up_slice_stride = m.cfg.num_slots * m.layout.b_bytes[kPoolGate] / es;
  for (int i = 0; i < kPoolModules; ++i) {
    t.a_slot_stride[i] = m.layout.a_bytes[i] / es;
    t.b_slot_stride[i] = m.layout.b_bytes[i] / es;
    t.k[i] = m.layout.k[i];
    t.n[i] = m.layout.n[i];
  }
  *out = t;
  return Status::Ok();
}

Status AdapterPool::info(int32_t id, AdapterInfo* out) const {
  Adapter* a = impl_->get(id);
  if (!a) return Status::NotFound("adapter id " + std::to_string(id) + " is not loaded");
  *out = a->info;
  return Status::Ok();
}

std::vector<AdapterInfo> AdapterPool::adapters() const {
  std::vector<AdapterInfo> v;
  for (const auto& a : impl_->adapters)
    if (a) v.push_back(a->info);
  return v;
}

int AdapterPool::slot_adapter(int slot) const {
  if (slot < 0 || slot >= impl_->cfg.num_slots) return -1;
  return impl_->slot_owner[slot];
}

PoolStats AdapterPool::stats() const { return impl_->st; }

Status AdapterPool::read_back(const void* src, size_t bytes, void* dst) const {
  const Impl& m = *impl_;
  if (!m.dev) {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
#if MOLORA_HAVE_CUDA
  MOLORA_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  MOLORA_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
#endif
  return Status::Ok();
}

}  // namespace molora
