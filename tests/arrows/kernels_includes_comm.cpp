// Forbidden: a kernel never sees a rank (DESIGN.md). tests/arrows.sh expects this file to fail to
// compile against moetrain_kernels.
#include "comm/exchange.h"
