// Simulated per-message overhead. See sim_overhead.h.
#include "comm/sim_overhead.h"

#ifdef MOETRAIN_SMPI
#include <simgrid/host.h>
#include <smpi/smpi.h>
#endif

#include "core/error.h"

namespace moe::comm {
namespace {
// One value per rank: SMPI privatises the executable's globals per simulated rank, and every
// rank sets it from its own command line.
double g_overhead_s = 0;
long long g_pending = 0;  // messages noted since the last charge
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

void note_sim_messages(int messages) { g_pending += messages; }

void charge_sim_messages() {
#ifdef MOETRAIN_SMPI
  // smpi_execute(seconds) scales by smpi/host-speed (a benchmark factor), so the time is given as
  // flops at this host's speed: exactly g_overhead_s per message on a core of its own.
  if (g_overhead_s > 0 && g_pending > 0)
    smpi_execute_flops(g_overhead_s * static_cast<double>(g_pending) * sg_host_get_speed(sg_host_self()));
#endif
  g_pending = 0;
}

}  // namespace moe::comm
