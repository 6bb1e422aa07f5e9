# Hardening tests (issue 15): hostile files, resource checks, flag validation, locks, stalled ranks.
# Included from the top-level CMakeLists.txt; MOETRAIN_MPIRUN and the moetrain target are defined there.

# Hostile files (classes 1, 2 and the load side of 4): checkpoints reaching outside their folder,
# deep JSON at every entry point, size-overflow configs, NaN/Inf checkpoints, stray step-N folders.
add_test(NAME hostile_files COMMAND ${CMAKE_SOURCE_DIR}/tests/hostile_files.sh $<TARGET_FILE:moetrain>)
# 84 s in a Release build, 280 s under ASan on a 2-core CI machine: the limit is for hangs.
set_tests_properties(hostile_files PROPERTIES TIMEOUT 900)

# Runs that meet each other or a stalled machine (classes 3, 4, 6, 7): two runs on one folder,
# metrics kept, a FIFO as data, non-finite runs, stale export files, kill -STOP on one of 4 ranks
# with --comm.timeout 5, SIGTERM on one rank of 4. The script sets MOETRAIN_MPIRUN's environment
# and flags itself around the same mpirun (it needs mpirun's pid to find the ranks).
add_test(NAME run_guards
         COMMAND ${CMAKE_SOURCE_DIR}/tests/run_guards.sh $<TARGET_FILE:moetrain>
                 ${CMAKE_SOURCE_DIR}/data/kjv.txt ${MPIRUN_EXECUTABLE})
set_tests_properties(run_guards PROPERTIES LABELS "mpi" TIMEOUT 300)

# Issue 42, classes 7 and 8 (tests/hostile_flags.sh): ulimit -f in train and export (no MPI_Init
# for a lone process), an export that fails or is stopped halfway, metrics.jsonl not a plain file,
# stale temp files of a dead writer, and every numeric flag and stored manifest value out of its
# range (train/value_ranges.cpp). About 10 s in a Release build.
add_test(NAME hostile_flags COMMAND ${CMAKE_SOURCE_DIR}/tests/hostile_flags.sh $<TARGET_FILE:moetrain>)
set_tests_properties(hostile_flags PROPERTIES TIMEOUT 300)

# Issue 42, classes 3-6 (tests/hostile_data.sh): a dataset written as one unit (a second tokenize
# refused by pid, a failed or stopped tokenize leaving the dataset and its model untouched), one
# tokenizer identity (eval, generate, --resume refuse another one's dataset or model by
# fingerprint; a tampered sidecar), a .bin truncated under a running train (one line, a checkpoint,
# exit 1) or replaced at the same size (found at --resume), an overlapping .idx refused at once,
# SIGTERM during setup. About 7 s in a Release build (20 s beside other tests).
add_test(NAME hostile_data
         COMMAND ${CMAKE_SOURCE_DIR}/tests/hostile_data.sh $<TARGET_FILE:moetrain> ${CMAKE_SOURCE_DIR}/data/kjv.txt)
set_tests_properties(hostile_data PROPERTIES TIMEOUT 600)
