# One static archive per concern of libptrain. Its DEPS are the other concerns it may use: the link
# graph is the architecture, and CMake refuses a concern that reaches for one it did not declare.
#
# Every archive reuses one precompiled header (LibTorch is most of the compile time on two cores).

# ptrain's own C++ sources (components, apps, tests; not the .cu files nvcc compiles) build with -Wall
# -Wextra, and a switch over an enum that misses one of its values does not compile. Dependencies'
# headers (LibTorch's, GoogleTest's, ...) come in as system includes, so their warnings stay out.
set(PTRAIN_WARNING_FLAGS "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Werror=switch>")
function(ptrain_warnings target)
  target_compile_options(${target} PRIVATE ${PTRAIN_WARNING_FLAGS})
endfunction()

add_library(ptrain_pch STATIC ${PROJECT_SOURCE_DIR}/cmake/pch_anchor.cpp)
target_link_libraries(ptrain_pch PUBLIC ${TORCH_LIBRARIES} Threads::Threads)
target_include_directories(ptrain_pch PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src> $<INSTALL_INTERFACE:include>)
target_compile_options(ptrain_pch PUBLIC ${TORCH_CXX_FLAGS})
target_compile_features(ptrain_pch PUBLIC cxx_std_17)
if(PTRAIN_WITH_CUDA)
  # c10d guards ProcessGroupNCCL.hpp behind USE_C10D_NCCL; the wheel's targets do not always define it.
  target_compile_definitions(ptrain_pch PUBLIC PTRAIN_WITH_CUDA=1 USE_C10D_NCCL)
endif()
target_precompile_headers(ptrain_pch PRIVATE ${PROJECT_SOURCE_DIR}/src/ptrain/core/pch.h)
# The targets that reuse the precompiled header compile with the same flags it was made with.
ptrain_warnings(ptrain_pch)

# A fresh build spends most of its time instantiating the same LibTorch templates in every translation
# unit, even with the precompiled header: compiling a concern's files in batches (a unity build) costs about
# a third of compiling them one by one. Incremental work on a few files may prefer -DPTRAIN_UNITY_BUILD=OFF.
option(PTRAIN_UNITY_BUILD "Compile each concern's sources in batches (faster fresh builds)" ON)
set(PTRAIN_UNITY_BATCH_SIZE 8 CACHE STRING "Sources per unity batch")

function(ptrain_use_pch target)
  target_precompile_headers(${target} REUSE_FROM ptrain_pch)
  ptrain_warnings(${target})
  if(PTRAIN_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${PTRAIN_UNITY_BATCH_SIZE})
  endif()
endfunction()

# ptrain_component(NAME <name> SOURCES <files...> [DEPS <components...>] [LIBS <libs...>])
function(ptrain_component)
  cmake_parse_arguments(C "" "NAME" "SOURCES;DEPS;LIBS" ${ARGN})
  add_library(ptrain_${C_NAME} STATIC ${C_SOURCES})
  target_link_libraries(ptrain_${C_NAME} PUBLIC ptrain_pch)
  foreach(dep IN LISTS C_DEPS)
    target_link_libraries(ptrain_${C_NAME} PUBLIC ptrain_${dep})
  endforeach()
  if(C_LIBS)
    target_link_libraries(ptrain_${C_NAME} PUBLIC ${C_LIBS})
  endif()
  ptrain_use_pch(ptrain_${C_NAME})
  set_property(GLOBAL APPEND PROPERTY PTRAIN_COMPONENTS ptrain_${C_NAME})
endfunction()

# ptrain_gtest_entries(<target> NAME <name> [LABELS <labels...>] [SLOW <patterns...>] [GPU <patterns...>]
#                      [PER_CASE] [CASE_COST <cost>] [CASE_COSTS <Suite.Case=cost...>]): the ctest entries of a GoogleTest binary, written by
# cmake/gtest_entries.py after each link. A test process costs about 0.65 s of CPU to start (LibTorch), more than
# most cases take, so the binary's quick cases run in one entry, <name>.fast (label fast). Cases matching a SLOW
# pattern (gtest filter syntax: Suite.Case, Suite.*) and those of a source that forks ranks or reads the peak RSS
# get one entry each, Suite.Case (label slow), so that ctest -j spreads them; PER_CASE gives every case its own
# entry (the CLI tests). Cases that skip without a CUDA device (their first statement says so, or they match a
# GPU pattern): a CPU build runs them in one entry, <name>.gpu_only (label gpu), which shows each skip's reason
# and fails if one of them ran; a CUDA build gives each its own.
function(ptrain_gtest_entries target)
  cmake_parse_arguments(G "PER_CASE" "NAME;CASE_COST" "LABELS;SLOW;GPU;CASE_COSTS" ${ARGN})
  set(entries ${CMAKE_CURRENT_BINARY_DIR}/${target}_entries.cmake)
  set(options)
  if(G_PER_CASE)
    list(APPEND options --per-case)
  endif()
  if(PTRAIN_WITH_CUDA)
    list(APPEND options --cuda-build)
  endif()
  if(G_CASE_COST)
    list(APPEND options --case-cost ${G_CASE_COST})
  endif()
  if(G_CASE_COSTS)
    list(APPEND options --case-costs ${G_CASE_COSTS})
  endif()
  # A change of the script relinks the binary, so that its entries are written again.
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/gtest_entries.py)
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${PTRAIN_ORACLE_PYTHON} ${PROJECT_SOURCE_DIR}/cmake/gtest_entries.py --binary $<TARGET_FILE:${target}>
            --name ${G_NAME} --out ${entries} --working-dir ${CMAKE_CURRENT_BINARY_DIR} ${options}
            --labels ${G_LABELS} --slow ${G_SLOW} --gpu ${G_GPU} --environment ${PTRAIN_TEST_ENVIRONMENT}
    BYPRODUCTS ${entries} VERBATIM)
  # PTRAIN_TEST_PROCESS_PER_CASE=1 ctest ...: every case in a process of its own, as before the grouping.
  set(include_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_include.cmake)
  string(REGEX REPLACE "\\.cmake$" "_per_case.cmake" per_case_entries ${entries})
  file(WRITE ${include_file} "if(NOT EXISTS \"${entries}\")\n  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
                             "elseif(\"\$ENV{PTRAIN_TEST_PROCESS_PER_CASE}\")\n  include(\"${per_case_entries}\")\n"
                             "else()\n  include(\"${entries}\")\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${include_file})
endfunction()

# ptrain_test(NAME <name> SOURCES <files...> DEPS <components...> [SLOW <patterns...>] [GPU <patterns...>]):
# one GoogleTest binary per concern, its entries as ptrain_gtest_entries makes them.
function(ptrain_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;DEPS;LABELS;SLOW;GPU" ${ARGN})
  add_executable(test_${T_NAME} ${T_SOURCES} ${PROJECT_SOURCE_DIR}/tests/support/crash_report.cpp
                 ${PROJECT_SOURCE_DIR}/tests/support/test_main.cpp)
  # Exported symbols give crash_report.cpp's backtraces function names.
  set_target_properties(test_${T_NAME} PROPERTIES ENABLE_EXPORTS ON)
  foreach(dep IN LISTS T_DEPS)
    target_link_libraries(test_${T_NAME} PRIVATE ptrain_${dep})
  endforeach()
  target_link_libraries(test_${T_NAME} PRIVATE GTest::gtest)
  target_include_directories(test_${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support)
  target_compile_definitions(test_${T_NAME} PRIVATE
    PTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}" PTRAIN_BINARY_DIR="${PROJECT_BINARY_DIR}")
  ptrain_use_pch(test_${T_NAME})
  ptrain_gtest_entries(test_${T_NAME} NAME ${T_NAME} LABELS ${T_LABELS} SLOW ${T_SLOW} GPU ${T_GPU})
endfunction()

# Sources that define helpers of the same name as a neighbour's in their anonymous namespaces (each file's
# own small test helpers, say) compile alone rather than in a unity batch.
function(ptrain_compile_alone)
  set_source_files_properties(${ARGN} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
endfunction()
