# pool suites: CPU (reader, conversion, policy; PEFT loading) and GPU (upload, events, slot ids).
molora_add_test(pool_test SOURCES pool_test.cc LIBS molora_pool)
molora_add_test(pool_peft_test SOURCES pool_peft_test.cc LIBS molora_pool)
molora_add_test(pool_gpu_test SOURCES pool_gpu_test.cc LIBS molora_pool GPU)
