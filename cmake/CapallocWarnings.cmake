# Warnings (as errors unless CAPALLOC_WERROR=OFF) and sanitizers for capalloc's
# own targets. Third-party headers come in as system includes and stay quiet.
function(capalloc_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
      -Wconversion -Wno-sign-conversion -Wimplicit-fallthrough
      -Wno-missing-field-initializers>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${CAPALLOC_WERROR}>>:-Werror>)
endfunction()

if(CAPALLOC_SANITIZE)
  add_compile_options(-fsanitize=${CAPALLOC_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${CAPALLOC_SANITIZE})
endif()
