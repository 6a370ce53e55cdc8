/*
 * The poll verbs SHIFT installs on a context it took over (dp/poll.c).
 */
#ifndef SHIFT_DP_POLL_H
#define SHIFT_DP_POLL_H

#include <infiniband/verbs.h>
#include <limits.h>
#include <stdbool.h>

struct shift_ctx;
struct shift_dqp;

typedef int (*shift_poll_fn)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);

/* The fast poll_cq of a context (per slot; lean or full, split_cqs). */
shift_poll_fn shift_dp_fast_poll(const struct shift_ctx *s);
/* The poll_cq of a slow context: the failover layer's. */
int shift_dp_poll_slow(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
int shift_dp_req_notify_cq(struct ibv_cq *cq, int solicited_only);

/*
 * Polls inside a context's fast path (dp/poll.c): the failover layer judges
 * a QP's outstanding WRs only once its context is slow and none is left.
 * shift_dp_poll_busy: the word a context's fast polls count themselves in,
 * SHIFT_POLL_SLOW set while slow (shift_dp_poll_mark_slow, from
 * shift_ctx_set_slow). shift_dp_fast_polls_out: slow, and no poll inside
 * (a load); shift_dp_fast_polls_wait: until then (a poll inside never
 * waits for anything: call it holding no post_lock or SRQ lock).
 * shift_dp_poll_release: a poll handed over to the slow path leaves (busy
 * NULL: it held none).
 */
#define SHIFT_POLL_SLOW INT_MIN
int *shift_dp_poll_busy(struct shift_ctx *s);
void shift_dp_poll_mark_slow(struct shift_ctx *s, bool slow);
bool shift_dp_fast_polls_out(struct shift_ctx *s);
void shift_dp_fast_polls_wait(struct shift_ctx *s);
/* ... for at most max_looks looks of shift_backoff() (base/backoff.h):
 * false if a poll is still inside then */
bool shift_dp_fast_polls_out_within(struct shift_ctx *s, unsigned max_looks);
void shift_dp_poll_release(int *busy);
/* A poll into the fast path counted by busy (one locked add): false, and
 * out again, if the context is slow; shift_dp_poll_leave once what it took
 * is retired (one locked subtract). */
static inline bool shift_dp_poll_enter(int *busy)
{
	if (__builtin_expect(__atomic_add_fetch(busy, 1, __ATOMIC_SEQ_CST) >= 0, 1))
		return true;
	__atomic_fetch_sub(busy, 1, __ATOMIC_RELEASE);
	return false;
}

static inline void shift_dp_poll_leave(int *busy)
{
	__atomic_fetch_sub(busy, 1, __ATOMIC_RELEASE);
}
/* In the child of a fork: no poll is inside any slot's fast path (the
 * parent's threads that were are not here; the slots' next contexts are
 * the child's). */
void shift_dp_poll_fork_child(void);

/* s took its slot (s->slot, s->poll_cq set); d leaves s's last-polled
 * cache. */
void shift_dp_poll_slot_init(struct shift_ctx *s);
void shift_dp_poll_forget(struct shift_ctx *s, struct shift_dqp *d);

#endif /* SHIFT_DP_POLL_H */
