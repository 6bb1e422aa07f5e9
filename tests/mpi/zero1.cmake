# ZeRO-1's collectives (Group::reduce_scatter_sum / allgatherv, parallel::ZeroShard) on real MPI
# processes, origins stamped into every element. Included from tests/mpi/CMakeLists.txt.
add_executable(mpi_test_zero1 ${CMAKE_CURRENT_LIST_DIR}/test_zero1_mpi.cpp)
target_link_libraries(mpi_test_zero1 PRIVATE moetrain_lib)
foreach(np 1 2 3 4)
  add_test(NAME mpi_zero1_np${np} COMMAND ${MOETRAIN_MPIRUN} -np ${np} $<TARGET_FILE:mpi_test_zero1>)
  set_tests_properties(mpi_zero1_np${np} PROPERTIES LABELS "mpi" TIMEOUT 120)
endforeach()
