/*
 * What a failover needs from the KV store, moved off the application's
 * threads: the peer's backup rkeys and my episode record.
 *
 * No verb of the application (post, poll, modify) does KV I/O. A failover
 * on an application thread only notes what it needs: the backup key of each
 * peer rkey its WRs use (fo_rk_lookup() marks a key it does not have as
 * wanted) and my new episode record (fo_kvq_publish() encodes it into the
 * QP). The background pass of the context collects that under slow_lock,
 * drops every lock for the KV commands themselves, and takes the results in
 * under slow_lock again, for the QPs that still exist (fo_kvq_run()).
 *
 * A send WR whose peer key is not read yet is held, with every WR after it
 * (fo_post_bk_send()): the WRs are in the mirror, the post succeeds, and the
 * background pass posts them on the backup once the key is read
 * (fo_held_release()). A key read after the failover started is used; one
 * read before it is stale (the peer may have registered its memory anew)
 * and read again. A key still unread SHIFT_KV_WAIT_MS after it was first
 * wanted (the store gone, slow or empty; or the key absent while the store
 * failed within SHIFT_KV_WAIT_MS, as the peer may not have written its
 * records again yet) counts as absent: the WR fails as a key the peer
 * never published fails on the default path, no wait without bound. A
 * key absent from a store that kept answering fails at once. One the
 * store cannot give, with none read before, is also asked of the peer
 * itself over the backup path (the key mailbox, fo/mbox.c).
 *
 * The read-ahead: once a second the background pass notes the peer keys of
 * the newest send WRs in each Default-state QP's mirror and reads them, so
 * that a failover while the store is gone, dripping, emptied or garbled
 * still has a backup key: the one read before (prev) is used when the
 * store cannot give one now (an error, the wait above, a key now absent or
 * unreadable). It cannot send data anywhere else: a backup key names a
 * backup MR of the same peer process and PD, on the same virtual memory as
 * the application's MR; one the peer has deregistered since fails at its
 * NIC (remote access error), as the application's stale key would.
 */
#include "shift/fo/fo_int.h"
#include "shift/dp/nwq.h"

#define RK_MAX 4096       /* keys one QP keeps */
#define KVQ_PUBS 64       /* records one pass writes */
#define RK_AHEAD_MS 1000  /* read-ahead period, per QP */
#define RK_AHEAD_WALK 64  /* newest mirrored send WRs one read-ahead looks at */

/* A send WR that names a peer key. */
static bool remote_op(unsigned opcode)
{
	return opcode == IBV_WR_RDMA_WRITE || opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
	       opcode == IBV_WR_RDMA_READ || shift_wr_is_atomic(opcode);
}

static struct shift_rkey_val rk_val(const struct shift_mr_value *mv)
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
		e->prev = rk_val(&mv);
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
static bool rk_earlier(struct shift_dqp *d, struct shift_rkey *e, uint64_t now, bool *say)
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

static void rk_earlier_say(const struct shift_dqp *d, uint32_t app, bool known)
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
			timed_out = !rk_earlier(d, e, now, &say);
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
		rk_earlier_say(d, app, true);
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

/* ---- the background's KV commands ------------------------------------------ */

struct kvq_item {
	struct shift_dqp *d; /* (compared only, until found alive again) */
	uint64_t serial, seq, at;
	uint32_t qpn, app;
	char key[SHIFT_EXCHANGE_KEY_MAX];
	char val[SHIFT_KV_SLOT_VAL];
	unsigned len;
	void *v;     /* (a key read: its value, NULL if absent) */
	size_t vlen;
	int rc;      /* (the command's result) */
	bool poke;   /* (a pub: a poke of the peer, not my record) */
};

struct kvq {
	struct kvq_item rk[SHIFT_KV_MGET_MAX];
	struct kvq_item ep[SHIFT_KV_MGET_MAX];
	struct kvq_item pub[KVQ_PUBS];
	size_t nrk, nep, npub;
	bool more; /* left for the next pass */
};

/*
 * The read-ahead (see the top; background, slow_lock): the peer keys of the
 * newest send WRs mirrored since the last one (outstanding or completed),
 * wanted if new, and those still unread wanted again. It holds post_lock
 * for a walk of at most RK_AHEAD_WALK entries, no I/O.
 */
static void rk_read_ahead(struct shift_dqp *d, uint64_t now)
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

/* A slot of d's to write, if changed (rk_lock held). */
static void collect_pub(struct shift_dqp *d, const struct shift_kv_slot *sl, struct kvq *q,
			bool poke)
{
	if (sl->seq == sl->done)
		return;
	if (q->npub == KVQ_PUBS) {
		q->more = true;
		return;
	}
	struct kvq_item *it = &q->pub[q->npub++];

	memcpy(it->key, sl->key, sizeof(it->key));
	memcpy(it->val, sl->val, sl->len);
	it->len = sl->len;
	it->seq = sl->seq;
	it->poke = poke;
	it->d = d, it->serial = d->serial, it->qpn = d->qpn;
}

static void collect_qp(struct shift_dqp *d, struct kvq *q, uint64_t now)
{
	rk_read_ahead(d, now);
	pthread_mutex_lock(&d->rk_lock);
	collect_pub(d, &d->ep_pub, q, false);
	collect_pub(d, &d->poke_pub, q, true);
	fo_dgram_collect(d);
	if (d->rk_want && d->shadow) {
		d->rk_want = false;
		for (unsigned i = 0; i < d->rk_n; i++) {
			struct shift_rkey *e = &d->rk[i];

			if (e->st != SHIFT_RK_WANT)
				continue;
			if (q->nrk == SHIFT_KV_MGET_MAX) {
				d->rk_want = q->more = true;
				break;
			}
			struct kvq_item *it = &q->rk[q->nrk];

			if (shift_exchange_mr_key(&d->shadow->peer_key.gid, e->app, it->key,
						  sizeof(it->key)) < 0)
				continue;
			it->app = e->app;
			it->at = now;
			it->d = d, it->serial = d->serial, it->qpn = d->qpn;
			it->v = NULL;
			q->nrk++;
		}
	}
	pthread_mutex_unlock(&d->rk_lock);
}

/* The peer records the failback work of this pass reads: those due, or
 * due within half their period (the schedules of QPs that failed over
 * together line up after one batch). */
static bool ep_wanted(const struct shift_dqp *d, uint64_t now, uint64_t at)
{
	if (!d || !d->scq || !d->shadow || shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED ||
	    !fo_ep_due(d, at))
		return false;
	/* (not before the failure: t_error_us may be later than now) */
	return d->t_error_us / 1000u <= now;
}

static void collect_ep(struct shift_ctx *s, struct kvq *q, uint64_t now)
{
	bool any = false;

	/* (none due now: none read early either, or a QP alone would read
	 * at half its period) */
	for (int i = 0; i < s->nfo && !any; i++)
		any = ep_wanted(s->fo[i], now, now);
	for (int i = 0; any && i < s->nfo; i++) {
		struct shift_dqp *d = s->fo[i];

		if (!d || !ep_wanted(d, now, now + fo_probe_wait(d) / 2))
			continue;
		if (q->nep == SHIFT_KV_MGET_MAX) {
			q->more = true;
			return;
		}
		struct kvq_item *it = &q->ep[q->nep];

		if (shift_exchange_ep_key(&d->shadow->peer_key, it->key, sizeof(it->key)) < 0)
			continue;
		it->d = d, it->serial = d->serial, it->qpn = d->qpn;
		it->v = NULL;
		q->nep++;
	}
}

/* Under slow_lock: what s's QPs need from the store. */
static void collect(struct shift_ctx *s, struct kvq *q, bool reads)
{
	uint64_t now = shift_clock_ms();

	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++)
		for (struct shift_dqp *d = shift_dqp_first(s, i); d; d = shift_dqp_next(d))
			collect_qp(d, q, now);
	if (reads)
		collect_ep(s, q, now);
}

/* One MGET for items[0..n): each item's value (NULL if absent) and rc. */
static int mget(shift_kv *kv, struct kvq_item *items, size_t n, int rc)
{
	const char *keys[SHIFT_KV_MGET_MAX];
	void *v[SHIFT_KV_MGET_MAX];
	size_t len[SHIFT_KV_MGET_MAX];

	if (!rc && n) {
		for (size_t k = 0; k < n; k++)
			keys[k] = items[k].key;
		rc = shift_kv_mget(kv, keys, n, v, len);
	}
	for (size_t k = 0; k < n; k++) {
		items[k].rc = rc;
		items[k].v = rc ? NULL : v[k];
		items[k].vlen = rc ? 0 : len[k];
	}
	return rc;
}

/* No lock of SHIFT's held: the commands. The first failure ends this
 * pass's I/O (a store gone costs one deadline per pass, not one per
 * command); what was not done is done at the next pass. */
static void io(shift_kv *kv, struct kvq *q)
{
	int rc = 0;

	for (size_t k = 0; k < q->npub; k++) {
		struct kvq_item *it = &q->pub[k];

		it->rc = rc ? rc : shift_kv_put(kv, it->key, it->val, it->len,
						  (uint64_t)shift_config.kv_ttl_s * 1000u);
		rc = it->rc;
	}
	rc = mget(kv, q->ep, q->nep, rc);
	mget(kv, q->rk, q->nrk, rc);
}

static bool kv_down; /* (relaxed atomic) */

/* Did s's store fail within SHIFT_KV_WAIT_MS before at? Then a key it
 * reads absent may be one a peer has not written again yet. */
static bool kv_failed_lately(const struct shift_ctx *s, uint64_t at)
{
	uint64_t e = s->kv_err_ms;

	return e && (e >= at || at - e < shift_config.kv_wait_ms);
}

static void apply_rk(struct shift_ctx *s, struct shift_dqp *d, struct kvq_item *it)
{
	struct shift_mr_value mv;
	bool known = it->v && !shift_exchange_mr_decode(it->v, it->vlen, &mv), say = false;
	bool e_known = false;

	pthread_mutex_lock(&d->rk_lock);
	struct shift_rkey *e = fo_rk_find(d, it->app);

	if (e && e->st == SHIFT_RK_WANT) {
		if (known) {
			fo_rk_known(e, rk_val(&mv), it->at);
		} else if (e->ahead) {
			/* (read ahead: absent is absent; an error is read again
			 * at the next read-ahead) */
			if (!it->rc) {
				e->st = SHIFT_RK_ABSENT;
				e->at_ms = it->at;
			}
		} else if (e->has_prev ||
			   (!it->rc && !kv_failed_lately(s, it->at) && !fo_mbox_possible(d))) {
			/* (absent or unreadable now, or the store cannot answer:
			 * the key read before, if any; none: absent, refused) */
			e_known = rk_earlier(d, e, it->at, &say);
		} else if (fo_mbox_possible(d)) {
			/* (the store cannot answer, or says absent, none read
			 * before: the peer itself is asked over the backup path,
			 * fo/mbox.c, and the store again, until SHIFT_KV_WAIT_MS;
			 * a record not published yet, the peer's MR registered a
			 * moment ago, is not taken for memory it lacks) */
			e->ask = true;
			d->rk_want = true;
		} else {
			/* (again at the next pass, until SHIFT_KV_WAIT_MS: the
			 * store cannot answer, or it failed lately and the peer
			 * may not have written its records again yet) */
			d->rk_want = true;
		}
	}
	pthread_mutex_unlock(&d->rk_lock);
	if (say)
		rk_earlier_say(d, it->app, e_known);
	shift_debug("%s QP %u: the peer's backup key for rkey %u: %s (%d)", d->dev, d->qpn,
		    it->app, it->rc ? "not read" : known ? "read" : "none", it->rc);
	__atomic_fetch_add(&shift_stats.rkeys_read, 1, __ATOMIC_RELAXED);
}

static void apply(struct shift_ctx *s, struct kvq *q)
{
	int rc = q->npub ? q->pub[q->npub - 1].rc : q->nep ? q->ep[0].rc : q->nrk ? q->rk[0].rc : 0;

	if (rc)
		s->kv_err_ms = shift_clock_ms();
	for (size_t k = 0; k < q->npub; k++) {
		struct kvq_item *it = &q->pub[k];
		struct shift_dqp *d = fo_dqp_again(s, it->d, it->qpn, it->serial);

		if (!d)
			continue;
		uint64_t *done = it->poke ? &d->poke_pub.done : &d->ep_pub.done;

		pthread_mutex_lock(&d->rk_lock);
		if (!it->rc && *done < it->seq)
			*done = it->seq;
		pthread_mutex_unlock(&d->rk_lock);
		if (!it->rc)
			shift_debug("%s QP %u: %s %s = %.*s", d->dev, d->qpn,
				    it->poke ? "poked the peer:" : "published", it->key, (int)it->len,
				    it->val);
	}
	for (size_t k = 0; k < q->nrk; k++) {
		struct kvq_item *it = &q->rk[k];
		struct shift_dqp *d = fo_dqp_again(s, it->d, it->qpn, it->serial);

		if (d)
			apply_rk(s, d, it);
		free(it->v);
	}
	if (q->nep) {
		/* (not through an item's QP: it may be gone since) */
		shift_debug("%s: %zu peer records in one KV read (%d)",
			    s->ibctx->device ? s->ibctx->device->name : "?", q->nep, q->ep[0].rc);
		__atomic_fetch_add(&shift_stats.ep_read_commands, 1, __ATOMIC_RELAXED);
		__atomic_fetch_add(&shift_stats.ep_records_read, q->nep, __ATOMIC_RELAXED);
	}
	for (size_t k = 0; k < q->nep; k++) {
		struct kvq_item *it = &q->ep[k];
		struct shift_dqp *d = fo_dqp_again(s, it->d, it->qpn, it->serial);

		if (d) {
			/* (taken in under its CQs' locks, as the failback work
			 * and the application's polls read it) */
			fo_lock_cqs(d);
			int8_t p = it->rc ? -1 : fo_ep_take(d, it->v, it->vlen) ? 1 : -2;

			/* (a datagram's record not followed yet stays news) */
			if (d->kv_pref != 1)
				d->kv_pref = p;
			fo_unlock_cqs(d);
		}
		free(it->v);
	}
	const char *dev = s->ibctx->device ? s->ibctx->device->name : "?";

	/* once per outage, and once when it ends */
	if (rc && !__atomic_exchange_n(&kv_down, true, __ATOMIC_RELAXED))
		shift_warn("%s: the KV store cannot be reached (%s): failover records wait, "
			   "read and written again at each pass", dev, shift_kv_strerror(rc));
	else if (!rc && (q->npub || q->nep || q->nrk) &&
		 __atomic_exchange_n(&kv_down, false, __ATOMIC_RELAXED))
		shift_warn("%s: the KV store answers again: failover records flow", dev);
}

/*
 * The background pass's KV share for s (bg_lock and slow_lock held; the
 * latter dropped around the commands): my records to write, the peer keys
 * wanted, and with reads (before the pass's failback work) the peer
 * records it follows (d->kv_pref); then the sends held for keys.
 */
void fo_kvq_run(struct shift_ctx *s, bool reads)
{
	/* (one for all: the passes of all contexts take turns, bg_lock) */
	static struct kvq buf;
	struct shift_rnic *r = s->rnic;
	struct kvq *q = &buf;

	if (!r || !r->kv)
		return;
	q->nrk = q->nep = q->npub = 0;
	q->more = false;
	collect(s, q, reads);
	if (q->npub || q->nrk || q->nep) {
		pthread_mutex_unlock(&s->slow_lock);
		io(r->kv, q);
		pthread_mutex_lock(&s->slow_lock);
		apply(s, q);
	}
	fo_dgram_run(s);
	if (q->more)
		shift_rnic_wake(r);
	fo_mbox_run(s);
	for (int i = 0; i < s->nfo; i++) {
		struct shift_dqp *d = s->fo[i];

		if (d && d->scq && __atomic_load_n(&d->sq_held, __ATOMIC_ACQUIRE))
			fo_held_release(d);
	}
}
