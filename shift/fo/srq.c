/*
 * Failover and failback of QPs on a shared receive queue (the SRQ's mirror
 * is shift/dp/dsrq.h; the front's side shift/srq.c; fo/srq_deliver.c hands
 * out what arrives on the backup QPs, fo/srq_burn.c takes WQEs out of the
 * default SRQ).
 *
 * An SRQ's receives belong to no QP: any QP on it consumes the oldest. And
 * a WQE posted to an SRQ stays there until a message consumes it: verbs
 * cannot take it back, except by consuming it. So:
 *
 * - Failover moves the SRQ as a whole. The first QP on it that fails over
 *   stops every other QP on it that may read the default SRQ (their own
 *   failovers, fo_start(), as if each had seen the error; a QP on its way
 *   back a new episode; their peers follow as usual) once it has checked
 *   that each one can (fo_srq_can_move: else it gives up). From then on the
 *   SRQ is "moved": no QP reads the default SRQ (a QP the application
 *   connects on it is refused, shift/srq.c), the application's posts are
 *   only recorded, and what arrives on the backup QPs fills the oldest
 *   live receives (their WQEs in the default SRQ go stale).
 * - Each backup QP has a receive queue of its own: SHIFT's control receive
 *   at its head (the handshake works as for any QP) and SHIFT_SRQ_BOUNCE
 *   receives of SHIFT's buffers behind it (fo_srq_post_bounce). What the
 *   peer sends lands there and counts in the QP's receive counter at once
 *   (it was executed: a later handshake must say so).
 * - Once the default NIC is back, SHIFT consumes every WQE left in the
 *   default SRQ with empty SENDs of its own (fo_srq_work, fo/srq_burn.c),
 *   then posts the live receives there again: the SRQ is no longer moved,
 *   and its QPs fail back one by one as any QP (the default QP reset, the
 *   probe, the notification: on an SRQ the first receive a reset default
 *   QP consumes, fo_srq_take_notify). A QP still on its backup then gets a
 *   receive for each message by consuming the default SRQ's next one the
 *   same way. Receive completions of a reset default QP wait until the
 *   QP's backup-path messages are all handed out (fo_srq_defer), so each
 *   QP's completions keep their order.
 * - The receive counter of each QP (the handshake's, the notification's)
 *   is the number of receives that QP consumed, as for a QP with a receive
 *   queue.
 */
#include "shift/fo/srq_int.h"

/* ---- moving an SRQ ---------------------------------------------------------- */

/* Does the QP read no receive now (RESET, INIT, ERR)? It cannot read
 * the default SRQ again once moved: connecting it is refused (shift/srq.c). */
static bool reads_nothing(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;

	memset(&a, 0, sizeof(a));
	if (shift_lower->query_qp(qp, &a, IBV_QP_STATE, &ia))
		return false;
	return a.qp_state == IBV_QPS_RESET || a.qp_state == IBV_QPS_INIT ||
	       a.qp_state == IBV_QPS_ERR;
}

/* May x's default QP read the default SRQ? Its sends are on it, its
 * receives are back on it, or it was reset for a failback (the peer's
 * notification, and what the peer sends after it, land there). */
static bool on_default(const struct shift_dqp *x)
{
	return shift_dqp_send_state(x) == SHIFT_SEND_DEFAULT || shift_dqp_recv_state(x) == SHIFT_RECV_DEFAULT ||
	       x->dflt != SHIFT_DFLT_ERR;
}

/* May the QPs of d's SRQ all leave the default SRQ now? Each one other
 * than d is failed over with its default QP stopped, can fail over (its
 * backup ready: a new episode for one on its way back), or reads nothing
 * (never connected, or in ERR: a connection that failed). */
bool fo_srq_can_move(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_dsrq *q = d->dsrq;

	if (shift_dsrq_unprotected(q))
		return false;
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *x = shift_dqp_first(s, i); x; x = shift_dqp_next(x)) {
			if (x == d || x->dsrq != q)
				continue;
			if (shift_dqp_send_state(x) == SHIFT_SEND_UNPROTECTED) {
				/* (one whose connection SHIFT failed is stopped
				 * by the move; another's may be live) */
				if (!x->failovers && !reads_nothing(x->qp))
					return false;
				continue;
			}
			if (!on_default(x))
				continue;
			pthread_mutex_lock(&s->rnic->lock);
			bool connected = x->shadow && x->shadow->app_state >= IBV_QPS_RTR &&
					 x->shadow->app_state != IBV_QPS_ERR;
			pthread_mutex_unlock(&s->rnic->lock);
			if (connected && (!x->shadow || !x->scq || !x->rcq ||
					  __atomic_load_n(&x->shadow->state, __ATOMIC_ACQUIRE) !=
						  SHIFT_SHADOW_READY))
				return false;
		}
	}
	return true;
}

/* d (stopped, drained) takes its SRQ's receives over: every other QP on it
 * that may read the default SRQ fails over too, a QP on its way back a
 * new episode (slow_lock held). */
void fo_srq_move(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_dsrq *q = d->dsrq;
	unsigned n = 0;

	shift_dsrq_lock(q);
	__atomic_store_n(&q->moved, true, __ATOMIC_RELEASE);
	shift_dsrq_unlock(q);
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *x = shift_dqp_first(s, i); x; x = shift_dqp_next(x)) {
			if (x != d && x->dsrq == q && shift_dqp_send_state(x) == SHIFT_SEND_UNPROTECTED &&
			    x->failovers && !reads_nothing(x->qp)) {
				/* (its connection failed: its default QP, reset for
				 * a failback, must not read the SRQ either) */
				struct ibv_qp_attr e = { .qp_state = IBV_QPS_ERR };

				shift_lower->modify_qp(x->qp, &e, IBV_QP_STATE);
				continue;
			}
			if (x == d || x->dsrq != q || shift_dqp_send_state(x) == SHIFT_SEND_UNPROTECTED ||
			    !on_default(x) || !x->shadow ||
			    __atomic_load_n(&x->shadow->state, __ATOMIC_ACQUIRE) != SHIFT_SHADOW_READY)
				continue;
			struct out o = { .wc = NULL, .n = 0, .max = 0, .c = x->scq };

			n++;
			fo_start(s, x, &o, NULL);
			if (shift_dqp_send_state(x) == SHIFT_SEND_UNPROTECTED && !reads_nothing(x->qp)) {
				/* (it could not fail over after all: it must not
				 * read the default SRQ either) */
				struct ibv_qp_attr e = { .qp_state = IBV_QPS_ERR };

				shift_lower->modify_qp(x->qp, &e, IBV_QP_STATE);
			}
		}
	}
	shift_info("%s QP %u: its SRQ's receives move to the backup path (%u more QPs on the SRQ "
		   "fail over with it; %u receives outstanding)", d->dev, d->qpn, n, q->live);
}

/* The default NIC of an SRQ back on its default SRQ died again while
 * messages on backup QPs wait for receives it holds (none of its QPs reads
 * it, or none can now: the port watch fails those over): the receives move
 * to the backup path again, through d (failed over), and its default QP
 * is stopped if it was reset for a failback. */
static void move_again(struct shift_ctx *s, struct shift_dqp *d)
{
	if (!fo_srq_can_move(s, d))
		return; /* (a QP still on the default path: the port watch first) */
	if (on_default(d)) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

		fo_start(s, d, &o, NULL); /* (it moves them) */
		return;
	}
	fo_srq_move(s, d);
}

/* d, failed over already, cannot fail over again with its SRQ (another QP
 * on it cannot): the connection fails for the application, every WR still
 * outstanding on either QP flushed to it (as when an episode expires). */
void fo_srq_fail(struct shift_ctx *s, struct shift_dqp *d, struct out *o)
{
	struct ibv_qp_attr e = { .qp_state = IBV_QPS_ERR };

	if (d->bk)
		shift_lower->modify_qp(d->bk, &e, IBV_QP_STATE);
	shift_lower->modify_qp(d->qp, &e, IBV_QP_STATE);
	shift_dqp_lock(d);
	shift_dqp_set_send_state(d, SHIFT_SEND_FALLBACK, "the connection fails");
	shift_dqp_unlock(d);
	fo_drain_default(s, d->scq, NULL);
	if (d->rcq != d->scq)
		fo_drain_default(s, d->rcq, NULL);
	fo_fail_connection(d, o, "a QP on its SRQ cannot fail over again", NULL, 0);
}

/* ---- SHIFT's receives on the backup QP ------------------------------------- */

struct bounce *fo_srq_bounce_of(struct shift_dqp *d)
{
	struct bounce *b = d->fo_bounce;
	struct shift_rnic *r = shift_rnic_of(d->qp->context);

	if (b || !r || !d->shadow || !d->shadow->pd || !d->shadow->pd->bk)
		return b;
	b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	/* room for the largest receive the application posted so far */
	b->len = (uint32_t)((d->dsrq->max_len < 64 ? 64 : d->dsrq->max_len) + 63) & ~63u;
	b->buf = calloc(SHIFT_SRQ_BOUNCE, b->len);
	if (b->buf)
		b->mr = shift_lower->reg_mr(d->shadow->pd->bk, b->buf,
					    (size_t)SHIFT_SRQ_BOUNCE * b->len, IBV_ACCESS_LOCAL_WRITE);
	if (!b->mr) {
		free(b->buf);
		free(b);
		return NULL;
	}
	d->fo_bounce = b;
	return b;
}

int fo_srq_post_slot(struct shift_dqp *d, struct bounce *b, unsigned k)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(b->buf + (size_t)k * b->len), .length = b->len,
			       .lkey = b->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = SHIFT_WRID_DATA | SHIFT_WRID_RECV | SHIFT_WRID_BOUNCE |
					   SHIFT_WRID_GEN(d->bk_gen) | k,
				  .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(d->bk, &wr, &bad))
		return -1;
	b->slot[k].state = SLOT_POSTED;
	b->slot[k].gen = d->bk_gen;
	b->slot[k].d = d;
	return 0;
}

/* SHIFT's receives on d's backup QP, behind its control receive: every
 * slot not waiting for an application receive (a reset emptied the queue
 * of the earlier generation's). 0, or -1. */
int fo_srq_post_bounce(struct shift_dqp *d)
{
	struct bounce *b = fo_srq_bounce_of(d);

	if (!b)
		return -1;
	for (unsigned k = 0; k < SHIFT_SRQ_BOUNCE; k++) {
		struct slot *x = &b->slot[k];

		if (x->state == SLOT_POSTED && x->gen != d->bk_gen)
			x->state = SLOT_FREE;
		if (x->state == SLOT_FREE && fo_srq_post_slot(d, b, k))
			return -1;
	}
	return 0;
}

/* ---- failback ----------------------------------------------------------------- */

/* d's default QP was reset: the next receive it consumes is the peer's
 * failback notification (an SRQ has no room for SHIFT's own receive). */
void fo_srq_expect_notify(struct shift_dqp *d)
{
	struct bounce *b = fo_srq_bounce_of(d);

	if (b)
		b->notify_due = true;
}

/* A receive completion of d on its default QP: the notification (true; wc
 * becomes SHIFT's control receive's, and the application's receive it
 * consumed, empty, stays the application's). */
bool fo_srq_take_notify(struct shift_dqp *d, struct ibv_wc *wc)
{
	struct bounce *b = d->fo_bounce;

	if (!b || !b->notify_due || wc->status != IBV_WC_SUCCESS)
		return false;
	b->notify_due = false;
	shift_dsrq_burned(d->dsrq, wc->wr_id);
	wc->wr_id = shift_dqp_own_wrid(d, SHIFT_OWN_CTRL_RECV);
	return true;
}

/* The background's share for the SRQs of s's failed-over QPs: their pairs'
 * completions; a moved SRQ emptied of the WQEs the backup path made stale
 * once its port is up, then its receives back on it (its QPs may fail back
 * from then on); receives taken out and not needed put back. */
void fo_srq_work(struct shift_ctx *s)
{
	struct shift_dsrq *seen[8];
	unsigned nseen = 0;
	int n = __atomic_load_n(&s->nfo, __ATOMIC_ACQUIRE);

	for (int i = 0; i < n; i++) {
		struct shift_dqp *d = __atomic_load_n(&s->fo[i], __ATOMIC_ACQUIRE);
		struct shift_dsrq *q = d ? d->dsrq : NULL;
		bool dup = false;

		for (unsigned k = 0; q && k < nseen; k++)
			dup |= seen[k] == q;
		if (!q || dup || shift_dsrq_unprotected(q))
			continue;
		if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED) {
			/* (its connection ended: messages of its may still wait
			 * for receives the pair takes out, its error behind
			 * them; the SRQ's other QPs still get their turn) */
			if (!shift_dsrq_moved(q) && fo_srq_waits(d)) {
				fo_srq_burn_poll(q);
				fo_srq_deliver(q, NULL);
			}
			continue;
		}
		if (nseen < 8)
			seen[nseen++] = q;
		fo_srq_burn_poll(q);
		if (!shift_dsrq_moved(q) && fo_srq_waiting(q) && !fo_port_active(s, d))
			move_again(s, d);
		if (!shift_dsrq_moved(q)) {
			fo_srq_deliver(q, NULL);
			if (!q->fo_pending_head && !fo_srq_burning(q) && shift_dsrq_held(q))
				(void)shift_dsrq_repost(q, false);
			continue;
		}
		if (!fo_port_active(s, d))
			continue; /* (the default NIC is not back) */
		if (q->d_phys > fo_srq_burning(q))
			fo_srq_burn(s, q, d, q->d_phys - fo_srq_burning(q));
		if (!q->d_phys && !fo_srq_burning(q) && shift_dsrq_repost(q, true) >= 0)
			shift_info("%s: SRQ's default receives consumed by SHIFT: %u receives back on "
				   "the default SRQ, its QPs may fail back", q->dev, q->live);
	}
}

/* d is being destroyed: its waiting messages leave the SRQ's FIFO (they
 * are lost with the QP, as a plain QP's receive completions are), and
 * SHIFT's buffers are released. */
void fo_srq_forget(struct shift_dqp *d)
{
	struct bounce *b = d->fo_bounce;
	struct shift_dsrq *q = d->dsrq;

	if (!b)
		return;
	if (q) {
		struct slot *prev = NULL;

		for (struct slot *x = q->fo_pending_head; x;) {
			struct slot *nx = x->next;

			if (x->d == d) {
				if (prev)
					prev->next = nx;
				else
					q->fo_pending_head = nx;
				if (q->fo_pending_tail == x)
					q->fo_pending_tail = prev;
				if (x->state == SLOT_READY)
					free(x);
			} else {
				prev = x;
			}
			x = nx;
		}
	}
	while (b->held_head) {
		struct slot *x = b->held_head;

		b->held_head = x->next;
		free(x);
	}
	if (b->mr)
		shift_lower->dereg_mr(b->mr);
	free(b->buf);
	free(b);
	d->fo_bounce = NULL;
}
