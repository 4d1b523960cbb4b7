// Linked into every test binary: a crash (segmentation fault, bus error, abort) prints the stack before
// the process dies, so that a CI log or a remote GPU run says where it happened without a debugger.
#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

namespace {

void report_and_die(int signal_number) {
  const char* name = strsignal(signal_number);
  const char header[] = "\n*** test binary crashed: ";
  (void)!write(STDERR_FILENO, header, sizeof(header) - 1);
  (void)!write(STDERR_FILENO, name, std::strlen(name));
  (void)!write(STDERR_FILENO, "\n", 1);
  void* frames[64];
  const int count = backtrace(frames, 64);
  backtrace_symbols_fd(frames, count, STDERR_FILENO);
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

const bool installed = [] {
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(s, report_and_die);
  return true;
}();

}  // namespace
