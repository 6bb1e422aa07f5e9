// SIGTERM / SIGINT during a run: install_stop_handlers (train/trainer.h) and the flag they set
// (g_stop_requested, train/run_setup.h), which the trainer and the comm timeout read.
#include <unistd.h>

#include <csignal>

#include "io/data_file.h"
#include "train/run_setup.h"
#include "train/trainer.h"

namespace moe::train {

volatile std::sig_atomic_t g_stop_requested = 0;  // read by the comm timeout (train/run_setup.h)

namespace {

// First signal: finish the step, checkpoint, return. Second: the user means it, end now (only
// async-signal-safe calls here).
void request_stop(int sig) {
  if (g_stop_requested) {
    static const char msg[] = "moetrain: second stop signal: exiting now, without a checkpoint\n";
    ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)n;
    _exit(128 + sig);
  }
  g_stop_requested = 1;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = request_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  io::set_stop_flag(&g_stop_requested);  // the dataset checks of setup stop too (issue 42, class 6)
}

}  // namespace moe::train
