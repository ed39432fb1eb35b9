// molora::Communicator: buffers, IPC exchange, path choice, NCCL fallback, error reporting.
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <sstream>

#include "comm/kernels.h"
#include "comm/policy.h"
#include "core/cuda_util.h"
#include "molora/comm.h"
#include "molora/settings.h"

#if MOLORA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#if MOLORA_HAVE_NCCL
#include <nccl.h>
#endif

namespace molora {

const char* comm_fallback_name(CommFallback r) noexcept {
  switch (r) {
    case CommFallback::kDtype:
      return "dtype";
    case CommFallback::kNotContiguous:
      return "not_contiguous";
    case CommFallback::kSize:
      return "size";
    case CommFallback::kAlignment:
      return "alignment";
    case CommFallback::kWorldSize:
      return "world_size";
    case CommFallback::kTopology:
      return "topology";
    case CommFallback::kIpcFailure:
      return "ipc_failure";
    case CommFallback::kTimeout:
      return "timeout";
    case CommFallback::kMismatch:
      return "mismatch";
    case CommFallback::kDisabled:
      return "disabled";
    default:
      return "unknown";
  }
}

#if !MOLORA_HAVE_CUDA
struct Communicator::Impl {};
Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;
static Status no_cuda() { return Status::Unavailable("molora was built without CUDA"); }
Status Communicator::create(int, int, int, const CommExchange&, const CommOptions&,
                            std::unique_ptr<Communicator>*) {
  return no_cuda();
}
Status Communicator::create_local_group(int, int, const CommOptions&,
                                        std::vector<std::unique_ptr<Communicator>>*) {
  return no_cuda();
}
Status Communicator::all_reduce_local_group(const std::vector<Communicator*>&, const void* const*,
                                            void* const*, int64_t, DType, cudaStream_t) {
  return no_cuda();
}
Status Communicator::all_reduce(const void*, void*, int64_t, DType, cudaStream_t) {
  return no_cuda();
}
Status Communicator::all_reduce_residual_rmsnorm(const void*, void*, const void*, void*, int64_t,
                                                 int64_t, float, DType, cudaStream_t) {
  return no_cuda();
}
Status Communicator::fallback_all_reduce(const void*, void*, int64_t, DType, CommFallback,
                                         cudaStream_t) {
  return no_cuda();
}
Status Communicator::check() { return no_cuda(); }
CommStats Communicator::stats() const { return {}; }
bool Communicator::p2p_enabled() const { return false; }
std::string Communicator::p2p_disabled_reason() const { return "no CUDA"; }
int Communicator::rank() const { return 0; }
int Communicator::world() const { return 0; }
int Communicator::device() const { return 0; }
size_t Communicator::capacity_bytes() const { return 0; }
size_t Communicator::max_bytes() const { return 0; }
Status Communicator::set_max_bytes(size_t) { return no_cuda(); }
void Communicator::set_timeout_ms(long long) {}
void Communicator::set_algo(CommAlgo) {}
size_t Communicator::oneshot_max_bytes() const { return 0; }
Status Communicator::epoch(uint64_t*) const { return no_cuda(); }
#else

namespace {

using comm::ErrorMirror;
using comm::Header;

struct DeviceGuard {
  int prev = -1;
  explicit DeviceGuard(int dev) {
    cudaGetDevice(&prev);
    cudaSetDevice(dev);
  }
  ~DeviceGuard() {
    if (prev >= 0) cudaSetDevice(prev);
  }
};

// One rank's buffer: header region + 2 * world staging slots, and its host-mapped error mirror.
struct RankBuffer {
  char* base = nullptr;
  ErrorMirror* mirror_host = nullptr;
  ErrorMirror* mirror_dev = nullptr;
  int device = 0;
  ~RankBuffer() {
    DeviceGuard g(device);
    if (base) cudaFree(base);
    if (mirror_host) cudaFreeHost(mirror_host);
  }
};

Status alloc_rank_buffer(int device, int world, size_t slot_bytes, RankBuffer* b) {
  DeviceGuard g(device);
  b->device = device;
  size_t bytes = comm::kHeaderBytes + 2 * static_cast<size_t>(world) * slot_bytes;
  MOLORA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&b->base), bytes));
  MOLORA_CUDA_CHECK(cudaMemset(b->base, 0, comm::kHeaderBytes));
  MOLORA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&b->mirror_host), sizeof(ErrorMirror),
                                  cudaHostAllocMapped));
  std::memset(b->mirror_host, 0, sizeof(ErrorMirror));
  MOLORA_CUDA_CHECK(
      cudaHostGetDevicePointer(reinterpret_cast<void**>(&b->mirror_dev), b->mirror_host, 0));
  MOLORA_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}

size_t setting_max_bytes() {
  long long v = get_setting_int("MOLORA_COMM_MAX_BYTES", 16ll << 20);
  return v > 0 ? static_cast<size_t>(v) : (size_t(16) << 20);
}

#if MOLORA_HAVE_NCCL
ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    default:
      return ncclUint8;
  }
}
#endif

// The creation blob every rank sends in round 1.
struct Blob {
  uint32_t magic, version;
  int32_t rank, world;
  uint64_t slot_bytes;
  int32_t max_blocks, ipc_ok;
  uint64_t host_hash;
  int64_t pid;
  char bus_id[32];
  cudaIpcMemHandle_t handle;  // all 64 bytes, by value
};
constexpr uint32_t kMagic = 0x4d4c4352;  // "MLCR"

uint64_t host_hash() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  uint64_t h = 1469598103934665603ull;
  for (char* p = name; *p; ++p) h = (h ^ static_cast<uint8_t>(*p)) * 1099511628211ull;
  return h;
}

template <typename T>
std::vector<uint8_t> to_bytes(const T& v) {
  std::vector<uint8_t> b(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
  return b;
}

}  // namespace

struct Communicator::Impl {
  int rank = 0, world = 1, device = 0;
  bool local = false;
  size_t slot_bytes = 0, max_bytes = 0;
  long long timeout_ms = -1, oneshot_max = -1;
  CommAlgo algo = CommAlgo::kAuto;
  int max_blocks = 16;
  bool p2p_ok = false;
  CommFallback p2p_reason = CommFallback::kWorldSize;
  std::string p2p_detail;
  comm::RankArgs ra{};
  ErrorMirror* mirror_host = nullptr;
  std::shared_ptr<std::vector<std::unique_ptr<RankBuffer>>> group;  // local groups: all buffers
  std::unique_ptr<RankBuffer> own;                                  // multi-process: this rank's
  std::vector<void*> opened;                                        // IPC-opened peer buffers
  void* nccl = nullptr;
  bool own_nccl = false;
  std::string nccl_note;
  mutable std::mutex mu;
  CommStats stats;
  bool failed = false;
  CommFallback fail_reason = CommFallback::kTimeout;
  Status failure;

  ~Impl() {
    DeviceGuard g(device);
    for (void* p : opened) cudaIpcCloseMemHandle(p);
#if MOLORA_HAVE_NCCL
    if (own_nccl && nccl) ncclCommDestroy(static_cast<ncclComm_t>(nccl));
#endif
  }

  long long timeout() const {
    long long t = timeout_ms >= 0 ? timeout_ms : get_setting_int("MOLORA_COMM_TIMEOUT_MS", 1000);
    return t > 0 ? t : 1000;
  }
  size_t oneshot_limit() const {
    if (oneshot_max >= 0) return static_cast<size_t>(oneshot_max);
    long long v = get_setting_int("MOLORA_COMM_ONESHOT_MAX_BYTES", -1);
    return v >= 0 ? static_cast<size_t>(v) : comm::default_oneshot_max(world);
  }

  // Reads the host-mapped error mirror (no synchronisation).
  Status read_error() const {
    volatile ErrorMirror* m = mirror_host;
    uint32_t code = m->code;
    if (code == comm::kErrNone) return Status::Ok();
    uint32_t peer = m->peer, epoch = m->epoch, detail = m->detail;
    std::ostringstream os;
    os << "comm rank " << rank << ": ";
    StatusCode sc = StatusCode::kTimeout;
    if (code == comm::kErrTimeout) {
      os << "timeout at epoch " << epoch << " waiting for rank " << peer << " (deadline "
         << timeout() << " ms, CTA " << detail << ")";
    } else if (code == comm::kErrMismatch) {
      sc = StatusCode::kMismatch;
      os << "mismatch at epoch " << epoch << ": rank " << peer
         << " called with another sequence or shape (its shape hash 0x" << std::hex << detail
         << std::dec << ")";
    } else {
      sc = detail == comm::kErrMismatch ? StatusCode::kMismatch : StatusCode::kTimeout;
      os << "rank " << peer << " failed ("
         << (detail == comm::kErrMismatch ? "mismatch" : "timeout") << ") near epoch " << epoch
         << "; this rank stopped waiting";
    }
    os << "; later calls use NCCL";
    return Status(sc, os.str());
  }

  void count_fallback(CommFallback r, const std::string& detail) {
    {
      std::lock_guard<std::mutex> l(mu);
      stats.fallback[static_cast<int>(r)]++;
    }
    log_once(std::string("comm.fallback.") + comm_fallback_name(r),
             std::string("molora comm: all-reduce falls back to NCCL (reason: ") +
                 comm_fallback_name(r) + (detail.empty() ? "" : ", " + detail) +
                 "); counted in Communicator::stats()");
  }

  Status run_nccl(const void* in, void* out, int64_t numel, DType dt, cudaStream_t s) {
#if MOLORA_HAVE_NCCL
    if (nccl) {
      {
        std::lock_guard<std::mutex> l(mu);
        stats.nccl_calls++;
      }
      ncclResult_t r = ncclAllReduce(in, out, static_cast<size_t>(numel), nccl_type(dt), ncclSum,
                                     static_cast<ncclComm_t>(nccl), s);
      if (r != ncclSuccess) return nccl_status(r, "ncclAllReduce", __FILE__, __LINE__);
      return Status::Ok();
    }
#else
    (void)in, (void)out, (void)numel, (void)dt, (void)s;
#endif
    {
      std::lock_guard<std::mutex> l(mu);
      stats.unavailable++;
    }
    return Status::Unavailable(
        "comm: the all-reduce cannot take the P2P path and there is no "
        "NCCL communicator (" +
        (nccl_note.empty() ? std::string("none") : nccl_note) + ")");
  }

  // Host checks shared by every call; sets *done when the call is finished (error or no-op).
  Status precheck(const void* in, void* out, int64_t numel) {
    if (numel < 0) return Status::InvalidArgument("numel must be >= 0");
    if (numel > 0 && (!in || !out)) return Status::InvalidArgument("in/out must not be null");
    if (!failed && p2p_ok) {
      Status e = read_error();
      if (!e.ok()) {
        failed = true;
        fail_reason =
            e.code() == StatusCode::kMismatch ? CommFallback::kMismatch : CommFallback::kTimeout;
        failure = e;
        return e;  // reported once; later calls fall back
      }
    }
    return Status::Ok();
  }

  int path(const void* in, const void* out, int64_t numel, DType dt) const {
    comm::PathInputs p{dt,
                       numel,
                       reinterpret_cast<uintptr_t>(in),
                       reinterpret_cast<uintptr_t>(out),
                       world,
                       p2p_ok,
                       p2p_reason,
                       failed,
                       fail_reason,
                       max_bytes,
                       get_setting_int("MOLORA_COMM_DISABLE_P2P", 0) != 0};
    return comm::choose_path(p);
  }

  bool two_shot_for(size_t bytes) const {
    if (algo == CommAlgo::kOneShot) return false;
    if (algo == CommAlgo::kTwoShot) return true;
    return bytes > oneshot_limit();
  }

  comm::LaunchArgs launch_args(const void* in, void* out, int64_t numel, uint32_t kind, DType dt,
                               bool two, uint64_t extra) const {
    comm::LaunchArgs a{};
    a.ranks[0] = ra;
    a.ranks[0].in = in;
    a.ranks[0].out = out;
    a.world = world;
    a.nvec = static_cast<uint64_t>(numel) * 2 / comm::kVec;
    a.slot_bytes = slot_bytes;
    a.hash = comm::shape_hash(kind, static_cast<uint32_t>(dt), static_cast<uint64_t>(numel),
                              two ? 2u : 1u, extra);
    a.timeout_ns = static_cast<uint64_t>(timeout()) * 1000000ull;
    return a;
  }

  void count_fused() {
    std::lock_guard<std::mutex> l(mu);
    stats.fused_calls++;
  }
  void count_p2p(bool two) {
    std::lock_guard<std::mutex> l(mu);
    stats.p2p_calls++;
    (two ? stats.twoshot_calls : stats.oneshot_calls)++;
  }

  Status fallback(int reason, const void* in, void* out, int64_t numel, DType dt, cudaStream_t s) {
    CommFallback r = static_cast<CommFallback>(reason);
    std::string detail;
    if (r == CommFallback::kTopology || r == CommFallback::kIpcFailure) detail = p2p_detail;
    if (r == CommFallback::kTimeout || r == CommFallback::kMismatch) detail = failure.message();
    count_fallback(r, detail);
    return run_nccl(in, out, numel, dt, s);
  }
};

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

Status Communicator::create_local_group(int world, int device, const CommOptions& o,
                                        std::vector<std::unique_ptr<Communicator>>* out) {
  if (!out) return Status::InvalidArgument("out must not be null");
  if (world < 1 || world > comm::kMaxWorld)
    return Status::InvalidArgument("world must be in 1..8 for a local group");
  MOLORA_RETURN_IF_ERROR(require_gpu());
  int ndev = 0;
  MOLORA_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (device < 0 || device >= ndev) return Status::InvalidArgument("device out of range");
  int sms = 0;
  MOLORA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  MOLORA_RETURN_IF_ERROR(comm::preload_kernels(device));
  size_t slot = o.max_bytes ? o.max_bytes : setting_max_bytes();
  slot = (slot + comm::kVec - 1) / comm::kVec * comm::kVec;
  auto group = std::make_shared<std::vector<std::unique_ptr<RankBuffer>>>();
  for (int r = 0; r < world; ++r) {
    group->push_back(std::make_unique<RankBuffer>());
    MOLORA_RETURN_IF_ERROR(alloc_rank_buffer(device, world, slot, group->back().get()));
  }
  int max_blocks = o.max_blocks > 0 ? o.max_blocks : sms / world;
  if (max_blocks > comm::kMaxBlocks) max_blocks = comm::kMaxBlocks;
  if (max_blocks < 1) max_blocks = 1;
  out->clear();
  for (int r = 0; r < world; ++r) {
    auto impl = std::make_unique<Impl>();
    impl->rank = r;
    impl->world = world;
    impl->device = device;
    impl->local = true;
    impl->slot_bytes = slot;
    impl->max_bytes = slot;
    impl->timeout_ms = o.timeout_ms;
    impl->oneshot_max = o.oneshot_max;
    impl->algo = o.algo;
    impl->max_blocks = max_blocks;
    impl->p2p_ok = world >= 2;
    impl->p2p_reason = CommFallback::kWorldSize;
    impl->group = group;
    for (int k = 0; k < world; ++k) {
      impl->ra.peer_hdr[k] = reinterpret_cast<Header*>((*group)[k]->base);
      impl->ra.peer_data[k] = (*group)[k]->base + comm::kHeaderBytes;
    }
    impl->ra.mirror = (*group)[r]->mirror_dev;
    impl->mirror_host = (*group)[r]->mirror_host;
    impl->ra.rank = r;
    impl->nccl = o.nccl_comm;
    impl->nccl_note = "an in-process group on one device: NCCL needs one rank per GPU";
    out->push_back(std::unique_ptr<Communicator>(new Communicator(std::move(impl))));
  }
  return Status::Ok();
}

Status Communicator::create(int rank, int world, int device, const CommExchange& exchange,
                            const CommOptions& o, std::unique_ptr<Communicator>* out) {
  if (!out) return Status::InvalidArgument("out must not be null");
  if (world < 1) return Status::InvalidArgument("world must be >= 1");
  if (rank < 0 || rank >= world) return Status::InvalidArgument("rank must be in [0, world)");
  if (!exchange) return Status::InvalidArgument("exchange must be a callable");
  MOLORA_RETURN_IF_ERROR(require_gpu());
  int ndev = 0;
  MOLORA_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (device < 0 || device >= ndev) return Status::InvalidArgument("device out of range");
  DeviceGuard guard(device);
  MOLORA_RETURN_IF_ERROR(comm::preload_kernels(device));
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->world = world;
  impl->device = device;
  impl->timeout_ms = o.timeout_ms;
  impl->oneshot_max = o.oneshot_max;
  impl->algo = o.algo;
  size_t slot = o.max_bytes ? o.max_bytes : setting_max_bytes();
  slot = (slot + comm::kVec - 1) / comm::kVec * comm::kVec;
  impl->slot_bytes = slot;
  impl->max_bytes = slot;
  int sms = 0;
  MOLORA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int max_blocks = o.max_blocks > 0 ? o.max_blocks : 32;
  if (max_blocks > sms) max_blocks = sms;
  if (max_blocks > comm::kMaxBlocks) max_blocks = comm::kMaxBlocks;

  if (world < 2 || world > comm::kMaxWorld) {
    impl->p2p_ok = false;
    impl->p2p_reason = CommFallback::kWorldSize;
    impl->p2p_detail = "world " + std::to_string(world) + " (P2P serves 2..8)";
  } else {
    // Round 1: buffers and IPC handles (all 64 bytes, by value).
    impl->own = std::make_unique<RankBuffer>();
    MOLORA_RETURN_IF_ERROR(alloc_rank_buffer(device, world, slot, impl->own.get()));
    impl->mirror_host = impl->own->mirror_host;
    impl->ra.mirror = impl->own->mirror_dev;
    impl->ra.rank = rank;
    Blob mine{};
    mine.magic = kMagic;
    mine.version = 1;
    mine.rank = rank;
    mine.world = world;
    mine.slot_bytes = slot;
    mine.max_blocks = max_blocks;
    mine.host_hash = host_hash();
    mine.pid = static_cast<int64_t>(getpid());
    cudaDeviceGetPCIBusId(mine.bus_id, sizeof(mine.bus_id) - 1, device);
    mine.ipc_ok = cudaIpcGetMemHandle(&mine.handle, impl->own->base) == cudaSuccess ? 1 : 0;
    cudaGetLastError();
    std::vector<uint8_t> all;
    MOLORA_RETURN_IF_ERROR(exchange(to_bytes(mine), &all));
    if (all.size() != sizeof(Blob) * world)
      return Status::InvalidArgument("exchange returned " + std::to_string(all.size()) +
                                     " bytes, expected world * " + std::to_string(sizeof(Blob)));
    std::vector<Blob> blobs(world);
    std::memcpy(blobs.data(), all.data(), all.size());
    uint8_t ok = 1, reason = 0;
    std::string detail;
    for (int k = 0; k < world; ++k) {
      const Blob& b = blobs[k];
      if (b.magic != kMagic || b.rank != k || b.world != world || b.slot_bytes != slot)
        return Status::InvalidArgument("exchange: rank " + std::to_string(k) +
                                       "'s blob disagrees (rank order, world or max_bytes)");
      if (b.max_blocks < max_blocks) max_blocks = b.max_blocks;
    }
    for (int k = 0; k < world && ok; ++k) {
      const Blob& b = blobs[k];
      if (k == rank) {
        impl->ra.peer_hdr[k] = reinterpret_cast<Header*>(impl->own->base);
        impl->ra.peer_data[k] = impl->own->base + comm::kHeaderBytes;
        continue;
      }
      if (b.host_hash != mine.host_hash) {
        ok = 0, reason = static_cast<uint8_t>(CommFallback::kTopology);
        detail = "rank " + std::to_string(k) + " is on another host";
        break;
      }
      int peer_dev = -1;
      if (cudaDeviceGetByPCIBusId(&peer_dev, b.bus_id) == cudaSuccess && peer_dev != device) {
        int can = 0;
        cudaDeviceCanAccessPeer(&can, device, peer_dev);
        if (!can) {
          ok = 0, reason = static_cast<uint8_t>(CommFallback::kTopology);
          detail = "no peer access from device " + std::to_string(device) + " to rank " +
                   std::to_string(k) + "'s device " + b.bus_id;
          break;
        }
      }
      cudaGetLastError();
      void* p = nullptr;
      cudaError_t err = b.ipc_ok
                            ? cudaIpcOpenMemHandle(&p, b.handle, cudaIpcMemLazyEnablePeerAccess)
                            : cudaErrorInvalidValue;
      if (err != cudaSuccess || b.pid == mine.pid) {
        cudaGetLastError();
        if (p) cudaIpcCloseMemHandle(p);
        ok = 0, reason = static_cast<uint8_t>(CommFallback::kIpcFailure);
        detail = "cudaIpcOpenMemHandle of rank " + std::to_string(k) + ": " +
                 (b.pid == mine.pid ? std::string("same process (use create_local_group)")
                                    : std::string(cudaGetErrorString(err)));
        break;
      }
      impl->opened.push_back(p);
      impl->ra.peer_hdr[k] = reinterpret_cast<Header*>(p);
      impl->ra.peer_data[k] = static_cast<char*>(p) + comm::kHeaderBytes;
    }
    // Round 2: every rank must agree, or none uses P2P (a lone P2P rank would wait in vain).
    std::vector<uint8_t> st = {ok, reason}, sts;
    MOLORA_RETURN_IF_ERROR(exchange(st, &sts));
    if (sts.size() != 2u * world) return Status::InvalidArgument("exchange: bad round-2 size");
    impl->p2p_ok = true;
    for (int k = 0; k < world; ++k)
      if (!sts[2 * k]) {
        impl->p2p_ok = false;
        impl->p2p_reason = static_cast<CommFallback>(sts[2 * k + 1]);
        impl->p2p_detail =
            k == rank ? detail : "rank " + std::to_string(k) + " could not map its peers";
        break;
      }
  }
  impl->max_blocks = max_blocks;

  // Round 3: NCCL for the fallbacks.
  if (o.nccl_comm) {
    impl->nccl = o.nccl_comm;
  } else if (o.create_nccl) {
#if MOLORA_HAVE_NCCL
    ncclUniqueId id{};
    uint8_t have = 1;
    if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) have = 0;
    std::vector<uint8_t> m(1 + sizeof(id)), allid;
    m[0] = have;
    std::memcpy(m.data() + 1, &id, sizeof(id));
    MOLORA_RETURN_IF_ERROR(exchange(m, &allid));
    if (allid.size() != m.size() * world)
      return Status::InvalidArgument("exchange: bad round-3 size");
    if (allid[0]) {
      std::memcpy(&id, allid.data() + 1, sizeof(id));
      ncclComm_t c = nullptr;
      ncclResult_t r = ncclCommInitRank(&c, world, id, rank);
      if (r == ncclSuccess) {
        impl->nccl = c;
        impl->own_nccl = true;
      } else {
        impl->nccl_note = std::string("ncclCommInitRank failed: ") + ncclGetErrorString(r);
        log_once("comm.nccl_init", "molora comm: " + impl->nccl_note + "; fallbacks unavailable");
      }
    } else {
      impl->nccl_note = "ncclGetUniqueId failed on rank 0";
    }
#else
    impl->nccl_note = "molora was built without NCCL";
#endif
  } else {
    impl->nccl_note = "create_nccl = false and no nccl_comm given";
  }
  if (!impl->p2p_ok)
    log_once("comm.p2p_off." + std::string(comm_fallback_name(impl->p2p_reason)),
             std::string("molora comm: P2P all-reduce unavailable for this group (") +
                 comm_fallback_name(impl->p2p_reason) + ": " + impl->p2p_detail +
                 "); every call goes to NCCL");
  out->reset(new Communicator(std::move(impl)));
  return Status::Ok();
}

Status Communicator::all_reduce(const void* in, void* out, int64_t numel, DType dtype,
                                cudaStream_t stream) {
  Impl& m = *impl_;
  MOLORA_RETURN_IF_ERROR(m.precheck(in, out, numel));
  if (numel == 0) return Status::Ok();
  int p = m.path(in, out, numel, dtype);
  if (p != comm::kP2P) return m.fallback(p, in, out, numel, dtype, stream);
  bool two = m.two_shot_for(static_cast<size_t>(numel) * 2);
  comm::LaunchArgs a = m.launch_args(in, out, numel, 1, dtype, two, 0);
  DeviceGuard g(m.device);
  int grid = comm::grid_for(a.nvec, m.world, two, m.max_blocks);
  MOLORA_RETURN_IF_ERROR(comm::launch_all_reduce(
      a, grid, 1, dtype, two ? comm::Kernel::kTwoShot : comm::Kernel::kOneShot, stream));
  m.count_p2p(two);
  return Status::Ok();
}

Status Communicator::all_reduce_local_group(const std::vector<Communicator*>& ranks,
                                            const void* const* in, void* const* out, int64_t numel,
                                            DType dtype, cudaStream_t stream) {
  if (ranks.empty() || !in || !out) return Status::InvalidArgument("ranks/in/out must be given");
  Impl& m0 = *ranks[0]->impl_;
  if (!m0.local || static_cast<int>(ranks.size()) != m0.world)
    return Status::InvalidArgument("ranks must be every rank of one local group, in order");
  if (numel == 0) return Status::Ok();
  comm::LaunchArgs a{};
  bool two = m0.two_shot_for(static_cast<size_t>(numel) * 2);
  for (int r = 0; r < m0.world; ++r) {
    Impl& m = *ranks[r]->impl_;
    if (m.group != m0.group || m.rank != r)
      return Status::InvalidArgument("ranks must be every rank of one local group, in order");
    MOLORA_RETURN_IF_ERROR(m.precheck(in[r], out[r], numel));
    if (m.path(in[r], out[r], numel, dtype) != comm::kP2P)
      return Status::InvalidArgument("all_reduce_local_group: this call cannot take the P2P path");
    comm::LaunchArgs ar = m.launch_args(in[r], out[r], numel, 1, dtype, two, 0);
    a.ranks[r] = ar.ranks[0];
    a.world = ar.world;
    a.nvec = ar.nvec;
    a.slot_bytes = ar.slot_bytes;
    a.hash = ar.hash;
    a.timeout_ns = ar.timeout_ns;
  }
  DeviceGuard g(m0.device);
  int grid = comm::grid_for(a.nvec, m0.world, two, m0.max_blocks);
  MOLORA_RETURN_IF_ERROR(comm::launch_all_reduce(
      a, grid, m0.world, dtype, two ? comm::Kernel::kTwoShot : comm::Kernel::kOneShot, stream));
  for (Communicator* c : ranks) c->impl_->count_p2p(two);
  return Status::Ok();
}

Status Communicator::all_reduce_residual_rmsnorm(const void* in, void* residual, const void* weight,
                                                 void* out, int64_t numel, int64_t hidden,
                                                 float eps, DType dtype, cudaStream_t stream) {
  Impl& m = *impl_;
  if (hidden <= 0 || numel % hidden != 0)
    return Status::InvalidArgument("hidden must be > 0 and divide numel");
  if (dtype != DType::kBF16 && dtype != DType::kF16)
    return Status::InvalidArgument("dtype must be bf16 or f16 for the fused variant");
  if (numel > 0 && (!residual || !weight))
    return Status::InvalidArgument("residual/weight must not be null");
  MOLORA_RETURN_IF_ERROR(m.precheck(in, out, numel));
  if (numel == 0) return Status::Ok();
  DeviceGuard g(m.device);
  int p = m.path(in, out, numel, dtype);
  if (p != comm::kP2P) {
    MOLORA_RETURN_IF_ERROR(m.fallback(p, in, out, numel, dtype, stream));
    return comm::launch_residual_rmsnorm(out, residual, weight, out, numel / hidden, hidden, eps,
                                         dtype, stream);
  }
  bool two = m.two_shot_for(static_cast<size_t>(numel) * 2);
  comm::LaunchArgs a = m.launch_args(in, out, numel, 2, dtype, two, static_cast<uint64_t>(hidden));
  const int64_t rows = numel / hidden;
  if (!two && comm::rmsnorm_vectorised(in, residual, weight, out, hidden)) {
    // One kernel: all-reduce, residual add and rmsnorm; each CTA owns whole rows.
    a.ranks[0].residual = residual;
    a.ranks[0].weight = weight;
    a.hidden = hidden;
    a.eps = eps;
    int grid = comm::grid_for(a.nvec, m.world, false, m.max_blocks);
    if (grid > rows) grid = static_cast<int>(rows);
    MOLORA_RETURN_IF_ERROR(
        comm::launch_all_reduce(a, grid, 1, dtype, comm::Kernel::kOneShotResidualRmsnorm, stream));
    m.count_p2p(false);
    m.count_fused();
    return Status::Ok();
  }
  // Two-shot (or rows that are not whole vectors): the all-reduce, then a second kernel.
  int grid = comm::grid_for(a.nvec, m.world, two, m.max_blocks);
  MOLORA_RETURN_IF_ERROR(comm::launch_all_reduce(
      a, grid, 1, dtype, two ? comm::Kernel::kTwoShot : comm::Kernel::kOneShot, stream));
  m.count_p2p(two);
  return comm::launch_residual_rmsnorm(out, residual, weight, out, rows, hidden, eps, dtype,
                                       stream);
}

Status Communicator::fallback_all_reduce(const void* in, void* out, int64_t numel, DType dtype,
                                         CommFallback reason, cudaStream_t stream) {
  Impl& m = *impl_;
  if (static_cast<int>(reason) < 0 || reason >= CommFallback::kCount)
    return Status::InvalidArgument("reason out of range");
  MOLORA_RETURN_IF_ERROR(m.precheck(in, out, numel));
  if (numel == 0) return Status::Ok();
  DeviceGuard g(m.device);
  return m.fallback(static_cast<int>(reason), in, out, numel, dtype, stream);
}

Status Communicator::check() {
  Impl& m = *impl_;
  if (m.failed) return m.failure;
  if (!m.p2p_ok) return Status::Ok();
  Status e = m.read_error();
  if (!e.ok()) {
    m.failed = true;
    m.fail_reason =
        e.code() == StatusCode::kMismatch ? CommFallback::kMismatch : CommFallback::kTimeout;
    m.failure = e;
  }
  return e;
}

CommStats Communicator::stats() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->stats;
}
bool Communicator::p2p_enabled() const { return impl_->p2p_ok; }
std::string Communicator::p2p_disabled_reason() const {
  if (impl_->p2p_ok) return "";
  return std::string(comm_fallback_name(impl_->p2p_reason)) + ": " + impl_->p2p_detail;
}
int Communicator::rank() const { return impl_->rank; }
int Communicator::world() const { return impl_->world; }
int Communicator::device() const { return impl_->device; }
size_t Communicator::capacity_bytes() const { return impl_->slot_bytes; }
size_t Communicator::max_bytes() const { return impl_->max_bytes; }
Status Communicator::set_max_bytes(size_t bytes) {
  if (bytes > impl_->slot_bytes)
    return Status::OutOfRange("max_bytes " + std::to_string(bytes) + " exceeds the capacity " +
                              std::to_string(impl_->slot_bytes) + " allocated at creation");
  impl_->max_bytes = bytes;
  return Status::Ok();
}
void Communicator::set_timeout_ms(long long ms) { impl_->timeout_ms = ms; }
void Communicator::set_algo(CommAlgo algo) { impl_->algo = algo; }
size_t Communicator::oneshot_max_bytes() const { return impl_->oneshot_limit(); }
Status Communicator::epoch(uint64_t* out) const {
  if (!out) return Status::InvalidArgument("out must not be null");
  *out = 0;
  if (!impl_->ra.peer_hdr[impl_->rank]) return Status::Ok();
  DeviceGuard g(impl_->device);
  MOLORA_CUDA_CHECK(cudaMemcpy(out, &impl_->ra.peer_hdr[impl_->rank]->epoch, sizeof(uint64_t),
                               cudaMemcpyDeviceToHost));
  return Status::Ok();
}

#endif  // MOLORA_HAVE_CUDA

}  // namespace molora
