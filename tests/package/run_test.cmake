# ctest Package.find_package_consumer: installs this build into a fresh prefix inside the build
# tree, then configures, builds and runs tests/package (find_package(lockstep REQUIRED)) against
# that prefix alone. Run as
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DCXX_COMPILER=... [-DLAUNCHER=...]
#         [-DBUILD_TYPE=...] [-DEXTRA_FLAGS=...] -P run_test.cmake
# EXTRA_FLAGS (space-separated, e.g. the sanitizer flags) go on the consumer's compile and link
# lines: the installed libraries are static, built with them.
foreach(_v BUILD_DIR SOURCE_DIR WORK_DIR CXX_COMPILER)
  if(NOT DEFINED ${_v})
    message(FATAL_ERROR "run_test.cmake: -D${_v}=... is required")
  endif()
endforeach()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

set(configure ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package -B ${WORK_DIR}/consumer
    -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
    -DCMAKE_PREFIX_PATH=${prefix} -DLOCKSTEP_EXPECTED_PREFIX=${prefix}
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
    "-DCMAKE_CXX_FLAGS=${EXTRA_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXTRA_FLAGS}")
if(LAUNCHER)
  list(APPEND configure -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
run(${configure})

# The package must come from the fresh prefix, not from the build tree or the system.
file(STRINGS ${WORK_DIR}/consumer/CMakeCache.txt found REGEX "^lockstep_DIR:")
string(REGEX REPLACE "^lockstep_DIR:PATH=" "" found "${found}")
cmake_path(IS_PREFIX prefix "${found}" inside)
if(NOT inside)
  message(FATAL_ERROR "find_package(lockstep) found '${found}', not the prefix ${prefix}")
endif()

run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run(${WORK_DIR}/consumer/lockstep_consumer)
