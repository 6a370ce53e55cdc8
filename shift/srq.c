/*
 * The front's shared receive queues (see srq.h). A basic SRQ created on a
 * protected context gets a receive mirror (shift/dp/dsrq.h) and its RC QPs
 * are protected like the others; XRC and tag-matching SRQs, and SRQs of
 * unprotected contexts, pass through untouched (their QPs unprotected).
 * An SRQ that a QP SHIFT cannot fail over shares (a UD or UC QP, an RC QP
 * without data-path state) turns unprotected, with its QPs: their
 * receives could not move to the backup path without that QP's.
 *
 * Nothing is created on the backup NIC for the SRQ itself: the default
 * SRQ keeps every WQE posted to it until consumed (verbs cannot take one
 * back), so a backup SRQ holding the same receives would let two messages
 * land in one buffer. Each backup QP instead gets receives of its own for
 * what arrives once failed over, and the failover layer places that into
 * the application's receives (shift/fo/srq.c, docs/failover.md).
 */
#include "shift/srq.h"
#include "shift/shift.h"
#include "shift/dp/dsrq.h"
#include "shift/shadow/shadow.h"
#include "shift/fo/failover.h"

#include <errno.h>
#include <string.h>

#define L (shift_lower)

/* Mirror a basic SRQ the provider created on a protected context. */
static void srq_created(struct ibv_srq *srq, const struct ibv_srq_attr *a)
{
	struct shift_ctx *s = shift_ctx_of(srq->context);

	if (!s || !s->rnic || !s->post_srq_recv || a->max_sge > SHIFT_DSRQ_MAX_SGE)
		return;
	if (!shift_dsrq_create(srq, a->max_wr, a->max_sge, s->post_srq_recv))
		shift_warn("%s: out of memory for an SRQ's mirror: its QPs run unprotected",
			   srq->context->device ? srq->context->device->name : "?");
}

struct ibv_srq *shift_ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *srq_init_attr)
{
	struct ibv_srq *srq = L->create_srq(pd, srq_init_attr);

	if (srq)
		srq_created(srq, &srq_init_attr->attr);
	return srq;
}

static struct ibv_srq *shift_vctx_create_srq_ex(struct ibv_context *context,
						struct ibv_srq_init_attr_ex *attr)
{
	struct shift_ctx *s = shift_ctx_of(context);

	if (!s || !s->create_srq_ex) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct ibv_srq *srq = s->create_srq_ex(context, attr);
	bool basic = !(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) || attr->srq_type == IBV_SRQT_BASIC;

	if (srq && basic)
		srq_created(srq, &attr->attr);
	return srq;
}

#define VCTX_HAS_SRQ_EX(v)                                                        \
	((v) && (v)->sz >= sizeof(*(v)) - offsetof(struct verbs_context, create_srq_ex))

void shift_srq_vctx_take(struct shift_ctx *s)
{
	struct verbs_context *v = verbs_get_ctx(s->ibctx);

	if (VCTX_HAS_SRQ_EX(v) && v->create_srq_ex) {
		s->create_srq_ex = v->create_srq_ex;
		v->create_srq_ex = shift_vctx_create_srq_ex;
	}
}

void shift_srq_vctx_give_back(struct shift_ctx *s)
{
	struct verbs_context *v = verbs_get_ctx(s->ibctx);

	if (v && s->create_srq_ex)
		v->create_srq_ex = s->create_srq_ex;
}

int shift_ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr, int srq_attr_mask)
{
	int rc = L->modify_srq(srq, srq_attr, srq_attr_mask);
	struct shift_dsrq *q = !rc && (srq_attr_mask & IBV_SRQ_MAX_WR) ? shift_dsrq_of(srq) : NULL;

	if (q) {
		struct ibv_srq_attr now;

		/* (the provider may round max_wr up: its own figure) */
		if (L->query_srq(srq, &now) == 0)
			(void)shift_dsrq_resize(q, now.max_wr);
		else
			shift_dsrq_unprotect(q, "its size after modify_srq is unknown");
	}
	return rc;
}

int shift_ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr)
{
	return L->query_srq(srq, srq_attr);
}

int shift_ibv_destroy_srq(struct ibv_srq *srq)
{
	struct shift_dsrq *q = srq ? shift_dsrq_remove(srq) : NULL;
	struct shift_ctx *s = q ? shift_ctx_of(srq->context) : NULL;

	if (s)
		shift_failover_srq_gone(s, q); /* (its QP on the SRQ) */
	int rc = L->destroy_srq(srq);

	if (rc) {
		if (q)
			shift_dsrq_add(q);
		return rc;
	}
	shift_dsrq_destroy(q);
	return rc;
}

bool shift_srq_ok(struct ibv_srq *srq)
{
	struct shift_dsrq *q = srq ? shift_dsrq_of(srq) : NULL;

	return !srq || (q && !shift_dsrq_unprotected(q) && !shift_dsrq_moved(q));
}

struct ibv_qp_cap shift_srq_qp_created(struct shift_dqp *d, struct ibv_qp *qp,
				       enum ibv_qp_type type, struct ibv_srq *srq,
				       const struct ibv_qp_cap *cap)
{
	struct ibv_qp_cap bk = *cap;
	struct shift_dsrq *q = srq ? shift_dsrq_of(srq) : NULL;

	if (!srq || !qp)
		return bk;
	if (q && !d)
		shift_dsrq_unprotect(q, type == IBV_QPT_RC ? "an RC QP on it is not protected"
							   : "a QP on it is not an RC QP");
	if (d && q) {
		d->dsrq = q;
		bk.max_recv_wr = SHIFT_SRQ_BOUNCE;
		bk.max_recv_sge = 1;
	}
	return bk;
}

bool shift_srq_refuse_modify(struct ibv_qp *qp, const struct ibv_qp_attr *attr, int mask)
{
	struct shift_dsrq *q = qp && qp->srq && (mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTR ?
				       shift_dsrq_of(qp->srq) : NULL;

	if (!q || !shift_dsrq_moved(q))
		return false;
	shift_err("%s QP %u: cannot connect it: its SRQ's receives are on the backup path since a "
		  "failover, the default SRQ must not be read again (EINVAL)", q->dev, qp->qp_num);
	return true;
}
