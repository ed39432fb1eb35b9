# comm: CPU suite (reference, path choice, CPU protocol model stress) and GPU suite.
molora_add_test(comm_test SOURCES comm_test.cc LIBS molora_comm)
if(MOLORA_HAVE_CUDA)
  molora_add_test(comm_gpu_test SOURCES comm_gpu_test.cu LIBS molora_comm GPU)
endif()
