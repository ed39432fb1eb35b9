# bench_pool: load + convert + upload of an adapter set >= 1 GB (files written to /tmp at run time).
add_executable(bench_pool pool_bench.cc)
target_link_libraries(bench_pool PRIVATE molora_pool)
target_include_directories(bench_pool PRIVATE ${PROJECT_SOURCE_DIR}/src)
molora_host_warnings(bench_pool)
