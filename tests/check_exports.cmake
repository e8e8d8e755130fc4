# Checks the dynamic symbol table of libcapalloc.so (run by CTest).
execute_process(COMMAND nm -D --defined-only ${LIBRARY} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm -D failed on ${LIBRARY}")
endif()
foreach(required capalloc_torch_malloc capalloc_torch_free capalloc_torch_begin_allocate_to_pool
        capalloc_torch_end_allocate_to_pool capalloc_torch_release_pool capalloc_malloc capalloc_free
        capalloc_last_error)
  if(NOT symbols MATCHES " T ${required}\n")
    message(FATAL_ERROR "${required} is not exported by ${LIBRARY}")
  endif()
endforeach()
# Internal classes live in capalloc::detail or are an exported class's Impl,
# and stay hidden. HIP's runtime registers kernels through exported handle
# variables (data symbols of the device kernels' namespaces); they are the
# one exception.
string(REGEX MATCHALL "[^\n]*(8capalloc6detail|4Impl[0-9CD])[^\n]*" leaked "${symbols}")
list(FILTER leaked EXCLUDE REGEX " D .*(hip_kernels|cuda_kernels)")
if(leaked)
  message(FATAL_ERROR "internal symbols are exported:\n${leaked}")
endif()
message(STATUS "exports ok: capalloc_torch_malloc, capalloc_torch_free and the C ABI")
