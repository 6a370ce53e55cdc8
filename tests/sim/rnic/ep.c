/*
 * Application-side endpoint helper (see ep.h): opening and connecting an RC
 * QP through a verbs table only, with the attribute masks an application
 * passes to each modify_qp transition.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ep.h"

static struct ibv_cq_ex *open_cq_ex(struct sim_ep *ep, int cqe)
{
	struct ibv_cq_init_attr_ex a;

	memset(&a, 0, sizeof(a));
	a.cqe = (uint32_t)cqe;
	a.cq_context = ep;
	a.channel = ep->ch;
	a.wc_flags = IBV_WC_STANDARD_FLAGS;
	return ibv_create_cq_ex(ep->ctx, &a);
}

static struct ibv_qp *open_qp_ex(struct sim_ep *ep, struct ibv_qp_init_attr *ia)
{
	struct ibv_qp_init_attr_ex a;
	struct ibv_qp *qp;

	memset(&a, 0, sizeof(a));
	a.qp_context = ia->qp_context;
	a.send_cq = ia->send_cq;
	a.recv_cq = ia->recv_cq;
	a.cap = ia->cap;
	a.qp_type = ia->qp_type;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	a.pd = ep->pd;
	a.send_ops_flags = SIM_EP_EX_OPS;
	qp = ibv_create_qp_ex(ep->ctx, &a);
	ep->qpx = qp ? ibv_qp_to_qp_ex(qp) : NULL;
	if (qp && !ep->qpx) {
		ep->v->destroy_qp(qp);
		errno = EOPNOTSUPP;
		return NULL;
	}
	return qp;
}

int sim_ep_open(struct sim_ep *ep, const struct shift_lower *v,
		const char *devname, size_t len, int access,
		const struct ibv_qp_cap *cap, int cqe, unsigned flags)
{
	struct ibv_device **list;
	struct ibv_device *dev = NULL;
	struct ibv_qp_init_attr ia;
	int n = 0;

	memset(ep, 0, sizeof(*ep));
	ep->v = v;
	list = v->get_device_list(&n);
	if (!list)
		return errno ? errno : ENODEV;
	for (int i = 0; i < n; i++)
		if (!strcmp(v->get_device_name(list[i]), devname))
			dev = list[i];
	if (dev)
		ep->ctx = v->open_device(dev);
	v->free_device_list(list);
	if (!ep->ctx)
		return dev ? (errno ? errno : EIO) : ENODEV;
	ep->pd = v->alloc_pd(ep->ctx);
	if (!ep->pd)
		goto fail;
	if (flags & SIM_EP_CHANNEL) {
		ep->ch = v->create_comp_channel(ep->ctx);
		if (!ep->ch)
			goto fail;
	}
	if (flags & SIM_EP_EX) {
		ep->cqx = open_cq_ex(ep, cqe);
		ep->cq = ep->cqx ? ibv_cq_ex_to_cq(ep->cqx) : NULL;
	} else {
		ep->cq = v->create_cq(ep->ctx, cqe, ep, ep->ch, 0);
	}
	if (!ep->cq)
		goto fail;
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = ep->cq;
	ia.recv_cq = ep->cq;
	ia.cap = *cap;
	ia.qp_type = IBV_QPT_RC;
	ia.qp_context = ep;
	ep->qp = flags & SIM_EP_EX ? open_qp_ex(ep, &ia) : v->create_qp(ep->pd, &ia);
	if (!ep->qp)
		goto fail;
	ep->len = len;
	ep->buf = calloc(1, len ? len : 1);
	if (!ep->buf)
		goto fail;
	ep->mr = v->reg_mr(ep->pd, ep->buf, len, access);
	if (!ep->mr)
		goto fail;
	return 0;
fail:;
	int rc = errno ? errno : EINVAL;

	sim_ep_close(ep);
	return rc;
}

void sim_ep_info(const struct sim_ep *ep, uint32_t psn,
		 struct sim_ep_info *info)
{
	memset(info, 0, sizeof(*info));
	info->qpn = ep->qp->qp_num;
	info->psn = psn & 0xffffff;
	ep->v->query_gid(ep->ctx, 1, 1, &info->gid);
}

int sim_ep_connect(struct sim_ep *ep, const struct sim_ep_info *local,
		   const struct sim_ep_info *remote,
		   const struct sim_ep_conn *conn)
{
	static const struct sim_ep_conn dflt = { 14, 7, 7, 12, 16, 0 };
	struct ibv_qp_attr a;
	int rc;

	if (!conn)
		conn = &dflt;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	rc = ep->v->modify_qp(ep->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			      IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc)
		return rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = remote->qpn;
	a.rq_psn = remote->psn;
	a.max_dest_rd_atomic = conn->max_rd_atomic;
	a.min_rnr_timer = conn->min_rnr_timer;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = remote->gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	rc = ep->v->modify_qp(ep->qp, &a, IBV_QP_STATE | IBV_QP_AV |
			      IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			      IBV_QP_MIN_RNR_TIMER);
	if (rc || conn->rtr_only)
		return rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = local->psn;
	a.timeout = conn->timeout;
	a.retry_cnt = conn->retry_cnt;
	a.rnr_retry = conn->rnr_retry;
	a.max_rd_atomic = conn->max_rd_atomic;
	return ep->v->modify_qp(ep->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN |
				IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

void sim_ep_close(struct sim_ep *ep)
{
	const struct shift_lower *v = ep->v;

	if (ep->mr)
		v->dereg_mr(ep->mr);
	if (ep->qp)
		v->destroy_qp(ep->qp);
	if (ep->cq)
		v->destroy_cq(ep->cq);
	if (ep->ch)
		v->destroy_comp_channel(ep->ch);
	if (ep->pd)
		v->dealloc_pd(ep->pd);
	if (ep->ctx)
		v->close_device(ep->ctx);
	free(ep->buf);
	memset(ep, 0, sizeof(*ep));
	ep->v = v;
}
