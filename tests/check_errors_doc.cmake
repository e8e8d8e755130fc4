# tests/check_errors_doc.cmake: keeps docs/errors.md honest (CTest
# `errors_doc_rows_have_tests`).
#
#   cmake -DSOURCE_DIR=<repository root> -P tests/check_errors_doc.cmake
#
# Every row of a table in docs/errors.md whose header's last column is "Test"
# must name at least one test in that last column, each in backticks:
#
#   `<suite>:<Catch2 TEST_CASE name>`   TEST_CASE("<name>" appears in tests/*.cpp
#                                       and <suite> is a test program that
#                                       tests/CMakeLists.txt registers
#   `python:<Class>.<test_method>`      class <Class>( and def <test_method>(
#                                       appear in python/tests/test_capalloc.py
#   `ctest:<name>`                      add_test(NAME <name> appears in
#                                       tests/CMakeLists.txt
#
# A row with no reference, or a reference to a test that does not exist,
# fails the check with the row's line number. Cells must not hold a bare `|`.
cmake_minimum_required(VERSION 3.20)

if(NOT SOURCE_DIR)
  get_filename_component(SOURCE_DIR "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
endif()
set(doc "${SOURCE_DIR}/docs/errors.md")
if(NOT EXISTS "${doc}")
  message(FATAL_ERROR "check_errors_doc: ${doc} does not exist")
endif()

# Everything the references are checked against.
file(GLOB test_sources "${SOURCE_DIR}/tests/*.cpp")
set(catch_text "")
foreach(f IN LISTS test_sources)
  file(READ "${f}" text)
  string(APPEND catch_text "${text}\n")
endforeach()
file(READ "${SOURCE_DIR}/tests/CMakeLists.txt" cmake_text)
set(python_file "${SOURCE_DIR}/python/tests/test_capalloc.py")
set(python_text "")
if(EXISTS "${python_file}")
  file(READ "${python_file}" python_text)
endif()

# The document as a list of lines. Semicolons and square brackets would
# split or glue CMake list elements: they travel as placeholders and are put
# back in each reference before it is looked up.
file(READ "${doc}" doc_text)
string(REPLACE "\\|" "@ESCAPED_PIPE@" doc_text "${doc_text}")
string(REPLACE ";" "@SEMICOLON@" doc_text "${doc_text}")
string(REPLACE "[" "@OPEN_BRACKET@" doc_text "${doc_text}")
string(REPLACE "]" "@CLOSE_BRACKET@" doc_text "${doc_text}")
string(REPLACE "\n" ";" doc_lines "${doc_text}")

function(restore out text)
  string(REPLACE "@SEMICOLON@" ";" text "${text}")
  string(REPLACE "@OPEN_BRACKET@" "[" text "${text}")
  string(REPLACE "@CLOSE_BRACKET@" "]" text "${text}")
  string(REPLACE "@ESCAPED_PIPE@" "|" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

set(errors "")
set(rows 0)
set(references 0)
set(line_number 0)
set(in_table FALSE)
set(test_table FALSE)
foreach(line IN LISTS doc_lines)
  math(EXPR line_number "${line_number} + 1")
  string(STRIP "${line}" line)
  if(NOT line MATCHES "^\\|")
    set(in_table FALSE)
    continue()
  endif()
  # The text between the last two pipes: the last cell.
  string(REGEX REPLACE "\\|[ \t]*$" "" body "${line}")
  string(FIND "${body}" "|" last_pipe REVERSE)
  math(EXPR cell_start "${last_pipe} + 1")
  string(SUBSTRING "${body}" ${cell_start} -1 last_cell)
  string(STRIP "${last_cell}" last_cell)
  if(NOT in_table)
    # A table's first line is its header.
    set(in_table TRUE)
    if(last_cell STREQUAL "Test" OR last_cell STREQUAL "Tests")
      set(test_table TRUE)
    else()
      set(test_table FALSE)
    endif()
    continue()
  endif()
  if(line MATCHES "^\\|[ \t:|-]+$" OR NOT test_table)
    continue()  # the separator line, or a table that is not a list of errors
  endif()
  math(EXPR rows "${rows} + 1")
  string(REGEX MATCHALL "`[^`]+`" refs "${last_cell}")
  if(refs STREQUAL "")
    list(APPEND errors "docs/errors.md:${line_number}: the row names no test")
    continue()
  endif()
  foreach(ref IN LISTS refs)
    math(EXPR references "${references} + 1")
    string(REGEX REPLACE "^`(.*)`$" "\\1" ref "${ref}")
    restore(ref "${ref}")
    string(FIND "${ref}" ":" colon)
    if(colon LESS 1)
      list(APPEND errors "docs/errors.md:${line_number}: '${ref}' is not <suite>:<test>")
      continue()
    endif()
    string(SUBSTRING "${ref}" 0 ${colon} suite)
    math(EXPR name_start "${colon} + 1")
    string(SUBSTRING "${ref}" ${name_start} -1 name)
    if(suite STREQUAL "python")
      if(NOT name MATCHES "^([A-Za-z_][A-Za-z0-9_]*)\\.(test_[A-Za-z0-9_]+)$")
        list(APPEND errors
             "docs/errors.md:${line_number}: '${ref}' is not python:<Class>.<test_method>")
        continue()
      endif()
      set(class "${CMAKE_MATCH_1}")
      set(method "${CMAKE_MATCH_2}")
      string(FIND "${python_text}" "class ${class}(" class_at)
      string(FIND "${python_text}" "def ${method}(" method_at)
      if(class_at LESS 0 OR method_at LESS 0)
        list(APPEND errors "docs/errors.md:${line_number}: no Python test ${class}.${method} in python/tests/test_capalloc.py")
      endif()
    elseif(suite STREQUAL "ctest")
      string(FIND "${cmake_text}" "add_test(NAME ${name} " at_space)
      string(FIND "${cmake_text}" "add_test(NAME ${name}\n" at_newline)
      if(at_space LESS 0 AND at_newline LESS 0)
        list(APPEND errors "docs/errors.md:${line_number}: no CTest test '${name}' in tests/CMakeLists.txt")
      endif()
    else()
      set(registered "")
      if(suite MATCHES "^[A-Za-z0-9_]+$")
        string(REGEX MATCH
               "(capalloc_add_test|capalloc_add_public_test|catch_discover_tests)\\(${suite}[ \n]"
               registered "${cmake_text}")
      endif()
      if(registered STREQUAL "")
        list(APPEND errors "docs/errors.md:${line_number}: '${suite}' is not a test program of tests/CMakeLists.txt")
      endif()
      string(FIND "${catch_text}" "TEST_CASE(\"${name}\"" case_at)
      if(case_at LESS 0)
        list(APPEND errors "docs/errors.md:${line_number}: no TEST_CASE(\"${name}\" in tests/*.cpp")
      endif()
    endif()
  endforeach()
endforeach()

if(rows EQUAL 0)
  list(APPEND errors "docs/errors.md: no table with a Test column was found")
endif()
if(errors)
  list(LENGTH errors n)
  string(REPLACE ";" "\n  " listed "${errors}")
  message(FATAL_ERROR "check_errors_doc: ${n} problem(s):\n  ${listed}")
endif()
message(STATUS "check_errors_doc: ${rows} rows, ${references} test references, all found")
