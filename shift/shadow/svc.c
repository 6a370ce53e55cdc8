/*
 * The service channels (svc.h): each a UD QP with its own PD, CQ and one
 * registered buffer of receive and send slots. The backup channel lives on
 * the backup context and its CQ reports to the backup CQs' completion
 * channel (r->bk_ev); the default channel lives on a context of its own on
 * the application's device (never the application's: its CQs and ops are
 * SHIFT's front) with a completion channel of its own. Receives are posted
 * again as soon as they are read; sends take the next free slot, every one
 * signaled so that its slot is known free again.
 */
#include "shift/shadow/svc.h"
#include "shift/shadow/shadow_int.h"
#include "shift/base/config.h"
#include "shift/base/log.h"
#include "shift/base/lower.h"
#include "shift/dp/ctx.h"

#include <stdlib.h>
#include <string.h>

#define SVC_RECVS 64u
#define SVC_SENDS SHIFT_SVC_SENDS
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
	struct ibv_context *ctx;
	bool own_ctx;
	struct ibv_comp_channel *ch; /* NULL: polled at every pass */
	bool own_ch;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *mem; /* SVC_RECVS receive slots, then SVC_SENDS send slots */
	uint8_t port;
	unsigned send_at, sends_out;
	bool broken; /* its QP failed: brought back at the next poll */
	bool full_said;
	struct svc_ah ahs[SVC_AHS];
	unsigned nahs;
};

static const char *const path_name[SHIFT_SVC_PATHS] = { "backup", "default" };

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
	shift_comp_drain(v->own_ch ? v->ch : r->bk_ev);
	if (v->cq)
		shift_lower->destroy_cq(v->cq);
	if (v->mr)
		shift_lower->dereg_mr(v->mr);
	if (v->pd)
		shift_lower->dealloc_pd(v->pd);
	if (v->own_ch && v->ch)
		shift_lower->destroy_comp_channel(v->ch);
	if (v->own_ctx && v->ctx)
		shift_lower->close_device(v->ctx);
	free(v->mem);
	free(v);
}

/* The QP through INIT, RTR, RTS (from RESET); 0 or the failing call's error. */
static int svc_connect(struct shift_svc *v)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = v->port,
				 .qkey = SHIFT_SVC_QKEY };
	int rc = shift_lower->modify_qp(v->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
							   IBV_QP_QKEY);

	a.qp_state = IBV_QPS_RTR;
	if (!rc)
		rc = shift_lower->modify_qp(v->qp, &a, IBV_QP_STATE);
	a.qp_state = IBV_QPS_RTS;
	if (!rc)
		rc = shift_lower->modify_qp(v->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	for (unsigned i = 0; !rc && i < SVC_RECVS; i++)
		rc = post_recv(v, i);
	return rc;
}

/* The context, channel and port of path p; NULL or why not. */
static const char *svc_place(struct shift_rnic *r, enum shift_svc_path p, struct shift_svc *v)
{
	if (p == SHIFT_SVC_BACKUP) {
		v->ctx = r->bk_ctx;
		v->ch = r->bk_ev;
		v->port = shift_rnic_bk_port(r, 1);
		return NULL;
	}
	struct ibv_device *dev = r->sctx->ibctx->device;

	v->ctx = dev ? shift_lower->open_device(dev) : NULL;
	if (!v->ctx)
		return "no context of its own";
	v->own_ctx = true;
	v->port = 1;
	if (r->kick_fd < 0) /* (no thread waits: polled at every pass) */
		return NULL;
	v->ch = shift_lower->create_comp_channel(v->ctx);
	v->own_ch = v->ch != NULL;
	if (v->ch && !shift_fd_nonblocking(v->ch->fd))
		return "its completion channel cannot be read without blocking";
	return NULL;
}

static const char *svc_make(struct shift_rnic *r, enum shift_svc_path p, struct shift_svc *v)
{
	size_t bytes = (size_t)(SVC_RECVS + SVC_SENDS) * SVC_SLOT;
	struct ibv_qp_init_attr ia = {
		.qp_type = IBV_QPT_UD, .sq_sig_all = 1,
		.cap = { .max_send_wr = SVC_SENDS, .max_recv_wr = SVC_RECVS,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	const char *why = svc_place(r, p, v);

	if (why)
		return why;
	v->pd = shift_lower->alloc_pd(v->ctx);
	if (!v->pd)
		return "no PD";
	v->cq = shift_lower->create_cq(v->ctx, (int)(SVC_RECVS + SVC_SENDS), NULL, v->ch, 0);
	if (!v->cq)
		return "no CQ";
	ia.send_cq = ia.recv_cq = v->cq;
	v->qp = shift_lower->create_qp(v->pd, &ia);
	if (!v->qp)
		return "no UD QP";
	v->mem = calloc(1, bytes);
	if (!v->mem)
		return "out of memory";
	v->mr = shift_lower->reg_mr(v->pd, v->mem, bytes, IBV_ACCESS_LOCAL_WRITE);
	if (!v->mr)
		return "its buffer cannot be registered";
	if (svc_connect(v))
		return "the UD QP does not reach RTS with its receives";
	if (v->ch && ibv_req_notify_cq(v->cq, 0))
		return "its CQ cannot be armed";
	return NULL;
}

void shift_svc_open(struct shift_rnic *r)
{
	for (int p = 0; p < SHIFT_SVC_PATHS && shift_config.datagrams && r->bk_ctx; p++) {
		struct shift_svc *v = r->svc[p] ? NULL : calloc(1, sizeof(*v));
		const char *why = v ? svc_make(r, (enum shift_svc_path)p, v) : NULL;

		if (r->svc[p])
			continue;
		if (!v || why) {
			if (v)
				svc_free(r, v);
			shift_info("%s: no service channel on its %s NIC (%s): failover records go "
				   "that way through the KV store only", r->name, path_name[p],
				   why ? why : "out of memory");
			continue;
		}
		r->svc[p] = v;
		shift_debug("%s: service channel on its %s NIC: UD QP %u", r->name, path_name[p],
			    v->qp->qp_num);
	}
}

void shift_svc_close(struct shift_rnic *r)
{
	for (int p = 0; p < SHIFT_SVC_PATHS; p++) {
		if (r->svc[p])
			svc_free(r, r->svc[p]);
		r->svc[p] = NULL;
	}
}

uint32_t shift_svc_qpn(const struct shift_rnic *r, enum shift_svc_path p)
{
	return r->svc[p] ? r->svc[p]->qp->qp_num : 0;
}

static struct svc_ah *ah_find(struct shift_svc *v, const struct ibv_ah_attr *a)
{
	for (unsigned i = 0; i < v->nahs; i++)
		if (v->ahs[i].sgid_index == a->grh.sgid_index &&
		    !memcmp(&v->ahs[i].dgid, &a->grh.dgid, sizeof(a->grh.dgid)))
			return &v->ahs[i];
	return NULL;
}

bool shift_svc_peer(struct shift_rnic *r, enum shift_svc_path p, const struct ibv_ah_attr *a)
{
	struct shift_svc *v = r->svc[p];
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
		shift_debug("%s: no address handle to a peer on its %s NIC: its records go that "
			    "way through the KV store only", r->name, path_name[p]);
		return false;
	}
	v->ahs[v->nahs++] = (struct svc_ah){ .dgid = a->grh.dgid, .sgid_index = a->grh.sgid_index,
					     .ah = ah };
	return true;
}

int shift_svc_send(struct shift_rnic *r, enum shift_svc_path p, const struct ibv_ah_attr *a,
		   uint32_t qpn, const void *msg, size_t len)
{
	struct shift_svc *v = r->svc[p];
	struct svc_ah *h = v ? ah_find(v, a) : NULL;

	if (!h || !qpn || len > SHIFT_SVC_MSG_MAX || v->broken)
		return -1;
	if (v->sends_out == SVC_SENDS) {
		if (!v->full_said)
			shift_info("%s: service channel on its %s NIC: %u datagrams not sent yet; "
				   "more go through the KV store only", r->name, path_name[p],
				   SVC_SENDS);
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

unsigned shift_svc_room(const struct shift_rnic *r, enum shift_svc_path p)
{
	const struct shift_svc *v = r->svc[p];

	return v && !v->broken ? SVC_SENDS - v->sends_out : 0;
}

/* v's QP failed: reset and connected again, its receives posted (its CQ
 * empty: polled to the end before). */
static void svc_revive(struct shift_rnic *r, enum shift_svc_path p, struct shift_svc *v)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RESET };

	if (shift_lower->modify_qp(v->qp, &a, IBV_QP_STATE) || svc_connect(v))
		return; /* (again at the next poll) */
	v->broken = false;
	v->sends_out = 0;
	shift_debug("%s: service channel on its %s NIC: its UD QP failed and is back", r->name,
		    path_name[p]);
}

/* One completion of v: a send's slot free again, or a datagram to fn. */
static void svc_wc(struct shift_svc *v, enum shift_svc_path p, const struct ibv_wc *wc,
		   void (*fn)(void *, enum shift_svc_path, uint32_t, const void *, size_t),
		   void *arg)
{
	bool send = wc->wr_id & SVC_SEND_ID;
	unsigned i = (unsigned)wc->wr_id;

	/* (a failed WR of a UD QP: the QP failed, its other WRs flushed) */
	if (wc->status != IBV_WC_SUCCESS)
		v->broken = true;
	if (send) {
		if (v->sends_out)
			v->sends_out--;
		v->full_said = false;
		return;
	}
	if (i >= SVC_RECVS || wc->status != IBV_WC_SUCCESS)
		return;
	if (wc->byte_len > SVC_GRH && wc->byte_len <= SVC_SLOT)
		fn(arg, p, wc->src_qp, slot(v, i) + SVC_GRH, wc->byte_len - SVC_GRH);
	if (post_recv(v, i))
		v->broken = true;
}

void shift_svc_poll(struct shift_rnic *r,
		    void (*fn)(void *arg, enum shift_svc_path p, uint32_t src_qp, const void *msg,
			       size_t len),
		    void *arg)
{
	for (int p = 0; p < SHIFT_SVC_PATHS; p++) {
		struct shift_svc *v = r->svc[p];
		struct ibv_wc wc[16];
		bool armed = false;
		int n;

		while (v) {
			while ((n = ibv_poll_cq(v->cq, 16, wc)) > 0)
				for (int k = 0; k < n; k++)
					svc_wc(v, (enum shift_svc_path)p, &wc[k], fn, arg);
			if (v->broken)
				svc_revive(r, (enum shift_svc_path)p, v);
			/* (armed, then polled once more: nothing slips between) */
			if (armed || !v->ch || ibv_req_notify_cq(v->cq, 0))
				break;
			armed = true;
		}
	}
}

int shift_svc_fd(const struct shift_rnic *r)
{
	const struct shift_svc *v = r->svc[SHIFT_SVC_DEFAULT];

	return v && v->own_ch ? v->ch->fd : -1;
}

void shift_svc_drain(struct shift_rnic *r)
{
	const struct shift_svc *v = r->svc[SHIFT_SVC_DEFAULT];

	if (v && v->own_ch)
		shift_comp_drain(v->ch);
}
