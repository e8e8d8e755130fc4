// Catch2's main(), compiled once for every test program (its session code
// is the costliest translation unit of the suite: about 30 s of compile per
// tree). Programs that link capalloc add quiet_test_log.cpp beside it;
// dlopen_torch_test, which must not link capalloc, takes it alone. Compiled
// without the project's warning flags: it is Catch2's code, and GCC 12
// reports false maybe-uninitialized warnings in <regex> under the sanitizers.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
