#!/usr/bin/env python3
"""Python baseline for bench_prof: json.load (gzip when .gz) + the same classification loop as
`molora prof summary` (kernel time per category, first-match regex rules, per-name totals)."""
import gzip
import json
import re
import sys

RULES = [  # the built-in rules of src/prof/rules.cc, same order
    ("moe-lora", r"\bmolora_\w*(lora|shrink|expand)"), ("routing", r"\bmolora_\w*align"),
    ("allreduce", r"\bmolora_\w*(all_?reduce|one_?shot|two_?shot)"),
    ("moe-lora", r"(moe|expert).*lora|lora.*(moe|expert)|sgmv|bgmv|punica|lora_(shrink|expand|a|b)\b|_lora_"),
    ("allreduce", r"^nccl\w*AllReduce"), ("allgather", r"^nccl\w*AllGather"),
    ("reducescatter", r"^nccl\w*ReduceScatter"), ("alltoall", r"^nccl\w*(AllToAll|Alltoall)"),
    ("p2p", r"^nccl\w*(SendRecv|Send|Recv)"), ("other-comm", r"^nccl"),
    ("allreduce", r"cross_device_reduce_|custom_?all_?reduce|allreduce_fusion|oneShotAllReduce|twoShotAllReduce|oneshot_all_?reduce|twoshot_all_?reduce|lamport|all_?reduce"),
    ("allgather", r"all_?gather"), ("reducescatter", r"reduce_?scatter"),
    ("alltoall", r"all_?to_?all|deep_?ep|intranode::(dispatch|combine)|internode::(dispatch|combine)"),
    ("speculative", r"eagle|draft|speculative|spec_decode|verify_tree|build_tree|tree_speculative"),
    ("sampling", r"sampling|sampler|multinomial|ArgMax|argmax|gumbel|top_?p_|min_p"),
    ("attention", r"flash|fmha|BatchDecode|BatchPrefill|attention|attn|\bmla|_mla|paged|sdpa|xqa|cudnn.*mha|merge_state|reshape_and_cache|rotary|rope_|_rope"),
    ("routing", r"moe_align|align_block_size|topk|TopK|top_k|gating|router|count_and_sort|[Ss]ort|SoftMax|softmax"),
    ("moe", r"fused_moe|moe|MoE|Moe|expert|grouped_gemm|m_grouped"),
    ("gemm", r"gemm|Gemm|GEMM|gemv|nvjet|cutlass|xmma|cublas|splitKreduce|matmul|wgmma|s\d+gemm"),
    ("norm", r"[Nn]orm|rms"),
    ("elementwise", r"elementwise|silu|gelu|act_and_mul|swiglu|relu|sigmoid|tanh|CatArrayBatchedCopy|index|gather|scatter|reduce_kernel|triton_(poi|red|per)|copy|fill|cast|where|add|mul"),
]
COMPILED = [(c, re.compile(p)) for c, p in RULES]


def classify(name, cache):
    c = cache.get(name)
    if c is None:
        c = next((cat for cat, r in COMPILED if r.search(name)), "other")
        cache[name] = c
    return c


def main(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rb") as f:
        ev = json.load(f)["traceEvents"]
    cache, cats, names = {}, {}, {}
    kernel = memcpy = memset = 0.0
    for e in ev:
        c = e.get("cat")
        if c == "kernel":
            d = e.get("dur", 0)
            kernel += d
            n = e.get("name", "")
            k = classify(n, cache)
            cats[k] = cats.get(k, 0.0) + d
            names[n] = names.get(n, 0.0) + d
        elif c == "gpu_memcpy":
            memcpy += e.get("dur", 0)
        elif c == "gpu_memset":
            memset += e.get("dur", 0)
    print(json.dumps({"kernel_us": kernel, "memcpy_us": memcpy, "memset_us": memset,
                      "categories": cats, "kernels": len(names)}))


if __name__ == "__main__":
    main(sys.argv[1])
