# Included last from the top-level CMakeLists.txt when MOETRAIN_SANITIZE is ON. Every executable
# of the build (tests, tools, the CLI, also in subdirectories and those added later) gets
# sanitizer_defaults.cpp, which compiles the ASan/LSan/UBSan options into the binary. So ctest, the
# test scripts, every mpirun rank and a developer running a binary by hand all see the same
# options without setting ASAN_OPTIONS; an ASAN_OPTIONS/LSAN_OPTIONS/UBSAN_OPTIONS in the
# environment still overrides them. (CMake 3.25 cannot set test ENVIRONMENT from another
# directory, and the gtest cases only exist at test time, so per-test environments would miss
# some tests.)
set(MOETRAIN_LSAN_SUPP ${CMAKE_CURRENT_LIST_DIR}/lsan.supp)
configure_file(${CMAKE_CURRENT_LIST_DIR}/sanitizer_defaults.cpp.in
               ${CMAKE_BINARY_DIR}/sanitizer_defaults.cpp @ONLY)

function(moetrain_sanitize_executables dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t ${targets})
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "EXECUTABLE")
      target_sources(${t} PRIVATE ${CMAKE_BINARY_DIR}/sanitizer_defaults.cpp)
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub ${subdirs})
    moetrain_sanitize_executables(${sub})
  endforeach()
endfunction()
moetrain_sanitize_executables(${CMAKE_SOURCE_DIR})
