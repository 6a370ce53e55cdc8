/*
 * The front's share of a context SHIFT took over: the struct verbs_context
 * slots it routes through itself (extended verbs: create_qp_ex and
 * create_cq_ex record their objects for shadowing, query_port and
 * query_device_ex pass through), and linking a new QP's data-path state to
 * its shadow objects.
 */
#include "shift/shift.h"
#include "shift/srq.h"
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

static struct ibv_qp *shift_vctx_create_qp_ex(struct ibv_context *context,
					      struct ibv_qp_init_attr_ex *attr)
{
	struct shift_ctx *s = shift_ctx_of(context);

	if (!s || !s->create_qp_ex) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct ibv_qp *qp = s->create_qp_ex(context, attr);

	if (qp && s->rnic && attr->qp_type == IBV_QPT_RC && shift_srq_ok(attr->srq) &&
	    !(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD)) {
		struct shift_dqp *d = shift_dqp_create(qp, &attr->cap, attr->sq_sig_all);

		if (d)
			shift_ctx_add_dqp(s, d);
	}
	if (qp && s->rnic) {
		struct ibv_qp_cap cap = shift_srq_qp_created(s, qp, attr->qp_type, attr->srq,
							     &attr->cap);

		shift_shadow_qp(s->rnic, qp, attr->qp_type, attr->send_cq, attr->recv_cq,
				&cap, attr->sq_sig_all,
				(attr->srq && !shift_dqp_of_qp(qp)) ||
				(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD));
		shift_dqp_link(s, qp, attr->send_cq, attr->recv_cq);
	}
	return qp;
}

static struct ibv_cq_ex *shift_vctx_create_cq_ex(struct ibv_context *context,
						 struct ibv_cq_init_attr_ex *attr)
{
	struct shift_ctx *s = shift_ctx_of(context);

	if (!s || !s->create_cq_ex) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct shift_chan *k = shift_chan_lower_begin(attr->channel);
	struct ibv_cq_ex *cq = s->create_cq_ex(context, attr);

	shift_chan_lower_end(k, attr->channel);
	if (cq && s->rnic)
		shift_shadow_cq(s->rnic, ibv_cq_ex_to_cq(cq), (int)attr->cqe,
				attr->channel, (int)attr->comp_vector);
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
}

void shift_dqp_link(struct shift_ctx *s, struct ibv_qp *qp, struct ibv_cq *send_cq,
		    struct ibv_cq *recv_cq)
{
	struct shift_dqp *d = s ? shift_dqp_by_qpn(s, qp->qp_num) : NULL;

	if (!d || !s->rnic)
		return;
	d->shadow = shift_shadow_qp_of(s->rnic, qp);
	d->scq = shift_shadow_cq_of(s->rnic, send_cq);
	d->rcq = shift_shadow_cq_of(s->rnic, recv_cq);
	d->scq_app = d->scq ? d->scq->app : NULL;
	d->rcq_app = d->rcq ? d->rcq->app : NULL;
	if (send_cq != recv_cq)
		shift_ctx_set_split_cqs(s);
}
