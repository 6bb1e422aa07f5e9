# The SimGrid SMPI scale study's pieces in the normal build (the simulated program itself is the
# -DMOETRAIN_SMPI=ON build, cmake/smpi.cmake, which tests/smpi/smoke.sh configures and builds).
# The planner's exchange time for the study's planner-vs-simulation columns: links only the planner.
add_executable(moetrain_a2a_predict ${CMAKE_SOURCE_DIR}/src/smpi/a2a_predict.cpp)
target_link_libraries(moetrain_a2a_predict PRIVATE moetrain_plan)
