/*
 * The background pass of a context (on its RNIC's thread, or inline): the
 * backup CQs nobody polls while Default, the port watch, answering a
 * passive peer, failing over on a refused post or a peer's failover never
 * seen here, then the failback work of every failed-over QP.
 */
#include "shift/fo/fo_int.h"
#include "shift/base/backoff.h"

static void background(struct shift_ctx *s);

/*
 * May the pass judge the QPs of slow context s? Not while a poll of the
 * application that entered the fast path before the switch is still
 * inside it: it may hold completions it took from the provider and has not
 * counted yet (dp/poll.h). A poll never waits inside the fast path, so the
 * thread comes back in a millisecond (fo_start() waits for it anyway).
 */
static bool polls_out(struct shift_ctx *s, uint64_t now)
{
	if (shift_dp_fast_polls_out(s))
		return true;
	shift_rnic_due(s->rnic, now + 1);
	return false;
}

/* ---- the port watch ----------------------------------------------------------
 *
 * An error completion is the usual trigger of a failover. A port that stops
 * being ACTIVE is another, and sometimes the only one: soft-RoCE retries
 * for ever on a cut link and never completes a WR in error, and hardware
 * reports the failure only once its retry budget is spent. When the default
 * port of protected QPs has not been ACTIVE for SHIFT_PORT_DOWN_MS, they
 * fail over as if an error had been polled: fo_start() flushes the default QP
 * and keeps its successful completions for the application. The context
 * goes to the slow path as soon as the port is seen down, so by then no
 * poll of the application is inside the fast path.
 */
/* d's port is ACTIVE again: did its QP live through (not in ERR)? Then
 * its later flushes are no longer the device's (fo_on_error). */
static void port_back(struct shift_dqp *d)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;

	memset(&a, 0, sizeof(a));
	if (!shift_lower->query_qp(d->qp, &a, IBV_QP_STATE, &ia) && a.qp_state != IBV_QPS_ERR)
		d->port_was_down = false;
}

/* How long port must have been seen down before its QPs fail over: the
 * port watch's limit, or none when the device said so (an async event,
 * shadow/portev.c; a flap is the failback probe's to handle). */
static uint64_t port_limit(struct shift_ctx *s, unsigned port, uint64_t limit)
{
	return shift_rnic_port_event_down(s->rnic, port) ? 0 : limit;
}

/* d's port has been down for `for_ms`: d fails over as if an error had
 * been polled. */
static void port_fail_over(struct shift_ctx *s, struct shift_dqp *d, unsigned port,
			   uint64_t for_ms)
{
	fo_lock_cqs(d);
	if (shift_dqp_send_state(d) == SHIFT_SEND_DEFAULT) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

		shift_info("%s QP %u: port %u down for %llu %s: failing over without an error "
			   "completion", d->dev, d->qpn, port, (unsigned long long)for_ms, "ms");
		bool early = fo_dgram_starting(s, d); /* (the peer starts beside me) */

		if (fo_start(s, d, &o, NULL) && shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED) {
			/* given up: the application sees its QP fail, as the
			 * provider would have shown it sooner or later */
			struct ibv_qp_attr e = { .qp_state = IBV_QPS_ERR };

			/* (a peer that joined the start on my record ends its
			 * side now, not after its episode's time limit; sent
			 * once, fo_tell_abort) */
			if (early)
				fo_tell_abort(d);

			shift_lower->modify_qp(d->qp, &e, IBV_QP_STATE);
		}
	}
	fo_unlock_cqs(d);
}

static void watch_ports(struct shift_ctx *s, uint64_t now_ms)
{
	int st[SHIFT_WATCH_PORTS + 1] = { 0 }; /* 0 not asked, 1 active, 2 down */
	uint64_t t = now_ms + 1;
	uint64_t limit = shift_config.port_down_ms;
	bool down = false;

	if (!limit) {
		s->ports_down = false;
		return;
	}
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *d = shift_dqp_first(s, i); d;
		     d = shift_dqp_next(d)) {
			/* (every QP's port is looked at for port_was_down; only
			 * Default-state QPs fail over here) */
			bool dflt = shift_dqp_send_state(d) == SHIFT_SEND_DEFAULT;

			if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED || !d->scq || !d->rcq ||
			    !d->shadow ||
			    __atomic_load_n(&d->shadow->state, __ATOMIC_ACQUIRE) != SHIFT_SHADOW_READY)
				continue;
			pthread_mutex_lock(&s->rnic->lock);
			unsigned port = d->shadow->attr.port_num;
			bool connected = (d->shadow->attr_mask & IBV_QP_AV) != 0;
			pthread_mutex_unlock(&s->rnic->lock);
			if (!connected)
				continue;
			if (port < 1 || port > SHIFT_WATCH_PORTS)
				port = 1;
			if (!st[port]) {
				/* a port that cannot be queried counts as up */
				st[port] = fo_port_state(s, port) ? 1 : 2;
				if (st[port] == 1) {
					s->port_down_since[port] = 0;
				} else if (!s->port_down_since[port]) {
					s->port_down_since[port] = t;
					shift_info("%s: port %u is down: its QPs fail over in %llu %s unless it "
						   "comes back", d->dev, port, (unsigned long long)limit,
						   "ms");
				}
			}
			if (st[port] == 1) {
				/* (a failed-over QP's mark clears at its reset) */
				if (d->port_was_down && dflt)
					port_back(d);
				continue;
			}
			d->port_was_down = true; /* (its flushes are the device's) */
			if (!dflt)
				continue;
			down = true;
			shift_ctx_set_slow(s, true);
			uint64_t wait = port_limit(s, port, limit);

			if (t - s->port_down_since[port] < wait || !polls_out(s, now_ms)) {
				shift_rnic_due(s->rnic, s->port_down_since[port] + wait);
				continue;
			}
			port_fail_over(s, d, port, t - s->port_down_since[port]);
		}
	}
	s->ports_down = down;
}

/* Held by a whole background pass (of any context: the passes of all
 * RNICs take turns). */
static pthread_mutex_t bg_lock = PTHREAD_MUTEX_INITIALIZER;

/* Under the context's slow_lock, which the background pass and the slow
 * poll hold while they walk the context's QPs: neither meets a QP state
 * that destroy_qp is about to free (the fast path's lock-free readers are
 * covered by freeing it late, dp/limbo.h). */
struct shift_dqp *shift_failover_forget(struct shift_ctx *s, struct ibv_qp *qp, bool *driven)
{
	pthread_mutex_lock(&s->slow_lock);
	struct shift_dqp *d = shift_ctx_remove_dqp(s, qp);

	*driven = d && fo_remove(s, d);
	if (d)
		fo_srq_forget(d);
	pthread_mutex_unlock(&s->slow_lock);
	return d;
}

void shift_failover_unforget(struct shift_ctx *s, struct shift_dqp *d, bool driven)
{
	pthread_mutex_lock(&s->slow_lock);
	shift_ctx_add_dqp(s, d);
	if (driven && d->dsrq)
		shift_dqp_unprotect(d, "destroy_qp failed during a failover, and SHIFT's receive "
				       "buffers for its SRQ are gone");
	else if (driven && fo_add(s, d))
		shift_dqp_unprotect(d, "destroy_qp failed, and SHIFT cannot drive its failover again");
	pthread_mutex_unlock(&s->slow_lock);
}

static bool waiting_seen;

bool shift_failover_waiting(void)
{
	bool w = __atomic_exchange_n(&waiting_seen, false, __ATOMIC_ACQ_REL);

	return w;
}

/* (inside a background pass on this thread: fo_on_background) */
static _Thread_local bool in_pass;

bool fo_on_background(void)
{
	return in_pass;
}

void shift_failover_background(struct shift_ctx *s)
{
	if (!s->rnic)
		return;
	pthread_mutex_lock(&bg_lock);
	pthread_mutex_lock(&s->slow_lock);
	in_pass = true;
	/* the KV store's share (fo/kvq.c), which drops slow_lock around its
	 * commands: the peers' records this pass follows, then what it wrote */
	shift_clock_tick(); /* (the failback clock: one per pass in synchronous mode) */
	fo_kvq_run(s, true);
	background(s);
	fo_kvq_run(s, false);
	in_pass = false;
	pthread_mutex_unlock(&s->slow_lock);
	pthread_mutex_unlock(&bg_lock);
}

/*
 * A QP the application's error unprotected in Default: a peer whose own QP
 * saw only a flush while its device went down (the responder of the bad
 * request) fails over towards my parked backup, which may not answer (the
 * backup path failed too). My record says the connection ended, as my QP
 * in ERR says it to the peer's on the default path: it ends its QP too,
 * not after its episode's time limit. Once, from here (KV I/O).
 */
static void publish_app_end(struct shift_ctx *s, struct shift_dqp *d)
{
	if (!__atomic_load_n(&d->app_error_end, __ATOMIC_ACQUIRE) || d->app_error_published)
		return;
	fo_lock_cqs(d);
	d->app_error_published = true;
	if (d->shadow && !d->peer_closed)
		fo_ep_publish(s, d);
	fo_unlock_cqs(d);
}

/* A peer's handshake message the background thread noticed (a passive
 * application's, which may never poll): answered at once, on the switch's
 * path. A poll still inside the fast path is waited for a little, giving
 * it the CPU (shift_dp_fast_polls_out_within: spins, yields, then sleeps,
 * about 2 ms in all), where the pass came back a millisecond
 * later, which on a one-CPU host meant whenever the scheduler took the CPU
 * from the poller (the testbed's passive ends: 0.5-2.9 ms from the message
 * to their start). A poll still inside after that (a thread stopped in
 * it) is left to the next pass, as before: the pass never waits for an
 * application's thread without a bound. */
#define ANSWER_POLL_LOOKS (SHIFT_BACKOFF_SPINS + SHIFT_BACKOFF_YIELDS + 12u)

static void answer_peer(struct shift_ctx *s, struct shift_dqp *d, uint64_t now)
{
	if (!d->ctrl_pending)
		return;
	if (!shift_dp_fast_polls_out_within(s, ANSWER_POLL_LOOKS) && !polls_out(s, now))
		return;
	fo_lock_cqs(d);
	if (d->ctrl_pending) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->rcq ? d->rcq : d->scq };
		fo_on_ctrl(s, d, &o);
	}
	fo_unlock_cqs(d);
}

/* A QP whose provider refused a post because it failed, with no error
 * completion to start its failover (shift_failover_post_refused()). */
static void fail_over_refused(struct shift_ctx *s, struct shift_dqp *d, uint64_t now)
{
	if (!__atomic_load_n(&d->post_failed, __ATOMIC_ACQUIRE))
		return;
	/* (as for a port that went down: a poll that entered the fast path
	 * before the context went slow finishes first) */
	if (!polls_out(s, now))
		return;
	fo_lock_cqs(d);
	if (d->post_failed && (shift_dqp_send_state(d) == SHIFT_SEND_DEFAULT || d->need_rearm)) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

		shift_info("%s QP %u: failing over on a refused post", d->dev, d->qpn);
		/* (its QP may have failed for the application's error: judged
		 * once its CQs are drained) */
		fo_start_unsure(s, d, &o, NULL);
	}
	d->post_failed = false; /* (a failover holds its WRs now) */
	fo_unlock_cqs(d);
}

/* A Default-state QP whose peer started failover peer_started without it
 * (fo_poke_read(), or the peer's record as a datagram: of a lone end's
 * failover, or of one it is starting, fo_dgram_starting()): it follows
 * that failover. */
void fo_join_peer(struct shift_ctx *s, struct shift_dqp *d, uint64_t now)
{
	if (!__atomic_load_n(&d->peer_join, __ATOMIC_ACQUIRE))
		return;
	if (!polls_out(s, now))
		return;
	fo_lock_cqs(d);
	if (d->peer_join && shift_dqp_send_state(d) == SHIFT_SEND_DEFAULT && !d->need_rearm &&
	    d->peer_started > d->failovers) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

		if (d->peer_bkfail)
			shift_info("%s QP %u: the peer started failover %u, which never reached me "
				   "(its backup path failed): following it", d->dev, d->qpn,
				   d->peer_started);
		else
			shift_info("%s QP %u: the peer starts failover %u: starting mine beside it",
				   d->dev, d->qpn, d->peer_started);
		SHIFT_STAT_SET(d->failovers, d->peer_started - 1); /* (fo_start() counts it) */
		if (fo_start(s, d, &o, NULL) == 0 && shift_dqp_send_state(d) != SHIFT_SEND_UNPROTECTED &&
		    d->published_ep != d->failovers)
			fo_ep_publish(s, d);
	}
	d->peer_join = false;
	fo_unlock_cqs(d);
}

/* Nothing failed over any more: polls take the fast path again once
 * every completion SHIFT kept has been handed out. */
static void fast_again(struct shift_ctx *s, struct shift_cq *head)
{
	if (__atomic_load_n(&s->slow, __ATOMIC_ACQUIRE) && !s->nfo) {
		bool quiet = !s->ports_down;

		for (struct shift_cq *c = head; c && quiet; c = c->next) {
			pthread_mutex_lock(&c->dp_lock);
			quiet = c->kept_head == c->kept_tail;
			pthread_mutex_unlock(&c->dp_lock);
		}
		for (int i = 0; quiet && i < SHIFT_DQP_BUCKETS; i++)
			for (struct shift_dqp *d = shift_dqp_first(s, i); d;
			     d = shift_dqp_next(d))
				if (d->ctrl_pending ||
				    __atomic_load_n(&d->post_failed, __ATOMIC_ACQUIRE) ||
				    __atomic_load_n(&d->peer_join, __ATOMIC_ACQUIRE))
					quiet = false; /* (work of the next pass's) */
		if (quiet)
			shift_ctx_set_slow(s, false);
	}
}

/* Does a failed-over QP of s wait for its peer's handshake message (a
 * passive application's, which never polls, is answered from here)? */
static bool waits_for_peer(struct shift_ctx *s)
{
	for (int i = 0; i < s->nfo; i++) {
		struct shift_dqp *d = s->fo[i];

		if (d && shift_dqp_send_state(d) == SHIFT_SEND_FALLBACK && !d->handshake_done)
			return true;
	}
	return false;
}

/* A peer's handshake message lands in a backup CQ nobody else polls while
 * this side is in the Default state, or waits for it. Each is armed before
 * it is polled: a completion after this poll wakes the thread
 * (shadow/portev.c). Not while the context is slow otherwise: the
 * application's polls look at the backups then, and every completion of
 * its traffic there would wake the thread. Armed? */
static bool poll_backups(struct shift_ctx *s, struct shift_cq *head)
{
	bool arm = !__atomic_load_n(&s->slow, __ATOMIC_ACQUIRE) || waits_for_peer(s);

	for (struct shift_cq *c = head; c; c = c->next) {
		if (!c->bk || SHIFT_SHADOW_DEAD(c) || pthread_mutex_trylock(&c->dp_lock))
			continue;
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = c };
		if (arm)
			shift_rnic_arm_backup(s->rnic, c->bk);
		fo_poll_backup(s, c, &o, false);
		pthread_mutex_unlock(&c->dp_lock);
	}
	return arm;
}

static void background(struct shift_ctx *s)
{
	struct shift_rnic *r = s->rnic;

	pthread_mutex_lock(&r->lock);
	struct shift_cq *head = r->cqs;
	pthread_mutex_unlock(&r->lock);
	bool armed = poll_backups(s, head);

	/* (messages on SRQ QPs' backups, for receives posted since; the
	 * default SRQs emptied for failback) */
	fo_srq_deliver_all(s, NULL);
	fo_srq_work(s);

	/*
	 * A passive application (a perftest server waiting on its socket)
	 * may never poll: answer the peer here. The context went to the slow
	 * path when the message was seen; a poll of the application still
	 * inside the fast path is waited for (answer_peer, a bound), so the
	 * default CQ is ours under dp_lock.
	 */
	uint64_t now = shift_clock_ms();
	watch_ports(s, now);
	fo_poke_read(s, now);
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *d = shift_dqp_first(s, i); d;
		     d = shift_dqp_next(d)) {
			if (!d->scq)
				continue;
			answer_peer(s, d, now);
			publish_app_end(s, d);
			fail_over_refused(s, d, now);
			fo_join_peer(s, d, now);
		}
	}

	/* failback: probes, switching back, re-arming the backup */
	uint64_t fbt = shift_clock_ms();
	int nfo = s->nfo;
	for (int i = 0; i < nfo && i < s->nfo; i++) {
		struct shift_dqp *d = s->fo[i];

		if (!d || !d->scq)
			continue;
		/* the application may be inside the fast path of a poll that
		 * started before the context went slow: let it finish */
		if (!polls_out(s, now))
			continue;
		fo_lock_cqs(d);
		fo_failback_work(s, d, fbt);
		/* (waiting for the peer: its record, or its handshake
		 * message on the backup) */
		if (shift_dqp_send_state(d) != SHIFT_SEND_UNPROTECTED &&
		    (d->ep_wait != SHIFT_EP_RUNNING || d->bk_error ||
		     (shift_dqp_send_state(d) == SHIFT_SEND_FALLBACK && !d->handshake_done)))
			__atomic_store_n(&waiting_seen, true, __ATOMIC_RELEASE);
		fo_unlock_cqs(d);
	}
	/* (a batched read the pass did not use is stale by the next one) */
	for (int i = 0; i < s->nfo; i++) {
		struct shift_dqp *d = s->fo[i];

		if (d)
			d->kv_pref = 0;
	}
	fast_again(s, head);
	/* (fast again, its backups unarmed by this pass: armed by the next,
	 * now) */
	if (!armed && !__atomic_load_n(&s->slow, __ATOMIC_ACQUIRE))
		shift_rnic_due(r, shift_clock_ms());
}
