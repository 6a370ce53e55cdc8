/*
 * The peer's backup rkeys a failover needs (the cache the background pass
 * fills from the KV store, fo/kvq.c; never KV I/O here).
 *
 * A failover on an application thread only notes the keys it needs:
 * fo_rk_lookup() marks a key it does not have as wanted. A send WR whose
 * peer key is not read yet is held, with every WR after it
 * (fo_post_bk_send()): the WRs are in the mirror, the post succeeds, and
 * the background pass posts them on the backup once the key is read
 * (fo_held_release()). A key read after the failover started is used. One
 * known before it (read from the store or the peer's mailbox, or listed
 * in the peer's MR index, shadow/mrindex.c) is used at once and read
 * again behind the WRs to confirm it (rk_at_once(); a changed one is used
 * from then on, logged and counted): waiting for that read held every
 * write and read of a failover on the testbed for 2 to 60 ms. A key still
 * unread SHIFT_KV_WAIT_MS after it was first wanted (the store gone, slow
 * or empty; or the key absent while the store failed within
 * SHIFT_KV_WAIT_MS, as the peer may not have written its records again
 * yet) counts as absent: the WR fails as a key the peer never published
 * fails on the default path, no wait without bound. A key absent from a
 * store that kept answering fails at once. One the store cannot give,
 * with none read before, is also asked of the peer itself over the backup
 * path (the key mailbox, fo/mbox.c).
 *
 * The read-ahead: once a second the background pass notes the peer keys of
 * the newest send WRs in each Default-state QP's mirror and reads them, so
 * that a failover, the store gone, dripping, emptied or garbled or not,
 * has a backup key at once. A key known before cannot send data anywhere
 * else: a backup key names a backup MR of the same peer process and PD, on
 * the same virtual memory as the application's MR; one the peer has
 * deregistered since fails at its NIC (remote access error), as the
 * application's stale key would.
 */
#include "shift/fo/fo_int.h"
#include "shift/dp/nwq.h"

#define RK_MAX 4096       /* keys one QP keeps */
#define RK_AHEAD_MS 1000  /* read-ahead period, per QP */
#define RK_AHEAD_WALK 64  /* newest mirrored send WRs one read-ahead looks at */

/* A send WR that names a peer key. */
static bool remote_op(unsigned opcode)
{
	return opcode == IBV_WR_RDMA_WRITE || opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
	       opcode == IBV_WR_RDMA_READ || shift_wr_is_atomic(opcode);
}

struct shift_rkey_val fo_rk_val(const struct shift_mr_value *mv)
{
	return (struct shift_rkey_val){ .bk = mv->bk_rkey, .ranged = mv->has_range,
					.addr = mv->addr, .len = mv->len };
}

static struct shift_rkey *rk_add(struct shift_dqp *d, uint32_t app)
{
	if (d->rk_n == d->rk_cap) {
		unsigned cap = d->rk_cap ? d->rk_cap * 2 : 8;
		struct shift_rkey *n;

		if (cap > RK_MAX || !(n = realloc(d->rk, cap * sizeof(*n))))
			return NULL;
		d->rk = n;
		d->rk_cap = cap;
	}
	struct shift_rkey *e = &d->rk[d->rk_n++];
	struct shift_mr_value mv;

	memset(e, 0, sizeof(*e));
	e->app = app;
	e->st = SHIFT_RK_WANT;
	e->want_ms = shift_clock_ms();
	/* (a key the peer's MR index led the RNIC's thread to read ahead:
	 * as one read before, the fallback when the store cannot tell) */
	if (d->shadow && shift_shadow_peer_mr(d->shadow, app, &mv)) {
		e->prev = fo_rk_val(&mv);
		e->has_prev = true;
	}
	return e;
}

/*
 * The store cannot give e's backup key now (unreachable, too slow, the key
 * absent or unreadable): use the one an earlier read gave, if any (see the
 * read-ahead above); else e is absent. rk_lock held. True if known now;
 * *say: the caller logs it (rk_earlier_say(), after rk_lock), the first of
 * this failover.
 */
bool fo_rk_earlier(struct shift_dqp *d, struct shift_rkey *e, uint64_t now, bool *say)
{
	*say = !d->rk_earlier_said;
	d->rk_earlier_said = true;
	e->at_ms = now;
	if (!e->has_prev) {
		e->st = SHIFT_RK_ABSENT;
		return false;
	}
	e->st = SHIFT_RK_KNOWN;
	e->v = e->prev;
	__atomic_fetch_add(&shift_stats.rkeys_earlier, 1, __ATOMIC_RELAXED);
	return true;
}

/*
 * A failover's key known before it started: e's (read from the store or
 * the peer's mailbox), or the one the peer's MR index led the RNIC's thread
 * to read (prev). It is used at once, not held for a read of the store:
 * a key changes only when the peer registers its memory anew, and a stale
 * one cannot send data elsewhere (the backup MR it names registers the
 * same memory of the same peer process; gone, the peer's NIC refuses the
 * WR). The confirming read (e->confirm) follows it, once per failover.
 * rk_lock held.
 */
static bool rk_at_once(struct shift_rkey *e)
{
	if (e->confirm)
		return e->st == SHIFT_RK_KNOWN;
	/* (never read itself: prev is the MR index's; one read absent since,
	 * or asked of the peer, waits for its answer) */
	if (e->st == SHIFT_RK_WANT && e->has_prev && !e->ask && !e->at_ms) {
		e->st = SHIFT_RK_KNOWN;
		e->v = e->prev;
	}
	if (e->st != SHIFT_RK_KNOWN)
		return false;
	e->confirm = true;
	e->ahead = false;
	__atomic_fetch_add(&shift_stats.rkeys_at_once, 1, __ATOMIC_RELAXED);
	return true;
}

void fo_rk_earlier_say(const struct shift_dqp *d, uint32_t app, bool known)
{
	shift_warn("%s QP %u: the KV store cannot give the peer's backup key for rkey %u now: "
		   "%s (and for any other such key of this failover)", d->dev, d->qpn, app,
		   known ? "the one read before the failover is used" :
			   "none was read before, its WR fails as on the default path");
}

/* [addr, addr + len) inside the range v's MR answers to (if it told)? */
static bool rk_covers(const struct shift_rkey_val *v, uint64_t addr, uint64_t len)
{
	return !v->ranged || (addr >= v->addr && len <= v->len && addr - v->addr <= v->len - len);
}

int fo_rk_lookup(struct shift_dqp *d, uint32_t app, uint64_t addr, uint64_t len, uint32_t *bk)
{
	struct shift_rkey *e;
	bool timed_out = false, say = false, outside = false;
	int rc;

	pthread_mutex_lock(&d->rk_lock);
	/* (read under the lock: an entry another thread made is never newer) */
	uint64_t now = shift_clock_ms();

	e = fo_rk_find(d, app);
	if (e && e->st != SHIFT_RK_WANT && e->at_ms >= d->rk_since_ms) {
		rc = e->st == SHIFT_RK_KNOWN ? 0 : -1;
		*bk = e->v.bk;
	} else if (!e && !(e = rk_add(d, app))) {
		rc = -1;
	} else if (rk_at_once(e)) {
		/* known before this failover (read from the store, the peer's
		 * mailbox or its MR index): used at once, read again behind
		 * the WRs to confirm it (apply_rk) */
		rc = 0;
		*bk = e->v.bk;
		d->rk_want = true;
	} else {
		if (e->st != SHIFT_RK_WANT || e->ahead) { /* (stale: read it again) */
			e->st = SHIFT_RK_WANT;
			e->want_ms = now;
			e->ahead = false;
			e->ask = false;
		}
		rc = now >= e->want_ms && now - e->want_ms >= shift_config.kv_wait_ms ? -1 : 1;
		if (rc > 0) {
			d->rk_want = true;
		} else { /* (given up for this failover: said once) */
			timed_out = !fo_rk_earlier(d, e, now, &say);
			rc = timed_out ? -1 : 0;
			*bk = e->v.bk;
		}
	}
	if (rc == 0 && len && !rk_covers(&e->v, addr, len)) {
		/* (not memory of that MR: refused as the peer's NIC refuses
		 * it on the default path, whatever the backup key allows) */
		outside = true;
		rc = -1;
	}
	pthread_mutex_unlock(&d->rk_lock);
	if (outside) {
		__atomic_fetch_add(&shift_stats.rkeys_outside, 1, __ATOMIC_RELAXED);
		shift_debug("%s QP %u: %llu bytes at %#llx are outside the peer's MR of rkey %u: "
			    "refused", d->dev, d->qpn, (unsigned long long)len,
			    (unsigned long long)addr, app);
	}
	if (rc < 0 && !e)
		shift_warn("%s QP %u: more than %u peer keys: rkey %u counts as unknown", d->dev,
			   d->qpn, RK_MAX, app);
	else if (timed_out)
		shift_warn("%s QP %u: the peer's backup key for rkey %u could not be read from the "
			   "KV store within %u ms (SHIFT_KV_WAIT_MS): its WR fails as on the "
			   "default path", d->dev, d->qpn, app, shift_config.kv_wait_ms);
	else if (say)
		fo_rk_earlier_say(d, app, true);
	if (rc > 0)
		__atomic_fetch_add(&shift_stats.rkeys_waited, 1, __ATOMIC_RELAXED);
	return rc;
}

/* Any backup key of the peer's known (for fo/common.c's reject_remotely). */
bool fo_rk_any(struct shift_dqp *d, uint32_t *bk)
{
	bool found = false;

	pthread_mutex_lock(&d->rk_lock);
	for (unsigned i = 0; i < d->rk_n && !found; i++) {
		if (d->rk[i].st == SHIFT_RK_KNOWN && d->rk[i].at_ms >= d->rk_since_ms) {
			*bk = d->rk[i].v.bk;
			found = true;
		}
	}
	pthread_mutex_unlock(&d->rk_lock);
	return found;
}

/* A failover starts (its CQs locked): keys read before now are stale; the
 * keys of its outstanding WRs are wanted now, read while the handshake
 * runs. */
void fo_rk_failover(struct shift_dqp *d)
{
	uint32_t bk;

	pthread_mutex_lock(&d->rk_lock);
	d->rk_since_ms = shift_clock_ms();
	d->rk_earlier_said = false;
	pthread_mutex_unlock(&d->rk_lock);
	shift_dqp_lock(d);
	shift_dqp_sync_locked(d);
	for (uint64_t i = d->sq_tail; i < d->sq_head; i++) {
		struct shift_swqe *e = shift_dqp_swqe(d, i);

		if (remote_op(e->opcode) && e->num_sge != SHIFT_WQE_NATIVE)
			(void)fo_rk_lookup(d, e->rkey, 0, 0, &bk);
	}
	shift_dqp_unlock(d);
}

/*
 * The read-ahead (see the top; background, slow_lock): the peer keys of the
 * newest send WRs mirrored since the last one (outstanding or completed),
 * wanted if new, and those still unread wanted again. It holds post_lock
 * for a walk of at most RK_AHEAD_WALK entries, no I/O.
 */
void fo_rk_read_ahead(struct shift_dqp *d, uint64_t now)
{
	if (!d->shadow || shift_dqp_send_state(d) != SHIFT_SEND_DEFAULT || now < d->rk_scan_at)
		return;
	d->rk_scan_at = now + RK_AHEAD_MS;
	shift_dqp_lock(d);
	/* (completed WRs too: the ring keeps the last sq_size WRs posted) */
	uint64_t head = d->sq_head, walk = d->sq_size < RK_AHEAD_WALK ? d->sq_size : RK_AHEAD_WALK;
	uint64_t from = head > walk ? head - walk : 0;

	if (from < d->rk_scan_head)
		from = d->rk_scan_head;
	d->rk_scan_head = head;
	pthread_mutex_lock(&d->rk_lock);
	for (unsigned i = 0; i < d->rk_n; i++) {
		struct shift_rkey *e = &d->rk[i];

		/* (read again: a read that failed, a key the peer had not
		 * published yet) */
		if (e->ahead && e->st == SHIFT_RK_ABSENT)
			e->st = SHIFT_RK_WANT;
		if (e->st == SHIFT_RK_WANT)
			d->rk_want = true;
	}
	uint32_t last = 0;
	bool any = false;

	/* (native: read back first; those whose WQE was reused are skipped) */
	shift_dqp_native_fill(d, from, d->rq_head);
	for (uint64_t i = from; i < head; i++) {
		const struct shift_swqe *w = shift_dqp_swqe(d, i);
		struct shift_rkey *e;

		if (!remote_op(w->opcode) || w->num_sge == SHIFT_WQE_NATIVE ||
		    (any && w->rkey == last))
			continue;
		last = w->rkey;
		any = true;
		if (fo_rk_find(d, w->rkey))
			continue;
		if (!(e = rk_add(d, w->rkey)))
			break;
		e->ahead = true;
		d->rk_want = true;
	}
	pthread_mutex_unlock(&d->rk_lock);
	shift_dqp_unlock(d);
}
