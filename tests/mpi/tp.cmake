# Tensor parallelism's slice / gather of the logical tensors (parallel/tensor_parallel.h) on real MPI
# processes. Included from tests/mpi/CMakeLists.txt.
add_executable(mpi_test_tp ${CMAKE_CURRENT_LIST_DIR}/test_tp_mpi.cpp)
target_link_libraries(mpi_test_tp PRIVATE moetrain_lib)
foreach(np 1 2 4)
  add_test(NAME mpi_tp_np${np} COMMAND ${MOETRAIN_MPIRUN} -np ${np} $<TARGET_FILE:mpi_test_tp>)
  set_tests_properties(mpi_tp_np${np} PROPERTIES LABELS "mpi" TIMEOUT 120)
endforeach()
