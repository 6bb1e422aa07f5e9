// Forbidden: the planner is pure arithmetic and must not see MPI (DESIGN.md). tests/arrows.sh
// expects this file to fail to compile against moetrain_plan.
#include "comm/group.h"
