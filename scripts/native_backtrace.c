/* Preloaded (LD_PRELOAD) by scripts/gpu_check.sh for the torch steps: on SIGSEGV, SIGBUS or
   SIGABRT it writes the native call stack to stderr, then dies by the same signal. Python's
   faulthandler shows only Python frames, and the GPU machine may have no debugger. */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void say(const char* text) { (void)!write(2, text, strlen(text)); }

static void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  (void)context;
  char address[2 + 16 + 2] = "0x";
  unsigned long value = (unsigned long)info->si_addr;
  int digits = 1;
  for (unsigned long rest = value >> 4; rest; rest >>= 4) ++digits;
  for (int i = digits - 1; i >= 0; --i, value >>= 4) address[2 + i] = "0123456789abcdef"[value & 15];
  address[2 + digits] = '\n';
  address[3 + digits] = '\0';
  say("\n=== native backtrace: ");
  say(strsignal(sig));
  /* si_addr is the faulting address only for a signal the kernel raised (si_code > 0). */
  say(info->si_code > 0 ? " at address " : " (sent, not a fault)\n");
  if (info->si_code > 0) say(address);
  void* frames[96];
  backtrace_symbols_fd(frames, backtrace(frames, 96), 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_fatal_signal;
  action.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigaction(SIGSEGV, &action, 0);
  sigaction(SIGBUS, &action, 0);
  sigaction(SIGABRT, &action, 0);
}
