# bench_lora: seed shapes x T x no-adapter share x routing, table last, SUMMARY lines.
if(MOLORA_HAVE_CUDA)
  add_executable(bench_lora ${CMAKE_CURRENT_SOURCE_DIR}/lora_bench.cc)
  target_link_libraries(bench_lora PRIVATE molora_lora molora_core)
  target_include_directories(bench_lora PRIVATE ${PROJECT_SOURCE_DIR}/src)
  molora_host_warnings(bench_lora)
endif()
