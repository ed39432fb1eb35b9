# bench_prof: generates 80 MB and 1 GB traces in /tmp and times `molora prof summary` against a
# Python baseline (bench/prof_baseline.py) on the same files in the same run.
find_package(ZLIB REQUIRED)
add_executable(bench_prof ${CMAKE_CURRENT_SOURCE_DIR}/prof_bench.cc)
target_include_directories(bench_prof PRIVATE ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(bench_prof PRIVATE ZLIB::ZLIB)
target_compile_definitions(bench_prof PRIVATE
  MOLORA_BENCH_BASELINE="${CMAKE_CURRENT_SOURCE_DIR}/prof_baseline.py")
molora_host_warnings(bench_prof)
if(MOLORA_BUILD_CLI)
  add_dependencies(bench_prof molora_cli)
  target_compile_definitions(bench_prof PRIVATE MOLORA_BENCH_CLI="$<TARGET_FILE:molora_cli>")
endif()

# bench_prof_stages: per-stage timing (inflate alone, parser alone, reader, summarize) in memory.
find_library(MOLORA_LIBDEFLATE deflate)
if(MOLORA_LIBDEFLATE)
  add_executable(bench_prof_stages ${CMAKE_CURRENT_SOURCE_DIR}/prof_stages.cc)
  target_include_directories(bench_prof_stages PRIVATE ${PROJECT_SOURCE_DIR}/tests
                             ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(bench_prof_stages PRIVATE molora_prof molora_core ${MOLORA_LIBDEFLATE}
                        ZLIB::ZLIB)
  molora_host_warnings(bench_prof_stages)
endif()
