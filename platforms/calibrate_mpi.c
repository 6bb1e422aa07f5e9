/* Small-message cost of the real MPI on this machine (2 ranks), for the SMPI study's
 * per-message overhead and latency (platforms/calibrate.sh runs it):
 *   latency   half the round trip of an 8-byte ping-pong (best of REPS runs of ITERS)
 *   rate      8-byte messages per second, rank 0 -> rank 1, windows of WINDOW MPI_Isend/Irecv
 *             followed by a 1-byte ack (osu_mbw_mr style; best of REPS runs)
 * Prints one JSON object on rank 0. Best-of because the machine is shared: slower runs measure
 * other processes, not MPI. */
#include <mpi.h>
#include <stdio.h>

enum { ITERS = 20000, WINDOW = 64, WINDOWS = 400, REPS = 5 };

static double pingpong(int me) {
  char buf[8] = {0};
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < ITERS; ++i) {
    if (me == 0) {
      MPI_Send(buf, 8, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
      MPI_Recv(buf, 8, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(buf, 8, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf, 8, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
    }
  }
  return (MPI_Wtime() - t0) / ITERS / 2;
}

static double message_rate(int me) {
  char buf[WINDOW][8], ack = 0;
  MPI_Request req[WINDOW];
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int w = 0; w < WINDOWS; ++w) {
    for (int k = 0; k < WINDOW; ++k) {
      if (me == 0) MPI_Isend(buf[k], 8, MPI_CHAR, 1, 2, MPI_COMM_WORLD, &req[k]);
      else MPI_Irecv(buf[k], 8, MPI_CHAR, 0, 2, MPI_COMM_WORLD, &req[k]);
    }
    MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
    if (me == 0) MPI_Recv(&ack, 1, MPI_CHAR, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    else MPI_Send(&ack, 1, MPI_CHAR, 0, 3, MPI_COMM_WORLD);
  }
  return (double)WINDOW * WINDOWS / (MPI_Wtime() - t0);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n != 2) {
    if (me == 0) fprintf(stderr, "calibrate_mpi: needs exactly 2 ranks, got %d\n", n);
    MPI_Finalize();
    return 1;
  }
  double lat = 1e9, rate = 0;
  for (int r = 0; r < REPS; ++r) {
    double l = pingpong(me), m = message_rate(me);
    if (l < lat) lat = l;
    if (m > rate) rate = m;
  }
  if (me == 0)
    printf("{\"latency_us\": %.4f, \"msg_rate_per_s\": %.0f, \"overhead_us\": %.4f}\n", lat * 1e6, rate,
           1e6 / rate);
  MPI_Finalize();
  return 0;
}
