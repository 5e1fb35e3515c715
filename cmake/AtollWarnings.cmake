# atoll_warnings(target): the project's warning set, errors when ATOLL_WERROR is on.
function(atoll_warnings target)
  # -Wno-restrict: GCC 12 reports false -Wrestrict errors inside libstdc++ for ordinary
  # std::string concatenation at -O3 (GCC bug 105651).
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")  # the fuzz build (ATOLL_FUZZ)
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
  else()
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow=local
                           -Wno-unused-parameter -Wno-restrict)
  endif()
  if(ATOLL_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# atoll_test(name SOURCES... LIBS ...): a GoogleTest executable registered with ctest.
# LABELS become ctest labels (unit, integration, chaos, slow) so subsets can be run.
function(atoll_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  atoll_warnings(${name})
  target_link_libraries(${name} PRIVATE ${T_LIBS} atoll_testing GTest::gtest GTest::gtest_main GTest::gmock)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
                       PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
endfunction()
