/*
 * The service channel (svc.h): a UD QP on the backup NIC with its own PD,
 * CQ (on the thread's completion channel, if it has one) and one
 * registered buffer of receive and send slots. Receives are posted again
 * as soon as they are read; sends take the next free slot, every one
 * signaled so that its slot is known free again.
 */
#include "shift/shadow/svc.h"
#include "shift/shadow/shadow_int.h"
#include "shift/base/config.h"
#include "shift/base/log.h"
#include "shift/base/lower.h"

#include <stdlib.h>
#include <string.h>

#define SVC_RECVS 64u
#define SVC_SENDS 32u
#define SVC_GRH 40u
#define SVC_SLOT (SVC_GRH + SHIFT_SVC_MSG_MAX)
#define SVC_AHS 64u
#define SVC_SEND_ID (1ull << 63)

struct svc_ah {
	union ibv_gid dgid;
	uint8_t sgid_index;
	struct ibv_ah *ah;
};

struct shift_svc {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *mem; /* SVC_RECVS receive slots, then SVC_SENDS send slots */
	uint8_t port; /* the backup NIC's port it is on */
	unsigned send_at, sends_out;
	struct svc_ah ahs[SVC_AHS];
	unsigned nahs;
	bool full_said;
};

static uint8_t *slot(struct shift_svc *v, unsigned i)
{
	return v->mem + (size_t)i * SVC_SLOT;
}

static int post_recv(struct shift_svc *v, unsigned i)
{
	struct ibv_sge sge = { (uintptr_t)slot(v, i), SVC_SLOT, v->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(v->qp, &wr, &bad);
}

static void svc_free(struct shift_rnic *r, struct shift_svc *v)
{
	if (v->qp)
		shift_lower->destroy_qp(v->qp);
	for (unsigned i = 0; i < v->nahs; i++)
		shift_lower->destroy_ah(v->ahs[i].ah);
	/* (its events acknowledged first: destroying a CQ waits for them) */
	shift_bkev_drain(r);
	if (v->cq)
		shift_lower->destroy_cq(v->cq);
	if (v->mr)
		shift_lower->dereg_mr(v->mr);
	if (v->pd)
		shift_lower->dealloc_pd(v->pd);
	free(v->mem);
	free(v);
}

/* The QP through INIT, RTR, RTS on port; 0 or the failing call's error. */
static int svc_connect(struct ibv_qp *qp, uint8_t port)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = port,
				 .qkey = SHIFT_SVC_QKEY };
	int rc = shift_lower->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
							IBV_QP_QKEY);

	a.qp_state = IBV_QPS_RTR;
	if (!rc)
		rc = shift_lower->modify_qp(qp, &a, IBV_QP_STATE);
	a.qp_state = IBV_QPS_RTS;
	if (!rc)
		rc = shift_lower->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	return rc;
}

static const char *svc_make(struct shift_rnic *r, struct shift_svc *v)
{
	size_t bytes = (size_t)(SVC_RECVS + SVC_SENDS) * SVC_SLOT;
	struct ibv_qp_init_attr ia = {
		.qp_type = IBV_QPT_UD, .sq_sig_all = 1,
		.cap = { .max_send_wr = SVC_SENDS, .max_recv_wr = SVC_RECVS,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};

	v->pd = shift_lower->alloc_pd(r->bk_ctx);
	if (!v->pd)
		return "no PD";
	v->cq = shift_lower->create_cq(r->bk_ctx, (int)(SVC_RECVS + SVC_SENDS), NULL, r->bk_ev, 0);
	if (!v->cq)
		return "no CQ";
	ia.send_cq = ia.recv_cq = v->cq;
	v->qp = shift_lower->create_qp(v->pd, &ia);
	if (!v->qp)
		return "no UD QP";
	v->port = shift_rnic_bk_port(r, 1);
	if (svc_connect(v->qp, v->port))
		return "the UD QP does not reach RTS";
	v->mem = calloc(1, bytes);
	if (!v->mem)
		return "out of memory";
	v->mr = shift_lower->reg_mr(v->pd, v->mem, bytes, IBV_ACCESS_LOCAL_WRITE);
	if (!v->mr)
		return "its buffer cannot be registered";
	for (unsigned i = 0; i < SVC_RECVS; i++)
		if (post_recv(v, i))
			return "no receive can be posted";
	if (r->bk_ev && ibv_req_notify_cq(v->cq, 0))
		return "its CQ cannot be armed";
	return NULL;
}

bool shift_svc_open(struct shift_rnic *r)
{
	struct shift_svc *v;
	const char *why;

	if (r->svc || !r->bk_ctx || !shift_config.datagrams)
		return r->svc != NULL;
	v = calloc(1, sizeof(*v));
	why = v ? svc_make(r, v) : "out of memory";
	if (why) {
		if (v)
			svc_free(r, v);
		shift_info("%s: no service channel on %s (%s): failover records go through the KV "
			   "store only", r->name, r->bk_name, why);
		return false;
	}
	r->svc = v;
	shift_debug("%s: service channel on %s: UD QP %u", r->name, r->bk_name, v->qp->qp_num);
	return true;
}

void shift_svc_close(struct shift_rnic *r)
{
	if (r->svc)
		svc_free(r, r->svc);
	r->svc = NULL;
}

uint32_t shift_svc_qpn(const struct shift_rnic *r)
{
	return r->svc ? r->svc->qp->qp_num : 0;
}

static struct svc_ah *ah_find(struct shift_svc *v, const struct ibv_ah_attr *a)
{
	for (unsigned i = 0; i < v->nahs; i++)
		if (v->ahs[i].sgid_index == a->grh.sgid_index &&
		    !memcmp(&v->ahs[i].dgid, &a->grh.dgid, sizeof(a->grh.dgid)))
			return &v->ahs[i];
	return NULL;
}

bool shift_svc_peer(struct shift_rnic *r, const struct ibv_ah_attr *a)
{
	struct shift_svc *v = r->svc;
	struct ibv_ah_attr copy = *a;

	if (!v)
		return false;
	copy.port_num = v->port; /* (the channel's, whichever port the QP's is) */
	if (ah_find(v, a))
		return true;
	if (v->nahs == SVC_AHS) /* (the peers' GIDs beyond: KV only) */
		return false;
	struct ibv_ah *ah = shift_lower->create_ah(v->pd, &copy);

	if (!ah) {
		shift_debug("%s: no address handle to a peer's backup: its records go through "
			    "the KV store only", r->name);
		return false;
	}
	v->ahs[v->nahs++] = (struct svc_ah){ .dgid = a->grh.dgid, .sgid_index = a->grh.sgid_index,
					     .ah = ah };
	return true;
}

int shift_svc_send(struct shift_rnic *r, const struct ibv_ah_attr *a, uint32_t qpn,
		   const void *msg, size_t len)
{
	struct shift_svc *v = r->svc;
	struct svc_ah *h = v ? ah_find(v, a) : NULL;

	if (!h || !qpn || len > SHIFT_SVC_MSG_MAX)
		return -1;
	if (v->sends_out == SVC_SENDS) {
		if (!v->full_said)
			shift_info("%s: service channel: %u datagrams not sent yet; more wait for "
				   "the KV store", r->name, SVC_SENDS);
		v->full_said = true;
		return -1;
	}
	unsigned i = SVC_RECVS + v->send_at;
	struct ibv_sge sge = { (uintptr_t)slot(v, i), (uint32_t)len, v->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = SVC_SEND_ID | i, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND }, *bad;

	memcpy(slot(v, i), msg, len);
	wr.wr.ud.ah = h->ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = SHIFT_SVC_QKEY;
	if (ibv_post_send(v->qp, &wr, &bad))
		return -1;
	v->send_at = (v->send_at + 1) % SVC_SENDS;
	v->sends_out++;
	return 0;
}

/* One completion: a send's slot free again, or a datagram to fn. */
static unsigned svc_wc(struct shift_rnic *r, const struct ibv_wc *wc,
		       void (*fn)(void *, uint32_t, const void *, size_t), void *arg)
{
	struct shift_svc *v = r->svc;

	if (wc->wr_id & SVC_SEND_ID) {
		v->sends_out--;
		v->full_said = false;
		return 0;
	}
	unsigned i = (unsigned)wc->wr_id;

	if (i >= SVC_RECVS)
		return 0;
	bool got = wc->status == IBV_WC_SUCCESS && wc->byte_len > SVC_GRH &&
		   wc->byte_len <= SVC_SLOT;

	if (got)
		fn(arg, wc->src_qp, slot(v, i) + SVC_GRH, wc->byte_len - SVC_GRH);
	if (wc->status != IBV_WC_WR_FLUSH_ERR && post_recv(v, i))
		shift_debug("%s: service channel: a receive cannot be posted again", r->name);
	return got;
}

unsigned shift_svc_poll(struct shift_rnic *r,
			void (*fn)(void *arg, uint32_t src_qp, const void *msg, size_t len),
			void *arg)
{
	struct shift_svc *v = r->svc;
	struct ibv_wc wc[16];
	unsigned got = 0;
	bool armed = false;
	int n;

	if (!v)
		return 0;
	for (;;) {
		while ((n = ibv_poll_cq(v->cq, 16, wc)) > 0)
			for (int k = 0; k < n; k++)
				got += svc_wc(r, &wc[k], fn, arg);
		/* (armed, then polled once more: nothing slips between) */
		if (armed || !r->bk_ev || ibv_req_notify_cq(v->cq, 0))
			return got;
		armed = true;
	}
}
