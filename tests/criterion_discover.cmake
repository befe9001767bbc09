# SPDX-License-Identifier: Apache-2.0
# Included by ctest (TEST_INCLUDE_FILES) when it starts: registers one ctest test per Criterion
# test of one executable, named EXE/suite/test, run with --filter suite/test. A test that skips
# exits 77 (tests/criterion_main.c), which SKIP_RETURN_CODE turns into "Skipped" in ctest's
# summary. Set by tests/CMakeLists.txt: KVX_T_BIN, KVX_T_NAME, KVX_T_TIMEOUT, KVX_T_LABELS,
# KVX_T_DIR. An executable this build did not produce (the TSan build builds a subset) adds no
# test; one that cannot list its tests adds a test that fails with the reason.
if(NOT EXISTS "${KVX_T_BIN}")
  return()
endif()
execute_process(COMMAND "${KVX_T_BIN}" --list OUTPUT_VARIABLE _out ERROR_VARIABLE _err
                RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  add_test("${KVX_T_NAME}/--list" sh -c "echo '${KVX_T_BIN} --list failed (exit ${_rc})'; exit 1")
  return()
endif()
string(REPLACE "\n" ";" _lines "${_out}")
set(_suite "")
set(_n 0)
foreach(_l IN LISTS _lines)
  if(_l MATCHES "^([A-Za-z0-9_]+): [0-9]+ tests?$")
    set(_suite "${CMAKE_MATCH_1}")
  elseif(_l MATCHES "([A-Za-z0-9_]+)( \\(skipped\\))?$" AND NOT _suite STREQUAL "")
    set(_t "${CMAKE_MATCH_1}")
    set(_name "${KVX_T_NAME}/${_suite}/${_t}")
    add_test("${_name}" "${KVX_T_BIN}" --filter "${_suite}/${_t}" -j1 --verbose=0)
    set_tests_properties("${_name}" PROPERTIES TIMEOUT ${KVX_T_TIMEOUT} LABELS "${KVX_T_LABELS}"
                         SKIP_RETURN_CODE 77 WORKING_DIRECTORY "${KVX_T_DIR}")
    math(EXPR _n "${_n} + 1")
  endif()
endforeach()
if(_n EQUAL 0)
  add_test("${KVX_T_NAME}/--list" sh -c "echo '${KVX_T_BIN} --list named no test'; exit 1")
endif()
