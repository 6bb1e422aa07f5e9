// Per-message software overhead for simulated runs (SimGrid SMPI builds, -DMOETRAIN_SMPI=ON).
// SMPI's network model is fluid: a message costs its bytes over the bottleneck bandwidth plus the
// links' latency, and posting 500 messages costs a rank no more time than posting one. A real
// MPI stack spends CPU time on every message (matching, descriptor setup, progress), and that is
// what separates an exchange of (p - 1) messages per rank from one of (nodes - 1).
// comm::Group notes every message a rank posts or receives (note_sim_messages) and charges the
// noted messages' overhead as simulated CPU time (smpi_execute_flops) when the rank next completes a
// wait or a collective (charge_sim_messages): the overhead adds to the rank's time and overlaps
// the transfers it posted. Charging at each post instead (as SMPI's smpi/ois does) staggers the
// flows and made the simulation far slower (NOTES §D4: ~150x; here P = 64 ran > 10 min).
// Outside an SMPI build this is a no-op.
#pragma once

namespace moe::comm {

// Seconds per message sent and per message received (0 = off, the default).
void set_sim_message_overhead(double seconds);
double sim_message_overhead();
// Notes `messages` messages of the calling rank; charges every noted message (SMPI builds only).
void note_sim_messages(int messages);
void charge_sim_messages();

}  // namespace moe::comm
