# `moetrain generate` and the golden loss curves. Included from the top-level CMakeLists.txt;
# SYSTEM_PYTHON3, MPIRUN_EXECUTABLE and the moetrain target are defined there.

# Greedy decoding with the KV cache equals the PyTorch reference's greedy decoding of an exported
# model token for token; checkpoint == export; seeds reproducible; bad input one line (5 s).
if(SYSTEM_PYTHON3)
  add_test(NAME generate_greedy_reference
           COMMAND ${CMAKE_SOURCE_DIR}/tests/generate.sh $<TARGET_FILE:moetrain> ${SYSTEM_PYTHON3}
                   ${CMAKE_SOURCE_DIR}/data/kjv.txt ${CMAKE_BINARY_DIR}/generate_greedy_reference)
  set_tests_properties(generate_greedy_reference PROPERTIES LABELS "reference" TIMEOUT 300)
endif()

# generate --device cuda == --device cpu token for token on the emulated device (CI: its memory
# faults when host code touches it outside kernels and device copies). On a GPU machine the same
# script runs by hand: tests/generate_device.sh build-gpu/moetrain data/kjv.txt /tmp/gd.
if(MOETRAIN_EMULATE_CUDA)
  add_test(NAME generate_device
           COMMAND ${CMAKE_SOURCE_DIR}/tests/generate_device.sh $<TARGET_FILE:moetrain>
                   ${CMAKE_SOURCE_DIR}/data/kjv.txt ${CMAKE_BINARY_DIR}/generate_device)
  set_tests_properties(generate_device PROPERTIES LABELS "emulated-cuda" TIMEOUT 300)
endif()

# Golden loss curves (scripts/golden.sh, tests/golden/): bit for bit. Measured bit-exact on the
# Release build and on the sanitizer build (RelWithDebInfo -O2 + ASan/UBSan: tiny-50 in 61 s,
# pp2-ep2-30 in 13 s), so both builds compare exactly; for another compiler or BLAS run ctest
# with MOETRAIN_GOLDEN_RTOL=1e-3 in the environment (README), which golden.sh reads.
foreach(c tiny-50 pp2-ep2-30)
  add_test(NAME golden_${c}
           COMMAND ${CMAKE_SOURCE_DIR}/scripts/golden.sh --bin $<TARGET_FILE:moetrain>
                   --work ${CMAKE_BINARY_DIR}/golden ${c})
  if(c MATCHES "^pp")
    set_tests_properties(golden_${c} PROPERTIES LABELS "golden;mpi;long" TIMEOUT 300 RUN_SERIAL TRUE)
  else()
    set_tests_properties(golden_${c} PROPERTIES LABELS "golden;long" TIMEOUT 300)
  endif()
endforeach()
