// A diagnostic LD_PRELOAD library: on SIGSEGV / SIGBUS / SIGABRT it prints the faulting address,
// the instruction pointer and a native backtrace, each frame as "object+offset" so that
// `addr2line -f -C -i -e OBJECT OFFSET` names the source line. For machines without gdb (the GPU
// image). Build: gcc -shared -fPIC -O1 -o segv_backtrace.so dev/segv_backtrace.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static void print_frame(int i, void* addr) {
  Dl_info info;
  char line[1024];
  if (dladdr(addr, &info) && info.dli_fname) {
    snprintf(line, sizeof line, "segv: #%d %p %s+0x%lx (%s)\n", i, addr, info.dli_fname,
             (unsigned long)((char*)addr - (char*)info.dli_fbase),
             info.dli_sname ? info.dli_sname : "?");
  } else {
    snprintf(line, sizeof line, "segv: #%d %p ?\n", i, addr);
  }
  (void)!write(2, line, strlen(line));
}

static void on_fault(int sig, siginfo_t* si, void* uc_void) {
  ucontext_t* uc = (ucontext_t*)uc_void;
  char line[256];
  void* ip = (void*)uc->uc_mcontext.gregs[REG_RIP];
  snprintf(line, sizeof line, "segv: signal %d at address %p, ip %p, sp %p\n", sig, si->si_addr,
           ip, (void*)uc->uc_mcontext.gregs[REG_RSP]);
  (void)!write(2, line, strlen(line));
  print_frame(-1, ip);
  void* frames[64];
  int n = backtrace(frames, 64);
  for (int i = 0; i < n; ++i) print_frame(i, frames[i]);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  static char stack[1 << 16];
  stack_t ss = {.ss_sp = stack, .ss_size = sizeof stack, .ss_flags = 0};
  sigaltstack(&ss, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, NULL);
  sigaction(SIGBUS, &sa, NULL);
  sigaction(SIGABRT, &sa, NULL);
}
