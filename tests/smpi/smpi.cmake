# The SimGrid SMPI scale study's pieces in the normal build (the simulated program itself is the
# -DMOETRAIN_SMPI=ON build, cmake/smpi.cmake, which tests/smpi/smoke.sh configures and builds).
# The planner's exchange time for the study's planner-vs-simulation columns: links only the planner.
add_executable(moetrain_a2a_predict ${CMAKE_SOURCE_DIR}/src/tools/smpi/a2a_predict.cpp)
target_link_libraries(moetrain_a2a_predict PRIVATE moetrain_plan)
# CI smoke test: 64 simulated ranks, the real exchange, #wrong = 0 and the study's time ordering
# (builds the SMPI targets in its own dir; skipped where SimGrid is not installed).
add_test(NAME smpi_exchange_smoke
         COMMAND ${CMAKE_SOURCE_DIR}/tests/smpi/smoke.sh ${CMAKE_BINARY_DIR}/smpi)
set_tests_properties(smpi_exchange_smoke PROPERTIES LABELS "smpi" TIMEOUT 600 SKIP_RETURN_CODE 77)
# The simulated training step (moetrain_smpi_step, 32 ranks, the planner's layout): exact exchange
# counts, the planner's injected compute, the all-reduce within 25% of the ring model (~1 min).
add_test(NAME smpi_step COMMAND ${CMAKE_SOURCE_DIR}/tests/smpi/step.sh ${CMAKE_BINARY_DIR}/smpi)
set_tests_properties(smpi_step PROPERTIES LABELS "smpi" TIMEOUT 300 SKIP_RETURN_CODE 77)
# Both configure and build the same SMPI build dir: never at once.
set_tests_properties(smpi_exchange_smoke smpi_step PROPERTIES RESOURCE_LOCK smpi_build_dir)
