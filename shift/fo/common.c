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
 * fo[] has holes (NULL) so lock-free readers never miss a moved entry;
 * nfo is its high-water mark. Writers hold fo_lock. */
static pthread_mutex_t fo_lock = PTHREAD_MUTEX_INITIALIZER;

int fo_add(struct shift_ctx *s, struct shift_dqp *d)
{
	int rc = -1;

	pthread_mutex_lock(&fo_lock);
	for (int i = 0; i < s->nfo; i++)
		if (__atomic_load_n(&s->fo[i], __ATOMIC_RELAXED) == d)
			rc = 0;
	for (int i = 0; rc && i < SHIFT_MAX_FO; i++) {
		if (i < s->nfo && s->fo[i])
			continue;
		__atomic_store_n(&s->fo[i], d, __ATOMIC_RELEASE);
		if (i == s->nfo)
			__atomic_store_n(&s->nfo, i + 1, __ATOMIC_RELEASE);
		rc = 0;
	}
	pthread_mutex_unlock(&fo_lock);
	return rc;
}

void fo_remove(struct shift_ctx *s, struct shift_dqp *d)
{
	pthread_mutex_lock(&fo_lock);
	for (int i = 0; i < s->nfo; i++)
		if (s->fo[i] == d)
			__atomic_store_n(&s->fo[i], NULL, __ATOMIC_RELEASE);
	while (s->nfo && !s->fo[s->nfo - 1])
		s->nfo--;
	pthread_mutex_unlock(&fo_lock);
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

/* ---- the failed-over QPs of a context ------------------------------------ */

struct shift_dqp *fo_dqp_of_bk(struct shift_ctx *s, uint32_t bk_qpn)
{
	int n = __atomic_load_n(&s->nfo, __ATOMIC_ACQUIRE);

	for (int i = 0; i < n; i++) {
		struct shift_dqp *d = __atomic_load_n(&s->fo[i], __ATOMIC_ACQUIRE);

		if (d && d->bk && d->bk->qp_num == bk_qpn)
			return d;
	}
	return NULL;
}

/* ---- key translation -------------------------------------------------- */

static int remote_key(struct shift_dqp *d, uint32_t app_rkey, uint32_t *bk)
{
	struct shift_rnic *r = shift_rnic_of(d->qp->context);
	char key[SHIFT_EXCHANGE_KEY_MAX];
	void *v;
	size_t len;

	for (unsigned i = 0; i < d->nrkeys; i++) {
		if (d->rkeys[i].app == app_rkey) {
			*bk = d->rkeys[i].bk;
			return 0;
		}
	}
	if (!r || !r->kv ||
	    shift_exchange_mr_key(&d->shadow->peer_key.gid, app_rkey, key, sizeof(key)) < 0 ||
	    shift_kv_get(r->kv, key, &v, &len))
		return -1;
	int rc = shift_exchange_mr_decode(v, len, bk);
	free(v);
	if (rc)
		return -1;
	d->rkeys[d->nrkeys % 16].app = app_rkey;
	d->rkeys[d->nrkeys % 16].bk = *bk;
	d->nrkeys++;
	return 0;
}

static int local_keys(struct shift_dqp *d, struct ibv_sge *sge, unsigned n)
{
	struct shift_rnic *r = shift_rnic_of(d->qp->context);

	for (unsigned i = 0; i < n; i++)
		if (!r || shift_shadow_bk_lkey(r, sge[i].lkey, &sge[i].lkey))
			return -1;
	return 0;
}

/* ---- posting on the backup QP ------------------------------------------ */

/*
 * Mirrored send WR idx as it is posted again: for the backup QP (keys
 * translated, wr_id tagged for translation back) or, when failing back, for
 * the default QP exactly as the application posted it; sge has room for
 * its SGEs.
 */
static int build_mirrored(struct shift_dqp *d, uint64_t idx, bool dflt, struct ibv_send_wr *wrp,
			  struct ibv_sge *sge)
{
	struct shift_swqe *e = shift_dqp_swqe(d, idx);
	struct ibv_send_wr wr;

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
		if (!bytes || dflt)
			wr.wr.rdma.rkey = e->rkey;
		else if (remote_key(d, e->rkey, &wr.wr.rdma.rkey)) {
			shift_debug("%s QP %u: no backup rkey for the peer's rkey %u (opcode %u, %lu bytes, flags %x)", d->dev, d->qpn, e->rkey, e->opcode, (unsigned long)bytes, e->send_flags);
			return -1;
		}
	}
	if (shift_wr_is_atomic(e->opcode)) {
		/* only posted here once failed over: never a retransmission */
		wr.wr.atomic.remote_addr = e->remote_addr;
		wr.wr.atomic.compare_add = e->compare_add;
		wr.wr.atomic.swap = e->swap;
		wr.wr.atomic.rkey = e->rkey;
		if (!dflt && remote_key(d, e->rkey, &wr.wr.atomic.rkey)) {
			shift_debug("%s QP %u: no backup rkey for the peer's rkey %u (atomic)", d->dev, d->qpn,
				    e->rkey);
			return -1;
		}
	}
	*wrp = wr;
	return 0;
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
		    build_mirrored(d, i, false, &wr, sge))
			return false;
	}
	return true;
}

/* Post mirrored send WR idx again (build_mirrored). */
int fo_post_mirrored(struct shift_dqp *d, uint64_t idx, bool dflt)
{
	struct shift_swqe *e = shift_dqp_swqe(d, idx);
	struct ibv_sge sge[e->num_sge ? e->num_sge : 1];
	struct ibv_send_wr wr, *bad;

	if (build_mirrored(d, idx, dflt, &wr, sge))
		return -1;
	int rc = dflt ? d->prov_post_send(d->qp, &wr, &bad) : ibv_post_send(d->bk, &wr, &bad);
	if (rc) {
		shift_debug("%s QP %u: %s post_send: %s", d->dev, d->qpn, dflt ? "default" : "backup",
			    strerror(rc));
		return -1;
	}
	if (!dflt)
		d->retransmitted++;
	return 0;
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
int fo_post_bk_placeholder(struct shift_dqp *d, uint64_t idx)
{
	struct shift_swqe *e = shift_dqp_swqe(d, idx);
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = SHIFT_WRID_DATA | SHIFT_WRID_GEN(d->bk_gen) | idx;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = e->send_flags & IBV_SEND_SIGNALED;
	return ibv_post_send(d->bk, &wr, &bad);
}

int fo_post_bk_send(struct shift_dqp *d, uint64_t idx)
{
	return fo_post_mirrored(d, idx, false);
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
	return ibv_post_recv(d->bk, &wr, &bad) ? -1 : 0;
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
