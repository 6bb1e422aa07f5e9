# -DMOETRAIN_SMPI=ON: the SimGrid SMPI build (its own build dir, e.g. build-smpi/). Everything the
# simulated program links is compiled with smpicxx (a library built by another compiler would
# miss SMPI's malloc/exit renaming, NOTES §D2), from the same module source lists as the main
# build (cmake/modules.cmake): core/, balance/ and comm/ (the real exchange) with the a2a
# benchmark, and two executables run under smpirun.
find_package(nlohmann_json REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
include(${CMAKE_SOURCE_DIR}/cmake/modules.cmake)
add_library(moetrain_smpi_comm STATIC ${core_src} ${balance_src} ${comm_src} ${S}/tools/bench_a2a.cpp
            ${S}/tools/bench_driver.cpp)
target_include_directories(moetrain_smpi_comm PUBLIC ${S})
target_compile_definitions(moetrain_smpi_comm PUBLIC MOETRAIN_SMPI=1
                           MOETRAIN_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
target_link_libraries(moetrain_smpi_comm PUBLIC nlohmann_json::nlohmann_json ${CMAKE_DL_LIBS})
add_executable(moetrain_smpi_a2a ${S}/tools/smpi/bench_a2a_smpi.cpp)
target_link_libraries(moetrain_smpi_a2a PRIVATE moetrain_smpi_comm CLI11::CLI11)
# moetrain_smpi_step: one training step, communication only, compute injected from the planner's
# time model (src/tools/smpi/step_*.cpp). It links the planner and what the planner links (the
# model config, the dispatch layout, the pipeline schedules; cmake/modules.cmake's pieces), the
# grid, and the two kernels the layout runs (with the execution context they read).
add_library(moetrain_smpi_plan STATIC ${plan_src} ${model_config_src} ${moe_layout_src}
            ${parallel_schedule_src} ${io_src} ${S}/parallel/grid.cpp ${S}/kernels/permute.cpp
            ${S}/kernels/device_select.cpp ${S}/kernels/exec_context.cpp ${S}/kernels/gemm_bf16_cpu.cpp
            ${S}/tools/smpi/step_spec.cpp ${S}/tools/smpi/step_report.cpp)
target_link_libraries(moetrain_smpi_plan PUBLIC moetrain_smpi_comm)
add_executable(moetrain_smpi_step ${S}/tools/smpi/step_smpi.cpp)
target_link_libraries(moetrain_smpi_step PRIVATE moetrain_smpi_plan CLI11::CLI11)
