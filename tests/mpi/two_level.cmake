# The two-level all-reduce (comm/two_level.h) on real MPI processes, one machine as nodes of
# --ranks-per-node ranks. Included from tests/mpi/CMakeLists.txt.
add_executable(mpi_test_two_level ${CMAKE_CURRENT_LIST_DIR}/test_two_level_mpi.cpp)
target_link_libraries(mpi_test_two_level PRIVATE moetrain_lib)
# name  ranks  ranks-per-node: 2 x 2 nodes, 4 x 2, 2 x 4, and 3 ranks in nodes of 2 (unequal: flat)
foreach(case "np4_rpn2 4 2" "np8_rpn4 8 4" "np8_rpn2 8 2" "np3_rpn2 3 2")
  separate_arguments(args UNIX_COMMAND "${case}")
  list(GET args 0 name)
  list(GET args 1 np)
  list(GET args 2 rpn)
  add_test(NAME mpi_two_level_${name}
           COMMAND ${MOETRAIN_MPIRUN} -np ${np} $<TARGET_FILE:mpi_test_two_level> --ranks-per-node ${rpn})
  set_tests_properties(mpi_two_level_${name} PROPERTIES LABELS "mpi" TIMEOUT 120)
endforeach()
