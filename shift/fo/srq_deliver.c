/*
 * What arrives on the backup QPs of QPs on an SRQ, handed to the
 * application (see fo/srq.c): each message SHIFT's receive took waits, in
 * arrival order across the SRQ's QPs, for the oldest receive the
 * application posted on the SRQ and has not had back; its bytes are copied
 * there and its completion is the application's. Receive completions of
 * the default path that must not overtake them wait in the same line.
 */
#include "shift/fo/srq_int.h"

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

/* Pop the oldest waiting item of q (lock: slow_lock). */
static void pop(struct shift_dsrq *q, struct slot *x)
{
	q->fo_pending_head = x->next;
	if (!x->next)
		q->fo_pending_tail = NULL;
}

/* The messages that arrived on the backup QPs and wait for receives:
 * until the first of them without one. */
unsigned fo_srq_waiting(const struct shift_dsrq *q)
{
	unsigned n = 0;

	for (const struct slot *x = q->fo_pending_head; x; x = x->next)
		n += x->state == SLOT_PENDING;
	return n;
}

/* Put one waiting message into the application's receive e. */
static void fill(struct slot *x, const struct shift_dsrq_entry *e, struct out *o)
{
	struct shift_dqp *d = x->d;
	struct bounce *b = d->fo_bounce;
	unsigned k = (unsigned)(x - b->slot);
	struct ibv_wc wc = x->wc;
	struct out ro = { .wc = NULL, .n = 0, .max = 0, .c = d->rcq };

	if (wc.opcode == IBV_WC_RECV && !scatter(e, b->buf + (size_t)k * b->len, wc.byte_len))
		wc.status = IBV_WC_LOC_LEN_ERR;
	wc.wr_id = e->wr_id;
	wc.qp_num = d->qpn;
	fo_emit(o && o->c == d->rcq ? o : &ro, &wc);
	x->state = SLOT_FREE;
	if (shift_dqp_send_state(d) != SHIFT_SEND_UNPROTECTED && d->bk && x->gen == d->bk_gen)
		(void)fo_srq_post_slot(d, b, k);
}

/* The messages waiting on q go into the oldest receives the application
 * posted, in arrival order, each slot posted again; the default path's
 * completions held behind them follow in their place (o: the CQ being
 * polled, or NULL). Once q is back on the default SRQ, a receive for a
 * message comes out of it by an empty SEND of SHIFT's (fo/srq_burn.c). */
void fo_srq_deliver(struct shift_dsrq *q, struct out *o)
{
	union {
		struct shift_dsrq_entry e;
		uint8_t room[sizeof(struct shift_dsrq_entry) + SHIFT_DSRQ_MAX_SGE * sizeof(struct ibv_sge)];
	} u;
	struct slot *x;

	if (q->max_sge > SHIFT_DSRQ_MAX_SGE)
		return; /* (not mirrored: the front refuses such SRQs) */
	while ((x = q->fo_pending_head)) {
		struct shift_dqp *d = x->d;

		if (x->state == SLOT_READY) {
			struct shift_cq *c = x->c ? x->c : d->rcq;
			struct out ro = { .wc = NULL, .n = 0, .max = 0, .c = c };

			pop(q, x);
			fo_emit(o && o->c == c ? o : &ro, &x->wc);
			free(x);
		} else if (shift_dsrq_take_oldest(q, &u.e) == 0) {
			pop(q, x);
			fill(x, &u.e, o);
		} else {
			unsigned need = fo_srq_waiting(q), burning = fo_srq_burning(q);
			struct shift_ctx *s = shift_ctx_of(d->qp->context);

			if (s && !shift_dsrq_moved(q) && need > burning &&
			    fo_srq_burn(s, q, d, need - burning))
				shift_debug("%s: %u receives taken out of the default SRQ for messages "
					    "on backup QPs", q->dev, need - burning);
			break;
		}
		if (d->notify_pending)
			fo_try_notify(d); /* (its receives may move back now) */
	}
}

static void append(struct shift_dsrq *q, struct slot *x)
{
	x->next = NULL;
	if (q->fo_pending_tail)
		((struct slot *)q->fo_pending_tail)->next = x;
	else
		q->fo_pending_head = x;
	q->fo_pending_tail = x;
}

/* A receive completion of d on the default path: held (true) while it
 * must wait, so each QP's completions keep their order: d's default QP was
 * reset for a failback and d's receives are not back yet (the messages of
 * the backup path, all earlier, are not all handed out), or messages that
 * arrived on a backup QP before it wait for receives. */
bool fo_srq_defer(struct shift_dqp *d, const struct ibv_wc *wc)
{
	struct shift_dsrq *q = d->dsrq;
	bool reset = d->dflt != SHIFT_DFLT_ERR && shift_dqp_recv_state(d) == SHIFT_RECV_FALLBACK;
	struct bounce *b = reset ? fo_srq_bounce_of(d) : NULL;
	struct slot *x;

	if ((!reset && !q->fo_pending_head) || (reset && !b) || !(x = calloc(1, sizeof(*x))))
		return false;
	x->d = d;
	x->wc = *wc;
	x->state = SLOT_READY;
	if (!reset) {
		append(q, x);
		return true;
	}
	if (b->held_tail)
		b->held_tail->next = x;
	else
		b->held_head = x;
	b->held_tail = x;
	b->late++;
	return true;
}

/* The messages on d's SRQ that wait for receives, up to d's last item in
 * its line (a message, or a completion held behind them); *mine: d has one
 * there; *ending: one of d's ending completions already waits there. */
static unsigned waiting_to(const struct shift_dqp *d, bool *mine, bool *ending)
{
	unsigned n = 0, to = 0;

	*mine = *ending = false;
	for (const struct slot *x = d->dsrq->fo_pending_head; x; x = x->next) {
		n += x->state == SLOT_PENDING;
		if (x->d != d)
			continue;
		to = n;
		*mine = true;
		*ending |= x->state == SLOT_READY && x->c;
	}
	return to;
}

/*
 * A completion of d as its connection ends (the application's error, its
 * flushes): messages that arrived on d's backup QP before it may still wait
 * for receives (fo_srq_deliver), and so may d's receive completions of the
 * default path held behind them (fo_srq_defer; those its reset default QP
 * took before its receives were back join the line now): it follows them,
 * as plain's CQ would have their completions first. Those with a receive
 * now are handed out now; the rest are waited for only if the receives
 * will come (SHIFT takes them out of the default SRQ, which holds enough
 * live ones; while moved, a waiting message has none): a completion the
 * application waits for must not depend on receives it may never post.
 * Once one waits, the later ones follow it.
 */
void fo_emit_after_srq(struct shift_dqp *d, struct out *o, const struct ibv_wc *wc)
{
	struct shift_dsrq *q = d->dsrq;
	bool mine = false, ending = false;
	unsigned need = 0;
	struct bounce *b = d->fo_bounce;
	struct slot *x;

	if (q) {
		if (b && b->held_head)
			fo_srq_release(d); /* (received before this completion) */
		(void)waiting_to(d, &mine, &ending);
		if (mine && !ending)
			fo_srq_deliver(q, o); /* (those with a receive now: now) */
		need = waiting_to(d, &mine, &ending);
	}
	if ((!ending && (!mine || shift_dsrq_moved(q) ||
			 __atomic_load_n(&q->live, __ATOMIC_RELAXED) < need)) ||
	    !(x = calloc(1, sizeof(*x)))) {
		fo_emit(o, wc);
		return;
	}
	x->d = d;
	x->c = o->c;
	x->wc = *wc;
	x->state = SLOT_READY;
	append(q, x);
}

/* d's receive counter as the peer's notification counts it: without what
 * its reset default QP received after the notification (fo_try_notify). */
uint32_t fo_srq_counted(const struct shift_dqp *d)
{
	const struct bounce *b = d->fo_bounce;

	return (uint32_t)SHIFT_LOAD(d->rq_tail) - (b ? b->late : 0);
}

/* d's receives are back on its default QP: what it held follows the
 * messages waiting on its SRQ (fo_srq_deliver hands them out). */
void fo_srq_release(struct shift_dqp *d)
{
	struct bounce *b = d->fo_bounce;

	while (b && b->held_head) {
		struct slot *x = b->held_head;

		b->held_head = x->next;
		append(d->dsrq, x);
	}
	if (b)
		b->held_tail = NULL;
	if (b)
		b->late = 0;
}

/* Does a message that arrived on d's backup QP wait for a receive? */
bool fo_srq_waits(const struct shift_dqp *d)
{
	for (const struct slot *x = d->dsrq ? d->dsrq->fo_pending_head : NULL; x; x = x->next)
		if (x->d == d && x->state == SLOT_PENDING)
			return true;
	return false;
}

/* A completion of SHIFT's receive on d's backup QP (application data, or
 * its failure). */
void fo_srq_bounced(struct shift_dqp *d, struct ibv_wc *wc, struct out *o)
{
	struct bounce *b = d->fo_bounce;
	unsigned k = (unsigned)(SHIFT_WRID_INDEX(wc->wr_id) & ~SHIFT_WRID_BOUNCE);
	struct shift_dsrq *q = d->dsrq;

	/* (a flush of an earlier generation's posting of this slot, polled
	 * after the slot was posted again: not this posting's) */
	if (!b || !q || k >= SHIFT_SRQ_BOUNCE || b->slot[k].state != SLOT_POSTED ||
	    SHIFT_WRID_GEN_OF(wc->wr_id) != (b->slot[k].gen & 0x3fffu)) {
		if (wc->status == IBV_WC_SUCCESS)
			shift_warn("%s QP %u: a message on the backup QP landed in a buffer SHIFT "
				   "no longer expects (slot %u): dropped", d->dev, d->qpn, k);
		return;
	}
	struct slot *x = &b->slot[k];

	if (wc->status != IBV_WC_SUCCESS) {
		x->state = SLOT_FREE;
		return;
	}
	shift_dqp_retire(d, wc); /* (its receive counter) */
	x->wc = *wc;
	x->state = SLOT_PENDING;
	append(q, x);
	fo_srq_deliver(q, o);
}

/* Messages waiting for receives the application has posted since: every
 * SRQ of s's failed-over QPs (slow_lock held; o as for fo_srq_deliver). */
void fo_srq_deliver_all(struct shift_ctx *s, struct out *o)
{
	/* (every QP: one back on its default QP may still have a turn; one
	 * whose receives came back another way, its connection failed, lets
	 * what it held go) */
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *d = shift_dqp_first(s, i); d; d = shift_dqp_next(d)) {
			struct bounce *b = d->fo_bounce;

			if (b && b->held_head && shift_dqp_recv_state(d) == SHIFT_RECV_DEFAULT)
				fo_srq_release(d);
			if (d->dsrq && d->dsrq->fo_pending_head)
				fo_srq_deliver(d->dsrq, o);
		}
	}
}
