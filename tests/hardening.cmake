# Hardening tests (issue 15): hostile files, resource checks, flag validation, locks, stalled ranks.
# Included from the top-level CMakeLists.txt; MOETRAIN_MPIRUN and the moetrain target are defined there.
