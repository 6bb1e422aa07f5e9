# A cluster on one machine (issue 39): scripts/cluster.sh makes nodes of network namespaces with
# veth uplinks to a bridge in its own namespace, and runs mpirun across them over TCP. cluster_smoke
# runs bench a2a (four exchanges, 2 nodes x 2 ranks, unlimited and 200 Mbit/s links), checks the
# topology moetrain detects, #wrong 0, that the rate is applied, 10 steps of EP 2 x DP 2 across the
# nodes against one host and one process, the link-cut fault, and that nothing of ours is left.
# SKIPPED (77) where namespaces cannot be made (not root, no iproute2, no CAP_NET_ADMIN) or
# without mpirun. Included from the top-level CMakeLists.txt.
add_test(NAME cluster_smoke
         COMMAND ${CMAKE_SOURCE_DIR}/tests/cluster.sh $<TARGET_FILE:moetrain> ${CMAKE_SOURCE_DIR})
set_tests_properties(cluster_smoke PROPERTIES LABELS "mpi" TIMEOUT 300 RUN_SERIAL TRUE
                     SKIP_RETURN_CODE 77)
# The four network faults with their figures (tests/cluster_faults.sh): a cut link, a killed node, a
# node slowed to 10 Mbit/s, a link that flaps; about 2 minutes, Release only ("long").
add_test(NAME cluster_faults
         COMMAND ${CMAKE_SOURCE_DIR}/tests/cluster_faults.sh $<TARGET_FILE:moetrain> ${CMAKE_SOURCE_DIR})
set_tests_properties(cluster_faults PROPERTIES LABELS "mpi;long" TIMEOUT 600 RUN_SERIAL TRUE
                     SKIP_RETURN_CODE 77)
