# Pipeline executor (parallel/pipeline.h) on real MPI processes: the world is one pipeline of N
# stages running a tiny real model, checked bit for bit against the serial composition. Included
# from tests/mpi/CMakeLists.txt.
add_executable(mpi_test_pipeline ${CMAKE_CURRENT_LIST_DIR}/test_pipeline_mpi.cpp)
target_link_libraries(mpi_test_pipeline PRIVATE moetrain_lib)
foreach(np 1 2 4)
  add_test(NAME mpi_pipeline_np${np}
           COMMAND ${MOETRAIN_MPIRUN} -np ${np} $<TARGET_FILE:mpi_test_pipeline>)
  set_tests_properties(mpi_pipeline_np${np} PROPERTIES LABELS "mpi" TIMEOUT 120)
endforeach()
