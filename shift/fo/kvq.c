/*
 * What a failover needs from the KV store, moved off the application's
 * threads: the peer's backup rkeys (the cache of fo/rkeys.c) and my
 * episode record.
 *
 * No verb of the application (post, poll, modify) does KV I/O. A failover
 * on an application thread only notes what it needs: the backup key of each
 * peer rkey its WRs use (fo_rk_lookup() marks a key it does not have as
 * wanted) and my new episode record (fo_kvq_publish() encodes it into the
 * QP). The background pass of the context collects that under slow_lock,
 * drops every lock for the KV commands themselves, and takes the results in
 * under slow_lock again, for the QPs that still exist (fo_kvq_run()).
 */
#include "shift/fo/fo_int.h"

#define KVQ_PUBS 64       /* records one pass writes */

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
	fo_rk_read_ahead(d, now);
	pthread_mutex_lock(&d->rk_lock);
	collect_pub(d, &d->ep_pub, q, false);
	collect_pub(d, &d->poke_pub, q, true);
	fo_dgram_collect(d);
	if (d->rk_want && d->shadow) {
		d->rk_want = false;
		for (unsigned i = 0; i < d->rk_n; i++) {
			struct shift_rkey *e = &d->rk[i];

			if (e->st != SHIFT_RK_WANT && !e->confirm)
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
	bool e_known = false, changed = false;
	struct shift_rkey_val was = { 0 };

	pthread_mutex_lock(&d->rk_lock);
	struct shift_rkey *e = fo_rk_find(d, it->app);

	if (e && e->confirm) {
		/* (the key in use since the failover started, read again: a
		 * new one is used from now on; none or no answer keeps it) */
		e->confirm = false;
		was = e->v;
		changed = known && (fo_rk_val(&mv).bk != e->v.bk || fo_rk_val(&mv).addr != e->v.addr ||
				    fo_rk_val(&mv).len != e->v.len);
		if (known)
			fo_rk_known(e, fo_rk_val(&mv), it->at);
		else
			e->at_ms = it->at;
	} else if (e && e->st == SHIFT_RK_WANT) {
		if (known) {
			fo_rk_known(e, fo_rk_val(&mv), it->at);
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
			e_known = fo_rk_earlier(d, e, it->at, &say);
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
		fo_rk_earlier_say(d, it->app, e_known);
	if (changed) {
		__atomic_fetch_add(&shift_stats.rkeys_changed, 1, __ATOMIC_RELAXED);
		shift_warn("%s QP %u: the peer's backup key for rkey %u changed since it was read "
			   "(backup key %u for %#llx+%llu, was %u for %#llx+%llu: the peer registered "
			   "its memory anew): the new one from now on; a WR of this failover sent "
			   "with the old one fails at the peer as a stale rkey would", d->dev, d->qpn,
			   it->app, fo_rk_val(&mv).bk, (unsigned long long)fo_rk_val(&mv).addr,
			   (unsigned long long)fo_rk_val(&mv).len, was.bk,
			   (unsigned long long)was.addr, (unsigned long long)was.len);
	}
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
