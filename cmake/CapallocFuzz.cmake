# CAPALLOC_BUILD_FUZZERS: instruments every target of this build tree for
# libFuzzer (coverage, no libFuzzer main), ASan and UBSan, so that the
# fuzzers in tests/fuzz see the library's edges and its memory errors. The
# fuzzers themselves link with -fsanitize=fuzzer (tests/fuzz/CMakeLists.txt).
# Use a build tree of its own (scripts/fuzz.sh uses build-fuzz/).
if(NOT CAPALLOC_BUILD_FUZZERS)
  return()
endif()
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang" OR NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR
    "CAPALLOC_BUILD_FUZZERS=ON needs clang (libFuzzer), but the C++ compiler is "
    "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION} and the C compiler "
    "${CMAKE_C_COMPILER_ID}: configure with -DCMAKE_C_COMPILER=clang-14 "
    "-DCMAKE_CXX_COMPILER=clang++-14 (scripts/fuzz.sh does)")
endif()
if(CAPALLOC_SANITIZE AND NOT CAPALLOC_SANITIZE STREQUAL "address,undefined")
  message(FATAL_ERROR
    "CAPALLOC_BUILD_FUZZERS=ON builds with ASan and UBSan; CAPALLOC_SANITIZE="
    "'${CAPALLOC_SANITIZE}' cannot be combined with it (leave it empty)")
endif()
add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
  -fno-sanitize-recover=all)
add_link_options(-fsanitize=address,undefined)
