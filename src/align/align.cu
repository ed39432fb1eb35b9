// moe_align_block_size, CUDA path: one launch (numel <= 4096) or three, no host synchronisation,
// no allocation.
//
// The building block (sort_pairs): one CTA of 512 threads loads up to 4096 pairs, forms the
// virtual id v of each, in index order (blocked arrangement), and sorts the keys
// (v << ibits | local index) with cub::BlockRadixSort over the bucket bits only: the passes are
// stable, so each bucket keeps ascending flat index, the CPU reference's order. Neighbour compares
// then give each sorted pair its bucket's head, its rank inside the bucket and, at a bucket's last
// pair, the bucket's size; one block scan gives the block offset of every bucket.
//
// One launch (molora_align_small), decode sizes: the outputs are cut into G slices of P positions
// (P a multiple of B, so slice c also owns expert_ids blocks [c*P/B, (c+1)*P/B)). Every CTA fills
// its slice with the sentinel / -1. No used position can lie at or past
// X = numel + min(V, numel) * (B - 1), so the CTAs whose slice starts below X (and CTA 0) also sort
// all the pairs themselves and, after a __syncthreads, write the pairs and block experts that fall
// in their own slice. CTAs never exchange data, so one launch suffices. Up to 128 pairs the sort
// is replaced by counting (count_pairs): each pair's rank, bucket size and bucket block offset
// from comparing its bucket with every other pair's in shared memory, the same numbers.
//
// Three launches, prefill sizes: the pairs are cut into C slices of 4096, the experts into R ranges
// of 512.
//   1. molora_align_count: slice CTA c sorts its pairs, writes each pair's packed (v, rank in the
//      slice) into vbuf and the slice's per-expert counts into row c of a [C][V] table; the other
//      CTAs fill sorted_token_ids / expert_ids with the sentinel / -1.
//   2. molora_align_scan: range CTA r turns the column of each of its experts into the exclusive
//      prefix over the slices (in place), pads each expert's total to blocks and scans them inside
//      the range (loc) and writes the range total (part); CTA 0 sums the per-slice drop counts.
//   3. molora_align_scatter: every CTA scans part (R <= 128 words) for the range bases; range CTAs
//      write the expert id of each of their blocks, pair CTAs place each pair at
//      (base + loc[v]) * B + prefix[c][v] + rank.
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "align/align_internal.h"
#include "core/cuda_util.h"
#include "molora/align.h"

namespace molora {
namespace {

constexpr int kThreads = 512;
constexpr int kRange = static_cast<int>(align_detail::kExpertsPerRange);
constexpr int kSliceItems = static_cast<int>(align_detail::kSlicePairs) / kThreads;
constexpr int kSliceBits = 12;  // local index bits of a slice
constexpr int kMaxRanges = static_cast<int>(kAlignMaxExperts / align_detail::kExpertsPerRange);
constexpr int kScatterItems = 4;
constexpr uint32_t kNoKey = 0xffffffffu;
static_assert(kRange == kThreads, "one expert of a range per thread");
static_assert(kThreads * kSliceItems == align_detail::kSlicePairs, "slice = one CTA's items");
static_assert((1 << kSliceBits) == align_detail::kSlicePairs, "slice index bits");
static_assert(align_detail::kSmallPairs <= align_detail::kSlicePairs, "small path fits a CTA");
static_assert(kMaxRanges <= kThreads, "one range per thread in the base scan");

__device__ __forceinline__ int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t imax64(int64_t a, int64_t b) { return a > b ? a : b; }

struct MaxOp {
  __device__ __forceinline__ int operator()(int a, int b) const { return a > b ? a : b; }
};

// Fills p[0, n) with `value`, threads tid of nthreads each taking 16-byte stores.
__device__ void fill_i32(int32_t* p, int64_t n, int32_t value, int64_t tid, int64_t nthreads) {
  if (n <= 0) return;
  int64_t head = ((16 - (reinterpret_cast<uintptr_t>(p) & 15)) & 15) / 4;
  if (head > n) head = n;
  if (tid < head) p[tid] = value;
  const int64_t body = (n - head) / 4;
  int4* q = reinterpret_cast<int4*>(p + head);
  const int4 v4 = make_int4(value, value, value, value);
  for (int64_t j = tid; j < body; j += nthreads) q[j] = v4;
  const int64_t tail0 = head + body * 4;
  if (tid < n - tail0) p[tail0 + tid] = value;
}

// The routing inputs. Exactly one of i32 / i64 is set.
struct Ids {
  const int32_t* i32;
  const int64_t* i64;
  const int32_t* slots;  // may be null
  unsigned topk;
  int64_t E, V;
};

// Virtual id of pair i: >= 0 its bucket, -1 invalid id, -2 slot -1 (no adapter).
__device__ __forceinline__ int vid_of(const Ids& d, int64_t i) {
  int64_t e = d.i64 != nullptr ? d.i64[i] : static_cast<int64_t>(d.i32[i]);
  if (d.slots != nullptr) {
    const int64_t s = d.slots[static_cast<unsigned>(i) / d.topk];
    if (s == -1) return -2;
    if (s < 0 || e < 0 || e >= d.E) return -1;
    e = s * d.E + e;  // s < 2^31, E <= 2^16: no overflow
  }
  return (e >= 0 && e < d.V) ? static_cast<int>(e) : -1;
}

template <int ITEMS>
struct SortStorage {
  union {
    typename cub::BlockRadixSort<uint32_t, kThreads, ITEMS>::TempStorage sort;
    typename cub::BlockScan<int, kThreads>::TempStorage scan;
    typename cub::BlockReduce<int, kThreads>::TempStorage reduce;
  } tmp;
  uint32_t keys[kThreads * ITEMS];
};

// Thread t's ITEMS consecutive sorted pairs (sorted positions q = t*ITEMS + j).
template <int ITEMS>
struct Sorted {
  uint32_t key[ITEMS];  // v << ibits | local index, kNoKey past the valid pairs
  int rank[ITEMS];      // rank of the pair inside its bucket
  int count[ITEMS];     // at a bucket's last pair: the bucket's size; else 0
  int drops;            // this thread's drop counts, packed: invalid | no_adapter << 16
};

// Loads pairs [first, first + n) (n <= kThreads * ITEMS) and sorts them by (bucket, index).
// With vbuf, every pair that goes to no bucket gets vbuf[first + l] = -1.
template <int ITEMS>
__device__ void sort_pairs(const Ids& ids, int64_t first, int n, int ibits, int end_bit,
                           int32_t* vbuf, SortStorage<ITEMS>& sm, Sorted<ITEMS>& out) {
  int invalid = 0, no_adapter = 0;
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {  // blocked: item j of thread t is pair t*ITEMS + j
    const int l = static_cast<int>(threadIdx.x) * ITEMS + j;
    uint32_t key = kNoKey;
    if (l < n) {
      const int v = vid_of(ids, first + l);
      if (v >= 0) {
        key = (static_cast<uint32_t>(v) << ibits) | static_cast<uint32_t>(l);
      } else {
        invalid += v == -1;
        no_adapter += v == -2;
        if (vbuf != nullptr) vbuf[first + l] = -1;
      }
    }
    out.key[j] = key;
  }
  out.drops = invalid | (no_adapter << 16);
  // The keys start in ascending index order (blocked arrangement) and every radix pass is stable,
  // so sorting the bucket bits alone leaves each bucket in ascending index order: the low ibits
  // bits need no passes (T=256 at V=8192: 4 passes of 4 bits instead of 7).
  cub::BlockRadixSort<uint32_t, kThreads, ITEMS>(sm.tmp.sort).Sort(out.key, ibits, end_bit);
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) sm.keys[threadIdx.x * ITEMS + j] = out.key[j];
  __syncthreads();  // keys visible; the sort's storage may be reused

  constexpr int kCap = kThreads * ITEMS;
  int head_at[ITEMS];
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const int q = static_cast<int>(threadIdx.x) * ITEMS + j;
    const uint32_t key = out.key[j];
    const bool valid = key != kNoKey;  // valid keys are < 2^28
    const uint32_t v = key >> ibits;
    const bool head = valid && (q == 0 || (sm.keys[q - 1] >> ibits) != v);
    const uint32_t next = q + 1 < kCap ? sm.keys[q + 1] : kNoKey;
    out.count[j] = (valid && (next == kNoKey || (next >> ibits) != v)) ? 1 : 0;  // tail flag
    head_at[j] = head ? q : 0;
  }
  int head[ITEMS];
  cub::BlockScan<int, kThreads>(sm.tmp.scan).InclusiveScan(head_at, head, MaxOp());
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const int q = static_cast<int>(threadIdx.x) * ITEMS + j;
    out.rank[j] = q - head[j];
    out.count[j] = out.count[j] ? out.rank[j] + 1 : 0;
  }
  __syncthreads();  // the scan's storage may be reused
}

// Sum of every thread's packed drop counts into num_dropped[0..1] (thread 0 writes).
template <int ITEMS>
__device__ void write_drops(int drops, SortStorage<ITEMS>& sm, int32_t* dst) {
  const int sum = cub::BlockReduce<int, kThreads>(sm.tmp.reduce).Sum(drops);
  if (threadIdx.x == 0) {
    dst[0] = sum & 0xffff;
    dst[1] = sum >> 16;
  }
}

// ---------------------------------------------------------------------------------------------
// One launch.

struct SmallParams {
  Ids ids;
  int32_t* sorted_token_ids;
  int64_t sorted_len;
  int32_t* expert_ids;
  int64_t expert_len;
  int32_t* num_tokens_post_pad;
  int32_t* num_dropped;  // may be null
  int64_t slice;         // P: positions per CTA, a multiple of B
  int64_t layout_end;    // X: no used position at or past it
  int numel, block_shift, ibits, end_bit;
  int count_shift;  // counting path: log2 of the threads per pair (count_pairs)
};

// Up to kCountPairs pairs the one-launch kernel finds each pair's place by counting instead of
// sorting: every pair compares its bucket with every other pair's in shared memory. For up to a
// hundred pairs that is a short loop, where the radix sort's passes and the two block scans are
// each a chain of barriers across 512 threads. Measured (H100, bench_align, k=8, µs per call;
// bench/NOTES.md "align v0.4"): sorting -> counting with one thread per pair -> counting with
// 512 / numel threads per pair (this code): 8 pairs 4.8-6.5 -> 2.6-3.0 -> 2.8-3.6; 128 pairs
// 4.8-6.6 -> 4.8-5.3 -> 4.0-4.8.
constexpr int kCountPairs = 128;

// Pairs [0, numel) (numel <= kCountPairs): pair i's key (v << ibits | i, or kNoKey when it goes to
// no bucket), its rank in its bucket, at its bucket's last pair the bucket's blocks (else 0), its
// bucket's block offset (the blocks of every bucket below it), the total blocks, and the drop
// counts (invalid | no_adapter << 16): exactly what the sorting path gives each sorted pair, so
// the stores after it are the same. Pair i is counted by the G = 2^count_shift threads
// [i*G, (i+1)*G) of one warp (G = 512 / numel rounded up to a power of two, at most 32 and
// at most numel / 8: moe_align_block_size sets count_shift), each taking
// every G-th other pair, their sums added with shuffles; the group's first thread returns the
// pair (the others return kNoKey), thread 0 the total and the drops.
struct Counted {
  uint32_t key;
  int rank, blocks, offset, total, drops;
};
__device__ Counted count_pairs(const SmallParams& p) {
  __shared__ int s_v[kCountPairs];   // each pair's bucket (< 0: none)
  __shared__ int s_hb[kCountPairs];  // at a bucket's first pair: its blocks, else 0
  __shared__ int s_drops;
  const int t = static_cast<int>(threadIdx.x), n = p.numel;
  const int G = 1 << p.count_shift, i = t >> p.count_shift, sub = t & (G - 1);
  if (t == 0) s_drops = 0;
  int vt = -3;  // pair t's bucket (-3: no pair t)
  if (t < n) vt = vid_of(p.ids, t), s_v[t] = vt;
  __syncthreads();
  if (vt == -1 || vt == -2) atomicAdd(&s_drops, vt == -1 ? 1 : 1 << 16);
  const int v = i < n ? s_v[i] : -3;
  int cnt = 0, rank = 0;
  if (v >= 0) {
#pragma unroll 4
    for (int j = sub; j < n; j += G) {
      const bool same = s_v[j] == v;
      cnt += same;
      rank += same && j < i;
    }
  }
  for (int o = G >> 1; o > 0; o >>= 1) {  // (every lane: G divides 32, the groups are warp-aligned)
    cnt += __shfl_xor_sync(~0u, cnt, o);
    rank += __shfl_xor_sync(~0u, rank, o);
  }
  const int blocks = v >= 0 ? (cnt + (1 << p.block_shift) - 1) >> p.block_shift : 0;
  if (sub == 0 && i < n) s_hb[i] = rank == 0 ? blocks : 0;
  __syncthreads();
  int offset = 0, total = 0;
  if (i < n) {
#pragma unroll 4
    for (int j = sub; j < n; j += G) {
      const int b = s_hb[j];
      total += b;
      offset += s_v[j] < v ? b : 0;  // (pairs without a bucket hold b = 0)
    }
  }
  for (int o = G >> 1; o > 0; o >>= 1) {
    offset += __shfl_xor_sync(~0u, offset, o);
    total += __shfl_xor_sync(~0u, total, o);
  }
  Counted c;
  const bool mine = sub == 0 && v >= 0;
  c.key = mine ? (static_cast<uint32_t>(v) << p.ibits) | static_cast<uint32_t>(i) : kNoKey;
  c.rank = rank;
  c.blocks = mine && rank == cnt - 1 ? blocks : 0;
  c.offset = offset;
  c.total = total;    // (thread 0: group 0 summed every pair's)
  c.drops = s_drops;  // (every atomicAdd came before the barrier above)
  return c;
}

template <int ITEMS, bool COUNT>
__global__ void __launch_bounds__(kThreads) molora_align_small(SmallParams p) {
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * p.slice;
  const int64_t p1 = imin64(p0 + p.slice, p.sorted_len);
  const int64_t b0 = p0 >> p.block_shift;
  const int64_t b1 = imin64(b0 + (p.slice >> p.block_shift), p.expert_len);
  fill_i32(p.sorted_token_ids + p0, p1 - p0, p.numel, threadIdx.x, kThreads);
  fill_i32(p.expert_ids + b0, b1 - b0, -1, threadIdx.x, kThreads);
  if (blockIdx.x != 0 && p0 >= p.layout_end) return;

  uint32_t key[ITEMS];
  int rank[ITEMS], blocks[ITEMS], offset[ITEMS], total = 0;
  if constexpr (COUNT) {
    static_assert(ITEMS == 1 && kCountPairs <= kThreads, "one pair per thread");
    // (Its barriers order this CTA's sentinel stores above before its pairs.)
    const Counted c = count_pairs(p);
    key[0] = c.key, rank[0] = c.rank, blocks[0] = c.blocks, offset[0] = c.offset;
    total = c.total;
    if (blockIdx.x == 0 && threadIdx.x == 0 && p.num_dropped != nullptr) {
      p.num_dropped[0] = c.drops & 0xffff;
      p.num_dropped[1] = c.drops >> 16;
    }
  } else {
    __shared__ SortStorage<ITEMS> sm;
    Sorted<ITEMS> s;
    sort_pairs<ITEMS>(p.ids, 0, p.numel, p.ibits, p.end_bit, nullptr, sm, s);
    // Block offset of each pair's bucket: exclusive sum of the bucket block counts at their
    // tails.
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      key[j] = s.key[j], rank[j] = s.rank[j];
      blocks[j] = (s.count[j] + (1 << p.block_shift) - 1) >> p.block_shift;
    }
    cub::BlockScan<int, kThreads>(sm.tmp.scan).ExclusiveSum(blocks, offset, total);
    // The fill above and the scan's barriers order this CTA's sentinel stores before its pairs.
    __syncthreads();
    if (blockIdx.x == 0 && p.num_dropped != nullptr) write_drops<ITEMS>(s.drops, sm, p.num_dropped);
  }
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    if (key[j] == kNoKey) continue;
    const int64_t pos = (static_cast<int64_t>(offset[j]) << p.block_shift) + rank[j];
    if (pos >= p0 && pos < p1)
      p.sorted_token_ids[pos] = static_cast<int32_t>(key[j] & ((1u << p.ibits) - 1u));
    if (blocks[j] > 0) {  // last pair of its bucket: the bucket's blocks in this slice
      const int v = static_cast<int>(key[j] >> p.ibits);
      const int64_t lo = imax64(offset[j], b0), hi = imin64(offset[j] + blocks[j], b1);
      for (int64_t b = lo; b < hi; ++b) p.expert_ids[b] = v;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) p.num_tokens_post_pad[0] = total << p.block_shift;
}

// ---------------------------------------------------------------------------------------------
// Three launches.

struct CountParams {
  Ids ids;
  int32_t* sorted_token_ids;
  int64_t sorted_len;
  int32_t* expert_ids;
  int64_t expert_len;
  int32_t* vbuf;
  int32_t* counts;  // [C][V]
  int32_t* drops;   // [C][2]
  int numel, V, end_bit, slices, fill_ctas;
};

__global__ void __launch_bounds__(kThreads) molora_align_count(CountParams p) {
  if (static_cast<int>(blockIdx.x) >= p.slices) {
    const int64_t tid = static_cast<int64_t>(blockIdx.x - p.slices) * kThreads + threadIdx.x;
    const int64_t nthreads = static_cast<int64_t>(p.fill_ctas) * kThreads;
    fill_i32(p.sorted_token_ids, p.sorted_len, p.numel, tid, nthreads);
    fill_i32(p.expert_ids, p.expert_len, -1, tid, nthreads);
    return;
  }
  const int c = blockIdx.x;
  const int64_t first = static_cast<int64_t>(c) * align_detail::kSlicePairs;
  const int n = static_cast<int>(imin64(p.numel - first, align_detail::kSlicePairs));
  int32_t* row = p.counts + static_cast<int64_t>(c) * p.V;
  fill_i32(row, p.V, 0, threadIdx.x, kThreads);

  __shared__ SortStorage<kSliceItems> sm;
  Sorted<kSliceItems> s;
  sort_pairs<kSliceItems>(p.ids, first, n, kSliceBits, p.end_bit, p.vbuf, sm, s);
  // sort_pairs ends with a barrier: the row is zero before the counts land.
#pragma unroll
  for (int j = 0; j < kSliceItems; ++j) {
    const uint32_t key = s.key[j];
    if (key == kNoKey) continue;
    const int v = static_cast<int>(key >> kSliceBits);
    const int l = static_cast<int>(key & ((1u << kSliceBits) - 1u));
    p.vbuf[first + l] = (v << kSliceBits) | s.rank[j];
    if (s.count[j] > 0) row[v] = s.count[j];
  }
  write_drops<kSliceItems>(s.drops, sm, p.drops + 2 * c);
}

struct ScanParams {
  int32_t* counts;  // [C][V]: counts in, exclusive prefix over the slices out
  int32_t* loc;
  int32_t* part;
  const int32_t* drops;  // [C][2]
  int32_t* num_dropped;  // may be null
  int V, slices, block_shift;
};

__global__ void __launch_bounds__(kThreads) molora_align_scan(ScanParams p) {
  const int r = blockIdx.x;
  const int v = r * kRange + static_cast<int>(threadIdx.x);
  int total = 0;
  if (v < p.V) {
    int32_t* col = p.counts + v;
    constexpr int kU = 8;  // loads in flight per thread
    for (int c0 = 0; c0 < p.slices; c0 += kU) {
      int x[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u)
        x[u] = c0 + u < p.slices ? col[static_cast<int64_t>(c0 + u) * p.V] : 0;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (c0 + u < p.slices) col[static_cast<int64_t>(c0 + u) * p.V] = total;
        total += x[u];
      }
    }
  }
  const int blocks = (total + (1 << p.block_shift) - 1) >> p.block_shift;
  using Scan = cub::BlockScan<int, kThreads>;
  using Reduce = cub::BlockReduce<int, kThreads>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } tmp;
  int offset = 0, range_total = 0;
  Scan(tmp.scan).ExclusiveSum(blocks, offset, range_total);
  if (v < p.V) p.loc[v] = offset;
  if (threadIdx.x == 0) p.part[r] = range_total;
  if (r == 0 && p.num_dropped != nullptr) {
    int d = 0, na = 0;
    for (int c = threadIdx.x; c < p.slices; c += kThreads) {
      d += p.drops[2 * c];
      na += p.drops[2 * c + 1];
    }
    __syncthreads();
    const int ds = Reduce(tmp.reduce).Sum(d);
    __syncthreads();
    const int ns = Reduce(tmp.reduce).Sum(na);
    if (threadIdx.x == 0) {
      p.num_dropped[0] = ds;
      p.num_dropped[1] = ns;
    }
  }
}

struct ScatterParams {
  int32_t* sorted_token_ids;
  int32_t* expert_ids;
  int32_t* num_tokens_post_pad;
  const int32_t* vbuf;
  const int32_t* prefix;  // [C][V]
  const int32_t* loc;
  const int32_t* part;
  int numel, V, block_shift, ranges;
};

__global__ void __launch_bounds__(kThreads) molora_align_scatter(ScatterParams p) {
  __shared__ int sbase[kMaxRanges];
  __shared__ int sloc[kRange + 1];
  __shared__ typename cub::BlockScan<int, kThreads>::TempStorage scan;
  const int tid = threadIdx.x;
  const int pb = tid < p.ranges ? p.part[tid] : 0;
  int base = 0, total = 0;
  cub::BlockScan<int, kThreads>(scan).ExclusiveSum(pb, base, total);
  if (tid < p.ranges) sbase[tid] = base;

  if (static_cast<int>(blockIdx.x) < p.ranges) {
    // Expert id of each block of range r: the last expert whose offset is <= the block.
    const int r = blockIdx.x;
    const int lo = r * kRange;
    const int n_r = static_cast<int>(imin64(p.V - lo, kRange));
    if (tid < n_r) sloc[tid] = p.loc[lo + tid];
    if (tid == 0) sloc[n_r] = p.part[r];
    __syncthreads();
    const int base_r = sbase[r];
    const int range_blocks = sloc[n_r];
    if (r == 0 && tid == 0) p.num_tokens_post_pad[0] = total << p.block_shift;
    for (int j = tid; j < range_blocks; j += kThreads) {
      int a = 0, b = n_r;  // invariant: sloc[a] <= j < sloc[b]
      while (b - a > 1) {
        const int m = (a + b) >> 1;
        if (sloc[m] <= j)
          a = m;
        else
          b = m;
      }
      p.expert_ids[base_r + j] = lo + a;
    }
    return;
  }
  __syncthreads();
  const int64_t i0 = static_cast<int64_t>(blockIdx.x - p.ranges) * kThreads * kScatterItems;
  int w[kScatterItems];
#pragma unroll
  for (int u = 0; u < kScatterItems; ++u) {
    const int64_t i = i0 + u * kThreads + tid;
    w[u] = i < p.numel ? p.vbuf[i] : -1;
  }
#pragma unroll
  for (int u = 0; u < kScatterItems; ++u) {
    if (w[u] < 0) continue;
    const int64_t i = i0 + u * kThreads + tid;
    const int v = w[u] >> kSliceBits;
    const int rank = w[u] & ((1 << kSliceBits) - 1);
    const int64_t c = i >> kSliceBits;
    const int64_t block = sbase[v / kRange] + p.loc[v];
    const int64_t pos = (block << p.block_shift) + p.prefix[c * p.V + v] + rank;
    p.sorted_token_ids[pos] = static_cast<int32_t>(i);
  }
}

int bit_length(int64_t x) {
  int b = 0;
  while (x > 0) ++b, x >>= 1;
  return b;
}

}  // namespace

Status moe_align_block_size(const AlignArgs& a, cudaStream_t stream) {
  MOLORA_RETURN_IF_ERROR(align_detail::check_values(a, true));
  // Under stream capture the pointer attribute query is skipped (it is not a stream operation
  // and some capture modes forbid it); an eager call checks every pointer.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MOLORA_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusNone)
    MOLORA_RETURN_IF_ERROR(align_detail::check_pointers(a));
  AlignSizes sz;
  MOLORA_RETURN_IF_ERROR(moe_align_sizes(a.num_tokens, a.topk, a.num_experts, a.block_size, &sz));
  const int64_t numel = a.num_tokens * a.topk, V = a.num_experts, B = a.block_size;
  const int shift = bit_length(B) - 1;

  Ids ids{};
  if (a.topk_dtype == DType::kI64)
    ids.i64 = static_cast<const int64_t*>(a.topk_ids);
  else
    ids.i32 = static_cast<const int32_t*>(a.topk_ids);
  ids.slots = a.slot_ids;
  ids.topk = static_cast<unsigned>(a.topk);
  ids.E = a.slot_ids != nullptr ? a.num_base_experts : V;
  ids.V = V;

  int device = 0, sms = 0;
  MOLORA_CUDA_CHECK(cudaGetDevice(&device));
  MOLORA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));

  if (numel <= align_detail::kSmallPairs) {
    SmallParams sp{};
    sp.ids = ids;
    sp.sorted_token_ids = a.sorted_token_ids;
    sp.sorted_len = sz.sorted_token_ids;
    sp.expert_ids = a.expert_ids;
    sp.expert_len = sz.expert_ids;
    sp.num_tokens_post_pad = a.num_tokens_post_pad;
    sp.num_dropped = a.num_dropped;
    // Slices of >= 4096 positions, about two per SM at most (the fill dominates at large V).
    const int64_t quantum = 4096;  // a multiple of every B
    sp.slice =
        std::max<int64_t>(quantum, cdiv(cdiv(sz.sorted_token_ids, 2 * sms), quantum) * quantum);
    sp.layout_end = std::min<int64_t>(sz.sorted_token_ids, numel + std::min(V, numel) * (B - 1));
    sp.numel = static_cast<int>(numel);
    sp.block_shift = shift;
    sp.ibits = std::max(1, bit_length(numel - 1));
    sp.end_bit = sp.ibits + bit_length(V);
    const int grid = static_cast<int>(cdiv(sz.sorted_token_ids, sp.slice));
    // Threads per pair of the counting path: 512 / numel rounded up to a power of two, 1 to 32
    // (numel rounds up to 2^bit_length(numel - 1)), and at most numel / 8, so that each thread
    // compares ~8 pairs or more: at 8 pairs one thread per pair is 6% faster than 32 (their
    // shuffle rounds cost more than the 8 compares; H100, bench_align, bench/NOTES.md "align
    // v0.5"). Counting threads: 1 per pair to 8 pairs, 2 to 16, 4 to 32, then 512 / numel.
    sp.count_shift = std::min(std::clamp(bit_length(kThreads) - 1 - bit_length(numel - 1), 0, 5),
                              std::max(0, bit_length(numel - 1) - 3));
    if (numel <= kCountPairs)
      molora_align_small<1, true><<<grid, kThreads, 0, stream>>>(sp);
    else if (numel <= kThreads)
      molora_align_small<1, false><<<grid, kThreads, 0, stream>>>(sp);
    else if (numel <= 4 * kThreads)
      molora_align_small<4, false><<<grid, kThreads, 0, stream>>>(sp);
    else
      molora_align_small<8, false><<<grid, kThreads, 0, stream>>>(sp);
    MOLORA_CUDA_CHECK(cudaGetLastError());
    return Status::Ok();
  }

  const int slices = static_cast<int>(align_detail::num_slices(numel));
  const int ranges = static_cast<int>(align_detail::num_ranges(V));
  int32_t* ws = static_cast<int32_t*>(a.workspace);
  int32_t* vbuf = ws;
  int32_t* counts = vbuf + numel;
  int32_t* loc = counts + static_cast<int64_t>(slices) * V;
  int32_t* part = loc + V;
  int32_t* drops = part + ranges;

  CountParams cp{};
  cp.ids = ids;
  cp.sorted_token_ids = a.sorted_token_ids;
  cp.sorted_len = sz.sorted_token_ids;
  cp.expert_ids = a.expert_ids;
  cp.expert_len = sz.expert_ids;
  cp.vbuf = vbuf;
  cp.counts = counts;
  cp.drops = drops;
  cp.numel = static_cast<int>(numel);
  cp.V = static_cast<int>(V);
  cp.end_bit = kSliceBits + bit_length(V);
  cp.slices = slices;
  // Fill: about 32 KB per CTA, at most two CTAs per SM.
  cp.fill_ctas = static_cast<int>(std::min<int64_t>(
      cdiv((sz.sorted_token_ids + sz.expert_ids) * 4, 32768), 2 * static_cast<int64_t>(sms)));
  molora_align_count<<<slices + cp.fill_ctas, kThreads, 0, stream>>>(cp);
  MOLORA_CUDA_CHECK(cudaGetLastError());

  ScanParams sc{};
  sc.counts = counts;
  sc.loc = loc;
  sc.part = part;
  sc.drops = drops;
  sc.num_dropped = a.num_dropped;
  sc.V = static_cast<int>(V);
  sc.slices = slices;
  sc.block_shift = shift;
  molora_align_scan<<<ranges, kThreads, 0, stream>>>(sc);
  MOLORA_CUDA_CHECK(cudaGetLastError());

  ScatterParams st{};
  st.sorted_token_ids = a.sorted_token_ids;
  st.expert_ids = a.expert_ids;
  st.num_tokens_post_pad = a.num_tokens_post_pad;
  st.vbuf = vbuf;
  st.prefix = counts;
  st.loc = loc;
  st.part = part;
  st.numel = static_cast<int>(numel);
  st.V = static_cast<int>(V);
  st.block_shift = shift;
  st.ranges = ranges;
  const int pair_ctas = static_cast<int>(cdiv(numel, kThreads * kScatterItems));
  molora_align_scatter<<<ranges + pair_ctas, kThreads, 0, stream>>>(st);
  MOLORA_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace molora
