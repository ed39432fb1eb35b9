// The "stream" kernel of aligned routing (block size <= 32): a warp-specialised pipeline that
// streams every weight byte of the call through a ring of shared-memory stages filled by bulk
// asynchronous copies (cp.async.bulk, Hopper's TMA engine), so that the bytes in flight do not
// depend on how many registers or threads the arithmetic needs.
//
// One CTA per SM. Warp 0 is the producer, warps 1..stream_consumers(op) the consumers. The CTA's
// tasks are (group, chunk) items taken grid-stride, exactly as the grid kernel (lora.cu) numbers
// them; every warp walks the same list, reads the expert id of each task (one load per 32 tasks)
// and keeps only the tasks that hold work (a valid virtual expert whose slot has rank > 0 and,
// shrink, a rank row in the chunk), so every warp counts valid tasks identically without
// talking to the others:
//   valid task i is consumed by consumer warp i % stream_consumers(op), and its pieces take ring
//   positions i * pieces + q (stage = position % stages, phase = position / stages).
// A piece is one stage: expand, `tile` rows of B[v] at r_s (one copy when r_s == r_max, else
// one per row, so the bytes read follow r_s); shrink, the task's <= 16 rank rows of A[v] over
// one K-chunk of kShrinkKc columns (one copy per row). The producer waits for the stage to be
// released, announces its byte count on the stage's `full` barrier and issues the copies; the
// consumer loads its task's pair ids and activations (t and y, or x) while the copy is in
// flight, waits on `full`, computes from shared memory and releases the stage on `empty`.
// Every sum is taken in a fixed order and every output element written by one thread: the
// result is the same bits run to run. Every wait is bounded: a lost arrival traps (a launch
// error) instead of hanging the stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <mutex>

#include "core/cuda_util.h"
#include "lora/lora_device.cuh"
#include "lora/lora_internal.h"
#include "molora/settings.h"

namespace molora::lora::detail {
namespace {

constexpr int kSlots = kStreamSlots;
constexpr int kTBatch = kStreamTBatch;
constexpr int kYPre = kStreamYPre;
constexpr int kYRows = 32 * kStreamMaxRowsPerLane;
constexpr int kXPre = kStreamXPre;

// --- mbarrier and bulk-copy primitives (PTX ISA 8.0, sm_90) -------------------------------
__device__ __forceinline__ uint32_t sa(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(b)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(b)) : "memory");
}
// A waiting warp is suspended in hardware (up to this long per try) instead of spinning: spinning
// warps take issue slots from the consumers that share their scheduler.
constexpr uint32_t kSuspendNs = 20000;
__device__ __forceinline__ bool bar_try(uint64_t* b, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(ok)
      : "r"(sa(b)), "r"(parity), "r"(kSuspendNs)
      : "memory");
  return ok != 0;
}
// Waits for the phase of parity `parity` to complete; traps after ~2^33 cycles (seconds).
__device__ __forceinline__ void bar_wait(uint64_t* b, uint32_t parity) {
  if (bar_try(b, parity)) return;
  const long long t0 = clock64();
  while (!bar_try(b, parity))
    if (clock64() - t0 > (1LL << 33)) __trap();
}
// Waits until the producer has issued ring position `pos` (its counter is past it), then for
// the stage's fill. The counter comes first because consumers share stages: without it a warp
// that runs ahead could see the previous fill of its stage still pending, whose parity differs,
// and take that as its own phase being complete.
__device__ __forceinline__ void wait_filled(const volatile int* issued, uint64_t* full, int64_t pos,
                                            int stages) {
  if (*issued <= pos) {
    const long long t0 = clock64();
    unsigned ns = 64;  // back off: a sleeping warp issues nothing
    while (*issued <= pos) {
      __nanosleep(ns);
      ns = ns < 1024 ? 2 * ns : ns;
      if (clock64() - t0 > (1LL << 33)) __trap();
    }
  }
  bar_wait(full, static_cast<uint32_t>((pos / stages) & 1));
}
// One bulk copy global -> this CTA's shared memory, completing `bytes` on barrier b.
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* b,
                                         uint64_t policy) {
  if (policy == 0) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(sa(dst)),
        "l"(src), "r"(bytes), "r"(sa(b))
        : "memory");
    return;
  }
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;" ::"r"(sa(dst)),
      "l"(src), "r"(bytes), "r"(sa(b)), "l"(policy)
      : "memory");
}
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

struct Ctx {
  const KernelArgs* a;
  uint8_t* smem;
  StreamLayout L;
  uint64_t *full, *empty;
  volatile int* issued;  // ring positions the producer has announced (written by its lane 0)
  const int* rank;
  const float* scale;
  int V, pieces, kc;
  int64_t my_tasks;
};

__device__ __forceinline__ int rank_of(const Ctx& x, int slot) {
  return x.a->S <= kSlots ? x.rank[slot] : min(max(__ldg(x.a->ranks + slot), 0), x.a->r_max);
}
__device__ __forceinline__ float scale_of(const Ctx& x, int slot) {
  return x.a->S <= kSlots ? x.scale[slot] : __ldg(x.a->scales + slot);
}

// Walks this CTA's valid tasks in order, calling f(valid_index, task, group, chunk, v, r).
// Called by a whole warp; f is called uniformly by every lane.
template <Op OP, typename F>
__device__ __forceinline__ void for_valid_tasks(const Ctx& x, F&& f) {
  const KernelArgs& a = *x.a;
  const int lane = threadIdx.x & 31;
  int vi = 0;
  for (int64_t l0 = 0; l0 < x.my_tasks; l0 += 32) {
    const int64_t lt = l0 + lane;
    int ve = -1, r = 0;
    bool ok = false;
    if (lt < x.my_tasks) {
      const int64_t task = blockIdx.x + lt * gridDim.x;
      const int64_t g = task / a.chunks;
      const int c = static_cast<int>(task - g * a.chunks);
      ve = __ldg(a.rt.expert_ids + g);
      if (ve >= 0 && ve < x.V) {
        r = rank_of(x, ve / a.E);
        ok = r > 0 && (OP == Op::kExpand || c * a.tile < r);
      }
    }
    unsigned m = __ballot_sync(~0u, ok);
    while (m != 0) {
      const int j = __ffs(m) - 1;
      m &= m - 1;
      const int64_t task = blockIdx.x + (l0 + j) * gridDim.x;
      const int64_t g = task / a.chunks;
      const int c = static_cast<int>(task - g * a.chunks);
      const int v = __shfl_sync(~0u, ve, j), rr = __shfl_sync(~0u, r, j);
      f(vi++, g, c, v, rr);
    }
  }
}

// --- producer -------------------------------------------------------------------------------
template <Op OP, typename T>
__device__ void produce(const Ctx& x) {
  const KernelArgs& a = *x.a;
  const int lane = threadIdx.x & 31;
  const uint64_t pol = (a.dbg & 8) ? 0 : evict_first_policy();
  const int R = a.r_max;
  const T* W = static_cast<const T*>(a.w);
  for_valid_tasks<OP>(x, [&](int vi, int64_t, int c, int v, int r) {
    for (int q = 0; q < x.pieces; ++q) {
      const int64_t pos = static_cast<int64_t>(vi) * x.pieces + q;
      const int s = static_cast<int>(pos % x.L.stages);
      const int64_t n = pos / x.L.stages;
      if (n > 0) bar_wait(x.empty + s, static_cast<uint32_t>((n - 1) & 1));
      uint8_t* dst = x.smem + static_cast<size_t>(s) * kStreamStageBytes;
      if (OP == Op::kExpand) {
        const int64_t N = a.dim, n0 = static_cast<int64_t>(c) * a.tile;
        const int rows = static_cast<int>(min(static_cast<int64_t>(a.tile), N - n0));
        const int r8 = (r + 7) / 8 * 8;
        const T* src = W + (static_cast<int64_t>(v) * N + n0) * R;
        if (a.dbg & 4) {
          if (lane == 0) bar_arrive(x.full + s);
        } else if (lane == 0) {
          bar_arrive_tx(x.full + s, static_cast<uint32_t>(rows) * r8 * 2);
        }
        __syncwarp();
        if (a.dbg & 4) {
        } else if (r8 == R) {
          if (lane == 0) bulk_g2s(dst, src, static_cast<uint32_t>(rows) * R * 2, x.full + s, pol);
        } else {
          for (int j = lane; j < rows; j += 32)
            bulk_g2s(dst + static_cast<size_t>(j) * r8 * 2, src + static_cast<int64_t>(j) * R,
                     r8 * 2, x.full + s, pol);
        }
      } else {
        const int64_t K = a.dim, k0 = static_cast<int64_t>(q) * x.kc;
        const int cols = static_cast<int>(min(static_cast<int64_t>(x.kc), K - k0));
        const int r0 = c * a.tile;
        const int rows = min(a.tile, r - r0);
        const T* src = W + (static_cast<int64_t>(v) * R + r0) * K + k0;
        if (a.dbg & 4) {
          if (lane == 0) bar_arrive(x.full + s);
        } else if (lane == 0) {
          bar_arrive_tx(x.full + s, static_cast<uint32_t>(rows) * cols * 2);
        }
        __syncwarp();
        if (lane < rows && !(a.dbg & 4))
          bulk_g2s(dst + static_cast<size_t>(lane) * x.kc * 2, src + static_cast<int64_t>(lane) * K,
                   cols * 2, x.full + s, pol);
      }
      if (lane == 0) {  // after the stage's arrive: its phase for `pos` is the current one
        __threadfence_block();
        *x.issued = static_cast<int>(pos + 1);
      }
    }
  });
}

// Loads this task's pair ids (block g of the align output) into ids[], ascending; returns the
// count. Whole warp.
__device__ __forceinline__ int load_members(const KernelArgs& a, int64_t g, int* ids) {
  const int lane = threadIdx.x & 31;
  int p = -1;
  const int64_t at = g * a.block + lane;
  if (lane < a.block && at < a.sorted_len) p = __ldg(a.rt.sorted_token_ids + at);
  const bool ok = p >= 0 && p < a.P;
  const unsigned bal = __ballot_sync(~0u, ok);
  if (ok) ids[__popc(bal & ((1u << lane) - 1u))] = p;
  __syncwarp();
  return __popc(bal);
}

// 16-byte asynchronous copy global -> shared (Ampere cp.async), waited with cp_async_wait().
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.commit_group;\n cp.async.wait_all;" ::: "memory");
}
__device__ __forceinline__ uint4 mask4(uint4 v, const uint4& keep) {
  v.x &= keep.x, v.y &= keep.y, v.z &= keep.z, v.w &= keep.w;
  return v;
}
// --- expand consumer: y[p, n0 + row] += scale * B[v, n0 + row, :r] . t[p, :r] ------------------
// Lane l owns rows l, l + 32, ... of the piece (the smem rows are r8 elements; each lane starts
// its row at a different 16-byte vector so that the 8 lanes of a shared-memory phase hit
// distinct banks). The t rows of up to kTBatch members and the y of the first kYPre members
// (this chunk's rows) are copied to shared memory (cp.async) while the weights land. Loops are
// kept rolled: the kernel's code must stay within the instruction cache.
template <typename T>
__device__ void expand_task(const Ctx& x, int vi, int64_t g, int c, int v, int r, int* ids,
                            uint8_t* wbuf) {
  const KernelArgs& a = *x.a;
  const int lane = threadIdx.x & 31;
  const int64_t N = a.dim, n0 = static_cast<int64_t>(c) * a.tile;
  const int rows = static_cast<int>(min(static_cast<int64_t>(a.tile), N - n0));
  const int R = a.r_max, nv = (r + 7) / 8;
  const int rot = (nv >= 8 ? lane : (lane * nv) >> 3) % nv;
  const uint4 keep = tail_mask(r);
  const float scale = scale_of(x, v / a.E);
  const T* tin = static_cast<const T*>(a.in);
  T* y = static_cast<T*>(a.out);
  uint4* tb = reinterpret_cast<uint4*>(wbuf);                      // [kTBatch][16] vectors
  T* yb = reinterpret_cast<T*>(wbuf + kTBatch * 128 * sizeof(T));  // [kYPre][kYRows]
  const int count = (a.dbg & 2) ? 0 : load_members(a, g, ids);
  auto stage_t = [&](int m0, int mc) {
    for (int i = lane; i < mc * nv; i += 32) {
      const int m = i / nv, q = i - m * nv;
      cp_async16(tb + m * 16 + q, tin + static_cast<int64_t>(ids[m0 + m]) * R + q * 8);
    }
  };
  stage_t(0, min(kTBatch, count));
  const int ny = min(kYPre, count), yv = rows / 8;
  for (int i = lane; i < ny * yv; i += 32) {
    const int m = i / yv, q = i - m * yv;
    cp_async16(yb + m * kYRows + q * 8, y + static_cast<int64_t>(ids[m]) * N + n0 + q * 8);
  }
  const int64_t pos = vi;  // expand: one piece per task
  const int s = static_cast<int>(pos % x.L.stages);
  wait_filled(x.issued, x.full + s, pos, x.L.stages);
  cp_async_wait();
  __syncwarp();
  const uint4* st =
      reinterpret_cast<const uint4*>(x.smem + static_cast<size_t>(s) * kStreamStageBytes);
  for (int m0 = 0; m0 < ((a.dbg & 1) ? 0 : count); m0 += kTBatch) {
    const int mc = min(kTBatch, count - m0);
    if (m0 > 0) {
      __syncwarp();
      stage_t(m0, mc);
      cp_async_wait();
      __syncwarp();
    }
    // Two rows per pass (rows r and r + 32): two independent FMA chains per member.
#pragma unroll 1
    for (int row = lane; row < rows; row += 64) {
      const bool two = row + 32 < rows;
      float acc[2][kTBatch];
#pragma unroll
      for (int m = 0; m < kTBatch; ++m) acc[0][m] = 0.f, acc[1][m] = 0.f;
#pragma unroll 1
      for (int q = 0; q < nv; ++q) {
        int qq = q + rot;
        qq -= qq >= nv ? nv : 0;
        const bool last = qq == nv - 1;
        uint4 w0 = st[row * nv + qq];
        uint4 w1 = two ? st[(row + 32) * nv + qq] : make_uint4(0, 0, 0, 0);
        if (last) w0 = mask4(w0, keep), w1 = mask4(w1, keep);
        float f0[8], f1[8];
        to8<T>(w0, f0);
        to8<T>(w1, f1);
#pragma unroll
        for (int m = 0; m < kTBatch; ++m) {
          if (m < mc) {
            uint4 tv = tb[m * 16 + qq];
            if (last) tv = mask4(tv, keep);
            float tf[8];
            to8<T>(tv, tf);
            float s0 = acc[0][m], s1 = acc[1][m];
#pragma unroll
            for (int e = 0; e < 8; ++e) s0 = fmaf(f0[e], tf[e], s0), s1 = fmaf(f1[e], tf[e], s1);
            acc[0][m] = s0, acc[1][m] = s1;
          }
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rw = row + 32 * h;
        if (h == 1 && !two) break;
#pragma unroll
        for (int m = 0; m < kTBatch; ++m) {
          if (m < mc) {
            const int mm = m0 + m;
            T* yp = y + static_cast<int64_t>(ids[mm]) * N + n0 + rw;
            const float yold = mm < kYPre ? Cvt<T>::one(yb[mm * kYRows + rw]) : Cvt<T>::one(*yp);
            *yp = Cvt<T>::from(yold + scale * acc[h][m]);
          }
        }
      }
    }
  }
  __syncwarp();
  if (lane == 0) bar_arrive(x.empty + s);
}

// c ? a : b on registers (a plain ?: over array elements becomes an address select, which puts
// the array in local memory).
__device__ __forceinline__ float sel(bool c, float a, float b) {
  float r;
  asm("{\n .reg .pred p;\n setp.ne.u32 p, %1, 0;\n selp.f32 %0, %2, %3, p;\n}"
      : "=f"(r)
      : "r"(static_cast<unsigned>(c)), "f"(a), "f"(b));
  return r;
}

// One halving step of reduce_scatter32: lanes with bit OFF keep the upper OFF values.
template <int OFF>
__device__ __forceinline__ void rs_step(float (&v)[32], int lane) {
  const bool up = (lane & OFF) != 0;
#pragma unroll
  for (int j = 0; j < OFF; ++j) {
    const float lo = v[j], hi = v[j + OFF];
    v[j] = sel(up, hi, lo) + __shfl_xor_sync(~0u, sel(up, lo, hi), OFF);
  }
}
// Sums 32 values across the warp so that lane l ends with the total of index l.
__device__ __forceinline__ float reduce_scatter32(float (&v)[32]) {
  const int lane = threadIdx.x & 31;
  rs_step<16>(v, lane);
  rs_step<8>(v, lane);
  rs_step<4>(v, lane);
  rs_step<2>(v, lane);
  rs_step<1>(v, lane);
  return v[0];
}

// --- shrink consumer: t[p, r0 + rr] = A[v, r0 + rr, :] . x[token(p), :] for rr < 16 ------------
// Lane l reads 16-byte vectors l, l + 32, ... of each row of a K-chunk. The x chunks of up to
// kXPre members are copied to shared memory (cp.async) while the weights land. The 8 x 4 partial
// sums of each 8-row half (rows x members) are reduced across the warp so that lane l holds
// row l / 4 of that half for member l % 4: once per task with at most kXPre members (partials kept
// over every K-chunk), else once per K-chunk and member pass.
template <typename T>
__device__ void shrink_task(const Ctx& x, int vi, int64_t g, int c, int v, int r, int* ids,
                            uint8_t* wbuf) {
  const KernelArgs& a = *x.a;
  const int lane = threadIdx.x & 31;
  const int64_t K = a.dim;
  const int r0 = c * a.tile, rows = min(a.tile, r - r0);
  const int count = (a.dbg & 2) ? 0 : load_members(a, g, ids);
  const int nb = (count + kXPre - 1) / kXPre;
  const bool fast = nb <= 1;
  const T* xg = static_cast<const T*>(a.in);
  uint4* xb = reinterpret_cast<uint4*>(wbuf);  // [kXPre][kc / 8] vectors
  const int srow = x.kc / 8;                   // vectors per shared-memory row
  float acc[kStreamShrinkRows][kXPre];
  constexpr int kHalves = kStreamShrinkRows / 8;  // 8 rows x 4 members = one 32-lane reduction
  float out[kHalves][kStreamMaxBlock / kXPre];
#pragma unroll
  for (int h = 0; h < kHalves; ++h)
#pragma unroll
    for (int b = 0; b < kStreamMaxBlock / kXPre; ++b) out[h][b] = 0.f;
#pragma unroll
  for (int rr = 0; rr < kStreamShrinkRows; ++rr)
#pragma unroll
    for (int m = 0; m < kXPre; ++m) acc[rr][m] = 0.f;
  auto stage_x = [&](int b, int64_t k0, int nvec) {
    const int mc = min(kXPre, count - b * kXPre);
    for (int i = lane; i < mc * nvec; i += 32) {
      const int m = i / nvec, q = i - m * nvec;
      cp_async16(xb + m * srow + q,
                 xg + static_cast<int64_t>(ids[b * kXPre + m] / a.k) * K + k0 + q * 8);
    }
  };
#pragma unroll 1
  for (int q = 0; q < x.pieces; ++q) {
    const int64_t pos = static_cast<int64_t>(vi) * x.pieces + q;
    const int s = static_cast<int>(pos % x.L.stages);
    const int64_t k0 = static_cast<int64_t>(q) * x.kc;
    const int nvec = static_cast<int>(min(static_cast<int64_t>(x.kc), K - k0)) / 8;
    __syncwarp();  // the previous chunk's readers of xb are done
    if (nb > 0) stage_x(0, k0, nvec);
    wait_filled(x.issued, x.full + s, pos, x.L.stages);
    cp_async_wait();
    __syncwarp();
    const uint4* st =
        reinterpret_cast<const uint4*>(x.smem + static_cast<size_t>(s) * kStreamStageBytes);
#pragma unroll 1
    for (int b = 0; b < ((a.dbg & 1) ? 0 : nb); ++b) {
      if (b > 0) {
        __syncwarp();
        stage_x(b, k0, nvec);
        cp_async_wait();
        __syncwarp();
      }
      const int mc = min(kXPre, count - b * kXPre);
#pragma unroll 1
      for (int vec = lane; vec < nvec; vec += 32) {
        float xf[kXPre][8];
#pragma unroll
        for (int m = 0; m < kXPre; ++m)
          to8<T>(m < mc ? xb[m * srow + vec] : make_uint4(0, 0, 0, 0), xf[m]);
#pragma unroll
        for (int rr = 0; rr < kStreamShrinkRows; ++rr) {
          if (rr < rows) {
            float wf[8];
            to8<T>(st[rr * srow + vec], wf);
#pragma unroll
            for (int m = 0; m < kXPre; ++m) {
              if (m < mc) {
                float sum = acc[rr][m];
#pragma unroll
                for (int e = 0; e < 8; ++e) sum = fmaf(wf[e], xf[m][e], sum);
                acc[rr][m] = sum;
              }
            }
          }
        }
      }
      if (!fast) {
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          float flat[32];
#pragma unroll
          for (int j = 0; j < 32; ++j)
            flat[j] = acc[8 * h + j / kXPre][j % kXPre], acc[8 * h + j / kXPre][j % kXPre] = 0.f;
          const float sum = reduce_scatter32(flat);
#pragma unroll
          for (int bb = 0; bb < kStreamMaxBlock / kXPre; ++bb)
            if (bb == b) out[h][bb] += sum;
        }
      }
    }
    __syncwarp();
    if (lane == 0) bar_arrive(x.empty + s);
  }
  if (fast) {
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      float flat[32];
#pragma unroll
      for (int j = 0; j < 32; ++j) flat[j] = acc[8 * h + j / kXPre][j % kXPre];
      out[h][0] = reduce_scatter32(flat);
    }
  }
  T* t = static_cast<T*>(a.out);
  const int m = lane % kXPre;
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    const int rr = 8 * h + lane / kXPre;
    if (rr < rows) {
#pragma unroll
      for (int b = 0; b < kStreamMaxBlock / kXPre; ++b) {
        const int mm = b * kXPre + m;
        if (b < nb && mm < count)
          t[static_cast<int64_t>(ids[mm]) * a.r_max + r0 + rr] = Cvt<T>::from(out[h][b]);
      }
    }
  }
  __syncwarp();  // ids[] is rewritten by the next task
}

template <Op OP, typename T>
__global__ void __launch_bounds__(stream_threads(OP), 1)
    molora_lora_stream(KernelArgs a, int stages) {
  extern __shared__ __align__(128) uint8_t smem[];
  Ctx x;
  x.a = &a;
  x.smem = smem;
  x.L = stream_layout(OP, stages);
  x.full = reinterpret_cast<uint64_t*>(smem + x.L.full);
  x.empty = reinterpret_cast<uint64_t*>(smem + x.L.empty);
  x.issued = reinterpret_cast<volatile int*>(smem + x.L.issued);
  int* s_rank = reinterpret_cast<int*>(smem + x.L.rank);
  float* s_scale = reinterpret_cast<float*>(smem + x.L.scale);
  x.rank = s_rank;
  x.scale = s_scale;
  x.V = a.S * a.E;
  x.kc =
      OP == Op::kShrink ? static_cast<int>(min(a.dim, static_cast<int64_t>(kStreamShrinkKc))) : 0;
  x.pieces = OP == Op::kShrink ? static_cast<int>((a.dim + x.kc - 1) / x.kc) : 1;
  int64_t used = __ldg(a.rt.num_tokens_post_pad);
  used = max(int64_t{0}, min(used, a.sorted_len));
  const int64_t n_tasks = used / a.block * a.chunks;
  x.my_tasks = n_tasks > blockIdx.x ? (n_tasks - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  if (a.S <= kSlots)
    for (int s = threadIdx.x; s < a.S; s += blockDim.x) {
      s_rank[s] = min(max(__ldg(a.ranks + s), 0), a.r_max);
      s_scale[s] = (OP == Op::kExpand && a.scales != nullptr) ? __ldg(a.scales + s) : 0.f;
    }
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) bar_init(x.full + s, 1), bar_init(x.empty + s, 1);
    *x.issued = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  if (warp == 0) {
    produce<OP, T>(x);
    return;
  }
  const int w = warp - 1;
  int* ids = reinterpret_cast<int*>(smem + x.L.ids) + w * kStreamMaxBlock;
  uint8_t* wbuf = smem + x.L.tbuf + static_cast<size_t>(w) * stream_warp_bytes(OP);
  for_valid_tasks<OP>(x, [&](int vi, int64_t g, int c, int v, int r) {
    if (vi % stream_consumers(OP) != w) return;
    if (OP == Op::kExpand)
      expand_task<T>(x, vi, g, c, v, r, ids, wbuf);
    else
      shrink_task<T>(x, vi, g, c, v, r, ids, wbuf);
  });
}

template <Op OP, typename T>
Status launch_t(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  auto kern = molora_lora_stream<OP, T>;
  const size_t smem = stream_layout(OP, plan.stages).total;
  static std::once_flag once;
  static cudaError_t attr = cudaSuccess;
  std::call_once(once, [&] {
    attr = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(stream_layout(OP, stream_stages(OP)).total));
  });
  MOLORA_CUDA_CHECK(attr);
  KernelArgs k = a;
  static const int probe = static_cast<int>(get_setting_int("MOLORA_LORA_STREAM_PROBE", 0));
  k.dbg = probe;
  kern<<<static_cast<unsigned>(plan.grid), stream_threads(OP), smem, stream>>>(k, plan.stages);
  MOLORA_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace

Status launch_stream(Op op, DType dt, const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  if (plan.stages < 2 || plan.stages > stream_stages(op))
    return Status::InvalidArgument("stream plan with " + std::to_string(plan.stages) + " stages");
  if (dt == DType::kBF16)
    return op == Op::kShrink ? launch_t<Op::kShrink, __nv_bfloat16>(a, plan, stream)
                             : launch_t<Op::kExpand, __nv_bfloat16>(a, plan, stream);
  if (dt == DType::kF16)
    return op == Op::kShrink ? launch_t<Op::kShrink, __half>(a, plan, stream)
                             : launch_t<Op::kExpand, __half>(a, plan, stream);
  return Status::InvalidArgument(std::string("dtype must be bf16 or f16 on the GPU, got ") +
                                 dtype_name(dt));
}

}  // namespace molora::lora::detail
