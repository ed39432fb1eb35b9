// The stream kernels' translation unit (lora_stream.cuh says how they work): the kernels and their
// launchers (lora_stream_shrink.cuh, lora_stream_expand.cuh, included here), and the host side:
// the probe setting, the tensor maps and their cache shared by both ops, the timeline probe's
// buffer, and launch_stream, which sets a launch's divisors and picks the kernel.
// One translation unit on purpose: nvcc's register allocation for a kernel depends on the rest of
// its module. Compiled in a file of its own, the shrink kernel of K a multiple of the piece
// (KFULL) spilled 24 bytes (ptxas -v; 8 STL in its SASS) and ran 2-4.5% slower on the H200
// (bench/NOTES.md "lora v0.12"); compiled beside the expand kernels it spills nothing.
#include <atomic>
#include <mutex>

#include "lora/lora_stream.cuh"
#include "lora/lora_stream_expand.cuh"
#include "lora/lora_stream_shrink.cuh"
#include "lora/memo_cache.h"
#include "molora/settings.h"

namespace molora::lora::detail {

int probe_bits() {
  static const int probe = static_cast<int>(get_setting_int("MOLORA_LORA_STREAM_PROBE", 0));
  return probe;
}

namespace {

// The driver's cuTensorMapEncodeTiled (null where the driver has none; looked up once).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    cudaGetLastError();
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The tensor maps of every distinct (weights, shape, box) key made so far, shared by both ops and
// every host thread: a map depends on nothing else, so a hit is exact. 512 keys cover the 4 ops
// x ~120 layers of an engine that calls every layer eagerly (memo_cache.h says why one entry per
// op was not enough). A failed encode is kept too (ok = 0: the kernels' fallback copies).
struct MapKey {
  uint64_t w;
  int64_t d0, d1, d2;  // shrink: K, rows, 0; expand: r_max, N, V
  int32_t kind, tile;  // 0 shrink (tile: its ShrinkMapForm), 1 expand
};
struct MapValue {
  ExpandMaps maps;  // shrink: maps.m[0]
};
constexpr size_t kMapCacheKeys = 512;
MemoCache<MapKey, MapValue>& map_cache() {
  static MemoCache<MapKey, MapValue> c(kMapCacheKeys);
  return c;
}

}  // namespace

// Expand's tensor maps (ExpandMaps) for r_max >= 32: B viewed as [V, N, r_max] (16-bit
// elements), map j with boxes of (8 << j) columns x tile rows x 1 expert for each 8 << j below
// r_max, no L2 promotion (a box row of r8 columns must not fetch the rest of its r_max row).
// ok = 0 where they cannot be made (tile > 256 rows, a driver without the entry point, a
// misaligned B): the kernel then uses its per-lane copies.
void expand_maps(const KernelArgs& a, ExpandMaps* out) {
  std::memset(out, 0, sizeof(*out));
  if (a.r_max < 32 || a.tile <= 0 || a.tile > 256) return;
  const auto fn = encode_fn();
  if (fn == nullptr) return;
  const int64_t V = static_cast<int64_t>(a.S) * a.E;
  const MapKey key{reinterpret_cast<uint64_t>(a.w), a.r_max, a.dim, V, 1, a.tile};
  *out = map_cache()
             .get(key,
                  [&](MapValue* v) {
                    ExpandMaps& m = v->maps;
                    std::memset(&m, 0, sizeof(m));
                    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(a.r_max),
                                                static_cast<cuuint64_t>(a.dim),
                                                static_cast<cuuint64_t>(V)};
                    const cuuint64_t strides[2] = {static_cast<cuuint64_t>(a.r_max) * 2,
                                                   static_cast<cuuint64_t>(a.dim) * a.r_max * 2};
                    const cuuint32_t es[3] = {1, 1, 1};
                    for (int j = 0; (8 << j) < a.r_max; ++j) {
                      const cuuint32_t box[3] = {static_cast<cuuint32_t>(8 << j),
                                                 static_cast<cuuint32_t>(a.tile), 1};
                      if (fn(&m.m[j], CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void*>(a.w),
                             dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                             CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
                        std::memset(&m, 0, sizeof(m));
                        return;
                      }
                    }
                    m.ok = 1;
                  })
             .maps;
}

// The tensor map of A (16-bit elements). kShrinkMapPlain: A viewed as [S*E*r_max rows, K
// columns], boxes of 8 rows x 256 columns; false where it cannot be made (K < 256, or a driver
// without the entry point): the kernel then copies row by row. kShrinkMapSwizzled (the SWZ
// kernels, K a multiple of the 64-column chunk): A viewed as [K / 64 chunks, rows, 64 columns]
// (the chunks 128 bytes apart), one box of 8 chunks (K / 64 where K < 512) x 8 rows x 64
// columns per piece, with the 128-byte swizzle (lora_stream_shrink.cuh says why);
// kShrinkMapTail, the same view with a box of the last piece's chunks (K % 512 / 64), so that
// the piece that ends at K moves no zero-filled chunk. False where they cannot be made: the
// launcher then takes the unswizzled kernel and map.
bool shrink_map(const KernelArgs& a, CUtensorMap* out, ShrinkMapForm form) {
  const int64_t piece_chunks = kStreamShrinkKc / kStreamShrinkSwzBox;
  const int64_t chunks = a.dim / kStreamShrinkSwzBox;
  const bool swizzled = form != kShrinkMapPlain;
  if (swizzled ? a.dim % kStreamShrinkSwzBox != 0 : a.dim < kBox) return false;
  // (the last piece's chunks: K % 512 / 64, or K / 64 where K < 512)
  const int64_t box_chunks =
      form == kShrinkMapTail ? (chunks - 1) % piece_chunks + 1 : std::min(chunks, piece_chunks);
  const auto fn = encode_fn();
  if (fn == nullptr) return false;
  const int64_t rows = static_cast<int64_t>(a.S) * a.E * a.r_max;
  const MapKey key{reinterpret_cast<uint64_t>(a.w), a.dim, rows, 0, 0, static_cast<int32_t>(form)};
  const MapValue v = map_cache().get(key, [&](MapValue* mv) {
    std::memset(mv, 0, sizeof(*mv));
    const cuuint32_t es[3] = {1, 1, 1};
    if (swizzled) {  // [K / 64 chunks][rows][64 columns]: one box of `box_chunks` x 8 rows
      const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kStreamShrinkSwzBox),
                                  static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(chunks)};
      const cuuint64_t strides[2] = {static_cast<cuuint64_t>(a.dim) * 2,
                                     static_cast<cuuint64_t>(kStreamShrinkSwzBox) * 2};
      const cuuint32_t box[3] = {static_cast<cuuint32_t>(kStreamShrinkSwzBox), kStreamShrinkRows,
                                 static_cast<cuuint32_t>(box_chunks)};
      mv->maps.ok =
          fn(&mv->maps.m[0], CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void*>(a.w), dims,
             strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
      return;
    }
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(a.dim), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(a.dim) * 2};
    const cuuint32_t box[2] = {kBox, kStreamShrinkRows};
    mv->maps.ok =
        fn(&mv->maps.m[0], CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void*>(a.w), dims, strides,
           box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  });
  if (!v.maps.ok) return false;
  *out = v.maps.m[0];
  return true;
}

namespace {
struct TraceState {
  std::atomic<bool> on{false};  // (read without the lock by every launch)
  std::mutex mu;
  unsigned long long* buf = nullptr;
  int64_t words = 0, used = 0;
};
TraceState& trace_state() {
  static TraceState t;
  return t;
}
}  // namespace

bool stream_trace_built() { return kTrace; }

void set_stream_trace(unsigned long long* buf, int64_t words) {
  TraceState& t = trace_state();
  std::lock_guard<std::mutex> lock(t.mu);
  t.buf = buf;
  t.words = buf != nullptr ? words : 0;
  t.used = 0;
  t.on.store(buf != nullptr, std::memory_order_release);
}

Status launch_stream(Op op, DType dt, const KernelArgs& args, const Plan& plan,
                     cudaStream_t stream) {
  KernelArgs a = args;
  a.trace = nullptr;
  if (TraceState& t = trace_state(); kTrace && t.on.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(t.mu);
    const int64_t need = static_cast<int64_t>(plan.grid) * kTraceWords;
    if (t.buf != nullptr && t.used + need <= t.words) a.trace = t.buf + t.used, t.used += need;
  }
  a.early = plan.early_inputs ? 1 : 0;
  a.slot_check = plan.slot_check ? 1 : 0;
  a.fd_E = FastDiv(a.E);
  a.fd_k = FastDiv(a.k);
  a.fd_block = FastDiv(a.block);
  a.fd_chunks = FastDiv(a.chunks);
  const int64_t kc = std::min<int64_t>(a.dim, kStreamShrinkKc);  // (as the shrink kernel)
  a.fd_pieces = FastDiv(op == Op::kShrink && kc > 0 ? (a.dim + kc - 1) / kc : 1);
  a.fd_stages = FastDiv(plan.stages);
  a.fd_grid = FastDiv(plan.grid);
  a.fd_warps = FastDiv(plan.threads / 32);
  a.fd_consumers = FastDiv(stream_consumers_of(op, plan.threads));
  if (dt == DType::kBF16)
    return op == Op::kShrink ? launch_stream_shrink<__nv_bfloat16>(a, plan, stream)
                             : launch_stream_expand<__nv_bfloat16>(a, plan, stream);
  if (dt == DType::kF16)
    return op == Op::kShrink ? launch_stream_shrink<__half>(a, plan, stream)
                             : launch_stream_expand<__half>(a, plan, stream);
  return Status::InvalidArgument(std::string("dtype must be bf16 or f16 on the GPU, got ") +
                                 dtype_name(dt));
}

MapCacheStats tensor_map_cache_stats() {
  const auto st = map_cache().stats();
  return {st.hits, st.misses, st.size, st.capacity};
}
void tensor_map_cache_clear() { map_cache().clear(); }

}  // namespace molora::lora::detail
