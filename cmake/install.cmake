# `cmake --install <build> --prefix P`: the public headers (include/lockstep), the libraries, the
# `lockstep` command, and a CMake package so another project can write
#   find_package(lockstep REQUIRED)
#   target_link_libraries(app PRIVATE lockstep::lockstep)
# Every library target of this build that exists is exported as lockstep::<target> through one
# export set (lockstepTargets). tests/package is the consumer that checks it (ctest
# Package.find_package_consumer).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(LOCKSTEP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/lockstep)

set(_lockstep_libs)
# NOTE: static libraries, so every library an exported one links must be exported too; a library
# target added to CMakeLists.txt under another name goes in this list.
foreach(_t lockstep_core lockstep_contract lockstep_cpu lockstep_baseline lockstep_engine lockstep
           lockstep_gemm_plan lockstep_cuda lockstep_baseline_cuda lockstep_engine_cuda)
  if(TARGET ${_t})
    list(APPEND _lockstep_libs ${_t})
  endif()
endforeach()

# NOTE: a target's include directories are $<BUILD_INTERFACE:...> (include/ and src/ of the source
# tree); installed, each exports only the installed include/ (INCLUDES DESTINATION below).
# The public headers use C++20 (std::span); a consumer gets the standard from the targets.
foreach(_t ${_lockstep_libs})
  target_compile_features(${_t} INTERFACE cxx_std_20)
endforeach()

install(TARGETS ${_lockstep_libs} EXPORT lockstepTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET lockstep_cli)
  install(TARGETS lockstep_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# Plain C++ headers only (no CUDA types); include/lockstep/cuda declares the CUDA backend's entry
# points, so it is installed only with a CUDA library.
if(TARGET lockstep_cuda)
  install(DIRECTORY include/lockstep DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
else()
  install(DIRECTORY include/lockstep DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          PATTERN cuda EXCLUDE)
endif()

install(EXPORT lockstepTargets NAMESPACE lockstep:: DESTINATION ${LOCKSTEP_INSTALL_CMAKEDIR})

# The libraries are static, so a consumer links their private dependencies too: the config finds
# each package whose imported targets the exported libraries link (OpenBLAS appears as a library
# path when linked by ${BLAS_LIBRARIES}, and then needs no find).
set(_lockstep_link)
foreach(_t ${_lockstep_libs})
  get_target_property(_l ${_t} LINK_LIBRARIES)
  get_target_property(_il ${_t} INTERFACE_LINK_LIBRARIES)
  list(APPEND _lockstep_link ${_l} ${_il})
endforeach()
set(LOCKSTEP_FIND_DEPENDENCIES)
foreach(_dep "Threads::|Threads" "nlohmann_json::|nlohmann_json 3" "BLAS::|BLAS"
             "CUDA::|CUDAToolkit")
  string(REPLACE "|" ";" _dep "${_dep}")
  list(GET _dep 0 _prefix)
  list(GET _dep 1 _find)
  string(FIND "${_lockstep_link}" "${_prefix}" _at)
  if(NOT _at EQUAL -1)
    string(APPEND LOCKSTEP_FIND_DEPENDENCIES "find_dependency(${_find})\n")
  endif()
endforeach()
string(FIND "${_lockstep_link}" "BLAS::" _at)
if(NOT _at EQUAL -1)
  string(PREPEND LOCKSTEP_FIND_DEPENDENCIES "set(BLA_VENDOR OpenBLAS)\n")
endif()

configure_package_config_file(cmake/lockstepConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/lockstepConfig.cmake
                              INSTALL_DESTINATION ${LOCKSTEP_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/lockstepConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/lockstepConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/lockstepConfigVersion.cmake
        DESTINATION ${LOCKSTEP_INSTALL_CMAKEDIR})
