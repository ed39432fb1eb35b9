# lora suites: CPU (reference, planner, validation) and GPU (kernels vs reference).
molora_add_test(lora_test SOURCES lora_test.cc LIBS molora_lora)
# The host helpers: bench shape names and timeline summary, tensor-map memo, fastdiv.
molora_add_test(lora_support_test SOURCES lora_support_test.cc LIBS molora_lora)
if(MOLORA_HAVE_CUDA)
  molora_add_test(lora_gpu_test SOURCES lora_gpu_test.cc lora_gpu_writer.cu LIBS molora_lora GPU)
  # The stream shrink with MOLORA_LORA_STREAM_PROBE=16: every piece copied without a tensor map,
  # by 16-byte copies to the swizzled stages' places (the path of ranks short of 8 rows) or by
  # row copies to the unswizzled ones (the path where no map can be made). The setting is read
  # once per process.
  add_test(NAME lora_gpu_shrink_row_copies
    COMMAND lora_gpu_test
            --gtest_filter=LoraGpu.StreamKernelEdges:LoraGpu.MatchesReferenceAcrossShapes)
  set_tests_properties(lora_gpu_shrink_row_copies PROPERTIES
    ENVIRONMENT MOLORA_LORA_STREAM_PROBE=16 LABELS gpu SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
endif()
# `molora bench lora` one-shape mode: an unknown seed shape or a bad option is a usage error (2),
# checked before any GPU work.
if(MOLORA_BUILD_CLI)
  molora_add_exit_test(lora_cli_bench_unknown_shape_exits_2 2 bench lora --shape N1_r1)
  # A custom shape with fewer experts than the benchmark's top-8 (its routing draws 8 distinct).
  molora_add_exit_test(lora_cli_bench_fewer_experts_than_top_k_exits_2 2
    bench lora --shape N64_r8_V4x2)
  molora_add_exit_test(lora_cli_bench_zero_tokens_exits_2 2
    bench lora --shape N6144_r32_V160x8 --T 1,0)
  molora_add_exit_test(lora_cli_bench_bad_kernel_exits_2 2
    bench lora --shape N6144_r32_V160x8 --kernel fast)
  # The mixed-rank option is offered (every second slot at r_max / 2: the stream expand's
  # per-lane copy path) and takes no value.
  molora_add_output_test(lora_cli_bench_help_lists_mixed_ranks
    "--mixed-ranks +Every second slot at rank r_max / 2" bench lora --help)
  molora_add_exit_test(lora_cli_bench_mixed_ranks_value_exits_2 2
    bench lora --shape N6144_r32_V160x8 --mixed-ranks=maybe)
  # --layers takes 1..4096 weight pointers; --op takes expand, shrink, chain or delta (the two
  # pair forms time two ops, so neither takes --layers).
  molora_add_exit_test(lora_cli_bench_layers_zero_exits_2 2
    bench lora --shape N6144_r32_V160x8 --layers 0)
  molora_add_exit_test(lora_cli_bench_chain_with_layers_exits_2 2
    bench lora --shape N6144_r32_V160x8 --op chain --layers 4)
  molora_add_exit_test(lora_cli_bench_delta_with_timeline_exits_2 2
    bench lora --shape N6144_r32_V160x8 --op delta --timeline)
  molora_add_exit_test(lora_cli_bench_delta_after_with_layers_exits_2 2
    bench lora --shape N6144_r32_V160x8 --op delta-after --layers 2)
  molora_add_exit_test(lora_cli_bench_bad_op_exits_2 2
    bench lora --shape N6144_r32_V160x8 --op fused)
  # --tile takes 0 (the planner's) or a tile to force, never a negative one.
  molora_add_exit_test(lora_cli_bench_tile_negative_exits_2 2
    bench lora --shape N6144_r32_V160x8 --tile -4)
  molora_add_output_test(lora_cli_bench_help_lists_tile
    "--tile INT.*Force the plan's tile" bench lora --help)
  # --weight-copies takes 0 (automatic: one copy per rotating routing) to 256.
  molora_add_exit_test(lora_cli_bench_weight_copies_negative_exits_2 2
    bench lora --shape N6144_r32_V160x8 --weight-copies -1)
  molora_add_exit_test(lora_cli_bench_weight_copies_257_exits_2 2
    bench lora --shape N6144_r32_V160x8 --weight-copies 257)
  molora_add_output_test(lora_cli_bench_help_weight_copies_default_auto
    "--weight-copies INT.*default 0: one per rotating routing" bench lora --help)
  # --routing align: the align kernel, then the aligned call; not with --layers / --timeline.
  molora_add_output_test(lora_cli_bench_help_lists_routing_align
    "--routing TEXT.*align: the align kernel" bench lora --help)
  molora_add_exit_test(lora_cli_bench_bad_routing_exits_2 2
    bench lora --shape N6144_r32_V160x8 --routing sorted)
  molora_add_exit_test(lora_cli_bench_align_with_layers_exits_2 2
    bench lora --shape N6144_r32_V160x8 --routing align --layers 4)
  molora_add_exit_test(lora_cli_bench_align_with_timeline_exits_2 2
    bench lora --shape N6144_r32_V160x8 --routing align --timeline)
  molora_add_output_test(lora_cli_bench_help_lists_chain_and_layers
    "chain: shrink -> expand pairs.*delta: the same pairs as one moe_delta call.*--layers INT"
    bench lora --help)
endif()
