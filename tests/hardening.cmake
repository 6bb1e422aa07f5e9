# Hardening tests (issue 15): hostile files, resource checks, flag validation, locks, stalled ranks.
# Included from the top-level CMakeLists.txt; MOETRAIN_MPIRUN and the moetrain target are defined there.

# Hostile files (classes 1, 2 and the load side of 4): checkpoints reaching outside their folder,
# deep JSON at every entry point, size-overflow configs, NaN/Inf checkpoints, stray step-N folders.
add_test(NAME hostile_files COMMAND ${CMAKE_SOURCE_DIR}/tests/hostile_files.sh $<TARGET_FILE:moetrain>)
set_tests_properties(hostile_files PROPERTIES TIMEOUT 300)
