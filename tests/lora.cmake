# lora suites: CPU (reference, planner, validation) and GPU (kernels vs reference).
molora_add_test(lora_test SOURCES lora_test.cc LIBS molora_lora)
if(MOLORA_HAVE_CUDA)
  molora_add_test(lora_gpu_test SOURCES lora_gpu_test.cc LIBS molora_lora GPU)
endif()
