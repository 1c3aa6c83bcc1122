/* Prints the native stack of a process that aborts or faults, then lets the signal end it
 * as before. scripts/gpu_check.sh preloads it (LD_PRELOAD) into the pytest run of the CUDA
 * tests, where Python's faulthandler shows only the Python frames of a C++ abort.
 *
 *   cc -shared -fPIC -o crash_backtrace.so scripts/crash_backtrace.c
 */
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void print_stack(int sig) {
  static const char header[] = "\n=== crash_backtrace: native stack\n";
  void* frames[128];
  const int n = backtrace(frames, 128);
  (void)!write(STDERR_FILENO, header, sizeof header - 1);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  signal(sig, SIG_DFL); /* then end as the signal would have */
  raise(sig);
}

/* Installed at load; faulthandler, installed later, restores this handler and raises the
 * signal again after printing the Python frames. */
__attribute__((constructor)) static void install(void) {
  signal(SIGABRT, print_stack);
  signal(SIGSEGV, print_stack);
}
