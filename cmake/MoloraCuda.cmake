# Finds nvcc, decides the architecture list and fails loudly when a requested one is unknown.
#
# Never drops an architecture silently: each requested architecture is probed by compiling a tiny
# kernel for it (no `nvcc --help | grep` pipeline that can die of SIGPIPE); a requested one that
# fails stops the configure. 'auto' asks for every one of 90a;100a;103a the compiler knows and
# prints which.
set(MOLORA_HAVE_CUDA OFF)
set(MOLORA_HAVE_NCCL OFF)
set(MOLORA_CUDA_ARCH_LIST "")

string(TOUPPER "${MOLORA_CUDA}" _molora_cuda_mode)
if(NOT _molora_cuda_mode STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES OFF)  # we pass -gencode ourselves
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(MOLORA_HAVE_CUDA ON)
  elseif(_molora_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "MOLORA_CUDA=ON but no CUDA compiler (nvcc) was found")
  else()
    message(STATUS "molora: no nvcc found; building host code only (MOLORA_CUDA=AUTO)")
  endif()
endif()

if(MOLORA_HAVE_CUDA)
  set(_probe_dir ${CMAKE_BINARY_DIR}/arch-probe)
  file(MAKE_DIRECTORY ${_probe_dir})
  file(WRITE ${_probe_dir}/probe.cu "__global__ void molora_probe(int* p) { *p = 1; }\n")
  function(_molora_probe_arch arch out)
    execute_process(
      COMMAND ${CMAKE_CUDA_COMPILER} -gencode arch=compute_${arch},code=sm_${arch}
              -c ${_probe_dir}/probe.cu -o ${_probe_dir}/probe_${arch}.o
      RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
    if(rc EQUAL 0)
      set(${out} ON PARENT_SCOPE)
    else()
      set(${out} OFF PARENT_SCOPE)
      set(_molora_probe_err "${e}" PARENT_SCOPE)
    endif()
  endfunction()

  if(MOLORA_CUDA_ARCHS STREQUAL "auto")
    foreach(a 90a 100a 103a)
      _molora_probe_arch(${a} ok)
      if(ok)
        list(APPEND MOLORA_CUDA_ARCH_LIST ${a})
      else()
        message(STATUS "molora: nvcc ${CMAKE_CUDA_COMPILER_VERSION} does not know sm_${a}; 'auto' leaves it out")
      endif()
    endforeach()
    if(NOT MOLORA_CUDA_ARCH_LIST)
      message(FATAL_ERROR "molora: nvcc knows none of sm_90a, sm_100a, sm_103a")
    endif()
  else()
    foreach(a ${MOLORA_CUDA_ARCHS})
      _molora_probe_arch(${a} ok)
      if(NOT ok)
        message(FATAL_ERROR "molora: requested CUDA architecture sm_${a} is not supported by "
                            "${CMAKE_CUDA_COMPILER} (${CMAKE_CUDA_COMPILER_VERSION}):\n${_molora_probe_err}")
      endif()
      list(APPEND MOLORA_CUDA_ARCH_LIST ${a})
    endforeach()
  endif()
  string(REPLACE ";" ", sm_" _shown "${MOLORA_CUDA_ARCH_LIST}")
  message(STATUS "molora: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, building device code for sm_${_shown}")

  set(MOLORA_CUDA_GENCODE "")
  foreach(a ${MOLORA_CUDA_ARCH_LIST})
    list(APPEND MOLORA_CUDA_GENCODE "SHELL:-gencode arch=compute_${a},code=sm_${a}")
  endforeach()

  find_library(MOLORA_NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/lib)
  find_path(MOLORA_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/include)
  if(MOLORA_NCCL_LIBRARY AND MOLORA_NCCL_INCLUDE)
    set(MOLORA_HAVE_NCCL ON)
    message(STATUS "molora: NCCL ${MOLORA_NCCL_LIBRARY}")
  else()
    message(STATUS "molora: NCCL not found; the all-reduce fallback reports 'unavailable'")
  endif()
endif()

# Adds the architecture flags and common nvcc options to a target holding .cu files.
function(molora_cuda_target target)
  if(MOLORA_HAVE_CUDA)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:${MOLORA_CUDA_GENCODE} --expt-relaxed-constexpr -lineinfo>)
    # Compressed device code (SASS too): lora.cu's object 2.1 -> 0.36 MB, and every binary that
    # links a part statically carries it. Decompressed once when the module loads.
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xfatbin=-compress-all>)
  endif()
endfunction()
