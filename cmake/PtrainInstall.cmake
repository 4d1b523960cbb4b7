# `cmake --install build --prefix P`: the headers under P/include/ptrain, the static archives of libptrain
# under P/lib, the CMake package P/lib/cmake/ptrain (find_package(ptrain) gives the target ptrain::ptrain and
# finds LibTorch and the other dependencies for the user) and P/lib/pkgconfig/ptrain.pc; the ptrain and
# ptrain-loader-bench executables under P/bin.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

get_property(ptrain_components GLOBAL PROPERTY PTRAIN_COMPONENTS)
# CUDA builds link the nvcc-compiled kernels into ptrain_kernels: the archive installs with the rest.
if(TARGET ptrain_kernels_cuda)
  list(APPEND ptrain_components ptrain_kernels_cuda ptrain_kernels_cuda_exact ptrain_kernels_cudnn)
endif()
install(TARGETS ptrain_pch ${ptrain_components} ptrain
        EXPORT ptrainTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/ptrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(TARGETS ptrain_app ptrain_loader_bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(PTRAIN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ptrain)
install(EXPORT ptrainTargets NAMESPACE ptrain:: DESTINATION ${PTRAIN_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ptrainConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ptrainConfig.cmake INSTALL_DESTINATION ${PTRAIN_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ptrainConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ptrainConfig.cmake ${PROJECT_BINARY_DIR}/ptrainConfigVersion.cmake
        DESTINATION ${PTRAIN_CMAKE_DIR})

# pkg-config: the archives in one link group (they refer to each other), then every library they link,
# resolved from the imported targets (LibTorch's, yaml-cpp's, ...) to files, as CMake links the executable.
function(ptrain_link_closure out)
  set(result "")
  set(pending ${ARGN})
  set(seen "")
  while(pending)
    list(POP_FRONT pending item)
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" item "${item}")
    if(item STREQUAL "" OR item IN_LIST seen OR item MATCHES "^\\$<")
      continue()
    endif()
    list(APPEND seen "${item}")
    if(TARGET ${item})
      get_target_property(type ${item} TYPE)
      get_target_property(imported ${item} IMPORTED)
      if(imported AND NOT type STREQUAL "INTERFACE_LIBRARY")
        set(location "")
        foreach(property IMPORTED_LOCATION IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_NOCONFIG IMPORTED_LOCATION_RELWITHDEBINFO)
          if(NOT location)
            get_target_property(location ${item} ${property})
          endif()
        endforeach()
        if(location)
          list(APPEND result "${location}")
        endif()
      endif()
      get_target_property(deps ${item} INTERFACE_LINK_LIBRARIES)
      if(deps)
        list(APPEND pending ${deps})
      endif()
    elseif(item MATCHES "^-")
      list(APPEND result "${item}")
    elseif(IS_ABSOLUTE "${item}")
      list(APPEND result "${item}")
    else()
      list(APPEND result "-l${item}")
    endif()
  endwhile()
  list(REMOVE_DUPLICATES result)
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

set(ptrain_pc_link "")
foreach(component IN LISTS ptrain_components ITEMS ptrain_pch)
  string(APPEND ptrain_pc_link " -l:$<TARGET_LINKER_FILE_NAME:${component}>")
endforeach()
set(ptrain_external "")
foreach(component IN LISTS ptrain_components ITEMS ptrain_pch)
  get_target_property(deps ${component} LINK_LIBRARIES)
  foreach(dep IN LISTS deps)
    if(NOT dep MATCHES "^ptrain_")
      list(APPEND ptrain_external "${dep}")
    endif()
  endforeach()
endforeach()
ptrain_link_closure(ptrain_external_files ${ptrain_external})
# LibTorch registers its operators from static initialisers: keep its libraries even where the linker
# defaults to --as-needed.
list(JOIN ptrain_external_files " " ptrain_pc_external)
set(ptrain_pc_cflags "-std=c++17 ${TORCH_CXX_FLAGS}")
foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
  if(NOT dir STREQUAL "/usr/include")
    string(APPEND ptrain_pc_cflags " -I${dir}")
  endif()
endforeach()
file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/ptrain.pc CONTENT
"prefix=\${pcfiledir}/../..
libdir=\${prefix}/${CMAKE_INSTALL_LIBDIR}
includedir=\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}

Name: ptrain
Description: Train LibTorch modules in every precision mode and distributed strategy, and measure what each costs
Version: ${PROJECT_VERSION}
Cflags: -I\${includedir} ${ptrain_pc_cflags}
Libs: -L\${libdir} -Wl,--start-group${ptrain_pc_link} -Wl,--end-group -Wl,--no-as-needed ${ptrain_pc_external} -Wl,--as-needed
")
install(FILES ${PROJECT_BINARY_DIR}/ptrain.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
