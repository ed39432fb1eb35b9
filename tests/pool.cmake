# pool suites: CPU (reader, loader, policy) and GPU (upload path, events, device slot ids).
molora_add_test(pool_test SOURCES pool_test.cc LIBS molora_pool)
molora_add_test(pool_gpu_test SOURCES pool_gpu_test.cc LIBS molora_pool GPU)
