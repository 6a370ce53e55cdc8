/*
 * SHIFT's entry points: the control verbs the application reaches (the
 * drop-in aliases each to its versioned libibverbs name) and the same set as
 * the shift_verbs table for stacking in tests.
 *
 * Each one does SHIFT's bookkeeping around one call of the lower verb; the
 * lower verb's result and errno are what the application gets. SHIFT's own
 * problems are never the application's: they are logged and the object runs
 * unprotected.
 */
#include "shift/shift.h"
#include "shift/srq.h"
#include "shift/dp/cqex.h"
#include "shift/dp/qpex.h"
#include "shift/dp/nwq.h"
#include "shift/dp/state.h"
#include "shift/base/config.h"
#include "providers/provider.h"
#include "shift/shadow/shadow.h"
#include "shift/shadow/chan.h"
#include "shift/fo/failover.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define L (shift_lower)

/* The shadowing RNIC of a context, or NULL (unprotected / not SHIFT's). */
static struct shift_rnic *rnic_of(struct ibv_context *ctx)
{
	struct shift_ctx *s = ctx ? shift_ctx_of(ctx) : NULL;

	return s ? s->rnic : NULL;
}

struct ibv_device **shift_ibv_get_device_list(int *num_devices)
{
	return L->get_device_list(num_devices);
}

void shift_ibv_free_device_list(struct ibv_device **list)
{
	L->free_device_list(list);
}

const char *shift_ibv_get_device_name(struct ibv_device *device)
{
	return L->get_device_name(device);
}

__be64 shift_ibv_get_device_guid(struct ibv_device *device)
{
	return L->get_device_guid(device);
}

/* The data path reaches the failover layer and the completion channels
 * only through these (shift/dp/ctx.h), and the RNIC's pass reaches the
 * failover layer only through its background hook (shift/shadow/shadow.h):
 * both set before the first attach. */
static const struct shift_dp_upcalls upcalls = {
	.poll_slow = shift_poll_slow,
	.post_refused = shift_failover_post_refused,
	.post_send_fallback = shift_post_send_fallback,
	.post_recv_fallback = shift_post_recv_fallback,
	.cq_armed = shift_chan_arm_backup,
};

/* Once, before the first context is attached (pthread_once orders these
 * writes before every reader: no data path runs before an attach). */
static void install_upcalls(void)
{
	shift_dp_set_upcalls(&upcalls);
	shift_shadow_set_background(shift_failover_background);
	shift_fork_install();
}

void shift_qp_native(struct shift_dqp *d)
{
	struct shift_nwq *q = d ? shift_provider_native_wq(d->qp) : NULL;

	if (!q)
		return;
	shift_dqp_set_native(d, q);
	shift_debug("%s QP %u: native %s work queues (%u send blocks, %u receives)", d->dev,
		    d->qpn, q->format, q->sq_cnt, q->rq_cnt);
}

struct ibv_context *shift_ibv_open_device(struct ibv_device *device)
{
	static pthread_once_t upcalls_once = PTHREAD_ONCE_INIT;
	struct ibv_context *ctx = L->open_device(device);
	struct shift_ctx *s;

	if (ctx) {
		pthread_once(&upcalls_once, install_upcalls);
		s = shift_ctx_attach(ctx); /* on failure: unprotected, logged */
		if (s && shift_config.native_wq && shift_provider_of(ctx)->wq == SHIFT_WQ_NATIVE)
			shift_ctx_set_native(s);
		if (s) {
			shift_vctx_take(s);
			shift_rnic_start(s); /* (sets s->rnic) */
		}
	}
	return ctx;
}

int shift_ibv_close_device(struct ibv_context *context)
{
	struct shift_rnic *r = rnic_of(context);
	struct shift_ctx *s = shift_ctx_of(context);

	if (r)
		shift_rnic_stop(r);
	if (s) {
		shift_vctx_give_back(s); /* (the SRQ slot too) */
		shift_qpx_detach_ctx(s);
		shift_cqx_detach_ctx(s);
	}
	shift_ctx_detach(context);
	shift_provider_forget(context);
	return L->close_device(context);
}

int shift_ibv_query_device(struct ibv_context *context,
			   struct ibv_device_attr *device_attr)
{
	return L->query_device(context, device_attr);
}

int shift_ibv_query_port(struct ibv_context *context, uint8_t port_num,
			 struct ibv_port_attr *port_attr)
{
	return L->query_port(context, port_num, port_attr);
}

int shift_ibv_query_gid(struct ibv_context *context, uint8_t port_num,
			int index, union ibv_gid *gid)
{
	return L->query_gid(context, port_num, index, gid);
}

/* Is this an event about one QP's failure (NCCL aborts on these)? SHIFT
 * hides it when it fails that QP over instead (shift_failover_hides_event). */
static bool qp_error_event(enum ibv_event_type t)
{
	return t == IBV_EVENT_QP_FATAL || t == IBV_EVENT_QP_REQ_ERR ||
	       t == IBV_EVENT_QP_ACCESS_ERR || t == IBV_EVENT_PATH_MIG_ERR;
}

int shift_ibv_get_async_event(struct ibv_context *context,
			      struct ibv_async_event *event)
{
	for (;;) {
		int rc = L->get_async_event(context, event);

		if (rc || !qp_error_event(event->event_type))
			return rc;
		struct shift_dqp *d = shift_dqp_of_qp(event->element.qp);
		if (!d || !shift_failover_hides_event(d, event->event_type))
			return rc;
		/* SHIFT fails this QP over; the application never hears of it */
		shift_info("%s QP %u: async event '%d' handled by SHIFT, not passed on", d->dev,
			   d->qpn, (int)event->event_type);
		L->ack_async_event(event);
	}
}

void shift_ibv_ack_async_event(struct ibv_async_event *event)
{
	L->ack_async_event(event);
}

struct ibv_pd *shift_ibv_alloc_pd(struct ibv_context *context)
{
	struct ibv_pd *pd = L->alloc_pd(context);
	struct shift_rnic *r = pd ? rnic_of(context) : NULL;

	if (r)
		shift_shadow_pd(r, pd);
	return pd;
}

int shift_ibv_dealloc_pd(struct ibv_pd *pd)
{
	struct shift_rnic *r = pd ? rnic_of(pd->context) : NULL;
	struct shift_pd *p = r ? shift_shadow_pd_of(r, pd) : NULL;
	int rc = L->dealloc_pd(pd);

	if (!rc && p)
		shift_shadow_pd_gone(r, p);
	return rc;
}

/*
 * The real library's own registration verbs call each other through its
 * PLT (ibv_reg_mr -> ibv_reg_mr_iova2 in rdma-core 44), and the global
 * scope binds that call to SHIFT's export: one registration would be
 * recorded twice, its second record never marked dead by the
 * application's dereg, replayed later on a freed PD (rdma_server's SIGSEGV
 * at exit). Only the outermost call on a thread records.
 */
static _Thread_local unsigned mr_depth;

#define LOWER_MR(call) (mr_depth++, mr = (call), mr_depth--, mr)

struct ibv_mr *shift_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
				int access)
{
	struct ibv_mr *mr;
	struct shift_rnic *r = LOWER_MR(L->reg_mr(pd, addr, length, access)) && !mr_depth ?
				       rnic_of(pd->context) : NULL;

	if (r)
		shift_shadow_mr(r, mr, SHIFT_MR_PLAIN, addr, length, 0, 0, -1,
				(unsigned int)access);
	return mr;
}

struct ibv_mr *shift_ibv_reg_mr_iova(struct ibv_pd *pd, void *addr,
				     size_t length, uint64_t iova, int access)
{
	struct ibv_mr *mr;
	struct shift_rnic *r = LOWER_MR(L->reg_mr_iova(pd, addr, length, iova, access)) &&
					       !mr_depth ? rnic_of(pd->context) : NULL;

	if (r)
		shift_shadow_mr(r, mr, SHIFT_MR_IOVA, addr, length, iova, 0, -1,
				(unsigned int)access);
	return mr;
}

struct ibv_mr *shift_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr,
				      size_t length, uint64_t iova,
				      unsigned int access)
{
	struct ibv_mr *mr;
	struct shift_rnic *r = LOWER_MR(L->reg_mr_iova2(pd, addr, length, iova, access)) &&
					       !mr_depth ? rnic_of(pd->context) : NULL;

	if (r)
		shift_shadow_mr(r, mr, SHIFT_MR_IOVA, addr, length, iova, 0, -1, access);
	return mr;
}

struct ibv_mr *shift_ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				       size_t length, uint64_t iova, int fd,
				       int access)
{
	struct ibv_mr *mr;
	struct shift_rnic *r = LOWER_MR(L->reg_dmabuf_mr(pd, offset, length, iova, fd, access)) &&
					       !mr_depth ? rnic_of(pd->context) : NULL;

	if (r)
		shift_shadow_mr(r, mr, SHIFT_MR_DMABUF, NULL, length, iova, offset, fd,
				(unsigned int)access);
	return mr;
}

int shift_ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd,
		       void *addr, size_t length, int access)
{
	struct shift_rnic *r = mr ? rnic_of(mr->context) : NULL;
	int rc = L->rereg_mr(mr, flags, pd, addr, length, access);

	/* (DO_FORK_OLD: the MR changed, only the old range's fork state did not) */
	if ((!rc || rc == IBV_REREG_MR_ERR_DO_FORK_OLD) && r)
		shift_shadow_mr_rereg(r, mr, flags, access);
	return rc;
}

int shift_ibv_dereg_mr(struct ibv_mr *mr)
{
	struct shift_rnic *r = mr ? rnic_of(mr->context) : NULL;
	struct shift_mr *m = r ? shift_shadow_mr_of(r, mr) : NULL;
	int rc = L->dereg_mr(mr);

	if (!rc && m)
		shift_shadow_mr_gone(r, m);
	return rc;
}

struct ibv_comp_channel *shift_ibv_create_comp_channel(struct ibv_context *context)
{
	struct ibv_comp_channel *ch = L->create_comp_channel(context);

	if (ch)
		shift_chan_created(context ? shift_ctx_of(context) : NULL, ch);
	return ch;
}

int shift_ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	struct shift_chan *k = shift_chan_lower_begin(channel);
	int rc = L->destroy_comp_channel(channel);

	shift_chan_lower_end(k, rc ? channel : NULL);
	if (!rc)
		shift_chan_destroyed(channel);
	return rc;
}

struct ibv_cq *shift_ibv_create_cq(struct ibv_context *context, int cqe,
				   void *cq_context,
				   struct ibv_comp_channel *channel,
				   int comp_vector)
{
	struct shift_chan *k = shift_chan_lower_begin(channel);
	struct ibv_cq *cq = L->create_cq(context, cqe, cq_context, channel, comp_vector);
	struct shift_rnic *r;

	shift_chan_lower_end(k, channel);
	r = cq ? rnic_of(context) : NULL;

	if (r)
		shift_shadow_cq(r, cq, cq->cqe, channel, comp_vector);
	return cq;
}

int shift_ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	struct shift_rnic *r = cq ? rnic_of(cq->context) : NULL;
	int rc = L->resize_cq(cq, cqe);

	if (!rc && r)
		shift_shadow_cq_resized(r, cq);
	return rc;
}

int shift_ibv_destroy_cq(struct ibv_cq *cq)
{
	struct shift_rnic *r = cq ? rnic_of(cq->context) : NULL;
	struct ibv_comp_channel *ch = r ? shift_chan_cq_detach(r, cq) : NULL;
	/* an extended CQ gets its provider's poll functions back first */
	struct shift_cqx *x = cq ? shift_cqx_forget(cq) : NULL;
	struct shift_cq *c = r ? shift_shadow_cq_of(r, cq) : NULL;
	int rc = L->destroy_cq(cq);

	if (!rc && c)
		shift_shadow_cq_gone(r, c);
	else if (rc)
		shift_chan_cq_reattach(r, cq, ch);
	if (rc)
		shift_cqx_restore(x);
	else
		shift_cqx_free(x);
	return rc;
}

int shift_ibv_get_cq_event(struct ibv_comp_channel *channel,
			   struct ibv_cq **cq, void **cq_context)
{
	return shift_chan_get_cq_event(channel, cq, cq_context);
}

void shift_ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	shift_chan_ack_cq_events(cq, nevents);
}

struct ibv_qp *shift_ibv_create_qp(struct ibv_pd *pd,
				   struct ibv_qp_init_attr *qp_init_attr)
{
	struct shift_rnic *r = rnic_of(pd->context);
	struct shift_dqp *d = NULL;
	/* room for SHIFT's own WRs on a QP it may protect (docs/failover.md) */
	unsigned room = r && qp_init_attr->qp_type == IBV_QPT_RC ? SHIFT_SQ_ROOM : 0;

	qp_init_attr->cap.max_send_wr += room;
	struct ibv_qp *qp = L->create_qp(pd, qp_init_attr);

	if (!qp && room) {
		qp_init_attr->cap.max_send_wr -= room;
		room = 0;
		qp = L->create_qp(pd, qp_init_attr);
	}
	qp_init_attr->cap.max_send_wr -= room;
	if (!qp || !r)
		return qp;
	/* create_qp wrote the actual capabilities back into the attr; a QP on
	 * an extended CQ SHIFT cannot poll runs unprotected */
	if (qp_init_attr->qp_type == IBV_QPT_RC && shift_srq_ok(qp_init_attr->srq) &&
	    !shift_cqx_blocks(qp_init_attr->send_cq) && !shift_cqx_blocks(qp_init_attr->recv_cq))
		d = shift_dqp_create(qp, &qp_init_attr->cap, qp_init_attr->sq_sig_all);
	shift_qp_native(d);
	struct ibv_qp_cap cap = shift_srq_qp_created(d, qp, qp_init_attr->qp_type,
						     qp_init_attr->srq, &qp_init_attr->cap);

	struct shift_qp *sq = shift_shadow_qp(r, qp, qp_init_attr->qp_type, qp_init_attr->send_cq,
					      qp_init_attr->recv_cq, &cap, qp_init_attr->sq_sig_all,
					      qp_init_attr->srq && !d);

	/* linked to its shadows before it is published: the background pass
	 * walks the published ones without a lock */
	shift_dqp_link(shift_ctx_of(pd->context), d, sq, qp_init_attr->send_cq,
		       qp_init_attr->recv_cq);
	if (d)
		shift_ctx_add_dqp(shift_ctx_of(pd->context), d);
	return qp;
}

/* A QP SHIFT protects (an unprotected one is passed through untouched);
 * r is its context's RNIC. */
static struct shift_dqp *protected_dqp(struct shift_rnic *r, struct ibv_qp *qp)
{
	struct shift_dqp *d = r ? shift_dqp_of_qp(qp) : NULL;

	if (!d || __atomic_load_n(&d->send_state, __ATOMIC_ACQUIRE) == SHIFT_SEND_UNPROTECTED)
		return NULL;
	/* (its shadow gave up: no backup NIC, no backup QP; the state alone,
	 * which the RNIC's thread publishes under the lock: the rest of the
	 * shadow is that thread's while it runs; from the record linked to
	 * d, as the post path finds it, without the RNIC's lock; a QP with
	 * no record has no shadow state to say so) */
	if (d->shadow && shift_shadow_state_of(d->shadow) == SHIFT_SHADOW_UNPROTECTED)
		return NULL;
	return d;
}

int shift_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			int attr_mask)
{
	struct shift_rnic *r = qp ? rnic_of(qp->context) : NULL;
	/* (only a retry count needs it: connecting costs no lookup else) */
	struct shift_dqp *d = attr_mask & IBV_QP_RETRY_CNT ? protected_dqp(r, qp) : NULL;
	struct ibv_qp_attr fixed;
	int rc;

	if (qp && qp->srq && shift_srq_refuse_modify(qp, attr, attr_mask))
		return EINVAL;
	/* a retry count the provider would turn into "forever" (rxe's 7), on
	 * a QP SHIFT protects: it must see the path fail */
	bool forever = d && attr && attr->retry_cnt >= 7;
	uint8_t retry = forever ? shift_provider_retry_cnt(qp->context, attr->retry_cnt) : 0;

	if (forever && retry != attr->retry_cnt) {
		fixed = *attr;
		fixed.retry_cnt = retry;
		rc = L->modify_qp(qp, &fixed, attr_mask);
		if (!rc) {
			d->app_retry_cnt = attr->retry_cnt;
			d->retry_cnt_changed = true;
		}
	} else {
		rc = L->modify_qp(qp, attr, attr_mask);
		if (!rc && d && (attr_mask & IBV_QP_RETRY_CNT))
			d->retry_cnt_changed = false;
	}
	if (rc)
		r = NULL;
	if (r && (attr_mask & IBV_QP_STATE) &&
	    (attr->qp_state == IBV_QPS_ERR || attr->qp_state == IBV_QPS_RESET)) {
		/* the application ends the connection itself (a disconnect):
		 * what follows is not a failure to hide, in any state */
		struct shift_dqp *e = shift_dqp_of_qp(qp);

		if (e && __atomic_load_n(&e->send_state, __ATOMIC_ACQUIRE) != SHIFT_SEND_UNPROTECTED)
			shift_failover_app_ended(e, attr->qp_state == IBV_QPS_ERR);
	}

	if (r)
		shift_shadow_qp_modified(r, qp, attr, attr_mask);
	return rc;
}

int shift_ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
		       int attr_mask, struct ibv_qp_init_attr *init_attr)
{
	int rc = L->query_qp(qp, attr, attr_mask, init_attr);
	struct shift_dqp *d = !rc && qp && rnic_of(qp->context) ? shift_dqp_of_qp(qp) : NULL;

	if (d)
		shift_failover_query_qp(d, attr, attr_mask);
	return rc;
}

int shift_ibv_destroy_qp(struct ibv_qp *qp)
{
	struct shift_ctx *s = qp ? shift_ctx_of(qp->context) : NULL;
	struct shift_rnic *r = s ? s->rnic : NULL;
	bool driven = false;
	/* forget it while qp is still valid; put it back if the verb fails */
	struct shift_dqp *d = s ? shift_failover_forget(s, qp, &driven) : NULL;
	/* its ibv_qp_ex gets the provider's builders back */
	struct shift_qpx *x = d ? shift_qpx_forget(qp) : NULL;
	struct shift_qp *q = r ? shift_shadow_qp_of(r, qp) : NULL;
	int rc = L->destroy_qp(qp);

	if (rc) {
		if (d)
			shift_failover_unforget(s, d, driven);
		shift_qpx_restore(x);
		return rc;
	}
	if (q)
		shift_shadow_qp_gone(r, q); /* only marks it: replay reaps later */
	shift_qpx_free(x);
	shift_dqp_destroy_later(d);
	return rc;
}

struct ibv_qp_ex *shift_ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	if (!L->qp_to_qp_ex) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return L->qp_to_qp_ex(qp);
}

int shift_ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	return L->query_ece(qp, ece);
}

int shift_ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	return L->set_ece(qp, ece);
}

void shift_compat_enter(unsigned int export_index)
{
	if (__atomic_fetch_add(&shift_stats.compat_1_0_calls, 1, __ATOMIC_RELAXED) == 0)
		shift_info("application uses the IBVERBS_1.0 compat ABI (export #%u): "
			   "its objects are forwarded, not protected", export_index);
}

const struct shift_lower shift_verbs = {
	.name = "shift",
	.get_device_list = shift_ibv_get_device_list,
	.free_device_list = shift_ibv_free_device_list,
	.get_device_name = shift_ibv_get_device_name,
	.get_device_guid = shift_ibv_get_device_guid,
	.open_device = shift_ibv_open_device,
	.close_device = shift_ibv_close_device,
	.query_device = shift_ibv_query_device,
	.query_port = shift_ibv_query_port,
	.query_gid = shift_ibv_query_gid,
	.get_async_event = shift_ibv_get_async_event,
	.ack_async_event = shift_ibv_ack_async_event,
	.alloc_pd = shift_ibv_alloc_pd,
	.dealloc_pd = shift_ibv_dealloc_pd,
	.reg_mr = shift_ibv_reg_mr,
	.reg_mr_iova = shift_ibv_reg_mr_iova,
	.reg_mr_iova2 = shift_ibv_reg_mr_iova2,
	.reg_dmabuf_mr = shift_ibv_reg_dmabuf_mr,
	.rereg_mr = shift_ibv_rereg_mr,
	.dereg_mr = shift_ibv_dereg_mr,
	.create_comp_channel = shift_ibv_create_comp_channel,
	.destroy_comp_channel = shift_ibv_destroy_comp_channel,
	.create_cq = shift_ibv_create_cq,
	.resize_cq = shift_ibv_resize_cq,
	.destroy_cq = shift_ibv_destroy_cq,
	.get_cq_event = shift_ibv_get_cq_event,
	.ack_cq_events = shift_ibv_ack_cq_events,
	.create_qp = shift_ibv_create_qp,
	.modify_qp = shift_ibv_modify_qp,
	.query_qp = shift_ibv_query_qp,
	.destroy_qp = shift_ibv_destroy_qp,
	.query_ece = shift_ibv_query_ece,
	.set_ece = shift_ibv_set_ece,
	.qp_to_qp_ex = shift_ibv_qp_to_qp_ex,
	.create_srq = shift_ibv_create_srq,
	.modify_srq = shift_ibv_modify_srq,
	.query_srq = shift_ibv_query_srq,
	.destroy_srq = shift_ibv_destroy_srq,
};
