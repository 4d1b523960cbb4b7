#include "ptrain/cli/stop_signals.h"

#include <signal.h>

namespace ptrain::cli {

namespace {

volatile sig_atomic_t first_signal = 0;
struct sigaction previous_term {}, previous_int {};

// Only async-signal-safe calls here: a flag, and for a second signal the default action again.
void on_stop_signal(int signal_number) {
  if (first_signal != 0) {
    ::signal(signal_number, SIG_DFL);
    ::raise(signal_number);
    return;
  }
  first_signal = signal_number;
}

void install(int signal_number, const struct sigaction& action, struct sigaction& previous) {
  ::sigaction(signal_number, nullptr, &previous);
  // A signal ignored from the start stays ignored, as whoever started the process meant it: a background
  // job of a shell without job control ignores SIGINT, and a Ctrl-C at the terminal is not for it.
  if (previous.sa_handler == SIG_IGN) return;
  ::sigaction(signal_number, &action, nullptr);
}

}  // namespace

StopSignals::StopSignals() {
  first_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  // Restarted system calls: a read in the data loader must not fail with EINTR because of the first signal.
  action.sa_flags = SA_RESTART;
  install(SIGTERM, action, previous_term);
  install(SIGINT, action, previous_int);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGTERM, &previous_term, nullptr);
  ::sigaction(SIGINT, &previous_int, nullptr);
}

int StopSignals::received() { return first_signal; }

}  // namespace ptrain::cli
