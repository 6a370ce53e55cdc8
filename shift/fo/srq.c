/*
 * Failover of QPs on a shared receive queue (the SRQ's mirror is
 * shift/dp/dsrq.h; the front's side shift/srq.c).
 *
 * An SRQ's receives belong to no QP: any QP on it consumes the oldest. And
 * a WQE posted to an SRQ stays there until a message consumes it: verbs
 * cannot take it back. So the receives cannot move to the backup NIC while
 * a QP still reads the default SRQ (a buffer posted on both could take two
 * messages), nor can part of them. The SRQ fails over as a whole:
 *
 * - The first QP on it that fails over stops every other QP on it (their
 *   own failovers, fo_start(), as if each had seen the error: their peers
 *   follow on the handshake message as usual) once it has checked that
 *   each one can (fo_srq_can_move: else it gives up, and the error is the
 *   application's). From then on the SRQ is "moved": the default SRQ is
 *   never read again (its QPs stay in ERR, there is no failback to it; a
 *   QP the application connects on it later is refused, shift/srq.c), and
 *   the application's posts are only recorded in the mirror.
 * - Each backup QP has a receive queue of its own: SHIFT's control receive
 *   at its head (the handshake works as for any QP) and SHIFT_SRQ_BOUNCE
 *   receives of SHIFT's buffers behind it (fo_srq_post_bounce). What the
 *   peer sends lands there; it counts in the QP's receive counter at once
 *   (it was executed: the handshake after a later failover must say so),
 *   and goes, in arrival order, into the oldest receive the application
 *   posted on the SRQ and has not had back (fo_srq_deliver): its data
 *   copied, its completion the application's (wr_id, QP number, length,
 *   immediate). A message that finds no receive waits until the
 *   application posts one; its buffer is posted again only then, so at
 *   most SHIFT_SRQ_BOUNCE messages per QP wait, and the sender sees RNR
 *   beyond that, as it would with an empty SRQ.
 * - The receive counter of each QP (the handshake's) is the number of
 *   receives that QP consumed: its own successful receive completions,
 *   as for a QP with a receive queue.
 */
#include "shift/fo/fo_int.h"
#include "shift/dp/dsrq.h"

enum { SLOT_FREE, SLOT_POSTED, SLOT_PENDING };

struct slot {
	struct slot *next;      /* the SRQ's pending FIFO */
	struct shift_dqp *d;
	struct ibv_wc wc;
	uint8_t state;
	unsigned gen;           /* the backup generation it was posted in */
};

struct bounce {
	uint8_t *buf;
	uint32_t len;           /* bytes per slot */
	struct ibv_mr *mr;      /* on the backup QP's PD */
	struct slot slot[SHIFT_SRQ_BOUNCE];
};

/* ---- moving an SRQ ----------------------------------------------------------- */

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

/* May the QPs of d's SRQ all leave the default SRQ now? Each one other
 * than d is failed over already, can fail over (its backup ready), or
 * reads nothing (never connected, or in ERR: a connection that failed). */
bool fo_srq_can_move(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_dsrq *q = d->dsrq;

	if (shift_dsrq_unprotected(q))
		return false;
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *x = s->dqp[i]; x; x = x->next_in_bucket) {
			if (x == d || x->dsrq != q)
				continue;
			if (x->send_state == SHIFT_SEND_UNPROTECTED) {
				if (!reads_nothing(x->qp))
					return false; /* (its default QP may be live) */
				continue;
			}
			if (x->send_state != SHIFT_SEND_DEFAULT)
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
 * fails over too (slow_lock held). */
void fo_srq_move(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_dsrq *q = d->dsrq;
	unsigned n = 0;

	shift_dsrq_lock(q);
	__atomic_store_n(&q->moved, true, __ATOMIC_RELEASE);
	shift_dsrq_unlock(q);
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *x = s->dqp[i]; x; x = x->next_in_bucket) {
			if (x == d || x->dsrq != q || x->send_state != SHIFT_SEND_DEFAULT ||
			    !x->shadow || __atomic_load_n(&x->shadow->state, __ATOMIC_ACQUIRE) !=
						  SHIFT_SHADOW_READY)
				continue;
			struct out o = { .wc = NULL, .n = 0, .max = 0, .c = x->scq };

			n++;
			fo_start(s, x, &o, NULL);
			if (x->send_state == SHIFT_SEND_UNPROTECTED && !reads_nothing(x->qp)) {
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

/* ---- SHIFT's receives on the backup QP ----------------------------------------- */

static struct bounce *bounce_of(struct shift_dqp *d)
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

static int post_slot(struct shift_dqp *d, struct bounce *b, unsigned k)
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
	struct bounce *b = bounce_of(d);

	if (!b)
		return -1;
	for (unsigned k = 0; k < SHIFT_SRQ_BOUNCE; k++) {
		struct slot *x = &b->slot[k];

		if (x->state == SLOT_POSTED && x->gen != d->bk_gen)
			x->state = SLOT_FREE;
		if (x->state == SLOT_FREE && post_slot(d, b, k))
			return -1;
	}
	return 0;
}

/* ---- what arrives on the backup QPs ----------------------------------------- */

/* Copy a message's bytes into an application receive's SGEs: false if
 * they do not fit (the application's receive is too short). */
static bool scatter(const struct shift_dsrq_entry *e, const uint8_t *src, uint32_t len)
{
	uint64_t room = 0;

	for (uint32_t i = 0; i < e->num_sge; i++)
		room += e->sge[i].length;
	if (len > room)
		return false;
	for (uint32_t i = 0; i < e->num_sge && len; i++) {
		uint32_t n = e->sge[i].length < len ? e->sge[i].length : len;

		memcpy((void *)(uintptr_t)e->sge[i].addr, src, n);
		src += n;
		len -= n;
	}
	return true;
}

/* The messages waiting on q go into the oldest receives the application
 * posted, in arrival order; each slot is posted again (o: the CQ being
 * polled, or NULL). */
void fo_srq_deliver(struct shift_dsrq *q, struct out *o)
{
	union {
		struct shift_dsrq_entry e;
		uint8_t room[sizeof(struct shift_dsrq_entry) + SHIFT_DSRQ_MAX_SGE * sizeof(struct ibv_sge)];
	} u;
	struct slot *x;

	if (q->max_sge > SHIFT_DSRQ_MAX_SGE)
		return; /* (not mirrored: the front refuses such SRQs) */
	while ((x = q->fo_pending_head) && shift_dsrq_take_oldest(q, &u.e) == 0) {
		struct shift_dqp *d = x->d;
		struct bounce *b = d->fo_bounce;
		unsigned k = (unsigned)(x - b->slot);
		struct ibv_wc wc = x->wc;
		struct out ro = { .wc = NULL, .n = 0, .max = 0, .c = d->rcq };

		q->fo_pending_head = x->next;
		if (!x->next)
			q->fo_pending_tail = NULL;
		if (wc.opcode == IBV_WC_RECV &&
		    !scatter(&u.e, b->buf + (size_t)k * b->len, wc.byte_len))
			wc.status = IBV_WC_LOC_LEN_ERR;
		wc.wr_id = u.e.wr_id;
		wc.qp_num = d->qpn;
		fo_emit(o && o->c == d->rcq ? o : &ro, &wc);
		x->state = SLOT_FREE;
		if (d->send_state != SHIFT_SEND_UNPROTECTED && d->bk && x->gen == d->bk_gen)
			(void)post_slot(d, b, k);
	}
}

/* A completion of SHIFT's receive on d's backup QP (application data, or
 * its failure). */
void fo_srq_bounced(struct shift_dqp *d, struct ibv_wc *wc, struct out *o)
{
	struct bounce *b = d->fo_bounce;
	unsigned k = (unsigned)(SHIFT_WRID_INDEX(wc->wr_id) & ~SHIFT_WRID_BOUNCE);
	struct shift_dsrq *q = d->dsrq;

	if (!b || !q || k >= SHIFT_SRQ_BOUNCE || b->slot[k].state != SLOT_POSTED)
		return;
	struct slot *x = &b->slot[k];

	if (wc->status != IBV_WC_SUCCESS) {
		x->state = SLOT_FREE;
		return;
	}
	shift_dqp_retire(d, wc); /* (its receive counter) */
	x->wc = *wc;
	x->state = SLOT_PENDING;
	x->next = NULL;
	if (q->fo_pending_tail)
		((struct slot *)q->fo_pending_tail)->next = x;
	else
		q->fo_pending_head = x;
	q->fo_pending_tail = x;
	fo_srq_deliver(q, o);
}

/* Messages waiting for receives the application has posted since: every
 * SRQ of s's failed-over QPs (slow_lock held; o as for fo_srq_deliver). */
void fo_srq_deliver_all(struct shift_ctx *s, struct out *o)
{
	int n = __atomic_load_n(&s->nfo, __ATOMIC_ACQUIRE);

	for (int i = 0; i < n; i++) {
		struct shift_dqp *d = __atomic_load_n(&s->fo[i], __ATOMIC_ACQUIRE);

		if (d && d->dsrq && d->dsrq->fo_pending_head)
			fo_srq_deliver(d->dsrq, o);
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
			} else {
				prev = x;
			}
			x = nx;
		}
	}
	if (b->mr)
		shift_lower->dereg_mr(b->mr);
	free(b->buf);
	free(b);
	d->fo_bounce = NULL;
}
