# align: the contract suite (tests/align_contract.h) against the CPU reference and the CUDA path.
molora_add_test(align_test SOURCES align_test.cc LIBS molora_align)
if(MOLORA_HAVE_CUDA)
  molora_add_test(align_gpu_test SOURCES align_gpu_test.cc LIBS molora_align GPU)
endif()
