# Run after lockstep._C is linked (src/python/CMakeLists.txt, POST_BUILD): fails the build when the
# module does not load libstdc++ as a shared library. A module with its own static copy of the C++
# runtime, loaded into a Python process that already has libstdc++.so.6 (torch, numpy), ends up
# with two half-bound runtimes and crashes at its first string stream (seen on 2026-12-02 with a
# g++ that links libstdc++ statically by default). -DMODULE=<file> -DOBJDUMP=<objdump>
# -DCOMPILER=<c++ compiler>
if(NOT OBJDUMP)
  message(WARNING "lockstep._C: no objdump found, the shared-libstdc++ check of ${MODULE} is skipped")
  return()
endif()
execute_process(COMMAND "${OBJDUMP}" -p "${MODULE}" OUTPUT_VARIABLE headers RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "lockstep._C: '${OBJDUMP} -p ${MODULE}' failed (${rc})")
endif()
if(NOT headers MATCHES "NEEDED +libstdc\\+\\+")
  message(FATAL_ERROR
    "lockstep._C (${MODULE}) links libstdc++ statically: the compiler ${COMPILER} does so by "
    "default. Loaded next to torch's shared libstdc++ such a module crashes. Build it with a "
    "compiler that links libstdc++ as a shared library, e.g. CC=/usr/bin/gcc CXX=/usr/bin/g++ "
    "CUDAHOSTCXX=/usr/bin/g++ pip install .")
endif()
