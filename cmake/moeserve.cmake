# Helpers shared by every module's CMakeLists.txt.
include_guard(GLOBAL)

# The module list, in dependency order. A module is a folder src/<name>/ with its own CMakeLists.txt that
# defines the library target moeserve_<name>; the moeserve binary links every module that exists.
set(MOESERVE_MODULES common storage backend dist model cache vision engine text server router loadgen deploy CACHE INTERNAL "")

# moeserve_add_test(<name> SOURCES a.cpp b.cpp LIBS moeserve_x ... [LABELS l ...])
# One GoogleTest executable per call; every TEST becomes its own ctest case, run from the source root so
# tests can open tests/fixtures/... by relative path.
function(moeserve_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE MOESERVE_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                             MOESERVE_BINARY="$<TARGET_FILE:moeserve>")
  gtest_discover_tests(${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} DISCOVERY_TIMEOUT 60
                       TEST_LIST ${name}_TESTS)
  # The labels go on the discovered cases by a script ctest reads after theirs: gtest_discover_tests's
  # PROPERTIES would keep only the first label of a list (the second became a property name).
  set(label_script ${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake)
  file(WRITE ${label_script}
       "if(${name}_TESTS)\n  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${ARG_LABELS}\")\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${label_script})
endfunction()

# moeserve_add_bench(<name> SOURCES ... LIBS ...): a Google Benchmark executable under build/bench/.
function(moeserve_add_bench name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} benchmark::benchmark)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
endfunction()

# moeserve_add_table_bench(<name> SOURCES ... LIBS ...): a benchmark that prints a table (its main() through
# bench/table_bench.h, its flags through CLI11) under build/bench/.
function(moeserve_add_table_bench name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/bench)
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} CLI11::CLI11)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
endfunction()
