# The consumer_find_package test, run with `cmake -P`:
#   1. installs the capalloc build tree BUILD_DIR into a scratch prefix,
#   2. configures tests/consumer against that prefix (CMAKE_PREFIX_PATH only),
#      and checks that capalloc was found there and nowhere else,
#   3. builds it, and 4. runs both consumer programs with CAPALLOC_RUNTIME=host.
# Any failing step fails the test.
#
# The README's C++ examples (every ```cpp block of README_FILE) are written
# out verbatim as readme_1.cpp, readme_2.cpp, ... and built and run with them.
#
# Inputs (-D): BUILD_DIR, SOURCE_DIR (tests/consumer), WORK_DIR, CXX_COMPILER,
# C_COMPILER, BUILD_TYPE, GENERATOR, SANITIZE (CAPALLOC_SANITIZE of the build),
# README_FILE.
cmake_minimum_required(VERSION 3.25)

foreach(var BUILD_DIR SOURCE_DIR WORK_DIR CXX_COMPILER C_COMPILER README_FILE)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer_test.cmake: -D${var}=... is required")
  endif()
endforeach()
# --config only where the build has one (multi-config generators, or a
# single-config build with CMAKE_BUILD_TYPE set).
set(config_args)
set(consumer_type RelWithDebInfo)
if(BUILD_TYPE)
  set(config_args --config "${BUILD_TYPE}")
  set(consumer_type "${BUILD_TYPE}")
endif()

set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(run_step name)
  message(STATUS "consumer_find_package: ${name}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer_find_package: step '${name}' failed (${rc}): ${ARGN}")
  endif()
endfunction()

# 0. The README's examples, as the reader sees them.
set(readme_dir "${WORK_DIR}/readme")
file(MAKE_DIRECTORY "${readme_dir}")
file(READ "${README_FILE}" readme)
set(readme_programs)
set(n 0)
while(TRUE)
  string(FIND "${readme}" "```cpp\n" open_at)
  if(open_at EQUAL -1)
    break()
  endif()
  math(EXPR body_at "${open_at} + 7")
  string(SUBSTRING "${readme}" ${body_at} -1 readme)
  string(FIND "${readme}" "\n```" close_at)
  if(close_at EQUAL -1)
    message(FATAL_ERROR "consumer_find_package: an unclosed ```cpp block in ${README_FILE}")
  endif()
  string(SUBSTRING "${readme}" 0 ${close_at} body)
  string(SUBSTRING "${readme}" ${close_at} -1 readme)
  math(EXPR n "${n} + 1")
  file(WRITE "${readme_dir}/readme_${n}.cpp" "${body}\n")
  list(APPEND readme_programs readme_${n})
endwhile()
if(n EQUAL 0)
  message(FATAL_ERROR "consumer_find_package: no ```cpp block in ${README_FILE}")
endif()
message(STATUS "consumer_find_package: ${n} C++ example(s) from the README")

# 1. Install.
run_step("install into ${prefix}"
  "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" ${config_args})

# 2. Configure. A sanitized libcapalloc needs sanitized programs (the
# sanitizer runtime must come first), so the consumer gets the same flags.
set(flag_args)
if(SANITIZE)
  set(san "-fsanitize=${SANITIZE} -fno-omit-frame-pointer")
  list(APPEND flag_args "-DCMAKE_C_FLAGS=${san}" "-DCMAKE_CXX_FLAGS=${san}"
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
endif()
set(generator_args)
if(GENERATOR)
  set(generator_args -G "${GENERATOR}")
endif()
run_step("configure tests/consumer"
  "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${consumer_build}" ${generator_args}
  "-DCMAKE_PREFIX_PATH=${prefix}"
  "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF"
  "-DCMAKE_BUILD_TYPE=${consumer_type}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  "-DCMAKE_C_COMPILER=${C_COMPILER}"
  "-DREADME_EXAMPLES_DIR=${readme_dir}"
  "-DEXPECTED_BACKENDS=${BACKENDS}"
  ${flag_args})

# The package must come from the scratch prefix, not from the build tree or
# a system install.
file(STRINGS "${consumer_build}/CMakeCache.txt" found_dir REGEX "^capalloc_DIR:")
string(REGEX REPLACE "^capalloc_DIR:[A-Z]+=" "" found_dir "${found_dir}")
file(REAL_PATH "${prefix}" real_prefix)
if(EXISTS "${found_dir}")
  file(REAL_PATH "${found_dir}" found_dir)
endif()
string(FIND "${found_dir}" "${real_prefix}/" at)
if(NOT at EQUAL 0)
  message(FATAL_ERROR
    "consumer_find_package: capalloc was found in '${found_dir}', not under '${real_prefix}'")
endif()

# 3. Build.
run_step("build tests/consumer"
  "${CMAKE_COMMAND}" --build "${consumer_build}" ${config_args})

# 4. Run. Single-config generators put the programs at the top of the build
# tree, multi-config ones in a per-config folder.
set(ENV{CAPALLOC_RUNTIME} host)
foreach(program consumer_cpp consumer_c ${readme_programs})
  set(exe "${consumer_build}/${program}")
  if(NOT EXISTS "${exe}")
    set(exe "${consumer_build}/${consumer_type}/${program}")
  endif()
  run_step("run ${program}" "${exe}")
endforeach()
# 5. pkg-config: the installed capalloc.pc compiles and links the C consumer
# (a sanitized build needs the sanitizer flags first; skipped there).
file(GLOB_RECURSE pc_files "${prefix}/*/capalloc.pc")
if(NOT pc_files)
  message(FATAL_ERROR "consumer_find_package: no capalloc.pc installed under ${prefix}")
endif()
list(GET pc_files 0 pc_file)
get_filename_component(pc_dir "${pc_file}" DIRECTORY)
find_program(PKG_CONFIG pkg-config)
if(NOT PKG_CONFIG)
  message(FATAL_ERROR "consumer_find_package: pkg-config is not installed")
endif()
set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
execute_process(COMMAND "${PKG_CONFIG}" --cflags --libs capalloc
  OUTPUT_VARIABLE pc_flags RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer_find_package: pkg-config --cflags --libs capalloc failed (${rc})")
endif()
message(STATUS "consumer_find_package: pkg-config --cflags --libs capalloc: ${pc_flags}")
if(NOT SANITIZE)
  separate_arguments(pc_args UNIX_COMMAND "${pc_flags}")
  run_step("build consumer.c with pkg-config's flags"
    "${C_COMPILER}" -std=c11 -Wall -Werror "${SOURCE_DIR}/consumer.c" ${pc_args}
    -o "${WORK_DIR}/consumer_c_pkgconfig")
  run_step("run consumer_c_pkgconfig" "${WORK_DIR}/consumer_c_pkgconfig")
endif()
message(STATUS "consumer_find_package: passed")
