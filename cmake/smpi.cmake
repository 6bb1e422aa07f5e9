# -DMOETRAIN_SMPI=ON: the SimGrid SMPI build (its own build dir, e.g. build-smpi/). Everything the
# simulated program links is compiled with smpicxx (a library built by another compiler would
# miss SMPI's malloc/exit renaming, NOTES §D2): core/, balance/ and comm/ (the real exchange, the
# a2a benchmark), and one executable, moetrain_smpi_a2a, run under smpirun.
find_package(nlohmann_json REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
set(S ${CMAKE_SOURCE_DIR}/src)
foreach(m core balance comm)
  file(GLOB ${m}_src CONFIGURE_DEPENDS ${S}/${m}/*.cpp)
endforeach()
# moetrain calibrate measures this machine's real MPI: nothing to simulate.
list(REMOVE_ITEM comm_src ${S}/comm/calibrate.cpp)
add_library(moetrain_smpi_comm STATIC ${core_src} ${balance_src} ${comm_src})
target_include_directories(moetrain_smpi_comm PUBLIC ${S})
target_compile_definitions(moetrain_smpi_comm PUBLIC MOETRAIN_SMPI=1
                           MOETRAIN_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
target_link_libraries(moetrain_smpi_comm PUBLIC nlohmann_json::nlohmann_json ${CMAKE_DL_LIBS})
add_executable(moetrain_smpi_a2a ${S}/smpi/bench_a2a_smpi.cpp)
target_link_libraries(moetrain_smpi_a2a PRIVATE moetrain_smpi_comm CLI11::CLI11)
# moetrain_smpi_step: one training step, communication only, compute injected from the planner's
# time model (src/smpi/step_*.cpp). It links the planner and what it reads (model config, the
# dispatch layout's capacity, the pipeline schedules, the grid), all compiled with smpicxx too.
set(smpi_plan_src ${S}/model/config.cpp ${S}/model/presets.cpp ${S}/model/family.cpp ${S}/model/params.cpp ${S}/model/memory_sizes.cpp
    ${S}/moe/layout.cpp ${S}/kernels/permute.cpp ${S}/kernels/device_select.cpp
    ${S}/parallel/schedule.cpp ${S}/parallel/parallel_dims.cpp ${S}/parallel/grid.cpp
    ${S}/io/safetensors.cpp ${S}/io/data_file.cpp ${S}/io/output_file.cpp)
file(GLOB plan_src CONFIGURE_DEPENDS ${S}/plan/*.cpp)
add_library(moetrain_smpi_plan STATIC ${plan_src} ${smpi_plan_src} ${S}/smpi/step_spec.cpp
            ${S}/smpi/step_report.cpp)
target_link_libraries(moetrain_smpi_plan PUBLIC moetrain_smpi_comm)
add_executable(moetrain_smpi_step ${S}/smpi/step_smpi.cpp)
target_link_libraries(moetrain_smpi_step PRIVATE moetrain_smpi_plan CLI11::CLI11)
