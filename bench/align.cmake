# bench_align: moe_align_block_size as CUDA-graph replays (the torch baseline is bench/align_torch.py).
if(MOLORA_HAVE_CUDA)
  add_executable(bench_align ${CMAKE_CURRENT_SOURCE_DIR}/align.cc)
  target_link_libraries(bench_align PRIVATE molora_align molora_core)
  target_include_directories(bench_align PRIVATE ${PROJECT_SOURCE_DIR}/src)
  molora_host_warnings(bench_align)
endif()
