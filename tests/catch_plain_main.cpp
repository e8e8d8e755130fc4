// Catch2's main() alone, for test programs that must not link capalloc
// (dlopen_torch_test loads the shared library itself). Compiled without the
// project's warning flags: it is Catch2's code, and GCC 12 reports false
// maybe-uninitialized warnings in <regex> under the sanitizers.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
