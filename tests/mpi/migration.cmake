# Expert migration's move (train/migration.cpp) on real MPI processes: slots permuted within a
# rank, experts changing rank, both in one layer; weights and AdamW m, v stamped with each
# expert's identity. Included from tests/mpi/CMakeLists.txt.
add_executable(mpi_test_migration ${CMAKE_CURRENT_LIST_DIR}/test_migration_mpi.cpp)
target_link_libraries(mpi_test_migration PRIVATE moetrain_lib)
foreach(np 1 2 4)
  add_test(NAME mpi_migration_np${np} COMMAND ${MOETRAIN_MPIRUN} -np ${np} $<TARGET_FILE:mpi_test_migration>)
  set_tests_properties(mpi_migration_np${np} PROPERTIES LABELS "mpi" TIMEOUT 120)
endforeach()
# The same binary with no launcher: a world of one without MPI (comm/mpi_runtime.h).
add_test(NAME mpi_migration_nolauncher COMMAND $<TARGET_FILE:mpi_test_migration>)
set_tests_properties(mpi_migration_nolauncher PROPERTIES LABELS "mpi" TIMEOUT 120
                     ENVIRONMENT "OMPI_COMM_WORLD_SIZE=;OMPI_COMM_WORLD_RANK=;PMIX_RANK=;PMIX_NAMESPACE=")
