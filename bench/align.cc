// bench_align: µs per moe_align_block_size call, as CUDA-graph replays on one stream.
//
// Each shape: random top-8 ids (int32), 20 calls captured into one graph, the graph replayed
// 25 times between events; µs/call = elapsed / 500. Launches per call = kernel nodes / 20.
// Bytes = ids read + every output word written (the sentinel fill dominates at large V).
// The torch-only baseline of the same contract is bench/align_torch.py (same device run).
#include "molora/align.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"

namespace {

struct Row {
  int64_t V, T, B;
  double us, bytes;
  int launches;
};

}  // namespace

int main() {
  const double copy_gbs = molora::bench::copy_bandwidth_gbs();
  std::mt19937 g(12345);
  std::vector<Row> rows;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int kCalls = 20, kReps = 25, k = 8;
  for (int64_t V : {256, 1024, 8192, 65536})
    for (int64_t T : {1, 16, 64, 256, 4096})
      for (int64_t B : {16, 64}) {
        molora::AlignSizes sz;
        if (!molora::moe_align_sizes(T, k, V, B, &sz).ok()) return 1;
        std::vector<int32_t> h(T * k);
        for (auto& x : h) x = static_cast<int32_t>(g() % V);
        int32_t *ids, *sorted, *eids, *post, *drop;
        void* ws;
        CK(cudaMalloc(reinterpret_cast<void**>(&ids), h.size() * 4));
        CK(cudaMalloc(reinterpret_cast<void**>(&sorted), sz.sorted_token_ids * 4));
        CK(cudaMalloc(reinterpret_cast<void**>(&eids), sz.expert_ids * 4));
        CK(cudaMalloc(reinterpret_cast<void**>(&post), 4));
        CK(cudaMalloc(reinterpret_cast<void**>(&drop), 8));
        CK(cudaMalloc(&ws, sz.workspace_bytes));
        CK(cudaMemcpy(ids, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        molora::AlignArgs a;
        a.topk_ids = ids, a.num_tokens = T, a.topk = k, a.num_experts = V, a.block_size = B;
        a.sorted_token_ids = sorted, a.sorted_token_ids_len = sz.sorted_token_ids;
        a.expert_ids = eids, a.expert_ids_len = sz.expert_ids;
        a.num_tokens_post_pad = post, a.num_dropped = drop;
        a.workspace = ws, a.workspace_bytes = sz.workspace_bytes;
        molora::Status st = molora::moe_align_block_size(a, s);  // eager: checks pointers
        if (!st.ok()) {
          std::fprintf(stderr, "%s\n", st.to_string().c_str());
          return 1;
        }
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int c = 0; c < kCalls; ++c) st = molora::moe_align_block_size(a, s);
        CK(cudaStreamEndCapture(s, &graph));
        if (!st.ok()) return 1;
        size_t nodes = 0;
        CK(cudaGraphGetNodes(graph, nullptr, &nodes));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(exec, s));
        CK(cudaEventRecord(e0, s));
        for (int r = 0; r < kReps; ++r) CK(cudaGraphLaunch(exec, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        Row row{V,
                T,
                B,
                ms * 1e3 / (kCalls * kReps),
                4.0 * (h.size() + sz.sorted_token_ids + sz.expert_ids + 3),
                static_cast<int>(nodes / kCalls)};
        rows.push_back(row);
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
        for (void* p :
             {static_cast<void*>(ids), static_cast<void*>(sorted), static_cast<void*>(eids),
              static_cast<void*>(post), static_cast<void*>(drop), ws})
          CK(cudaFree(p));
      }
  std::printf(
      "\nbench_align: moe_align_block_size, k=8, int32 ids, CUDA-graph replay "
      "(20 calls/graph); copy bandwidth %.0f GB/s\n",
      copy_gbs);
  std::printf("%7s %6s %4s %10s %9s %11s %8s %7s\n", "V", "T", "B", "us/call", "launches", "bytes",
              "GB/s", "%copy");
  double worst_decode_8192 = 0;
  for (const Row& r : rows) {
    const double gbs = r.bytes / (r.us * 1e-6) / 1e9;
    std::printf("%7lld %6lld %4lld %10.2f %9d %11.0f %8.1f %6.1f%%\n", (long long)r.V,
                (long long)r.T, (long long)r.B, r.us, r.launches, r.bytes, gbs,
                100.0 * gbs / copy_gbs);
    if (r.V == 8192 && r.T <= 256 && r.us > worst_decode_8192) worst_decode_8192 = r.us;
  }
  for (const Row& r : rows)
    if (r.V == 8192 && r.T == 4096)
      std::printf("SUMMARY align prefill T=4096 k=8 V=8192 B=%lld: %.2f us/call (target <= 40)\n",
                  (long long)r.B, r.us);
  std::printf("SUMMARY align decode V=8192 T<=256 k=8: worst %.2f us/call (target <= 10)\n",
              worst_decode_8192);
  std::printf("SUMMARY align launches per call: %d\n", rows.empty() ? 0 : rows[0].launches);
  return 0;
}
