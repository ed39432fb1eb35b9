# Host code: -Wall -Wextra (-Werror unless MOLORA_WERROR=OFF). CUDA sources get the same through
# -Xcompiler for their host side.
function(molora_host_warnings target)
  set(flags -Wall -Wextra)
  if(MOLORA_WERROR)
    list(APPEND flags -Werror)
  endif()
  string(JOIN "," xflags ${flags})
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${flags}>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${xflags}>)
endfunction()
