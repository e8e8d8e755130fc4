# Warnings (as errors unless CAPALLOC_WERROR=OFF) and sanitizers for capalloc's
# own targets. Third-party headers come in as system includes and stay quiet.
function(capalloc_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
      -Wconversion -Wno-sign-conversion -Wimplicit-fallthrough
      -Wno-missing-field-initializers>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${CAPALLOC_WERROR}>>:-Werror>)
  # GCC 12 reports memcpy overlaps and overflows inside libstdc++'s inlined
  # std::string code at -O2/-O3 that cannot happen (GCC PR 105329, 105651):
  # which lines trip it changes with the optimisation level and inlining, so
  # a Release build failed where RelWithDebInfo passed. Those three stay
  # warnings, printed but not fatal, on GCC before 13.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE
      $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${CAPALLOC_WERROR}>>:-Wno-error=restrict
        -Wno-error=stringop-overflow -Wno-error=array-bounds>)
  endif()
endfunction()

if(CAPALLOC_SANITIZE)
  add_compile_options(-fsanitize=${CAPALLOC_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${CAPALLOC_SANITIZE})
endif()
