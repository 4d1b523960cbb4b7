# PTRAIN_SOURCE_COMMIT: the commit ptrain is built from, for run records and bench results. `git archive`
# writes it into cmake/source_commit.txt (export-subst in .gitattributes), so a tree copied without its
# history still knows it; a checkout asks git, when the source folder is the top of its own work tree (a
# copy inside another checkout must not take that checkout's commit). "unknown" otherwise.
file(READ "${PROJECT_SOURCE_DIR}/cmake/source_commit.txt" PTRAIN_SOURCE_COMMIT)
string(STRIP "${PTRAIN_SOURCE_COMMIT}" PTRAIN_SOURCE_COMMIT)
if(NOT PTRAIN_SOURCE_COMMIT MATCHES "^[0-9a-f]+$")
  set(PTRAIN_SOURCE_COMMIT "unknown")
  find_package(Git QUIET)
  if(GIT_FOUND)
    execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse --show-toplevel WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
                    OUTPUT_VARIABLE top RESULT_VARIABLE status OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    file(REAL_PATH "${PROJECT_SOURCE_DIR}" source_real)
    if(status EQUAL 0)
      file(REAL_PATH "${top}" top_real)
    endif()
    if(status EQUAL 0 AND top_real STREQUAL source_real)
      execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse HEAD WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
                      OUTPUT_VARIABLE PTRAIN_SOURCE_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE)
      # A new commit reconfigures, so the recorded commit follows the checkout.
      foreach(ref HEAD packed-refs)
        execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse --git-path ${ref} WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
                        OUTPUT_VARIABLE path OUTPUT_STRIP_TRAILING_WHITESPACE)
        list(APPEND watched "${path}")
      endforeach()
      execute_process(COMMAND "${GIT_EXECUTABLE}" symbolic-ref -q HEAD WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
                      OUTPUT_VARIABLE branch RESULT_VARIABLE on_branch OUTPUT_STRIP_TRAILING_WHITESPACE)
      if(on_branch EQUAL 0)
        execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse --git-path "${branch}" WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
                        OUTPUT_VARIABLE path OUTPUT_STRIP_TRAILING_WHITESPACE)
        list(APPEND watched "${path}")
      endif()
      foreach(path IN LISTS watched)
        if(NOT IS_ABSOLUTE "${path}")
          set(path "${PROJECT_SOURCE_DIR}/${path}")
        endif()
        if(EXISTS "${path}")
          set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${path}")
        endif()
      endforeach()
    endif()
  endif()
endif()
configure_file("${PROJECT_SOURCE_DIR}/cmake/source_commit.cpp.in" "${PROJECT_BINARY_DIR}/generated/source_commit.cpp" @ONLY)
message(STATUS "ptrain: source commit ${PTRAIN_SOURCE_COMMIT}")
