/*
 * UD QPs and address handles on the simulated RNIC: enough for a service
 * channel of datagrams (SHIFT's, shift/shadow/svc.c).
 *
 * A datagram is delivered when it is posted, not by a later step of the
 * world: UD has no PSNs, acknowledgements or retransmission to model, and
 * delivery at the post keeps a schedule exactly replayable. It is lost,
 * silently, as on a real network, when the path between the two devices
 * is down (a dead port, a cut link), when no QP of that number is at RTR
 * or RTS on the destination, on a Q_Key mismatch, or when the destination
 * has no receive posted. The send completes with success either way. The
 * receive gets 40 bytes of GRH first (source GID at byte 8, destination
 * at 24, as an IPv6 header), its completion the sender's QPN and
 * IBV_WC_GRH. UD QPs are numbered apart from RC QPs (SIM_UD_QPN_BASE, at
 * most SIM_UD_QPS a device), so that RC QPs keep the numbers a run
 * without any UD QP gives them: traces that name them stay comparable.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sim_int.h"

#define TAG(s) ((uint32_t)(s)[0] | (uint32_t)(s)[1] << 8 | \
		(uint32_t)(s)[2] << 16 | (uint32_t)(s)[3] << 24)
#define SIM_UD_GRH 40u
#define SIM_UD_MTU 4096u

struct sim_ah {
	struct ibv_ah ah; /* must be first */
	union ibv_gid dgid;
};

struct ibv_ah *sim_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct sim_ah *a;

	/* RoCE: a GRH, port 1 */
	if (!pd || !attr || !attr->is_global || (attr->port_num && attr->port_num != 1)) {
		errno = EINVAL;
		return NULL;
	}
	a = calloc(1, sizeof(*a));
	if (!a) {
		errno = ENOMEM;
		return NULL;
	}
	a->ah.context = pd->context;
	a->ah.pd = pd;
	a->dgid = attr->grh.dgid;
	return &a->ah;
}

int sim_destroy_ah(struct ibv_ah *ah)
{
	free(ah);
	return 0;
}

/* The legal UD transitions (the kernel's table for UD QPs). */
bool sim_ud_modify_ok(enum ibv_qp_state cur, enum ibv_qp_state next, uint32_t mask)
{
	uint32_t req = IBV_QP_STATE, opt = 0;

	if (!(mask & IBV_QP_STATE))
		return !(mask & ~(uint32_t)(IBV_QP_QKEY | IBV_QP_PKEY_INDEX));
	if (next == IBV_QPS_RESET || next == IBV_QPS_ERR)
		return !(mask & ~(uint32_t)IBV_QP_STATE);
	if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT)
		req |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
	else if (cur == IBV_QPS_INIT && (next == IBV_QPS_INIT || next == IBV_QPS_RTR))
		opt = IBV_QP_PKEY_INDEX | IBV_QP_QKEY | (next == IBV_QPS_INIT ? IBV_QP_PORT : 0);
	else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS)
		req |= IBV_QP_SQ_PSN, opt = IBV_QP_QKEY;
	else if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS)
		opt = IBV_QP_QKEY;
	else
		return false;
	return (mask & req) == req && !(mask & ~(req | opt));
}

/* The destination QP of a datagram, or NULL: lost. */
static struct sim_qp *ud_dest(struct sim_qp *q, const struct ibv_send_wr *wr)
{
	struct sim_world *w = q->dev->w;
	const struct sim_ah *ah = (const struct sim_ah *)wr->wr.ud.ah;
	struct sim_dev *dd = ah ? sim_dev_by_gid(w, &ah->dgid) : NULL;
	uint32_t n = wr->wr.ud.remote_qpn;
	struct sim_qp *dq;

	if (!sim_path_ok(w, q->dev, dd) || n < SIM_UD_QPN_BASE || n - SIM_UD_QPN_BASE >= SIM_UD_QPS)
		return NULL;
	dq = dd->ud_qps[n - SIM_UD_QPN_BASE];
	/* (a Q_Key with its high bit set means the sender QP's own) */
	uint32_t qkey = wr->wr.ud.remote_qkey & 0x80000000u ? q->attr.qkey : wr->wr.ud.remote_qkey;

	if (!dq || dq->qp.qp_type != IBV_QPT_UD || dq->attr.qkey != qkey ||
	    (dq->qp.state != IBV_QPS_RTR && dq->qp.state != IBV_QPS_RTS))
		return NULL;
	return dq;
}

/* Deliver buf (GRH, then the payload: len bytes in all) to dq's next
 * receive; false if it has none or it is too small (lost). */
static bool ud_deliver(struct sim_qp *q, struct sim_qp *dq, const uint8_t *buf, uint32_t len,
		       const struct ibv_send_wr *wr)
{
	struct sim_rwqe *r = sim_rq_peek(dq);
	uint64_t room = 0;
	struct ibv_wc wc;

	for (unsigned i = 0; r && i < r->num_sge; i++)
		room += r->sge[i].length;
	if (!r || room < len)
		return false;
	sim_rq_take(dq);
	memset(&wc, 0, sizeof(wc));
	wc.wr_id = r->wr_id;
	wc.status = sim_scatter(dq, r->sge, r->num_sge, buf, len) ? IBV_WC_SUCCESS
								 : IBV_WC_LOC_PROT_ERR;
	wc.opcode = IBV_WC_RECV;
	wc.byte_len = len;
	wc.qp_num = dq->qp.qp_num;
	wc.src_qp = q->qp.qp_num;
	wc.wc_flags = IBV_WC_GRH;
	if (wr->opcode == IBV_WR_SEND_WITH_IMM) {
		wc.wc_flags |= IBV_WC_WITH_IMM;
		wc.imm_data = wr->imm_data;
	}
	sim_cq_push((struct sim_cq *)dq->qp.recv_cq, &wc,
		    (wr->send_flags & IBV_SEND_SOLICITED) != 0);
	return true;
}

/* One datagram: gathered, delivered or lost; its send completion. */
static int ud_send_one(struct sim_qp *q, struct ibv_send_wr *wr)
{
	struct sim_world *w = q->dev->w;
	uint8_t *buf;
	uint64_t len = 0;
	uint32_t at = SIM_UD_GRH;

	if ((wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM) ||
	    wr->num_sge < 0 || (unsigned)wr->num_sge > q->cap.max_send_sge)
		return EINVAL;
	for (int i = 0; i < wr->num_sge; i++)
		len += wr->sg_list[i].length;
	if (len > SIM_UD_MTU)
		return EINVAL;
	buf = calloc(1, SIM_UD_GRH + len);
	if (!buf)
		return ENOMEM;
	for (int i = 0; i < wr->num_sge; i++) {
		const struct ibv_sge *sg = &wr->sg_list[i];
		/* (inline data is read from the application's buffer) */
		const uint8_t *p = wr->send_flags & IBV_SEND_INLINE
					   ? (const uint8_t *)(uintptr_t)sg->addr
					   : sim_local(q, sg, 0);

		if (!p && sg->length) {
			free(buf);
			return EINVAL;
		}
		if (sg->length)
			memcpy(buf + at, p, sg->length);
		at += sg->length;
	}
	memcpy(buf + 8, &q->dev->gid[1], 16);
	struct sim_qp *dq = ud_dest(q, wr);

	if (dq)
		memcpy(buf + 24, &dq->dev->gid[1], 16);
	/* (printed, not hashed: the application's trace through SHIFT and
	 * without it stay comparable) */
	if (dq && ud_deliver(q, dq, buf, at, wr)) {
		w->stats.ud_delivered++;
		sim_trace_print(w, TAG("UDRX"), (uint64_t)q->dev->gidx << 32 | q->qp.qp_num,
			  (uint64_t)dq->dev->gidx << 32 | dq->qp.qp_num);
	} else {
		w->stats.ud_lost++;
		sim_trace_print(w, TAG("UDDR"), (uint64_t)q->dev->gidx << 32 | q->qp.qp_num,
			  wr->wr.ud.remote_qpn);
	}
	free(buf);
	if ((wr->send_flags & IBV_SEND_SIGNALED) || q->sq_sig_all) {
		struct ibv_wc wc = { .wr_id = wr->wr_id, .opcode = IBV_WC_SEND,
				     .qp_num = q->qp.qp_num }; /* (IBV_WC_SUCCESS) */

		sim_cq_push((struct sim_cq *)q->qp.send_cq, &wc, false);
	}
	return 0;
}

int sim_ud_post_send(struct sim_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	for (; wr; wr = wr->next) {
		int rc = q->qp.state == IBV_QPS_RTS ? ud_send_one(q, wr) : EINVAL;

		if (rc) {
			*bad = wr;
			return rc;
		}
	}
	return 0;
}
