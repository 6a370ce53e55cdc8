/*
 * Are the application's threads all asleep in the kernel? (quiesce.c)
 *
 * A context's polls leave its fast path (a few hundred instructions that
 * make no system call) when it goes slow (shift_ctx_set_slow); a poll that
 * loaded the fast path just before may still be inside it, and the
 * background pass lets it finish before it takes the context's CQs over:
 * a grace period (fo/background.c). A thread seen sleeping in the kernel
 * after the switch (state S: a system call that waits, such as a passive
 * server's read on its socket or get_cq_event) cannot be inside that fast
 * path, and when every thread but SHIFT's own is, the grace may end at
 * once. Any other state (running, runnable: it may have been preempted
 * there; D: a page fault inside it), too many threads or /proc unreadable
 * mean no. (A thread that entered the slow path from the fast one and
 * waits there for slow_lock sleeps too: it is the slow path's, as when
 * the grace runs out under it. The premise is a provider whose poll_cq
 * makes no system call that sleeps, as every userspace-queue provider:
 * mlx5, rxe, siw, efa, hns.) A thread that spins on its CQ (NCCL's proxy
 * thread, perftest) is never asleep; once it has left a slow poll of the
 * context after the switch it is not inside the fast path either, and the
 * caller names it in out (dp/ctx.h, slow_polled).
 */
#ifndef SHIFT_BASE_QUIESCE_H
#define SHIFT_BASE_QUIESCE_H

#include <stdbool.h>

/* SHIFT's own threads (the RNICs' background threads), which never poll
 * for the application: the calling thread registers itself, and leaves
 * before it exits. At most SHIFT_QUIESCE_OWN; past them, registration is a
 * no-op (those threads then keep the grace period in force). */
#define SHIFT_QUIESCE_OWN 64
void shift_quiesce_register(void);
void shift_quiesce_unregister(void);

/* Is every thread of the process, but the caller, SHIFT's own and the n
 * in out (known to be outside the fast path: dp/ctx.h, slow_polled),
 * asleep in the kernel (state S) now? Reads /proc/self/task (at most
 * SHIFT_QUIESCE_MAX_THREADS of them). */
#define SHIFT_QUIESCE_MAX_THREADS 512
bool shift_quiesce_others_asleep(const int *out, unsigned n);
/* The calling thread's id (gettid), kept per thread after the first call
 * (shift_quiesce_fork_child forgets the forking thread's). */
int shift_quiesce_tid(void);
/* In the child of a fork (shift/fork.c): what the parent's checks kept
 * open names the parent's threads. */
void shift_quiesce_fork_child(void);

#endif
