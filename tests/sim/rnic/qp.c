/*
 * RC queue pairs of the simulated RNIC: creation, the state machine
 * RESET/INIT/RTR/RTS/SQD/ERR with the attribute-mask rules the kernel
 * applies (required and optional masks per transition, as in the IBTA
 * QP state table), attribute checks, query and destroy.
 *
 * Moving to ERR flushes both queues with IBV_WC_WR_FLUSH_ERR; moving to
 * RESET empties them without completions and drops the QP's packets still
 * on the wire. Destroy and reset also purge the QP's entries from its CQs,
 * as mlx5 does.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sim_int.h"

#define M(x) IBV_QP_##x

/* Required / optional attribute masks for RC, by [cur][next]. STATE is
 * always allowed; a pair with valid == 0 is an illegal transition. */
struct sim_trans { uint8_t valid; uint32_t req, opt; };

static const struct sim_trans sim_trans[IBV_QPS_ERR + 1][IBV_QPS_ERR + 1] = {
	[IBV_QPS_RESET] = {
		[IBV_QPS_RESET] = { 1, 0, 0 },
		[IBV_QPS_INIT] = { 1, M(PKEY_INDEX) | M(PORT) | M(ACCESS_FLAGS), 0 },
		[IBV_QPS_ERR] = { 1, 0, 0 },
	},
	[IBV_QPS_INIT] = {
		[IBV_QPS_RESET] = { 1, 0, 0 },
		[IBV_QPS_ERR] = { 1, 0, 0 },
		[IBV_QPS_INIT] = { 1, 0, M(PKEY_INDEX) | M(PORT) | M(ACCESS_FLAGS) },
		[IBV_QPS_RTR] = { 1, M(AV) | M(PATH_MTU) | M(DEST_QPN) | M(RQ_PSN) |
				     M(MAX_DEST_RD_ATOMIC) | M(MIN_RNR_TIMER),
				  M(ALT_PATH) | M(ACCESS_FLAGS) | M(PKEY_INDEX) },
	},
	[IBV_QPS_RTR] = {
		[IBV_QPS_RESET] = { 1, 0, 0 },
		[IBV_QPS_ERR] = { 1, 0, 0 },
		[IBV_QPS_RTS] = { 1, M(SQ_PSN) | M(TIMEOUT) | M(RETRY_CNT) |
				     M(RNR_RETRY) | M(MAX_QP_RD_ATOMIC),
				  M(CUR_STATE) | M(ALT_PATH) | M(ACCESS_FLAGS) |
				  M(MIN_RNR_TIMER) | M(PATH_MIG_STATE) },
	},
	[IBV_QPS_RTS] = {
		[IBV_QPS_RESET] = { 1, 0, 0 },
		[IBV_QPS_ERR] = { 1, 0, 0 },
		[IBV_QPS_RTS] = { 1, 0, M(CUR_STATE) | M(ACCESS_FLAGS) | M(ALT_PATH) |
				     M(PATH_MIG_STATE) | M(MIN_RNR_TIMER) },
		[IBV_QPS_SQD] = { 1, 0, M(EN_SQD_ASYNC_NOTIFY) },
	},
	[IBV_QPS_SQD] = {
		[IBV_QPS_RESET] = { 1, 0, 0 },
		[IBV_QPS_ERR] = { 1, 0, 0 },
		[IBV_QPS_RTS] = { 1, 0, M(CUR_STATE) | M(ALT_PATH) | M(ACCESS_FLAGS) |
				     M(MIN_RNR_TIMER) | M(PATH_MIG_STATE) },
		[IBV_QPS_SQD] = { 1, 0, M(PKEY_INDEX) | M(AV) | M(TIMEOUT) |
				     M(RETRY_CNT) | M(RNR_RETRY) |
				     M(MAX_QP_RD_ATOMIC) | M(MAX_DEST_RD_ATOMIC) |
				     M(ALT_PATH) | M(ACCESS_FLAGS) |
				     M(MIN_RNR_TIMER) | M(PATH_MIG_STATE) },
	},
	[IBV_QPS_SQE] = {
		[IBV_QPS_RESET] = { 1, 0, 0 },
		[IBV_QPS_ERR] = { 1, 0, 0 },
	},
	[IBV_QPS_ERR] = {
		[IBV_QPS_RESET] = { 1, 0, 0 },
		[IBV_QPS_ERR] = { 1, 0, 0 },
	},
};

/* Whether (cur -> next, mask) is a legal RC transition; mirrors the rule
 * of the kernel's modify-QP check. */
static bool sim_modify_ok(enum ibv_qp_state cur, enum ibv_qp_state next,
			  uint32_t mask)
{
	const struct sim_trans *t;

	if (cur > IBV_QPS_ERR || next > IBV_QPS_ERR)
		return false;
	if ((mask & M(CUR_STATE)) && cur != IBV_QPS_RTR && cur != IBV_QPS_RTS &&
	    cur != IBV_QPS_SQD && cur != IBV_QPS_SQE)
		return false;
	t = &sim_trans[cur][next];
	if (!t->valid)
		return false;
	if ((mask & t->req) != t->req)
		return false;
	if (mask & ~(t->req | t->opt | M(STATE)))
		return false;
	return true;
}

static struct sim_ctx *to_ctx(struct ibv_context *c)
{
	return (struct sim_ctx *)verbs_get_ctx(c);
}

static struct ibv_qp *sim_qp_new(struct ibv_context *c, struct ibv_pd *pd,
				 struct ibv_qp_init_attr *ia)
{
	struct sim_ctx *ctx = to_ctx(c);
	struct sim_dev *d = ctx->dev;
	struct sim_qp *q;
	unsigned slot;

	if (d->fatal) {
		errno = EIO;
		return NULL;
	}
	if (ia->qp_type != IBV_QPT_RC && ia->qp_type != IBV_QPT_UD) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	bool ud = ia->qp_type == IBV_QPT_UD;
	unsigned free_ud = 0;

	while (ud && free_ud < SIM_UD_QPS && d->ud_qps[free_ud])
		free_ud++;
	if (ud && free_ud == SIM_UD_QPS) {
		errno = ENOMEM;
		return NULL;
	}
	if (!pd || pd->context != c || !ia->send_cq || !ia->recv_cq ||
	    ia->send_cq->context != c || ia->recv_cq->context != c ||
	    (ia->srq && ia->srq->context != c) ||
	    ia->cap.max_send_wr > SIM_MAX_WR || ia->cap.max_recv_wr > SIM_MAX_WR ||
	    ia->cap.max_send_sge > SIM_MAX_SGE ||
	    ia->cap.max_recv_sge > SIM_MAX_SGE ||
	    ia->cap.max_inline_data > SIM_MAX_INLINE) {
		errno = EINVAL;
		return NULL;
	}
	q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->cap = ia->cap;
	if (ia->srq)
		q->cap.max_recv_wr = q->cap.max_recv_sge = 0; /* (the SRQ's) */
	if (!q->cap.max_send_sge)
		q->cap.max_send_sge = 1;
	if (!q->cap.max_recv_sge)
		q->cap.max_recv_sge = 1;
	q->sq_cap = q->cap.max_send_wr ? q->cap.max_send_wr : 1;
	q->rq_cap = q->cap.max_recv_wr ? q->cap.max_recv_wr : 1;
	q->sq = calloc(q->sq_cap, sizeof(*q->sq));
	q->rq = calloc(q->rq_cap, sizeof(*q->rq));
	if (q->cap.max_inline_data)
		q->inl_arena = malloc((size_t)q->sq_cap * q->cap.max_inline_data);
	q->srq = (struct sim_srq *)ia->srq;
	q->dev = d;
	if (!q->sq || !q->rq || (q->cap.max_inline_data && !q->inl_arena) || sim_img_init(q)) {
		free(q->sq);
		free(q->rq);
		free(q->inl_arena);
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	/* the lowest free slot, as before, without walking the taken ones
	 * below the hint (N QPs' setup stays linear); a UD QP's among their
	 * own (its number apart: SIM_UD_QPN_BASE) */
	for (slot = d->qps_hint; !ud && slot < d->nqps && d->qps[slot]; slot++)
		;
	if (ud) {
		slot = free_ud;
		d->ud_qps[slot] = q;
	} else if (slot == d->nqps) {
		unsigned cap = d->nqps ? 2 * d->nqps : 16;
		void *p = realloc(d->qps, cap * sizeof(*d->qps));

		if (!p)
			abort();
		d->qps = p;
		memset(d->qps + d->nqps, 0, (cap - d->nqps) * sizeof(*d->qps));
		d->nqps = cap;
	}
	if (!ud) {
		d->qps[slot] = q;
		d->qps_hint = slot + 1;
	}
	q->ctx = ctx;
	q->dev = d;
	q->sq_sig_all = ia->sq_sig_all != 0;
	q->peer_dev = -1;
	q->qp.context = c;
	q->qp.qp_context = ia->qp_context;
	q->qp.pd = pd;
	q->qp.send_cq = ia->send_cq;
	q->qp.recv_cq = ia->recv_cq;
	q->qp.srq = ia->srq;
	q->srq = (struct sim_srq *)ia->srq;
	if (q->srq)
		q->srq->nqps++;
	q->qp.handle = slot;
	q->qp.qp_num = (ud ? SIM_UD_QPN_BASE : SIM_QPN_BASE) + slot;
	q->qp.state = IBV_QPS_RESET;
	q->qp.qp_type = ia->qp_type;
	pthread_mutex_init(&q->qp.mutex, NULL);
	pthread_cond_init(&q->qp.cond, NULL);
	q->attr.qp_state = IBV_QPS_RESET;
	q->attr.cap = q->cap;
	q->attr.port_num = 1;
	q->attr.path_mtu = IBV_MTU_1024;
	q->attr.timeout = 14;
	q->attr.retry_cnt = 7;
	q->attr.rnr_retry = 7;
	ia->cap = q->cap;
	/* (a UD QP has nothing for a step: no transmission, timer or wire,
	 * its datagrams delivered at their post; rnic/ud.c) */
	if (!ud)
		sim_world_add_qp(d->w, q);
	return &q->qp;
}

struct ibv_qp *sim_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
	return sim_qp_new(pd->context, pd, ia);
}

struct ibv_qp *sim_create_qp_ex(struct ibv_context *c,
				struct ibv_qp_init_attr_ex *ia)
{
	struct ibv_qp_init_attr base;
	struct ibv_qp *qp;

	if (!(ia->comp_mask & IBV_QP_INIT_ATTR_PD) ||
	    (ia->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD |
					 IBV_QP_INIT_ATTR_CREATE_FLAGS |
					 IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) ||
	    ((ia->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) &&
	     ia->create_flags)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	memset(&base, 0, sizeof(base));
	base.qp_context = ia->qp_context;
	base.send_cq = ia->send_cq;
	base.recv_cq = ia->recv_cq;
	base.srq = ia->srq;
	base.cap = ia->cap;
	base.qp_type = ia->qp_type;
	base.sq_sig_all = ia->sq_sig_all;
	qp = sim_qp_new(c, ia->pd, &base);
	if (qp && (ia->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) {
		int rc = sim_qp_ex_init((struct sim_qp *)qp, ia->send_ops_flags);

		if (rc) {
			sim_destroy_qp(qp);
			errno = rc;
			return NULL;
		}
	}
	if (qp)
		ia->cap = base.cap;
	return qp;
}

/* Checks attribute values of the bits in mask; EINVAL on a bad one. */
static int sim_check_attr(struct sim_qp *q, const struct ibv_qp_attr *a,
			  uint32_t mask)
{
	const unsigned acc = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			     IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE;

	if ((mask & M(PORT)) && a->port_num != 1)
		return EINVAL;
	if ((mask & M(PKEY_INDEX)) && a->pkey_index != 0)
		return EINVAL;
	if ((mask & M(ACCESS_FLAGS)) && (a->qp_access_flags & ~acc))
		return EINVAL;
	if ((mask & M(PATH_MTU)) &&
	    (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096))
		return EINVAL;
	if ((mask & M(DEST_QPN)) && a->dest_qp_num > SIM_PSN_MASK)
		return EINVAL;
	if ((mask & M(RQ_PSN)) && a->rq_psn > SIM_PSN_MASK)
		return EINVAL;
	if ((mask & M(SQ_PSN)) && a->sq_psn > SIM_PSN_MASK)
		return EINVAL;
	if ((mask & M(RETRY_CNT)) && a->retry_cnt > 7)
		return EINVAL;
	if ((mask & M(RNR_RETRY)) && a->rnr_retry > 7)
		return EINVAL;
	if ((mask & M(TIMEOUT)) && a->timeout > 31)
		return EINVAL;
	if ((mask & M(MIN_RNR_TIMER)) && a->min_rnr_timer > 31)
		return EINVAL;
	if ((mask & M(MAX_QP_RD_ATOMIC)) && a->max_rd_atomic > SIM_MAX_RD_ATOMIC)
		return EINVAL;
	if ((mask & M(MAX_DEST_RD_ATOMIC)) &&
	    a->max_dest_rd_atomic > SIM_MAX_RD_ATOMIC)
		return EINVAL;
	if (mask & M(AV)) {
		/* RoCE: the address vector must carry a GRH. */
		if (!a->ah_attr.is_global || a->ah_attr.grh.sgid_index > 1 ||
		    (a->ah_attr.port_num && a->ah_attr.port_num != 1))
			return EINVAL;
	}
	(void)q;
	return 0;
}

int sim_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	struct sim_qp *q = (struct sim_qp *)qp;
	uint32_t mask = (uint32_t)attr_mask;
	enum ibv_qp_state cur = qp->state;
	enum ibv_qp_state next = (mask & M(STATE)) ? attr->qp_state : cur;
	int rc;

	if (q->dev->fatal)
		return EIO;
	if ((mask & M(CUR_STATE)) && attr->cur_qp_state != cur)
		return EINVAL;
	if (qp->qp_type == IBV_QPT_UD ? !sim_ud_modify_ok(cur, next, mask)
				      : !sim_modify_ok(cur, next, mask))
		return EINVAL;
	rc = sim_check_attr(q, attr, mask);
	if (rc)
		return rc;

	if (mask & M(ACCESS_FLAGS)) q->attr.qp_access_flags = attr->qp_access_flags;
	if (mask & M(PKEY_INDEX)) q->attr.pkey_index = attr->pkey_index;
	if (mask & M(PORT)) q->attr.port_num = attr->port_num;
	if (mask & M(PATH_MTU)) q->attr.path_mtu = attr->path_mtu;
	if (mask & M(DEST_QPN)) q->attr.dest_qp_num = attr->dest_qp_num;
	if (mask & M(RQ_PSN)) q->attr.rq_psn = attr->rq_psn;
	if (mask & M(SQ_PSN)) q->attr.sq_psn = attr->sq_psn;
	if (mask & M(QKEY)) q->attr.qkey = attr->qkey;
	if (mask & M(MAX_DEST_RD_ATOMIC))
		q->attr.max_dest_rd_atomic = attr->max_dest_rd_atomic;
	if (mask & M(MAX_QP_RD_ATOMIC)) q->attr.max_rd_atomic = attr->max_rd_atomic;
	if (mask & M(MIN_RNR_TIMER)) q->attr.min_rnr_timer = attr->min_rnr_timer;
	if (mask & M(TIMEOUT)) q->attr.timeout = attr->timeout;
	if (mask & M(RETRY_CNT)) q->attr.retry_cnt = attr->retry_cnt;
	if (mask & M(RNR_RETRY)) q->attr.rnr_retry = attr->rnr_retry;
	if (mask & M(ALT_PATH)) {
		q->attr.alt_ah_attr = attr->alt_ah_attr;
		q->attr.alt_pkey_index = attr->alt_pkey_index;
		q->attr.alt_port_num = attr->alt_port_num;
		q->attr.alt_timeout = attr->alt_timeout;
	}
	if (mask & M(PATH_MIG_STATE)) q->attr.path_mig_state = attr->path_mig_state;
	if (mask & M(EN_SQD_ASYNC_NOTIFY))
		q->attr.en_sqd_async_notify = attr->en_sqd_async_notify;
	if (mask & M(AV)) {
		struct sim_dev *pd;

		q->attr.ah_attr = attr->ah_attr;
		pd = sim_dev_by_gid(q->dev->w, &attr->ah_attr.grh.dgid);
		q->peer_dev = pd ? (int)pd->gidx : -1;
	}

	if (next == cur && next != IBV_QPS_RESET && next != IBV_QPS_ERR)
		return 0;
	switch (next) {
	case IBV_QPS_RESET:
		sim_qp_clear_wire(q);
		q->sq_head = q->sq_tx = q->sq_tail = q->sq_hi = 0;
		q->rq_head = q->rq_tail = 0;
		q->rd_out = 0;
		q->rnr_wait = false;
		q->nak_sent = false;
		memset(q->acache, 0, sizeof(q->acache));
		sim_cq_purge((struct sim_cq *)qp->send_cq, qp->qp_num);
		sim_cq_purge((struct sim_cq *)qp->recv_cq, qp->qp_num);
		q->peer_dev = -1;
		sim_img_reset(q);
		break;
	case IBV_QPS_RTR:
		q->epsn = q->attr.rq_psn;
		q->nak_sent = false;
		break;
	case IBV_QPS_RTS:
		if (cur == IBV_QPS_RTR) {
			q->next_psn = q->attr.sq_psn;
			q->retry_left = q->attr.retry_cnt;
			q->rnr_left = q->attr.rnr_retry;
		}
		q->deadline = q->dev->w->now + sim_qp_timeout_ticks(qp);
		break;
	case IBV_QPS_SQD:
		q->sqd_notified = false;
		break;
	default:
		break;
	}
	qp->state = next;
	q->attr.qp_state = next;
	if (next == IBV_QPS_ERR)
		sim_qp_flush(q);
	return 0;
}

/* QP to ERR from inside the engine (errors, fatal faults). */
void sim_qp_to_err(struct sim_qp *q)
{
	q->qp.state = IBV_QPS_ERR;
	q->attr.qp_state = IBV_QPS_ERR;
	sim_qp_flush(q);
}

uint64_t sim_qp_timeout_ticks(struct ibv_qp *qp)
{
	struct sim_qp *q = (struct sim_qp *)qp;
	unsigned t = q->attr.timeout;
	uint64_t base = q->dev->w->opts.timeout_ticks;

	/* 4.096 us * 2^timeout on hardware; here ticks grow with the
	 * exponent above 10, so 14 (a common default) is 16 * base. 0 means
	 * "infinite" in the spec and is treated like 31. */
	if (t == 0)
		t = 31;
	return base << (t > 10 ? (t - 10 > 20 ? 20 : t - 10) : 0);
}

int sim_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
		 struct ibv_qp_init_attr *ia)
{
	struct sim_qp *q = (struct sim_qp *)qp;

	(void)attr_mask;
	*attr = q->attr;
	/* like rxe and mlx5: the PSNs in use now, not the ones last set */
	if (qp->state != IBV_QPS_RESET && qp->state != IBV_QPS_INIT)
		attr->rq_psn = q->epsn;
	if (qp->state == IBV_QPS_RTS || qp->state == IBV_QPS_SQD || qp->state == IBV_QPS_SQE ||
	    qp->state == IBV_QPS_ERR)
		attr->sq_psn = q->next_psn;
	attr->qp_state = qp->state;
	attr->cur_qp_state = qp->state;
	attr->cap = q->cap;
	attr->sq_draining = qp->state == IBV_QPS_SQD && q->sq_tx != q->sq_head;
	if (ia) {
		memset(ia, 0, sizeof(*ia));
		ia->qp_context = qp->qp_context;
		ia->send_cq = qp->send_cq;
		ia->recv_cq = qp->recv_cq;
		ia->cap = q->cap;
		ia->qp_type = IBV_QPT_RC;
		ia->sq_sig_all = q->sq_sig_all;
	}
	return 0;
}

void sim_qp_free(struct sim_qp *q)
{
	if (q->srq)
		q->srq->nqps--;
	sim_qp_clear_wire(q);
	if (q->qp.qp_type == IBV_QPT_UD) {
		q->dev->ud_qps[q->qp.handle] = NULL;
	} else {
		sim_world_del_qp(q->dev->w, q);
		q->dev->qps[q->qp.handle] = NULL;
		if (q->qp.handle < q->dev->qps_hint)
			q->dev->qps_hint = q->qp.handle;
	}
	pthread_mutex_destroy(&q->qp.mutex);
	pthread_cond_destroy(&q->qp.cond);
	free(q->out);
	free(q->sq);
	free(q->rq);
	free(q->inl_arena);
	sim_img_free(q);
	sim_qp_ex_free(q);
	free(q);
}

int sim_destroy_qp(struct ibv_qp *qp)
{
	struct sim_qp *q = (struct sim_qp *)qp;

	sim_cq_purge((struct sim_cq *)qp->send_cq, qp->qp_num);
	sim_cq_purge((struct sim_cq *)qp->recv_cq, qp->qp_num);
	sim_qp_free(q);
	return 0;
}
