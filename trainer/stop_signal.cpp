#include "trainer/stop_signal.h"

#include <csignal>

namespace flowtrain::trainer {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;  // the one process-global: signals need it
extern "C" void record_stop_signal(int sig) { g_stop_signal = sig; }
}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGTERM, SIGUSR1, SIGINT}) sigaction(sig, &action, nullptr);
}

int stop_signal() { return g_stop_signal; }

}  // namespace flowtrain::trainer
