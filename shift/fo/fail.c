/*
 * A connection that cannot be saved once its QP has left the Default state
 * (a failover or failback that cannot go on, the peer's ABORT, an atomic in
 * flight, an episode the peer never joined) fails for the application as it
 * would without SHIFT: every send and receive WR it posted completes once,
 * in order, with an error (the path's on the first send for a give-up, a
 * flush for the rest) unless it completed before, and both its QP and the
 * peer's end in ERR. Nothing is left waiting.
 *
 * Where the WRs are decides who completes them:
 * - on the backup QP: it stops (ERR) and its CQs are drained at once, its
 *   successes kept for the application (they executed), its errors
 *   dropped; its generation moves on, so whatever of it comes later is
 *   dropped too (from_backup). SHIFT flushes the rest itself.
 * - held in the mirror only (waiting for the handshake, the fence, a
 *   failback): SHIFT flushes them.
 * - on the default QP (a direction back there, or moving back when the
 *   give-up came): the provider's, as without SHIFT: the QP goes to ERR and
 *   its flushes reach the application unfiltered; the held WRs behind them
 *   in the same queue flush after them (the default CQs are drained first).
 *
 * The peer learns it from an ABORT handshake message, if my control
 * message of this episode is not spent (its one control receive: then the
 * backup QP carries nothing of the application's but receives the peer
 * never fills, and runs on for the ABORT to leave), and from
 * my record in the KV store (closed: it ends its side as if my application
 * had ended the connection, fo_end). A peer still in the Default state
 * finds my QP in ERR as it would without SHIFT.
 */
#include "shift/fo/fo_int.h"

/* ABORT to the peer, which waits for my handshake message (its control
 * receive is not consumed yet): best effort. true if it went out now. */
bool fo_tell_abort(struct shift_dqp *d)
{
	if (!d->ctrl_sent && d->shadow &&
	    __atomic_load_n(&d->shadow->state, __ATOMIC_ACQUIRE) == SHIFT_SHADOW_READY) {
		if (!d->bk)
			d->bk = d->shadow->bk;
		d->ctrl_sent = fo_send_ctrl(d, CTRL_ABORT) == 0;
		return d->ctrl_sent;
	}
	return false;
}

/* A give-up found where the connection cannot fail at once (post_lock
 * held): fo_fail_pending() finishes it. The send (receive) WRs before sq
 * (rq) are on the default QP (FO_BY_STATE: as the states say). The first
 * mark wins. */
void fo_fail_mark(struct shift_dqp *d, const char *why, uint64_t sq, uint64_t rq)
{
	if (d->fail_why || shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED)
		return;
	d->fail_why = why;
	d->fail_sq = sq;
	d->fail_rq = rq;
}

/* Finish a give-up fo_fail_mark() recorded (o: NULL to keep the
 * completions): true if there was one. post_lock not held. */
bool fo_fail_pending(struct shift_dqp *d, struct out *o)
{
	if (!d->fail_why)
		return false;
	fo_fail_connection(d, o, d->fail_why, NULL, FO_TELL_PEER | FO_PATH_ERROR);
	return true;
}

/* A give-up after leaving Default: the connection fails now. */
void fo_give_up_late(struct shift_dqp *d, struct out *o, const char *why)
{
	fo_fail_mark(d, why, FO_BY_STATE, FO_BY_STATE);
	fo_fail_pending(d, o);
}

/* The first send (receive) SHIFT completes itself: the WRs before it are
 * done or the provider's (on the default QP). post_lock held, synced. */
static void held_from(struct shift_dqp *d, uint64_t *sq, uint64_t *rq)
{
	bool marked = d->fail_why != NULL;

	*sq = marked && d->fail_sq != FO_BY_STATE ? d->fail_sq
	      : shift_dqp_send_state(d) == SHIFT_SEND_DEFAULT ? d->sq_head : d->sq_tail;
	*rq = marked && d->fail_rq != FO_BY_STATE ? d->fail_rq
	      : shift_dqp_recv_state(d) == SHIFT_RECV_FALLBACK ? SHIFT_LOAD(d->rq_tail) : d->rq_head;
	if (*sq < d->sq_tail)
		*sq = d->sq_tail;
	if (*rq < SHIFT_LOAD(d->rq_tail))
		*rq = SHIFT_LOAD(d->rq_tail);
	if (d->post_failed) {
		/* (WRs of a refused post: SHIFT's, behind the provider's) */
		*sq = *sq < d->sq_taken ? *sq : d->sq_taken;
		*rq = *rq < d->rq_taken ? *rq : d->rq_taken;
	}
}

/* The default QP to ERR; if a queue has WRs on it with held ones behind,
 * its flushes come first (the default CQs drained, d unprotected). */
static void stop_default_qp(struct shift_ctx *s, struct shift_dqp *d, struct out *o,
			    bool partial)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

	shift_lower->modify_qp(d->qp, &a, IBV_QP_STATE);
	if (!partial || !s)
		return;
	shift_ctx_set_slow(s, true);
	fo_drain_default(s, d->scq, o);
	if (d->rcq != d->scq)
		fo_drain_default(s, d->rcq, o);
}

/*
 * The connection fails for the application (see the top of this file):
 * why for the log; err, the error that started it, if any, in its place;
 * how: FO_TELL_PEER (ABORT), FO_PATH_ERROR (with no err, the first send
 * SHIFT completes gets the path's error, as plain's would). o: the
 * caller's completions (NULL: kept). Its CQs locked, post_lock not held.
 */
void fo_fail_connection(struct shift_dqp *d, struct out *o, const char *why,
			const struct ibv_wc *err, unsigned how)
{
	struct shift_ctx *s = shift_ctx_of(d->qp->context);
	struct out ko = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };
	struct ibv_wc path = { .status = IBV_WC_RETRY_EXC_ERR, .qp_num = d->qpn };
	uint64_t sq, rq;

	if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED) {
		d->fail_why = NULL;
		return;
	}
	shift_warn("%s QP %u: cannot fail over (%s): the connection fails for the application",
		   d->dev, d->qpn, why);
	if (!o || (o->c != d->scq && o->c != d->rcq))
		o = &ko;
	bool told = (how & FO_TELL_PEER) && fo_tell_abort(d);

	d->app_ended = true; /* (no failback step; late backup completions dropped) */
	/* An ABORT that goes out now is my first message of the episode: the
	 * peer never had my counter, so it sent nothing to my backup QP, and
	 * none of my sends went there (retransmission follows my message).
	 * The backup runs on for the ABORT to leave; else it stops now. */
	if (s && d->bk && d->need_rearm && !told)
		fo_flush_backup(s, d, true); /* (its successes kept, in order) */
	SHIFT_STAT_SET(d->bk_gen, (d->bk_gen + 1) & 0x3fffu);
	shift_dqp_lock(d);
	shift_dqp_sync_locked(d);
	held_from(d, &sq, &rq);
	bool partial = (sq > d->sq_tail && sq < d->sq_head) ||
		       (rq > SHIFT_LOAD(d->rq_tail) && rq < d->rq_head);
	bool first = sq == d->sq_tail && sq < d->sq_head; /* (no send of it on the default QP) */

	d->fail_why = NULL;
	d->recv_hold = false;
	d->notify_pending = false;
	d->post_failed = false;
	shift_dqp_set_send_state(d, SHIFT_SEND_UNPROTECTED, why);
	shift_dqp_unlock(d);
	stop_default_qp(s, d, o, partial);
	if (!err && (how & FO_PATH_ERROR) && first) {
		path.wr_id = shift_dqp_swqe(d, sq)->wr_id;
		err = &path;
	}
	fo_flush_held(d, o, err, sq, rq);
	if (s && !d->failovers)
		fo_remove(s, d);
	/* a peer on its backup, or one that starts a failover after this
	 * (its QP meets mine in ERR), reads it in my record (closed): also
	 * when this connection never failed over (an atomic in flight at
	 * its first failover, an ABORT that cannot leave), once my shadow
	 * published its record, so that the QP's end deletes this one too
	 * (shadow/replay.c) */
	if (s && d->shadow && !d->peer_closed &&
	    (d->failovers ||
	     __atomic_load_n(&d->shadow->state, __ATOMIC_ACQUIRE) == SHIFT_SHADOW_READY))
		fo_ep_publish(s, d);
}
