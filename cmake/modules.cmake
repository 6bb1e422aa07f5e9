# The modules' source lists, one per library target, shared by the main build (CMakeLists.txt)
# and the SimGrid SMPI build (cmake/smpi.cmake): <target>_src for every target below.
#   folder targets: core balance io kernels comm moe model parallel plan train text report tools
#   pure pieces with targets of their own (so the planner links no MPI): model_config (config,
#   families, parameter layout, size functions), moe_layout (the padding-free layout) and
#   parallel_schedule (dims, pipeline schedules).
# <target>_headers: the headers each target exposes (moetrain_module below), in the same split.
set(S ${CMAKE_SOURCE_DIR}/src)
set(moetrain_folder_modules core balance io kernels comm moe model parallel plan train text report tools)
foreach(m ${moetrain_folder_modules})
  file(GLOB ${m}_src CONFIGURE_DEPENDS ${S}/${m}/*.cpp)
  file(GLOB ${m}_headers CONFIGURE_DEPENDS ${S}/${m}/*.h ${S}/${m}/*.inc)
endforeach()
# The kernels expose their CUDA backend's and SIMT shim's headers too (src/kernels/{cuda,simt}/).
file(GLOB kernels_sub_headers CONFIGURE_DEPENDS ${S}/kernels/cuda/*.h ${S}/kernels/cuda/*.cuh
     ${S}/kernels/simt/*.h)
list(APPEND kernels_headers ${kernels_sub_headers})
# moetrain_piece(TARGET FOLDER STEMS...): TARGET takes FOLDER/STEM.cpp and FOLDER/STEM.h from
# the folder's target (a header-only stem moves its header alone, a source-only stem its source).
macro(moetrain_piece target folder)
  set(${target}_src "")
  set(${target}_headers "")
  foreach(stem ${ARGN})
    if(EXISTS ${S}/${folder}/${stem}.cpp)
      list(APPEND ${target}_src ${S}/${folder}/${stem}.cpp)
      list(REMOVE_ITEM ${folder}_src ${S}/${folder}/${stem}.cpp)
    endif()
    if(EXISTS ${S}/${folder}/${stem}.h)
      list(APPEND ${target}_headers ${S}/${folder}/${stem}.h)
      list(REMOVE_ITEM ${folder}_headers ${S}/${folder}/${stem}.h)
    endif()
  endforeach()
endmacro()
moetrain_piece(model_config model config config_fields presets family params memory_sizes)
moetrain_piece(moe_layout moe layout)
moetrain_piece(parallel_schedule parallel schedule parallel_dims)
