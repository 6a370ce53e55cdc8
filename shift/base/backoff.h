/*
 * Waiting for another thread of this process (a lock's holder, a poll
 * inside the fast path) without taking the CPU it may need: one look of
 * the wait at a time, each a little longer than the last.
 */
#ifndef SHIFT_BASE_BACKOFF_H
#define SHIFT_BASE_BACKOFF_H

/* Looks that only spin (a holder on another CPU is done within them) and
 * the yields after them; then the looks sleep, from SHIFT_BACKOFF_SLEEP_US
 * doubling to SHIFT_BACKOFF_SLEEP_MAX_US. */
#define SHIFT_BACKOFF_SPINS 256u
#define SHIFT_BACKOFF_YIELDS 64u
#define SHIFT_BACKOFF_SLEEP_US 20
#define SHIFT_BACKOFF_SLEEP_MAX_US 200

/*
 * One look of a wait; *looks counts them (0 before the first). A spin hint
 * for the first SHIFT_BACKOFF_SPINS, then sched_yield(), then a sleep:
 * the thread waited for may be on this very CPU (a one-vCPU guest: soft-
 * RoCE transmits inside post_send, under the poster's lock), and a yield
 * does not give the CPU away on every scheduler (CFS picks the yielder
 * again while it is far enough behind), where a sleep does.
 */
void shift_backoff(unsigned *looks);

/* How many looks of this thread's waits yielded and slept so far (a
 * failover's timing line says how often its start waited so). */
void shift_backoff_counts(unsigned *yields, unsigned *sleeps);

#endif /* SHIFT_BASE_BACKOFF_H */
