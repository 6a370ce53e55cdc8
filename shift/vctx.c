/*
 * The front's share of a context SHIFT took over: the struct verbs_context
 * slots it routes through itself (extended verbs: create_qp_ex and
 * create_cq_ex record their objects for shadowing and put SHIFT's data path
 * into their ibv_qp_ex and ibv_cq_ex, shift/dp/qpex.h and cqex.h;
 * query_port and query_device_ex pass through), and linking a new QP's
 * data-path state to its shadow objects.
 */
#include "shift/shift.h"
#include "shift/srq.h"
#include "shift/dp/cqex.h"
#include "shift/dp/qpex.h"
#include "shift/shadow/chan.h"
#include "shift/shadow/shadow.h"

#include <errno.h>
#include <stddef.h>


static int shift_vctx_query_port(struct ibv_context *context, uint8_t port_num,
				 struct ibv_port_attr *port_attr,
				 size_t port_attr_len)
{
	struct shift_ctx *s = shift_ctx_of(context);

	if (!s || !s->query_port)
		return EOPNOTSUPP;
	int rc = s->query_port(context, port_num, port_attr, port_attr_len);
	shift_debug("query_port(%p, %u, len %zu) = %d, state %d", (void *)context, port_num,
		    port_attr_len, rc, (int)port_attr->state);
	return rc;
}

static int shift_vctx_query_device_ex(struct ibv_context *context,
				      const struct ibv_query_device_ex_input *input,
				      struct ibv_device_attr_ex *attr,
				      size_t attr_size)
{
	struct shift_ctx *s = shift_ctx_of(context);

	if (!s || !s->query_device_ex)
		return EOPNOTSUPP;
	return s->query_device_ex(context, input, attr, attr_size);
}

/*
 * Can a QP created with attr be protected, and through which ibv_qp_ex?
 * NULL: yes (*qx set if it posts through ibv_wr_*); else why not. An RC QP
 * on an extended CQ SHIFT left alone, or posting operations SHIFT cannot
 * carry to a backup QP, is not (one warning line).
 */
static const char *qp_ex_unprotected(struct ibv_qp *qp, const struct ibv_qp_init_attr_ex *attr,
				     struct ibv_qp_ex **qx)
{
	*qx = NULL;
	if (shift_cqx_blocks(attr->send_cq) || shift_cqx_blocks(attr->recv_cq))
		return "its CQ was created with wc_flags SHIFT cannot answer for "
		       "(only IBV_WC_STANDARD_FLAGS)";
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS))
		return NULL;
	if (attr->send_ops_flags & ~SHIFT_QPX_OPS)
		return "its send_ops_flags include operations SHIFT cannot carry to a backup QP "
		       "(only send, RDMA write and read, compare-swap and fetch-add)";
	*qx = shift_lower->qp_to_qp_ex ? shift_lower->qp_to_qp_ex(qp) : NULL;
	return *qx ? NULL : "the library gives no ibv_qp_ex for it";
}

/* The data-path state of a new RC QP created by create_qp_ex (not yet
 * published), or NULL: it runs unprotected. */
static struct shift_dqp *qp_ex_protect(struct shift_ctx *s, struct ibv_qp *qp,
				       struct ibv_qp_init_attr_ex *attr)
{
	struct ibv_qp_ex *qx;
	const char *why = qp_ex_unprotected(qp, attr, &qx);
	struct shift_dqp *d;

	if (why) {
		shift_warn("%s QP %u unprotected: %s", qp->context->device->name, qp->qp_num, why);
		return NULL;
	}
	d = shift_dqp_create(qp, &attr->cap, attr->sq_sig_all);
	if (!d)
		return NULL;
	shift_qp_native(d);
	if (qx && shift_qpx_attach(s, d, qx)) {
		shift_warn("%s QP %u unprotected: its ibv_qp_ex cannot be taken over (no "
			   "wr_start/complete/abort, or out of memory)", d->dev, d->qpn);
		shift_dqp_destroy(d);
		return NULL;
	}
	return d;
}

static struct ibv_qp *shift_vctx_create_qp_ex(struct ibv_context *context,
					      struct ibv_qp_init_attr_ex *attr)
{
	struct shift_ctx *s = shift_ctx_of(context);

	if (!s || !s->create_qp_ex) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	unsigned room = s->rnic && attr->qp_type == IBV_QPT_RC ? SHIFT_SQ_ROOM : 0;

	attr->cap.max_send_wr += room;
	struct ibv_qp *qp = s->create_qp_ex(context, attr);

	if (!qp && room) {
		attr->cap.max_send_wr -= room;
		room = 0;
		qp = s->create_qp_ex(context, attr);
	}
	attr->cap.max_send_wr -= room;
	struct shift_dqp *d = NULL;

	if (!qp || !s->rnic)
		return qp;
	if (attr->qp_type == IBV_QPT_RC && shift_srq_ok(attr->srq) &&
	    !(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD))
		d = qp_ex_protect(s, qp, attr);
	struct ibv_qp_cap cap = shift_srq_qp_created(d, qp, attr->qp_type, attr->srq, &attr->cap);

	struct shift_qp *sq = shift_shadow_qp(s->rnic, qp, attr->qp_type, attr->send_cq,
					      attr->recv_cq, &cap, attr->sq_sig_all,
					      (attr->srq && !d) ||
						      (attr->comp_mask & IBV_QP_INIT_ATTR_XRCD));

	shift_dqp_link(s, d, sq, attr->send_cq, attr->recv_cq); /* (before it is published) */
	if (d)
		shift_ctx_add_dqp(s, d);
	return qp;
}

/*
 * An extended CQ: SHIFT polls it itself (shift/dp/cqex.h) if it can answer
 * every read_* the application asked for; it then needs the QP number of
 * each completion, which it asks the provider for. Otherwise the CQ stays
 * the provider's and its QPs run unprotected.
 */
static struct ibv_cq_ex *shift_vctx_create_cq_ex(struct ibv_context *context,
						 struct ibv_cq_init_attr_ex *attr)
{
	struct shift_ctx *s = shift_ctx_of(context);

	if (!s || !s->create_cq_ex) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	uint64_t app_flags = attr->wc_flags;
	bool wrap = s->rnic && !(app_flags & ~SHIFT_CQX_WC_FLAGS);
	struct shift_chan *k = shift_chan_lower_begin(attr->channel);
	struct ibv_cq_ex *cq;

	if (wrap)
		attr->wc_flags |= IBV_WC_EX_WITH_QP_NUM;
	cq = s->create_cq_ex(context, attr);
	attr->wc_flags = app_flags;
	if (!cq && wrap && !(app_flags & IBV_WC_EX_WITH_QP_NUM)) {
		wrap = false; /* the provider would not add it: as the application asked */
		cq = s->create_cq_ex(context, attr);
	}
	shift_chan_lower_end(k, attr->channel);
	if (!cq || !s->rnic)
		return cq;
	if (wrap && !shift_cqx_attach(s, cq, app_flags)) {
		shift_shadow_cq(s->rnic, ibv_cq_ex_to_cq(cq), (int)attr->cqe, attr->channel,
				(int)attr->comp_vector);
		return cq;
	}
	shift_cqx_unwrapped(s, cq);
	shift_warn("%s: extended CQ %p unprotected, and its QPs: SHIFT cannot poll it (wc_flags "
		   "%#llx; it answers IBV_WC_STANDARD_FLAGS and needs the QP number)",
		   context->device->name, (void *)cq, (unsigned long long)app_flags);
	return cq;
}

/*
 * The struct verbs_context of a context, or NULL for a legacy one. A slot
 * exists only if the provider's structure is large enough to hold it
 * (verbs.h grows the structure downwards: new slots sit at lower offsets).
 */
static struct verbs_context *vctx_of(struct ibv_context *ibctx)
{
	return verbs_get_ctx(ibctx);
}

#define VCTX_HAS(vctx, op)                                                  \
	((vctx) && (vctx)->sz >= sizeof(*(vctx)) - offsetof(struct verbs_context, op))

#define VCTX_TAKE(s, vctx, op)                                              \
	do {                                                                \
		if (VCTX_HAS(vctx, op) && (vctx)->op) {                     \
			(s)->op = (vctx)->op;                               \
			(vctx)->op = shift_vctx_##op;                       \
		}                                                           \
	} while (0)

#define VCTX_GIVE_BACK(s, vctx, op)                                         \
	do {                                                                \
		if ((s)->op)                                                \
			(vctx)->op = (s)->op;                               \
	} while (0)

void shift_vctx_take(struct shift_ctx *s)
{
	struct verbs_context *vctx = vctx_of(s->ibctx);

	VCTX_TAKE(s, vctx, query_port);
	VCTX_TAKE(s, vctx, query_device_ex);
	VCTX_TAKE(s, vctx, create_qp_ex);
	VCTX_TAKE(s, vctx, create_cq_ex);
	shift_srq_vctx_take(s);
}

void shift_vctx_give_back(struct shift_ctx *s)
{
	struct verbs_context *vctx = vctx_of(s->ibctx);

	if (!vctx)
		return;
	VCTX_GIVE_BACK(s, vctx, query_port);
	VCTX_GIVE_BACK(s, vctx, query_device_ex);
	VCTX_GIVE_BACK(s, vctx, create_qp_ex);
	VCTX_GIVE_BACK(s, vctx, create_cq_ex);
	shift_srq_vctx_give_back(s);
}

void shift_dqp_link(struct shift_ctx *s, struct shift_dqp *d, struct shift_qp *q,
		    struct ibv_cq *send_cq, struct ibv_cq *recv_cq)
{
	if (!s || !d || !s->rnic)
		return;
	/* (the record's CQs are set at its creation and never change) */
	d->shadow = q;
	d->scq = q ? q->send_cq : NULL;
	d->rcq = q ? q->recv_cq : NULL;
	d->scq_app = d->scq ? d->scq->app : NULL;
	d->rcq_app = d->rcq ? d->rcq->app : NULL;
	if (send_cq != recv_cq)
		shift_ctx_set_split_cqs(s);
}
