// Per-message software overhead for simulated runs (SimGrid SMPI builds, -DMOETRAIN_SMPI=ON).
// SMPI's network model is fluid: a message costs its bytes over the bottleneck bandwidth plus the
// links' latency, and posting 500 messages costs a rank no more time than posting one. A real
// MPI stack spends CPU time on every message (matching, descriptor setup, progress), and that is
// what separates an exchange of (p - 1) messages per rank from one of (nodes - 1). Every message
// a rank posts or receives through comm::Group is charged `seconds` of simulated CPU time
// (smpi_execute) before it is posted; SMPI's own per-Isend option (smpi/ois) does the same but
// made the simulation ~150x slower (NOTES §D4). Outside an SMPI build this is a no-op.
#pragma once

namespace moe::comm {

// Seconds charged per message sent and per message received (0 = off, the default).
void set_sim_message_overhead(double seconds);
double sim_message_overhead();
// Charges `messages` messages' overhead to the calling rank (SMPI builds only).
void charge_sim_messages(int messages);

}  // namespace moe::comm
