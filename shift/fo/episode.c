/*
 * Failover episodes: each end's record in the KV store (its backup QP's
 * generation, the episode it started, a return episode's receive counter,
 * a failed backup), read ahead in batches; resetting and re-arming the
 * backup QP for an episode; asking a peer that never saw a failover to
 * follow it (poke).
 */
#include "shift/fo/fo_int.h"

/* ---- failover episodes ------------------------------------------------------
 *
 * Failover number k of a connection runs on backup QPs reset at both ends
 * for it: generation k - 1 (the replay is generation 0), whose PSNs both
 * ends derive alike, with a fresh control receive at the head of the
 * receive queue and no stale receive behind it. After a full failback each
 * end resets its own backup for the next failover. If the default path
 * fails again before that (one direction still on the backup, or the peer
 * not reset yet), the end that sees it flushes both its QPs, resets its
 * backup, and publishes the episode it started in the KV store; the peer,
 * which reads that record while its backup is used, does the same. A
 * handshake message is only sent to a backup reset for its episode: the
 * peer's record says so, or the peer's own message proves it.
 */

/* A key and value of d's to write at the next pass (rk_lock). */
static void slot_set(struct shift_ctx *s, struct shift_dqp *d, struct shift_kv_slot *sl,
		     const char *key, const char *val, unsigned len)
{
	pthread_mutex_lock(&d->rk_lock);
	snprintf(sl->key, sizeof(sl->key), "%s", key);
	sl->len = len < sizeof(sl->val) ? len : sizeof(sl->val);
	memcpy(sl->val, val, sl->len);
	sl->seq++;
	pthread_mutex_unlock(&d->rk_lock);
	shift_rnic_wake(s->rnic);
}

/* My episode record (its CQs locked): written by the next background pass
 * (fo/kvq.c), which this wakes. */
void fo_kvq_publish(struct shift_ctx *s, struct shift_dqp *d, const char *key,
		    const char *val, unsigned len)
{
	slot_set(s, d, &d->ep_pub, key, val, len);
}

/* A poke of d's peer to write (fo_poke_peer), as fo_kvq_publish. */
void fo_kvq_poke(struct shift_ctx *s, struct shift_dqp *d, const char *key, const char *val,
		 unsigned len)
{
	slot_set(s, d, &d->poke_pub, key, val, len);
}

/* My record: d's episode as of now, in the store soon (fo/kvq.c). */
void fo_ep_publish(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_rnic *r = s->rnic;
	char key[SHIFT_EXCHANGE_KEY_MAX], val[SHIFT_KV_SLOT_VAL];
	int n;

	if (!r || !r->kv || shift_exchange_ep_key(&d->shadow->my_key, key, sizeof(key)) < 0)
		return;
	struct shift_ep_value ev = {
		.gen = d->bk_gen, .started = (unsigned)d->failovers,
		.ret = d->ret_ep && d->ret_ep == d->failovers, .count = d->ret_count,
		.bkfail = d->bk_error, .nosend = !fo_app_sends(s, d),
		.closed = d->app_ended || d->app_error_end, .seq = ++d->ep_seq,
	};

	n = shift_exchange_ep_encode_ex(&ev, val, sizeof(val));
	d->bkfail_published = d->bk_error;
	d->published_ep = d->failovers;
	d->published_at = shift_clock_ms();
	if (n < 0) {
		shift_warn("%s QP %u: cannot encode failover %lu for the KV store: the peer may not "
			   "follow it", d->dev, d->qpn, d->failovers);
		return;
	}
	/* (written by the background pass, never on this thread: fo/kvq.c) */
	fo_kvq_publish(s, d, key, val, (unsigned)n);
}

/* A peer record read into d, unless d took a later one already (the store
 * may lag behind a datagram, fo/dgram.c, or a datagram behind the store). */
static void ep_take(struct shift_dqp *d, const struct shift_ep_value *ev)
{
	if (ev->seq && ev->seq < d->peer_ep_seq)
		return;
	if (ev->seq)
		d->peer_ep_seq = ev->seq;
	d->peer_gen = ev->gen;
	d->peer_started = ev->started;
	d->peer_ret = ev->ret;
	d->peer_ret_count = ev->count;
	d->peer_bkfail = ev->bkfail;
	if (ev->nosend)
		d->peer_nosend = true; /* (as its handshake message says, which may be lost) */
	d->peer_closed = ev->closed;
}

/* A peer record as read (v, len) into d (its CQs locked): true if it is
 * one (well-formed, this version). */
bool fo_ep_take(struct shift_dqp *d, const void *v, size_t len)
{
	struct shift_ep_value ev;

	if (!v || shift_exchange_ep_decode_ex(v, len, &ev))
		return false;
	ep_take(d, &ev);
	return true;
}

/* Does d read the peer's record at this pass (failback_work)? */
bool fo_ep_due(const struct shift_dqp *d, uint64_t now)
{
	return (d->need_rearm || d->ep_wait != SHIFT_EP_RUNNING || d->bk_error) &&
	       now >= d->kv_at;
}

/* What the background pass read of d's peer record before its failback
 * work (fo/kvq.c): 0 read, -1 none, unreadable or not read at this pass
 * (d keeps what it knew; a record due now is read at the next pass). */
int fo_ep_read_pass(struct shift_dqp *d)
{
	int8_t p = d->kv_pref;

	d->kv_pref = 0;
	return p > 0 ? 0 : -1;
}

/* Is the peer's backup reset for my current episode? */
bool fo_peer_armed(const struct shift_dqp *d)
{
	return d->failovers <= 1 || d->peer_gen + 1 >= (unsigned)d->failovers;
}

/* Has the peer stopped the backup QP of its last failover (so a reset of
 * mine cannot acknowledge its packets as duplicates)? It joined my
 * failover, or it reset its own for it. */
bool fo_peer_old_dead(const struct shift_dqp *d)
{
	return d->peer_started >= (unsigned)d->failovers || d->peer_gen + 1 >= (unsigned)d->failovers;
}

/*
 * Stop my backup QP (ERR) and drain its CQs of d: successes are the
 * application's (kept, in order) when keep, else dropped with d off the
 * failed-over list; errors and flushes are SHIFT's. Its CQs locked.
 */
/*
 * Pokes. An end that fails over alone (the peer's retry budget outlasted
 * the fault, so its QP never failed) reaches the peer through its handshake
 * message on the backup path. If its backup NIC dies before that message
 * arrives, the peer never learns of the failover: it stays on its default
 * QP, which still answers the old connection's PSNs, so even a probe of the
 * default path may be answered (as a duplicate) while the two ends no longer
 * agree on anything. Such an end is "unjoined": it neither probes nor
 * restarts its failover; it pokes the peer instead, writing under the
 * peer's poke key (its default GID), and publishes its record. Every
 * process reads the poke keys of its contexts' default GIDs every
 * SHIFT_POKE_MS (one KV read per context); when a value changes it reads
 * the peer records of its Default-state QPs on that GID, and a QP whose
 * peer started a failover it never saw follows it (fo_start(), its number
 * taken from the peer). From there on it is the failover both ends saw,
 * whose backup path failed: both ends publish that, the prober probes the
 * reset default QPs, and both go back to them (ret_start).
 */
bool fo_unjoined(const struct shift_dqp *d)
{
	return d->bk_error && !d->handshake_done && d->peer_started < d->failovers;
}

bool fo_poke_peer(struct shift_ctx *s, struct shift_dqp *d, const char *why)
{
	struct shift_rnic *r = s->rnic;
	char key[SHIFT_EXCHANGE_KEY_MAX], val[48];
	int n;

	if (!r || !r->kv || !shift_config.poke_ms ||
	    shift_exchange_poke_key(&d->shadow->peer_key.gid, key, sizeof(key)) < 0)
		return false;
	n = snprintf(val, sizeof(val), "%u.%lu.%llu", d->qpn, d->failovers,
		     (unsigned long long)shift_clock_us());
	if (n < 0 || (size_t)n >= sizeof(val))
		return false;
	/* (written by the pass's KV share with no lock held, as my record;
	 * a failed write is written again at the next pass) */
	fo_kvq_poke(s, d, key, val, (unsigned)n);
	shift_info("%s QP %u: %s failover %lu: asking the peer to follow it (%s)", d->dev, d->qpn,
		   why, d->failovers, key);
	return true;
}

void fo_flush_backup(struct shift_ctx *s, struct shift_dqp *d, bool keep)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	struct shift_cq *cs[2] = { d->scq, d->rcq != d->scq ? d->rcq : NULL };

	if (!keep)
		fo_remove(s, d);
	shift_lower->modify_qp(d->bk, &a, IBV_QP_STATE);
	d->bk_flushing = true;
	for (int k = 0; k < 2; k++) {
		if (!cs[k])
			continue;
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = cs[k] };
		fo_poll_backup(s, cs[k], &o, false);
	}
	d->bk_flushing = false;
}

/* Reset my (stopped) backup QP as generation gen, with a fresh control
 * receive, and publish it. Its CQs locked. */
int fo_reset_backup(struct shift_ctx *s, struct shift_dqp *d, unsigned gen)
{
	d->handshake_done = false;
	d->ctrl_sent = false;
	d->bk_error = false;
	__atomic_store_n(&d->bk_refused, false, __ATOMIC_RELEASE); /* (fo_bk_refused) */
	fo_mbox_reset(d);
	SHIFT_STAT_SET(d->bk_gen, gen & 0x3fffu);
	if (shift_shadow_rearm(s->rnic, d->shadow, gen)) {
		const char *why = "its backup QP could not be reset for the next failover";

		/* (back on the default QP in both directions: it runs on,
		 * unprotected; else the caller fails the connection) */
		if (shift_dqp_send_state(d) == SHIFT_SEND_DEFAULT && shift_dqp_recv_state(d) == SHIFT_RECV_DEFAULT)
			fo_give_up(d, why);
		else
			fo_fail_mark(d, why, FO_BY_STATE, FO_BY_STATE);
		return -1;
	}
	d->need_rearm = false;
	SHIFT_STAT_SET(d->last_switch_s, shift_clock_wall_s());
	fo_ep_publish(s, d);
	return 0;
}

/* After a full failback: both directions left the backup QP, whose last
 * packets were all acknowledged: reset it for the next failover. */
int fo_rearm_backup(struct shift_ctx *s, struct shift_dqp *d)
{
	fo_flush_backup(s, d, false);
	return fo_reset_backup(s, d, (unsigned)d->failovers);
}
