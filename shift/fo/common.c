/*
 * What every part of failover shares: the probe wait, the context's list of
 * failed-over QPs, the completions kept for the application, the failed-over
 * QP of a backup QPN, key translation and posting a mirrored WR on the
 * backup (or default) QP.
 */
#include "shift/fo/fo_int.h"

/* ---- time ------------------------------------------------------------- *
 * Every time is shift_clock's (base/clock.h): ms for the failback clock,
 * us for switch times; a driver's logical clock counts background passes. */

/* Wait before the next probe of a failed default path: the probe period,
 * doubled per failed probe up to 8 periods, and doubled again per switch
 * back that failed right away (its notification), up to 16 more: a path
 * that answers probes but fails real traffic is not worth a new failover
 * every period. */
uint64_t fo_probe_wait(const struct shift_dqp *d)
{
	uint64_t base = shift_config.probe_ms ? shift_config.probe_ms : 1;
	unsigned sh = d->probe_fails < 3 ? d->probe_fails : 3;

	sh += d->failback_fails < 4 ? d->failback_fails : 4;
	return base << sh;
}

/* ---- the context's list of failed-over QPs ----------------------------
 * fo[] has holes (NULL) left by QPs that failed back; nfo is its high-water
 * mark. It grows without bound (doubling). Every reader and writer holds
 * the context's slow_lock: the slow poll, the background pass and
 * shift_failover_forget(). */
int fo_add(struct shift_ctx *s, struct shift_dqp *d)
{
	int hole = -1;

	for (int i = 0; i < s->nfo; i++) {
		if (s->fo[i] == d)
			return 0;
		if (!s->fo[i] && hole < 0)
			hole = i;
	}
	if (hole < 0 && s->nfo == s->fo_cap) {
		int cap = s->fo_cap ? 2 * s->fo_cap : 16;
		struct shift_dqp **n = realloc(s->fo, sizeof(*n) * (size_t)cap);

		if (!n)
			return -1;
		s->fo = n;
		s->fo_cap = cap;
	}
	if (hole < 0)
		hole = s->nfo++;
	s->fo[hole] = d;
	return 0;
}

bool fo_remove(struct shift_ctx *s, struct shift_dqp *d)
{
	bool was = false;

	for (int i = 0; i < s->nfo; i++) {
		if (s->fo[i] == d) {
			s->fo[i] = NULL;
			was = true;
		}
	}
	while (s->nfo && !s->fo[s->nfo - 1])
		s->nfo--;
	if (!s->nfo)
		s->fo_warned = false;
	return was;
}

/* The first failover since the context's list was last empty? (slow_lock) */
bool fo_first_failover(struct shift_ctx *s)
{
	bool first = !s->fo_warned;

	s->fo_warned = true;
	return first;
}

/* ---- kept completions ------------------------------------------------- */

static int kept_push(struct shift_cq *c, const struct ibv_wc *wc)
{
	if (c->kept_head - c->kept_tail == c->kept_cap) {
		unsigned cap = c->kept_cap ? c->kept_cap * 2 : 256;
		struct ibv_wc *n = malloc(sizeof(*n) * cap);

		if (!n)
			return -1;
		for (uint64_t i = c->kept_tail, j = 0; i < c->kept_head; i++, j++)
			n[j] = c->kept[i % c->kept_cap];
		c->kept_head -= c->kept_tail;
		c->kept_tail = 0;
		free(c->kept);
		c->kept = n;
		c->kept_cap = cap;
	}
	c->kept[c->kept_head++ % c->kept_cap] = *wc;
	return 0;
}

/* To the application now if its array has room, else kept for later. */
void fo_emit(struct out *o, const struct ibv_wc *wc)
{
	/* older completions wait in kept: keep the order */
	if (o->n < o->max && o->c->kept_head == o->c->kept_tail)
		o->wc[o->n++] = *wc;
	else if (kept_push(o->c, wc))
		shift_err("out of memory keeping a completion: one completion lost");
}

/* Keep wc at place `at` among c's kept completions (counted from the
 * oldest): those from there on move one place back. */
void fo_kept_insert(struct shift_cq *c, uint64_t at, const struct ibv_wc *wc)
{
	if (kept_push(c, wc)) {
		shift_err("out of memory keeping a completion: one completion lost");
		return;
	}
	uint64_t pos = c->kept_tail + at;

	if (pos >= c->kept_head)
		return; /* (at the end: where kept_push put it) */
	for (uint64_t i = c->kept_head - 1; i > pos; i--)
		c->kept[i % c->kept_cap] = c->kept[(i - 1) % c->kept_cap];
	c->kept[pos % c->kept_cap] = *wc;
}

/* ---- the failed-over QPs of a context ------------------------------------ */

struct shift_dqp *fo_dqp_of_bk(struct shift_ctx *s, uint32_t bk_qpn)
{
	for (int i = 0; i < s->nfo; i++) {
		struct shift_dqp *d = s->fo[i];

		if (d && d->bk && d->bk->qp_num == bk_qpn)
			return d;
	}
	return NULL;
}

/* ---- key translation -------------------------------------------------- */

static int local_keys(struct shift_dqp *d, struct ibv_sge *sge, unsigned n)
{
	struct shift_rnic *r = shift_rnic_of(d->qp->context);

	for (unsigned i = 0; i < n; i++)
		if (!r || shift_shadow_bk_lkey(r, sge[i].lkey, &sge[i].lkey))
			return -1;
	return 0;
}

/*
 * A remote key of the application's that the peer never published (no
 * backup key for it): on the default path the peer's responder would
 * reject it, a remote access error. The backup's does the same for a key it
 * has, aimed at an address no memory region covers (2^63: above every user
 * address, no overflow for any length): the WR fails on the backup as it
 * would have on the default QP, in its place, and the peer's backup QP goes
 * to ERR as its default QP would (fo/apperr.c takes it from there). false
 * if no backup key of the peer is known yet (the post then fails).
 */
static bool reject_remotely(struct shift_dqp *d, uint64_t *raddr, uint32_t *rkey)
{
	uint32_t bk;

	if (!fo_rk_any(d, &bk))
		return false;
	shift_debug("%s QP %u: the peer has no backup key for rkey %u: the WR goes out to be "
		    "refused, as the default path would", d->dev, d->qpn, *rkey);
	*raddr = 1ull << 63;
	*rkey = bk;
	return true;
}

/*
 * ... and with no backup key of the peer's known at all: an empty signaled
 * WRITE goes in its place (the WRs before it complete first), whose
 * completion is the refusal (from_backup, fo/poll.c); the WRs after it stay
 * in the mirror, for the flushes of the end of the connection.
 */
static int doom(struct shift_dqp *d, uint64_t idx)
{
	struct ibv_send_wr wr, *bad;

	shift_debug("%s QP %u: no backup key of the peer's known: WR %llu completes as refused",
		    d->dev, d->qpn, (unsigned long long)idx);
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = SHIFT_WRID_DATA | SHIFT_WRID_GEN(d->bk_gen) | idx;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(d->bk, &wr, &bad))
		return -1;
	if (!d->doomed || idx + 1 < d->doomed)
		d->doomed = idx + 1;
	return 0;
}

/* ---- posting on the backup QP ------------------------------------------ */

/* The peer's backup key for app, for len bytes at remote addr: 0; 1 it has
 * none (or it could not be read in time, or the bytes are not in its MR);
 * 2 not read yet (fo/kvq.c). Never KV I/O. */
static int remote_key(struct shift_dqp *d, uint32_t app, uint64_t addr, uint64_t len,
		      uint32_t *bk)
{
	int rc = fo_rk_lookup(d, app, addr, len, bk);

	return rc < 0 ? 1 : rc > 0 ? 2 : 0;
}

/*
 * Mirrored send WR idx as it is posted again: for the backup QP (keys
 * translated, wr_id tagged for translation back) or, when failing back, for
 * the default QP exactly as the application posted it; sge has room for
 * its SGEs. 0; -1 no backup lkey; for the backup, the remote key's
 * remote_key(): 1 the peer has no backup key for it, 2 not read yet.
 */
static int build_mirrored(struct shift_dqp *d, uint64_t idx, bool dflt, struct ibv_send_wr *wrp,
			  struct ibv_sge *sge)
{
	struct shift_swqe *e = shift_dqp_swqe(d, idx);
	struct ibv_send_wr wr;
	int unknown = 0;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = dflt ? e->wr_id : SHIFT_WRID_DATA | SHIFT_WRID_GEN(d->bk_gen) | idx;
	wr.opcode = (enum ibv_wr_opcode)e->opcode;
	wr.send_flags = e->send_flags;
	wr.imm_data = e->imm;
	if (e->send_flags & IBV_SEND_INLINE) {
		sge[0].addr = (uintptr_t)&e->sge[d->max_send_sge];
		sge[0].length = e->inline_len;
		sge[0].lkey = 0;
		wr.num_sge = e->inline_len ? 1 : 0;
	} else {
		memcpy(sge, e->sge, sizeof(struct ibv_sge) * e->num_sge);
		wr.num_sge = e->num_sge;
		if (!dflt && local_keys(d, sge, e->num_sge)) {
			shift_debug("%s QP %u: no backup lkey for lkey %u", d->dev, d->qpn, sge[0].lkey);
			return -1;
		}
	}
	wr.sg_list = sge;
	if (e->opcode == IBV_WR_RDMA_WRITE || e->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
	    e->opcode == IBV_WR_RDMA_READ) {
		wr.wr.rdma.remote_addr = e->remote_addr;
		uint64_t bytes = e->send_flags & IBV_SEND_INLINE ? e->inline_len : 0;

		for (unsigned k = 0; k < e->num_sge && !(e->send_flags & IBV_SEND_INLINE); k++)
			bytes += e->sge[k].length;
		/* a zero-length write touches no remote memory: its key is not used */
		wr.wr.rdma.rkey = e->rkey;
		if (bytes && !dflt)
			unknown = remote_key(d, e->rkey, e->remote_addr, bytes, &wr.wr.rdma.rkey);
	}
	if (shift_wr_is_atomic(e->opcode)) {
		/* only posted here once failed over: never a retransmission */
		wr.wr.atomic.remote_addr = e->remote_addr;
		wr.wr.atomic.compare_add = e->compare_add;
		wr.wr.atomic.swap = e->swap;
		wr.wr.atomic.rkey = e->rkey;
		if (!dflt)
			unknown = remote_key(d, e->rkey, e->remote_addr, 8, &wr.wr.atomic.rkey);
	}
	*wrp = wr;
	return unknown;
}

/* Can the backup QP carry mirrored send WRs [from, to) (only the READs
 * among them, if reads)? Not an operation on the default NIC's own objects
 * (memory windows, invalidation), nor memory without a backup key (a memory
 * window's rkey, an MR not replayed yet). */
bool fo_bk_carries(struct shift_dqp *d, uint64_t from, uint64_t to, bool reads)
{
	for (uint64_t i = from; i < to; i++) {
		struct shift_swqe *e = shift_dqp_swqe(d, i);
		struct ibv_sge sge[e->num_sge ? e->num_sge : 1];
		struct ibv_send_wr wr;

		if (reads && e->opcode != IBV_WR_RDMA_READ)
			continue;
		if (e->opcode == IBV_WR_BIND_MW || e->opcode == IBV_WR_LOCAL_INV ||
		    e->opcode == IBV_WR_SEND_WITH_INV || e->opcode == IBV_WR_TSO ||
		    build_mirrored(d, i, false, &wr, sge) % 2)
			return false; /* (a key not read yet: held, fo_post_bk_send) */
	}
	return true;
}

int fo_qp_failed(struct ibv_qp *qp)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;

	memset(&attr, 0, sizeof(attr));
	if (shift_lower->query_qp(qp, &attr, IBV_QP_STATE, &init))
		return -1;
	return attr.qp_state == IBV_QPS_ERR || attr.qp_state == IBV_QPS_SQE;
}

/* The backup's provider refused a WR: FO_BK_REFUSED if the backup QP
 * failed (fo_qp_failed), else -1 (the WR is the application's error,
 * refused as the default QP's provider would). */
static int bk_refusal(struct shift_dqp *d)
{
	return fo_qp_failed(d->bk) ? FO_BK_REFUSED : -1;
}

/* Post mirrored send WR idx again (build_mirrored): 0, -1 (cannot), or 1
 * for the backup when its peer key is not read yet (not posted). */
static int post_built(struct shift_dqp *d, uint64_t idx, bool dflt, int rc,
		      struct ibv_send_wr *wrp)
{
	struct ibv_send_wr wr = *wrp, *bad;

	if (rc < 0)
		return -1;
	if (rc == 2)
		return 1; /* (the caller holds it) */
	if (rc && !dflt && idx < d->sq_retx_end) {
		/* a WR outstanding when the default path failed, whose key
		 * the peer itself said it has no backup for (asked over the
		 * key mailbox while the WR was held: memory in no record, a
		 * memory window, memory registered outside SHIFT): it cannot
		 * go on the backup path, and the connection fails as plain's
		 * did when its path failed: from the first WR not completed
		 * yet (the ones before this one may still be in flight on the
		 * backup: completions in order), the path's error and then
		 * flushes, never a remote access error the default path
		 * would not have given */
		fo_fail_mark(d, "an outstanding WR uses memory the peer has no backup for", FO_BY_STATE,
			     FO_BY_STATE);
		return -1;
	}
	if (rc) {
		/* a remote key with no backup key: refused as on the default
		 * path (a WR posted while failed over; a failover's
		 * retransmission checks fo_bk_carries() first) */
		uint64_t *raddr = shift_wr_is_atomic(wr.opcode) ? &wr.wr.atomic.remote_addr :
								 &wr.wr.rdma.remote_addr;
		uint32_t *rkey = shift_wr_is_atomic(wr.opcode) ? &wr.wr.atomic.rkey : &wr.wr.rdma.rkey;

		if (!reject_remotely(d, raddr, rkey))
			return doom(d, idx);
	}
	rc = dflt ? d->prov_post_send(d->qp, &wr, &bad) : ibv_post_send(d->bk, &wr, &bad);
	if (rc) {
		shift_debug("%s QP %u: %s post_send: %s", d->dev, d->qpn, dflt ? "default" : "backup",
			    strerror(rc));
		return dflt ? -1 : bk_refusal(d);
	}
	if (!dflt) /* (relaxed: shiftctl's status reads it, shadow/status.c) */
		SHIFT_STAT_ADD(d->retransmitted, 1);
	return 0;
}

int fo_post_mirrored(struct shift_dqp *d, uint64_t idx, bool dflt)
{
	struct shift_swqe *e = shift_dqp_swqe(d, idx);
	struct ibv_sge sge[e->num_sge ? e->num_sge : 1];
	struct ibv_send_wr wr;

	return post_built(d, idx, dflt, build_mirrored(d, idx, dflt, &wr, sge), &wr);
}

/* The work completion opcode of a send WR's opcode. */
enum ibv_wc_opcode fo_send_wc_opcode(unsigned opcode)
{
	switch (opcode) {
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_SEND_WITH_INV:
		return IBV_WC_SEND;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		return IBV_WC_COMP_SWAP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return IBV_WC_FETCH_ADD;
	case IBV_WR_LOCAL_INV:
		return IBV_WC_LOCAL_INV;
	case IBV_WR_BIND_MW:
		return IBV_WC_BIND_MW;
	default:
		return IBV_WC_RDMA_WRITE;
	}
}

/* In place of mirrored send WR idx, which the peer has executed: an empty
 * WRITE on the backup QP, signaled like it, whose completion is idx's. */
static void placeholder_wr(struct shift_dqp *d, uint64_t idx, struct ibv_send_wr *wr)
{
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = SHIFT_WRID_DATA | SHIFT_WRID_GEN(d->bk_gen) | idx;
	wr->opcode = IBV_WR_RDMA_WRITE;
	wr->send_flags = shift_dqp_swqe(d, idx)->send_flags & IBV_SEND_SIGNALED;
}

int fo_post_bk_placeholder(struct shift_dqp *d, uint64_t idx)
{
	struct ibv_send_wr wr, *bad;

	placeholder_wr(d, idx, &wr);
	return ibv_post_send(d->bk, &wr, &bad) ? bk_refusal(d) : 0;
}

/* WR idx waits for its peer key (fo_post_mirrored said 1). */
static int bk_hold(struct shift_dqp *d, uint64_t idx)
{
	/* its peer key is not read yet: it and all after it wait for the
	 * background pass (fo/kvq.c), which this wakes */
	d->sq_held_from = idx;
	__atomic_store_n(&d->sq_held, true, __ATOMIC_RELEASE);
	if (!d->t_held_us && !d->timing_said)
		d->t_held_us = shift_clock_us();
	shift_debug("%s QP %u: WR %llu waits for the peer's backup key", d->dev, d->qpn,
		    (unsigned long long)idx);
	shift_rnic_wake(shift_rnic_of(d->qp->context));
	return 0;
}

int fo_post_bk_send(struct shift_dqp *d, uint64_t idx)
{
	if (d->doomed && idx >= d->doomed)
		return 0; /* (held: the connection ends at the doomed WR) */
	if (d->sq_held)
		return 0; /* (behind a held one: fo_held_release() posts it) */
	int rc = fo_post_mirrored(d, idx, false);

	return rc <= 0 ? rc : bk_hold(d, idx);
}

/* ---- mirrored send WRs posted again as chains (struct fo_chain) ------------ */

void fo_chain_init(struct fo_chain *ch, bool dflt)
{
	ch->n = ch->nsge = 0;
	ch->dflt = dflt;
	ch->failed = 0;
	ch->rc = 0;
}

int fo_chain_flush(struct shift_dqp *d, struct fo_chain *ch)
{
	struct ibv_send_wr *bad = NULL;
	unsigned n = ch->n, posted;

	if (!n)
		return 0;
	ch->wr[n - 1].next = NULL;
	/* (the time in the provider's post, until the failover's timing is
	 * said: soft-RoCE transmits inside it) */
	uint64_t t0 = ch->dflt || d->timing_said ? 0 : shift_clock_us();
	int rc = ch->dflt ? d->prov_post_send(d->qp, &ch->wr[0], &bad) :
			    ibv_post_send(d->bk, &ch->wr[0], &bad);

	if (t0)
		d->post_us += (uint32_t)(shift_clock_us() - t0);

	posted = !rc ? n : bad >= ch->wr && bad < ch->wr + n ? (unsigned)(bad - ch->wr) : 0;
	for (unsigned i = 0; i < posted; i++)
		SHIFT_STAT_ADD(d->retransmitted, ch->retx[i]);
	ch->n = ch->nsge = 0;
	if (!rc)
		return 0;
	shift_debug("%s QP %u: %s post_send of a chain of %u: %s", d->dev, d->qpn,
		    ch->dflt ? "default" : "backup", n, strerror(rc));
	ch->failed = ch->idx[posted < n ? posted : 0];
	ch->rc = rc;
	return -1;
}

/* Room for a WR of nsge SGEs: flush when full. 0 or -1. */
static int chain_room(struct shift_dqp *d, struct fo_chain *ch, unsigned nsge)
{
	if (ch->n < FO_CHAIN_WR && ch->nsge + nsge <= FO_CHAIN_SGE)
		return 0;
	return fo_chain_flush(d, ch);
}

static void chain_link(struct fo_chain *ch, uint64_t idx, unsigned nsge, bool retx)
{
	if (ch->n)
		ch->wr[ch->n - 1].next = &ch->wr[ch->n];
	ch->idx[ch->n] = idx;
	ch->retx[ch->n++] = retx;
	ch->nsge += nsge;
}

static unsigned chain_sges(struct shift_dqp *d, uint64_t idx)
{
	unsigned n = shift_dqp_swqe(d, idx)->num_sge;

	return n ? n : 1;
}

int fo_chain_default(struct shift_dqp *d, struct fo_chain *ch, uint64_t idx)
{
	unsigned need = chain_sges(d, idx);

	if (need > FO_CHAIN_SGE) {
		/* (too many SGEs for a chain: alone, after the chain) */
		if (fo_chain_flush(d, ch))
			return -1;
		if (!fo_post_mirrored(d, idx, true))
			return 0;
		ch->failed = idx;
		ch->rc = EINVAL;
		return -1;
	}
	if (chain_room(d, ch, need))
		return -1;
	if (build_mirrored(d, idx, true, &ch->wr[ch->n], &ch->sge[ch->nsge])) {
		if (fo_chain_flush(d, ch))
			return -1;
		ch->failed = idx;
		ch->rc = 0;
		return -1;
	}
	chain_link(ch, idx, need, false);
	return 0;
}

int fo_chain_send(struct shift_dqp *d, struct fo_chain *ch, uint64_t idx)
{
	if ((d->doomed && idx >= d->doomed) || d->sq_held)
		return 0; /* (as fo_post_bk_send) */
	unsigned need = chain_sges(d, idx);

	if (need > FO_CHAIN_SGE)
		return fo_chain_flush(d, ch) ? -1 : fo_post_bk_send(d, idx);
	if (chain_room(d, ch, need))
		return -1;
	struct ibv_send_wr *wr = &ch->wr[ch->n];
	int rc = build_mirrored(d, idx, false, wr, &ch->sge[ch->nsge]);

	if (!rc) {
		chain_link(ch, idx, need, true);
		return 0;
	}
	/* held for its key, refused or doomed: the WRs before it go first,
	 * then it as fo_post_bk_send() (its SGEs stay where they are) */
	if (fo_chain_flush(d, ch))
		return -1;
	rc = post_built(d, idx, false, rc, wr);
	return rc <= 0 ? rc : bk_hold(d, idx);
}

int fo_chain_placeholder(struct shift_dqp *d, struct fo_chain *ch, uint64_t idx)
{
	if (chain_room(d, ch, 0))
		return -1;
	placeholder_wr(d, idx, &ch->wr[ch->n]);
	chain_link(ch, idx, 0, false);
	return 0;
}

int fo_post_bk_recv(struct shift_dqp *d, uint64_t idx)
{
	struct shift_rwqe *e = shift_dqp_rwqe(d, idx);
	struct ibv_sge sge[e->num_sge ? e->num_sge : 1];
	struct ibv_recv_wr wr = { .wr_id = SHIFT_WRID_DATA | SHIFT_WRID_RECV |
					   SHIFT_WRID_GEN(d->bk_gen) | idx,
				  .sg_list = sge, .num_sge = (int)e->num_sge }, *bad;

	memcpy(sge, e->sge, sizeof(struct ibv_sge) * e->num_sge);
	if (local_keys(d, sge, e->num_sge))
		return -1;
	return ibv_post_recv(d->bk, &wr, &bad) ? bk_refusal(d) : 0;
}

/* A QP's send and receive CQs' dp_locks, in address order. */
void fo_lock_cqs(struct shift_dqp *d)
{
	struct shift_cq *c2 = d->rcq && d->rcq != d->scq ? d->rcq : NULL;

	if (c2 && c2 < d->scq)
		pthread_mutex_lock(&c2->dp_lock);
	pthread_mutex_lock(&d->scq->dp_lock);
	if (c2 && c2 > d->scq)
		pthread_mutex_lock(&c2->dp_lock);
}

void fo_unlock_cqs(struct shift_dqp *d)
{
	if (d->rcq && d->rcq != d->scq)
		pthread_mutex_unlock(&d->rcq->dp_lock);
	pthread_mutex_unlock(&d->scq->dp_lock);
}
