# Every test target and ctest registration (included from CMakeLists.txt when
# MOETRAIN_BUILD_TESTS is ON, the default): the unit tests, the test tools, the CUDA and emulated
# device tests, the PyTorch reference, the end-to-end scripts, MPI, fuzz, SMPI and cluster tests.
enable_testing()
file(GLOB MOETRAIN_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/*.cpp)
list(FILTER MOETRAIN_TEST_SOURCES EXCLUDE REGEX ".*/tests/tool_.*")
# The op table (tests/ops/): one description per kernel op, run by test_kernels.cpp and bench/.
add_executable(moetrain_tests ${MOETRAIN_TEST_SOURCES} ${MOETRAIN_OP_TABLE_SOURCES})
target_include_directories(moetrain_tests PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_link_libraries(moetrain_tests PRIVATE moetrain_lib moetrain_text GTest::gtest GTest::gtest_main)
include(GoogleTest)

# moetrain_script_test(NAME SCRIPT [NO_DIR] [SERIAL] TIMEOUT S [LABELS L...] [PROPERTIES P V...]):
# tests/SCRIPT run on the moetrain binary and the built-in corpus, with the scratch folder
# build/NAME as its third argument unless NO_DIR; SERIAL runs it alone.
function(moetrain_script_test name script)
  cmake_parse_arguments(T "NO_DIR;SERIAL" "TIMEOUT" "LABELS;PROPERTIES" ${ARGN})
  set(dir ${CMAKE_BINARY_DIR}/${name})
  if(T_NO_DIR)
    set(dir "")
  endif()
  add_test(NAME ${name} COMMAND ${CMAKE_SOURCE_DIR}/tests/${script} $<TARGET_FILE:moetrain>
                               ${CMAKE_SOURCE_DIR}/data/kjv.txt ${dir})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} ${T_PROPERTIES})
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
  if(T_SERIAL)
    set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE)
  endif()
endfunction()

gtest_discover_tests(moetrain_tests DISCOVERY_TIMEOUT 60)

# CUDA ops against the CPU kernels (forward, backward, the += contract): exits 77 (ctest: SKIPPED,
# never passed) where no GPU is visible; scripts/gpu_check.sh runs it on a machine with one.
if(MOETRAIN_HAVE_CUDA OR MOETRAIN_EMULATE_CUDA)
  file(GLOB MOETRAIN_CUDA_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cuda/*.cpp)
  # The op table's device mode (tests/ops/*.cpp with MOETRAIN_OP_DEVICE) drives every op.
  add_executable(moetrain_cuda_tests ${MOETRAIN_CUDA_TEST_SOURCES} ${MOETRAIN_OP_TABLE_SOURCES})
  target_include_directories(moetrain_cuda_tests PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_compile_definitions(moetrain_cuda_tests PRIVATE MOETRAIN_OP_DEVICE=1)
  # The kernels alone (no MPI, model or trainer): the ASan build of the SIMT shim's kernel tests
  # compiles only what they run.
  target_link_libraries(moetrain_cuda_tests PRIVATE moetrain_kernels)
  target_compile_definitions(moetrain_cuda_tests PRIVATE MOETRAIN_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
endif()
if(MOETRAIN_HAVE_CUDA)
  add_test(NAME cuda_ops COMMAND moetrain_cuda_tests)
  set_tests_properties(cuda_ops PROPERTIES SKIP_RETURN_CODE 77 LABELS "cuda")
elseif(MOETRAIN_EMULATE_CUDA)
  # The real kernels through the SIMT shim under three schedule seeds (0: index order; 1, 2:
  # shuffled fibers and blocks), and the shim's own refusals (bad launches, divergent barriers,
  # bad cuBLAS arguments).
  foreach(seed 0 1 2)
    add_test(NAME simt_kernels_seed${seed} COMMAND moetrain_cuda_tests --seed ${seed})
    set_tests_properties(simt_kernels_seed${seed} PROPERTIES LABELS "emulated-cuda" TIMEOUT 600)
  endforeach()
endif()

# Helper programs used by tests (tests/tool_*.cpp -> one executable each).
file(GLOB MOETRAIN_TEST_TOOLS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/tool_*.cpp)
foreach(src ${MOETRAIN_TEST_TOOLS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE moetrain_lib)
endforeach()

# The whole model on CUDA against the CPU in one process (loss, logits, every gradient, 20 AdamW
# steps); SKIPPED where no GPU is visible.
if(MOETRAIN_HAVE_CUDA)
  add_test(NAME cuda_model_parity COMMAND tool_device_parity --preset test-moe --steps 20)
  set_tests_properties(cuda_model_parity PROPERTIES SKIP_RETURN_CODE 77 LABELS "cuda")
  add_test(NAME cuda_model_parity_group COMMAND tool_device_parity --preset test-moe-group --steps 20)
  set_tests_properties(cuda_model_parity_group PROPERTIES SKIP_RETURN_CODE 77 LABELS "cuda")
  # DeepSeek-V3's architecture (MLA, MTP, sigmoid routing with the selection bias in groups).
  add_test(NAME cuda_model_parity_v3 COMMAND tool_device_parity --preset test-v3 --steps 20)
  set_tests_properties(cuda_model_parity_v3 PROPERTIES SKIP_RETURN_CODE 77 LABELS "cuda")
  # The other families (model/family.h): GQA, q/k/v biases, QK-norm, the gated shared expert.
  foreach(preset test-mixtral test-qwen2moe test-qwen3moe)
    add_test(NAME cuda_model_parity_${preset} COMMAND tool_device_parity --preset ${preset} --steps 20)
    set_tests_properties(cuda_model_parity_${preset} PROPERTIES SKIP_RETURN_CODE 77 LABELS "cuda")
  endforeach()
endif()

# The same on the emulated device (CI): the real .cu kernels through the SIMT shim against the CPU
# within the fp32 bounds of their reduction orders, bf16 within its bounds, and training /
# checkpoint / resume with --device cuda.
if(MOETRAIN_EMULATE_CUDA)
  foreach(p fp32 bf16)
    add_test(NAME emulated_model_parity_${p}
             COMMAND tool_device_parity --preset test-moe --steps 20 --precision ${p})
    set_tests_properties(emulated_model_parity_${p} PROPERTIES LABELS "emulated-cuda")
  endforeach()
  add_test(NAME emulated_model_parity_group
           COMMAND tool_device_parity --preset test-moe-group --steps 20 --precision fp32)
  set_tests_properties(emulated_model_parity_group PROPERTIES LABELS "emulated-cuda")
  add_test(NAME emulated_model_parity_v3
           COMMAND tool_device_parity --preset test-v3 --steps 10 --precision fp32)
  set_tests_properties(emulated_model_parity_v3 PROPERTIES LABELS "emulated-cuda")
  foreach(preset test-mixtral test-qwen2moe test-qwen3moe)
    add_test(NAME emulated_model_parity_${preset}
             COMMAND tool_device_parity --preset ${preset} --steps 20 --precision fp32)
    set_tests_properties(emulated_model_parity_${preset} PROPERTIES LABELS "emulated-cuda")
  endforeach()
  moetrain_script_test(emulated_device_train emulated_device.sh TIMEOUT 600 LABELS emulated-cuda)
  # Ranks on (emulated) GPUs: EP, DP, PP x EP, HALO and RBD with --device cuda == --device cpu bit
  # for bit, and a multi-rank device checkpoint resumed (mpirun).
  find_program(MPIRUN_FOR_EMULATED NAMES mpirun mpiexec)
  if(MPIRUN_FOR_EMULATED)
    add_test(NAME emulated_multirank_train
             COMMAND ${CMAKE_SOURCE_DIR}/tests/emulated_multirank.sh $<TARGET_FILE:moetrain>
                     ${CMAKE_SOURCE_DIR}/data/kjv.txt ${CMAKE_BINARY_DIR}/emulated_multirank
                     ${MPIRUN_FOR_EMULATED})
    set_tests_properties(emulated_multirank_train PROPERTIES LABELS "emulated-cuda" TIMEOUT 900)
  endif()
endif()

# PyTorch reference: the C++ side writes weights, a batch, logits, loss, every gradient, 10
# training losses and the weights after them; an independent PyTorch model recomputes them all
# (tests/reference/; final weights within 5e-6 relative).
find_program(SYSTEM_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
# The indexed-dataset reader is tested against files written by an independent Python writer
# (tests/fixtures/write_mmidx.py, numpy); without /usr/bin/python3 those tests skip.
target_compile_definitions(moetrain_tests PRIVATE MOETRAIN_SYSTEM_PYTHON3="${SYSTEM_PYTHON3}"
                           MOETRAIN_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
if(TARGET tool_ref_dump AND SYSTEM_PYTHON3)
  # test-moe: the issue's config (norm_topk_prob off, batch aux loss); test-moe-seqaux: the other
  # router branches (renormalised top-k weights, per-sequence aux loss); test-moe-noaux: DeepSeek-V3's
  # router (sigmoid, selection bias, routed_scaling_factor) and the bias update over the 10 steps;
  # test-moe-group / test-moe-v2group: group-limited routing (V3 noaux_tc, V2 group_limited_greedy).
  # test-mixtral / test-qwen2moe / test-qwen3moe: the other families (model/family.h) against
  # tests/reference/hf_moe_ref.py: GQA, q/k/v biases, QK-norm, gated shared expert, their routers.
  # DeepSeek-V2/V3 (issue 40): test-mla, multi-head latent attention with a query latent;
  # test-mla-noq, without it, with a value head wider than the query's and YaRN rope scaling (its
  # float32 reference drifts to 5.4e-6 on the final embedding: the torch side runs in float64);
  # test-v3, MLA with V3's router and a multi-token-prediction module.
  foreach(preset test-moe test-moe-seqaux test-moe-noaux test-moe-group test-moe-v2group
                 test-mixtral test-qwen2moe test-qwen3moe test-mla test-mla-noq test-v3)
    add_test(NAME torch_reference_${preset}
             COMMAND ${CMAKE_SOURCE_DIR}/tests/reference/run_reference.sh
                     $<TARGET_FILE:tool_ref_dump> ${SYSTEM_PYTHON3} ${CMAKE_BINARY_DIR}/torch_ref_${preset}
                     ${preset})
    set_tests_properties(torch_reference_${preset} PROPERTIES LABELS "reference" TIMEOUT 600)
  endforeach()
  set_tests_properties(torch_reference_test-mla-noq PROPERTIES ENVIRONMENT REF_DTYPE=float64)
  # test-moe at T = 150: attention over three of the CPU kernel's 64-row key blocks.
  add_test(NAME torch_reference_test-moe-T150
           COMMAND ${CMAKE_SOURCE_DIR}/tests/reference/run_reference.sh
                   $<TARGET_FILE:tool_ref_dump> ${SYSTEM_PYTHON3} ${CMAKE_BINARY_DIR}/torch_ref_test-moe-T150
                   test-moe fp32 150)
  set_tests_properties(torch_reference_test-moe-T150 PROPERTIES LABELS "reference" TIMEOUT 600)
  # --precision bf16 on the CPU: the reference rounds its GEMM inputs to bf16 too (tolerances in
  # deepseek_ref.py, BF16_WEIGHT_TOL); SKIPPED without oneDNN or AVX-512 BF16. test-moe-noaux is
  # not here yet: its gradients below the MoE layers differ by ~2e-3 in bf16 (not understood).
  foreach(preset test-moe)
    add_test(NAME torch_reference_${preset}_bf16
             COMMAND ${CMAKE_SOURCE_DIR}/tests/reference/run_reference.sh
                     $<TARGET_FILE:tool_ref_dump> ${SYSTEM_PYTHON3} ${CMAKE_BINARY_DIR}/torch_ref_${preset}_bf16
                     ${preset} bf16)
    set_tests_properties(torch_reference_${preset}_bf16 PROPERTIES LABELS "reference" TIMEOUT 600
                         SKIP_RETURN_CODE 77)
  endforeach()
endif()
# moetrain train --profile: the MoE step times in metrics.jsonl and the summary.
moetrain_script_test(train_profile profile.sh TIMEOUT 300)
# --time-budget: the chosen step count, its schedule, --steps N repeating it, resume keeping it.
moetrain_script_test(train_time_budget time_budget.sh TIMEOUT 300 LABELS mpi)
# --global-batch / --micro-batch: the same runs as --batch / --micro-batches on one process and
# on DP 2, one process against DP 2, the global batch in the run header (9 runs of 3 steps).
moetrain_script_test(batch_words batch_words.sh TIMEOUT 300 LABELS mpi)

# moetrain tokenize end to end: bytes and a small BPE, a Megatron-layout file from Python, train
# 3 steps on each; bad tokenize input.
moetrain_script_test(tokenize_cli tokenize.sh NO_DIR TIMEOUT 300)
# --precision bf16 on the CPU: 20 training steps against fp32 within a stated bound (SKIPPED
# without oneDNN or AVX-512 BF16).
moetrain_script_test(bf16_train bf16_train.sh TIMEOUT 300 PROPERTIES SKIP_RETURN_CODE 77)
# Bad input through the CLI: one-line errors, non-zero exit, nothing written.
# The module arrows are enforced by the build (CMakeLists.txt, moetrain_headers): tests/arrows/
# holds one allowed and three forbidden includes, each an object target built only by the test.
foreach(case plan_includes_model_config:plan plan_includes_comm:plan kernels_includes_comm:kernels
             model_includes_train:model)
  string(REPLACE ":" ";" parts ${case})
  list(GET parts 0 file)
  list(GET parts 1 module)
  add_library(arrows_${file} OBJECT EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/tests/arrows/${file}.cpp)
  target_link_libraries(arrows_${file} PRIVATE moetrain_${module})
endforeach()
add_test(NAME module_arrows COMMAND ${CMAKE_SOURCE_DIR}/tests/arrows.sh ${CMAKE_BINARY_DIR})
set_tests_properties(module_arrows PROPERTIES TIMEOUT 300)
# docs/cli.md is the binary's --help (scripts/cli_doc.sh): a flag added without regenerating it fails.
add_test(NAME cli_doc COMMAND sh -c "\"$0\" \"$1\" | diff -u \"$2\" - >&2"
                      ${CMAKE_SOURCE_DIR}/scripts/cli_doc.sh $<TARGET_FILE:moetrain> ${CMAKE_SOURCE_DIR}/docs/cli.md)
add_test(NAME cli_errors COMMAND ${CMAKE_SOURCE_DIR}/tests/cli_errors.sh $<TARGET_FILE:moetrain>)

# Multi-rank tests: real MPI processes launched with mpirun (tests/mpi/).
find_program(MPIRUN_EXECUTABLE NAMES mpirun mpiexec)
set(MOETRAIN_MPIRUN ${CMAKE_COMMAND} -E env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OPENBLAS_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1
    ${MPIRUN_EXECUTABLE} --oversubscribe --bind-to none)
if(EXISTS ${CMAKE_SOURCE_DIR}/tests/mpi/CMakeLists.txt)
  add_subdirectory(tests/mpi)
endif()

# Parallel parity: one process vs EP / DP / PP layouts (emulated nodes); flat vs rbd vs halo vs rbd-halo,
# 1F1B vs GPipe, recompute none/moe/full bit-identical; noaux: the aux-loss-free selection bias;
# migrate: expert migration bit-identical to no migration, across a resume; v3: DeepSeek-V3's
# architecture (MLA, MTP) on EP / DP / TP / PP (about 45 s); v3cfg: a scaled-down DeepSeek-V3
# config.json with the real field names on EP x PP, TP, EP (about 30 s).
foreach(suite ep pp noaux migrate v3 v3cfg)
  add_test(NAME parity_${suite}
           COMMAND ${CMAKE_SOURCE_DIR}/tests/parity.sh ${suite} $<TARGET_FILE:moetrain>
                   ${CMAKE_SOURCE_DIR}/data/kjv.txt ${CMAKE_BINARY_DIR}/parity_${suite})
  # "long": end-to-end runs of minutes that repeat code the unit tests and the shorter scripts
  # already drive; scripts/test.sh --sanitize leaves them out (-LE long), the Release run has them.
  # parity_noaux (under a minute) stays in the sanitizer run.
  set(labels "mpi;long")
  if(suite STREQUAL "noaux")
    set(labels "mpi")
  endif()
  set_tests_properties(parity_${suite} PROPERTIES LABELS "${labels}" TIMEOUT 900 RUN_SERIAL TRUE)
endforeach()
moetrain_script_test(cli_errors_mpi cli_errors_mpi.sh NO_DIR TIMEOUT 600 LABELS mpi)
# Pipeline memory from measured high-water marks: 1F1B in-flight micro-batches, recompute factors.
moetrain_script_test(pp_memory pp_memory.sh SERIAL TIMEOUT 600 LABELS mpi)
# ZeRO-1 (--zero1): parity with one process and with the plain layout (bit for bit where the
# sums agree), optimizer bytes and high-water marks, the planner's prediction, resume both ways.
moetrain_script_test(zero1 zero1.sh SERIAL TIMEOUT 600 LABELS mpi long)
# Tensor parallelism (--tp, SSMB): parity with one process (TP2, TP4, TP2xEP2, TP2xPP2,
# TP2xEP2xDP2 --zero1), the MoE token-row bytes divided by TP, ZeRO-1 shares, resume across TP degrees.
moetrain_script_test(tensor_parallel tp.sh SERIAL TIMEOUT 600 LABELS mpi long)
# Tensor-parallel plans: the train command `moetrain plan` prints for TP 2 layouts runs; the
# planner's per-rank memory for tp 1, 2, 4 (and tp x ep, tp x dp --zero1) within 5% of measured.
moetrain_script_test(tp_plan tp_plan.sh SERIAL TIMEOUT 600 LABELS mpi long)

# Checkpoints and faults end to end: resume bit for bit, kill -9 at random moments, resharding,
# SIGTERM, non-finite steps, a full disk.
moetrain_script_test(checkpoint_faults checkpoint.sh SERIAL TIMEOUT 900 LABELS mpi long)

# libFuzzer targets for the file parsers (-DMOETRAIN_FUZZ=ON, clang only): tests/fuzz, scripts/fuzz.sh.
option(MOETRAIN_FUZZ "build the libFuzzer targets in tests/fuzz (needs clang)" OFF)
if(MOETRAIN_FUZZ)
  add_subdirectory(tests/fuzz)
endif()

# Export: checkpoint -> Hugging Face folder, evaluated by the PyTorch reference.
if(SYSTEM_PYTHON3)
  add_test(NAME export_hf
           COMMAND ${CMAKE_SOURCE_DIR}/tests/export.sh $<TARGET_FILE:moetrain>
                   $<TARGET_FILE:tool_eval_loss> ${SYSTEM_PYTHON3} ${CMAKE_SOURCE_DIR}/data/kjv.txt
                   ${CMAKE_BINARY_DIR}/export_hf)
  set_tests_properties(export_hf PROPERTIES LABELS "mpi;reference" TIMEOUT 300)
  # DeepSeek-V3's architecture through export (MTP kept or dropped, selection biases), eval (PyTorch
  # from the export) and generate (about 20 s).
  add_test(NAME deepseek_v3_files
           COMMAND ${CMAKE_SOURCE_DIR}/tests/deepseek_v3.sh $<TARGET_FILE:moetrain> ${SYSTEM_PYTHON3}
                   ${CMAKE_SOURCE_DIR}/data/kjv.txt ${CMAKE_BINARY_DIR}/deepseek_v3_files)
  set_tests_properties(deepseek_v3_files PROPERTIES LABELS "mpi;reference" TIMEOUT 300)
  # Mixtral, Qwen2-MoE, Qwen3-MoE: train, export with the family's names, eval (against the
  # independent PyTorch model) and generate from the export (tests/families.sh).
  add_test(NAME families_cli
           COMMAND ${CMAKE_SOURCE_DIR}/tests/families.sh $<TARGET_FILE:moetrain> ${SYSTEM_PYTHON3}
                   ${CMAKE_SOURCE_DIR}/data/kjv.txt ${CMAKE_BINARY_DIR}/families_cli)
  set_tests_properties(families_cli PROPERTIES LABELS "reference" TIMEOUT 300)
endif()

# train --init-from FOLDER: an export continues where its run ended (held-out loss equal to
# `moetrain eval`), sharded / EP 2 / PP 2 / TP 2 / DP 2 ZeRO-1 equal one process, bf16 and fp16
# folders widen, bad tensors and disagreeing flags are one error line, a noaux bias loads.
add_test(NAME init_from
         COMMAND ${CMAKE_SOURCE_DIR}/tests/init_from.sh $<TARGET_FILE:moetrain> ${SYSTEM_PYTHON3}
                 ${CMAKE_BINARY_DIR}/init_from)
set_tests_properties(init_from PROPERTIES LABELS "mpi" TIMEOUT 300 RUN_SERIAL TRUE)

# moetrain upcycle: a dense model upcycled with identical experts and renormalised top-k starts at
# the dense model's loss (held-out and first step, to 1e-6), noise and shared experts move it, the
# upcycled model trains on EP 2, the folder is published whole and never over its input.
add_test(NAME upcycle
         COMMAND ${CMAKE_SOURCE_DIR}/tests/upcycle.sh $<TARGET_FILE:moetrain> ${SYSTEM_PYTHON3}
                 ${CMAKE_SOURCE_DIR}/data/kjv.txt ${CMAKE_BINARY_DIR}/upcycle)
set_tests_properties(upcycle PROPERTIES LABELS "mpi" TIMEOUT 300 RUN_SERIAL TRUE)

# 1F1B / GPipe bubble of balanced stages within 25% of (PP-1)/(M+PP-1) (bench pipeline).
add_test(NAME pipeline_bubble COMMAND ${CMAKE_SOURCE_DIR}/tests/bubble.sh $<TARGET_FILE:moetrain>)
set_tests_properties(pipeline_bubble PROPERTIES LABELS "mpi" TIMEOUT 300 RUN_SERIAL TRUE)
# The planner's memory predictions against measured high-water marks for 8 layouts of 1-8 ranks
# (scripts/plan_vs_measured.sh; step times are printed but judged only when run by hand).
add_test(NAME plan_vs_measured_memory
         COMMAND env PLAN_VS_MEASURED_CHECK=memory PLAN_VS_MEASURED_QUICK=1
                 ${CMAKE_SOURCE_DIR}/scripts/plan_vs_measured.sh $<TARGET_FILE:moetrain>
                 ${CMAKE_BINARY_DIR}/plan_vs_measured_test)
set_tests_properties(plan_vs_measured_memory PROPERTIES LABELS "mpi;long" TIMEOUT 900)

include(${CMAKE_SOURCE_DIR}/tests/hardening.cmake)
include(${CMAKE_SOURCE_DIR}/tests/generate.cmake)
include(${CMAKE_SOURCE_DIR}/tests/report.cmake)
include(${CMAKE_SOURCE_DIR}/tests/smpi/smpi.cmake)
include(${CMAKE_SOURCE_DIR}/tests/cluster.cmake)

if(MOETRAIN_EMULATE_CUDA)
  add_subdirectory(tests/fake_nccl)
endif()
