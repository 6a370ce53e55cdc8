/*
 * Deferred frees: memory that a lock-free reader may still hold when its
 * owner lets go of it. The data path reads the context table, the QP
 * lookup tables and each context's last-polled QP without a lock, so a
 * destroyed QP's state, a closed context and a table that grew cannot be
 * freed on the spot: they wait here for shift_config.free_grace_ms (one
 * second; 0 in an inline run, which has no concurrent reader), far longer
 * than any post or poll stays inside SHIFT, and are freed by the next
 * reclaim: each background pass, and each new entry.
 */
#ifndef SHIFT_DP_LIMBO_H
#define SHIFT_DP_LIMBO_H

/* Free p with fn(p) once no reader can hold it any more. If no entry can
 * be allocated, p is leaked (counted: shift_limbo_leaked()), never freed
 * early. */
void shift_limbo_put(void *p, void (*fn)(void *p));
/* Free what has waited long enough. */
void shift_limbo_reclaim(void);
/* Entries waiting, and memory given up for lack of an entry (tests). */
unsigned long shift_limbo_waiting(void);
unsigned long shift_limbo_leaked(void);

/* fork() (shift/fork.c, through shift_dp_fork_*): the list stays whole
 * across it (done: in the parent and in the child alike). */
void shift_limbo_fork_prepare(void);
void shift_limbo_fork_done(void);

#endif /* SHIFT_DP_LIMBO_H */
