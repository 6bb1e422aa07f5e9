// Simulated per-message overhead. See sim_overhead.h.
#include "comm/sim_overhead.h"

#ifdef MOETRAIN_SMPI
#include <smpi/smpi.h>
#endif

#include "core/error.h"

namespace moe::comm {
namespace {
// One value per rank: SMPI privatises the executable's globals per simulated rank, and every
// rank sets it from its own command line.
double g_overhead_s = 0;
}  // namespace

void set_sim_message_overhead(double seconds) {
  MOE_CHECK(seconds >= 0 && seconds < 1, "simulated per-message overhead must be in [0, 1) s, got ",
            seconds);
#ifndef MOETRAIN_SMPI
  MOE_CHECK(seconds == 0, "a simulated per-message overhead needs the SMPI build (-DMOETRAIN_SMPI=ON)");
#endif
  g_overhead_s = seconds;
}

double sim_message_overhead() { return g_overhead_s; }

void charge_sim_messages(int messages) {
#ifdef MOETRAIN_SMPI
  if (g_overhead_s > 0 && messages > 0) smpi_execute(g_overhead_s * messages);
#else
  (void)messages;
#endif
}

}  // namespace moe::comm
