# bench_comm: P2P all-reduce, ranks as streams of one process on one GPU (protocol overhead; the
# NVLink comparison against NCCL needs several GPUs: issue 7).
if(MOLORA_HAVE_CUDA)
  add_executable(bench_comm ${CMAKE_CURRENT_SOURCE_DIR}/comm_bench.cc)
  target_link_libraries(bench_comm PRIVATE molora_comm molora_core)
  target_include_directories(bench_comm PRIVATE ${PROJECT_SOURCE_DIR}/src)
  molora_host_warnings(bench_comm)
endif()
