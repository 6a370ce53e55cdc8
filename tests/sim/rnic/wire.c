/*
 * Data path and RC engine of the simulated RNIC.
 *
 * The application side (post_send, post_recv, poll_cq, req_notify_cq) only
 * queues WQEs and pops completions. The engine runs from the scheduler:
 * sim_qp_tx() turns the next WQE into a request packet on the QP's wire
 * FIFO, sim_qp_deliver() hands the head packet of a FIFO to the peer
 * (responder for requests, requester for responses), and the timers retry.
 *
 * RC rules kept here, as hardware keeps them: one PSN per message, requests
 * executed in PSN order, a request executed before its ACK leaves, duplicate
 * SEND/WRITE re-ACKed without re-execution, duplicate READ re-read,
 * duplicate atomics answered from a replay cache (never applied twice),
 * out-of-order requests NAKed once (sequence error) and go-back-N
 * retransmission, cumulative ACKs, completions strictly in WQE order, the
 * retry budget turning silence into IBV_WC_RETRY_EXC_ERR, RNR NAK with
 * rnr_retry (7 = forever), remote access and length errors, and ERR
 * flushing every remaining WQE with IBV_WC_WR_FLUSH_ERR.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sim_int.h"

#define TAG(s) ((uint32_t)(s)[0] | (uint32_t)(s)[1] << 8 | \
		(uint32_t)(s)[2] << 16 | (uint32_t)(s)[3] << 24)
#define SIM_WINDOW 64	/* max unacknowledged messages per QP */

static struct sim_world *qw(struct sim_qp *q) { return q->dev->w; }

static struct sim_swqe *swqe(struct sim_qp *q, uint32_t i)
{
	return &q->sq[i % q->sq_cap];
}

static bool is_rd_atomic(enum ibv_wr_opcode op)
{
	return op == IBV_WR_RDMA_READ || op == IBV_WR_ATOMIC_CMP_AND_SWP ||
	       op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

static bool has_payload(enum ibv_wr_opcode op)
{
	return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM ||
	       op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM;
}

static enum ibv_wc_opcode wc_opcode(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
	case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP: return IBV_WC_COMP_SWAP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD: return IBV_WC_FETCH_ADD;
	default: return IBV_WC_SEND;
	}
}

/* --- local memory --------------------------------------------------------- */

/* Host address of [addr, addr+len) in an MR of q's device and PD with the
 * given access, or NULL. */
uint8_t *sim_local(struct sim_qp *q, const struct ibv_sge *s,
			  unsigned need)
{
	struct sim_mr *mr = sim_mr_lookup(q->dev, s->lkey);
	uintptr_t base;

	if (!mr || mr->mr.pd != q->qp.pd || (mr->access & need) != need)
		return NULL;
	base = (uintptr_t)mr->mr.addr;
	if (s->addr < base || s->addr + s->length < s->addr ||
	    s->addr + s->length > base + mr->mr.length)
		return NULL;
	return (uint8_t *)(uintptr_t)s->addr;
}

/* Scatters len bytes into an SGE list; false on a protection error. */
bool sim_scatter(struct sim_qp *q, const struct ibv_sge *sge,
			unsigned n, const uint8_t *data, uint32_t len)
{
	for (unsigned i = 0; i < n && len; i++) {
		uint32_t k = sge[i].length < len ? sge[i].length : len;
		struct ibv_sge s = sge[i];
		uint8_t *p;

		s.length = k;
		p = sim_local(q, &s, IBV_ACCESS_LOCAL_WRITE);
		if (!p)
			return false;
		memcpy(p, data, k);
		data += k;
		len -= k;
	}
	return len == 0;
}

/* Remote address of a request in an MR of dq's device, or NULL. */
static uint8_t *sim_remote(struct sim_qp *dq, uint32_t rkey, uint64_t raddr,
			   uint32_t len, unsigned need)
{
	struct sim_mr *mr = sim_mr_lookup(dq->dev, rkey);

	if (!mr || mr->mr.pd != dq->qp.pd || (mr->access & need) != need ||
	    (dq->attr.qp_access_flags & need) != need)
		return NULL;
	if (raddr < mr->iova || raddr + len < raddr ||
	    raddr + len > mr->iova + mr->mr.length)
		return NULL;
	return (uint8_t *)mr->mr.addr + (raddr - mr->iova);
}

/* --- completions and flushes -------------------------------------------- */

static void sim_send_wc(struct sim_qp *q, struct sim_swqe *e,
			enum ibv_wc_status st)
{
	struct ibv_wc wc;

	memset(&wc, 0, sizeof(wc));
	wc.wr_id = e->wr_id;
	wc.status = st;
	wc.opcode = wc_opcode(e->opcode);
	wc.qp_num = q->qp.qp_num;
	if (e->opcode == IBV_WR_RDMA_READ)
		wc.byte_len = e->len;
	else if (e->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		 e->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
		wc.byte_len = 8;
	if (st != IBV_WC_SUCCESS && st != IBV_WC_WR_FLUSH_ERR)
		qw(q)->stats.err_completions++;
	sim_cq_push((struct sim_cq *)q->qp.send_cq, &wc, false);
}

static void sim_recv_flush_wc(struct sim_qp *q, struct sim_rwqe *r,
			      enum ibv_wc_status st)
{
	struct ibv_wc wc;

	memset(&wc, 0, sizeof(wc));
	wc.wr_id = r->wr_id;
	wc.status = st;
	wc.opcode = IBV_WC_RECV;
	wc.qp_num = q->qp.qp_num;
	sim_cq_push((struct sim_cq *)q->qp.recv_cq, &wc, false);
}

/* Every remaining WQE of both queues completes with IBV_WC_WR_FLUSH_ERR,
 * signaled or not. The QP is in ERR. */
void sim_qp_flush(struct sim_qp *q)
{
	/* (a reset does not clear it: only a read response does) */
	for (uint32_t i = q->sq_head; qw(q)->opts.rxe_stale_read && i != q->sq_tail; i++)
		if (swqe(q, i)->opcode == IBV_WR_RDMA_READ)
			q->comp_in_read = true;
	while (q->sq_head != q->sq_tail) {
		sim_send_wc(q, swqe(q, q->sq_head), IBV_WC_WR_FLUSH_ERR);
		q->sq_head++;
	}
	q->sq_tx = q->sq_hi = q->sq_head;
	q->rd_out = 0;
	q->rnr_wait = false;
	while (q->rq_head != q->rq_tail) {
		sim_recv_flush_wc(q, &q->rq[q->rq_head % q->rq_cap],
				  IBV_WC_WR_FLUSH_ERR);
		q->rq_head++;
	}
}

/* The WQE at head fails with st; the QP goes to ERR and flushes the rest. */
static void sim_sq_fail(struct sim_qp *q, enum ibv_wc_status st)
{
	sim_trace(qw(q), TAG("FAIL"), q->qp.qp_num, st);
	sim_send_wc(q, swqe(q, q->sq_head), st);
	q->sq_head++;
	q->qp.state = IBV_QPS_ERR;
	q->attr.qp_state = IBV_QPS_ERR;
	sim_qp_flush(q);
}

static void sim_rd_recount(struct sim_qp *q)
{
	q->rd_out = 0;
	for (uint32_t i = q->sq_head; i != q->sq_tx; i++)
		if (is_rd_atomic(swqe(q, i)->opcode))
			q->rd_out++;
}

/* Pops acknowledged WQEs from the head, in order, completing the signaled
 * ones; then fails a WQE whose local error was found at transmit once it
 * reaches the head. */
static void sim_sq_complete(struct sim_qp *q)
{
	while (q->sq_head != q->sq_tx && swqe(q, q->sq_head)->acked) {
		struct sim_swqe *e = swqe(q, q->sq_head);

		if (e->flags & IBV_SEND_SIGNALED || q->sq_sig_all)
			sim_send_wc(q, e, IBV_WC_SUCCESS);
		if (is_rd_atomic(e->opcode))
			q->rd_out--;
		q->sq_head++;
	}
	if (q->sq_head == q->sq_tx && q->sq_tx != q->sq_tail &&
	    swqe(q, q->sq_tx)->err != IBV_WC_SUCCESS) {
		sim_sq_fail(q, swqe(q, q->sq_tx)->err);
		return;
	}
	if (q->qp.state == IBV_QPS_SQD && q->sq_head == q->sq_tx &&
	    q->attr.en_sqd_async_notify && !q->sqd_notified) {
		q->sqd_notified = true;
		sim_async(q->ctx, IBV_EVENT_SQ_DRAINED, &q->qp, 0);
	}
}

/* --- application side ----------------------------------------------------- */

int sim_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
		  struct ibv_send_wr **bad)
{
	struct sim_qp *q = (struct sim_qp *)qp;
	int rc = 0;

	if (qp->qp_type == IBV_QPT_UD)
		return sim_ud_post_send(q, wr, bad);
	for (; wr; wr = wr->next) {
		enum ibv_qp_state st = qp->state;
		struct sim_swqe *e;
		uint64_t len = 0;

		if (st == IBV_QPS_RESET || st == IBV_QPS_INIT ||
		    st == IBV_QPS_RTR ||
		    (st == IBV_QPS_ERR && q->dev->w->opts.refuse_posts_in_err)) {
			rc = EINVAL;
			break;
		}
		if (q->sq_tail - q->sq_head >= q->sq_cap) {
			rc = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || (unsigned)wr->num_sge > q->cap.max_send_sge) {
			rc = EINVAL;
			break;
		}
		switch (wr->opcode) {
		case IBV_WR_SEND: case IBV_WR_SEND_WITH_IMM:
		case IBV_WR_RDMA_WRITE: case IBV_WR_RDMA_WRITE_WITH_IMM:
		case IBV_WR_RDMA_READ: case IBV_WR_ATOMIC_CMP_AND_SWP:
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			break;
		default:
			rc = EINVAL;
		}
		if (rc)
			break;
		for (int i = 0; i < wr->num_sge; i++)
			len += wr->sg_list[i].length;
		if (len > (1ull << 31) ||
		    (is_rd_atomic(wr->opcode) && wr->opcode != IBV_WR_RDMA_READ &&
		     (wr->num_sge != 1 || len != 8)) ||
		    ((wr->send_flags & IBV_SEND_INLINE) &&
		     (!has_payload(wr->opcode) || len > q->cap.max_inline_data))) {
			rc = EINVAL;
			break;
		}
		e = swqe(q, q->sq_tail);
		memset(e, 0, sizeof(*e));
		e->wr_id = wr->wr_id;
		e->opcode = wr->opcode;
		e->flags = wr->send_flags;
		e->imm = wr->imm_data;
		e->num_sge = (unsigned)wr->num_sge;
		e->len = (uint32_t)len;
		if (e->num_sge)
			memcpy(e->sge, wr->sg_list, e->num_sge * sizeof(*e->sge));
		if (is_rd_atomic(wr->opcode) && wr->opcode != IBV_WR_RDMA_READ) {
			e->raddr = wr->wr.atomic.remote_addr;
			e->rkey = wr->wr.atomic.rkey;
			e->cmp = wr->wr.atomic.compare_add;
			e->swp = wr->wr.atomic.swap;
		} else {
			e->raddr = wr->wr.rdma.remote_addr;
			e->rkey = wr->wr.rdma.rkey;
		}
		if ((wr->send_flags & IBV_SEND_INLINE) && len) {
			/* the application may reuse the buffer at once */
			uint8_t *p = q->inl_arena + (size_t)(q->sq_tail % q->sq_cap) *
				     q->cap.max_inline_data;

			e->inl = p;
			for (unsigned i = 0; i < e->num_sge; i++) {
				memcpy(p, (void *)(uintptr_t)e->sge[i].addr,
				       e->sge[i].length);
				p += e->sge[i].length;
			}
		}
		e->psn = q->next_psn;
		q->next_psn = (q->next_psn + 1) & SIM_PSN_MASK;
		q->sq_tail++;
		sim_img_send(q, wr);
	}
	sim_img_send_done(q);
	if (rc && bad)
		*bad = wr;
	if (qp->state == IBV_QPS_ERR)
		sim_qp_flush(q);
	return rc;
}

int sim_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
		  struct ibv_recv_wr **bad)
{
	struct sim_qp *q = (struct sim_qp *)qp;
	int rc = 0;

	for (; wr; wr = wr->next) {
		struct sim_rwqe *r;

		if (qp->state == IBV_QPS_RESET || q->srq ||
		    (qp->state == IBV_QPS_ERR && q->dev->w->opts.refuse_posts_in_err)) {
			rc = EINVAL;
			break;
		}
		if (q->rq_tail - q->rq_head >= q->rq_cap) {
			rc = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || (unsigned)wr->num_sge > q->cap.max_recv_sge) {
			rc = EINVAL;
			break;
		}
		r = &q->rq[q->rq_tail % q->rq_cap];
		r->wr_id = wr->wr_id;
		r->num_sge = (unsigned)wr->num_sge;
		if (r->num_sge)
			memcpy(r->sge, wr->sg_list, r->num_sge * sizeof(*r->sge));
		q->rq_tail++;
		sim_img_recv(q, wr);
	}
	if (rc && bad)
		*bad = wr;
	if (qp->state == IBV_QPS_ERR)
		sim_qp_flush(q);
	return rc;
}

int sim_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
	struct sim_cq *cq = (struct sim_cq *)ibcq;
	int k = 0;

	if (n < 0)
		return -1;
	while (k < n && cq->count) {
		wc[k++] = cq->ring[cq->head];
		cq->head = (cq->head + 1) % cq->cap;
		cq->count--;
	}
	return k;
}

int sim_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct sim_cq *cq = (struct sim_cq *)ibcq;

	/* "any" wins over "solicited" until the next event */
	if (!solicited_only)
		cq->armed = 1;
	else if (cq->armed != 1)
		cq->armed = 2;
	return 0;
}

/* --- wire FIFO ------------------------------------------------------------ */

static void sim_out_push(struct sim_qp *q, const struct sim_pkt *p)
{
	if (q->out_count == q->out_cap) {
		unsigned cap = q->out_cap ? 2 * q->out_cap : 16;
		struct sim_pkt *n = malloc(cap * sizeof(*n));

		if (!n)
			abort();
		for (unsigned i = 0; i < q->out_count; i++)
			n[i] = q->out[(q->out_head + i) % q->out_cap];
		free(q->out);
		q->out = n;
		q->out_head = 0;
		q->out_cap = cap;
	}
	q->out[(q->out_head + q->out_count) % q->out_cap] = *p;
	q->out_count++;
	if (p->kind == SIM_PKT_REQ)
		q->out_nreq++;
	else
		q->out_nresp++;
}

void sim_qp_clear_wire(struct sim_qp *q)
{
	for (unsigned i = 0; i < q->out_count; i++)
		free(q->out[(q->out_head + i) % q->out_cap].payload);
	q->out_count = q->out_head = 0;
	q->out_nreq = q->out_nresp = 0;
}

/* Responder -> requester packet on dq's FIFO. */
static void sim_respond(struct sim_qp *dq, uint8_t kind, uint32_t psn,
			uint8_t *payload, uint32_t len, uint64_t val,
			uint32_t status)
{
	struct sim_pkt p = {
		.kind = kind, .psn = psn, .src_qpn = dq->qp.qp_num,
		.dst_qpn = dq->attr.dest_qp_num, .dst_dev = dq->peer_dev,
		.len = len, .payload = payload, .cmp = val, .imm = status,
	};

	sim_out_push(dq, &p);
}

/* --- requester ------------------------------------------------------------ */

bool sim_qp_can_tx(struct sim_qp *q)
{
	struct sim_swqe *e;

	if (q->sq_tx == q->sq_tail || q->rnr_wait)
		return false;
	if (q->qp.state != IBV_QPS_RTS) {
		/* SQD: retransmit what was started, start nothing new */
		if (q->qp.state != IBV_QPS_SQD ||
		    q->sq_tx - q->sq_head >= q->sq_hi - q->sq_head)
			return false;
	}
	if (q->sq_tx - q->sq_head >= SIM_WINDOW)
		return false;
	e = swqe(q, q->sq_tx);
	if (e->err != IBV_WC_SUCCESS)
		return false;	/* waits for the head, see sim_sq_complete */
	if (is_rd_atomic(e->opcode) &&
	    q->rd_out >= (q->attr.max_rd_atomic ? q->attr.max_rd_atomic : 1u))
		return false;
	return true;
}

void sim_qp_tx(struct sim_qp *q)
{
	struct sim_swqe *e = swqe(q, q->sq_tx);
	struct sim_pkt p = {
		.kind = SIM_PKT_REQ, .op = (uint8_t)e->opcode, .psn = e->psn,
		.src_qpn = q->qp.qp_num, .dst_qpn = q->attr.dest_qp_num,
		.dst_dev = q->peer_dev, .len = e->len, .raddr = e->raddr,
		.rkey = e->rkey, .imm = e->imm, .cmp = e->cmp, .swp = e->swp,
		.solicited = (e->flags & IBV_SEND_SOLICITED) != 0,
	};
	unsigned need = has_payload(e->opcode) ? 0 : IBV_ACCESS_LOCAL_WRITE;

	if (!e->inl) {
		for (unsigned i = 0; i < e->num_sge; i++) {
			if (e->sge[i].length && !sim_local(q, &e->sge[i], need)) {
				e->err = IBV_WC_LOC_PROT_ERR;
				sim_trace(qw(q), TAG("LERR"), q->qp.qp_num, e->psn);
				if (q->sq_tx == q->sq_head)
					sim_sq_complete(q);
				return;
			}
		}
	}
	if (has_payload(e->opcode) && e->len) {
		uint8_t *d = malloc(e->len);

		if (!d)
			abort();
		if (e->inl) {
			memcpy(d, e->inl, e->len);
		} else {
			uint8_t *o = d;

			for (unsigned i = 0; i < e->num_sge; i++) {
				memcpy(o, (void *)(uintptr_t)e->sge[i].addr,
				       e->sge[i].length);
				o += e->sge[i].length;
			}
		}
		p.payload = d;
	}
	sim_out_push(q, &p);
	sim_trace(qw(q), TAG("TX  "), (uint64_t)q->dev->gidx << 32 | q->qp.qp_num,
		  e->psn);
	qw(q)->stats.tx++;
	if (is_rd_atomic(e->opcode))
		q->rd_out++;
	q->sq_tx++;
	if (q->sq_tx - q->sq_head > q->sq_hi - q->sq_head)
		q->sq_hi = q->sq_tx;
	q->deadline = qw(q)->now + sim_qp_timeout_ticks(&q->qp);
}

/* Rolls the transmit pointer back to WQE index i (go-back-N). */
static void sim_rewind(struct sim_qp *q, uint32_t i)
{
	if (q->sq_tx - q->sq_head > i - q->sq_head) {
		qw(q)->stats.retx += q->sq_tx - i;
		q->sq_tx = i;
		sim_rd_recount(q);
	}
}

/* Marks [head, upto) acknowledged. A read or atomic without its response
 * stops it: its response was lost, so transmission rewinds to it. Returns
 * false in that case. */
static bool sim_ack_upto(struct sim_qp *q, uint32_t upto)
{
	bool progress = false;

	for (uint32_t i = q->sq_head; i != upto; i++) {
		struct sim_swqe *e = swqe(q, i);

		if (e->acked)
			continue;
		if (is_rd_atomic(e->opcode)) {
			sim_rewind(q, i);
			return false;
		}
		e->acked = true;
		progress = true;
	}
	if (progress) {
		q->retry_left = q->attr.retry_cnt;
		q->deadline = qw(q)->now + sim_qp_timeout_ticks(&q->qp);
	}
	return true;
}

static void sim_requester_rx(struct sim_qp *q, struct sim_pkt *p)
{
	uint32_t idx, sent;
	int32_t off;
	struct sim_swqe *e;

	if (q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_SQD)
		return;
	if (q->sq_head == q->sq_tail)
		return;
	off = sim_psn_diff(p->psn, swqe(q, q->sq_head)->psn);
	/* WQEs in [head, tail) carry consecutive PSNs; only those already
	 * transmitted once can be answered. */
	sent = q->sq_tail - q->sq_head;
	if (off < 0 || (uint32_t)off >= sent)
		return;
	idx = q->sq_head + (uint32_t)off;
	if (idx - q->sq_head >= q->sq_tx - q->sq_head &&
	    p->kind != SIM_PKT_ACK)
		return;
	e = swqe(q, idx);
	if (q->comp_in_read && idx - q->sq_head < q->sq_tx - q->sq_head) {
		if (p->kind == SIM_PKT_READ_RESP && e->opcode == IBV_WR_RDMA_READ) {
			q->comp_in_read = false; /* a response: back in sequence */
		} else {
			/* rxe: out of sequence for a completer inside a read
			 * response; the head WQE completes with its unset
			 * status (success), the QP goes to ERR, no error CQE */
			struct sim_swqe *h = swqe(q, q->sq_head);

			sim_trace(qw(q), TAG("STAL"), q->qp.qp_num, p->psn);
			if (h->flags & IBV_SEND_SIGNALED || q->sq_sig_all)
				sim_send_wc(q, h, IBV_WC_SUCCESS);
			q->sq_head++;
			q->qp.state = IBV_QPS_ERR;
			q->attr.qp_state = IBV_QPS_ERR;
			sim_qp_flush(q);
			return;
		}
	}
	switch (p->kind) {
	case SIM_PKT_ACK:
		if (idx - q->sq_head >= q->sq_tx - q->sq_head)
			return;	/* acks something rewound: ignore */
		sim_ack_upto(q, idx + 1);
		break;
	case SIM_PKT_READ_RESP:
	case SIM_PKT_ATOMIC_RESP:
		if (!sim_ack_upto(q, idx))
			return;
		if (!e->acked) {
			uint8_t v[8];
			const uint8_t *src = p->payload;

			if (p->kind == SIM_PKT_ATOMIC_RESP) {
				memcpy(v, &p->cmp, 8);
				src = v;
			}
			if (!sim_scatter(q, e->sge, e->num_sge, src,
					 p->kind == SIM_PKT_ATOMIC_RESP ? 8 : p->len)) {
				sim_sq_complete(q);	/* head is now idx */
				if (q->qp.state != IBV_QPS_ERR)
					sim_sq_fail(q, IBV_WC_LOC_PROT_ERR);
				return;
			}
			e->acked = true;
			q->retry_left = q->attr.retry_cnt;
			q->deadline = qw(q)->now + sim_qp_timeout_ticks(&q->qp);
		}
		break;
	case SIM_PKT_NAK_SEQ:
		if (!sim_ack_upto(q, idx))
			return;
		if (!q->rnr_wait)
			sim_rewind(q, idx);
		break;
	case SIM_PKT_NAK_RNR:
		if (!sim_ack_upto(q, idx))
			return;
		sim_sq_complete(q);
		if (q->qp.state == IBV_QPS_ERR || q->sq_head != idx)
			return;
		if (q->attr.rnr_retry != 7) {
			if (!q->rnr_left) {
				sim_sq_fail(q, IBV_WC_RNR_RETRY_EXC_ERR);
				return;
			}
			q->rnr_left--;
		}
		sim_rewind(q, idx);
		q->rnr_wait = true;
		q->rnr_deadline = qw(q)->now + (uint64_t)qw(q)->opts.rnr_ticks *
					       (1 + (p->imm & 31));
		return;
	case SIM_PKT_NAK_ACCESS:
	case SIM_PKT_NAK_INV:
		if (!sim_ack_upto(q, idx))
			return;
		sim_sq_complete(q);
		if (q->qp.state != IBV_QPS_ERR && q->sq_head == idx)
			sim_sq_fail(q, (enum ibv_wc_status)p->imm);
		return;
	}
	sim_sq_complete(q);
}

int sim_qp_timer_armed(struct sim_qp *q, uint64_t *deadline)
{
	struct sim_dev *pd;
	struct sim_qp *peer = NULL;

	if (q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_SQD)
		return 0;
	if (q->rnr_wait) {
		*deadline = q->rnr_deadline;
		return 2;
	}
	if (q->sq_head == q->sq_tx || q->out_nreq)
		return 0;
	/* The timer only matters once nothing of this flow is in flight:
	 * no request queued here and no response queued at the peer. */
	pd = q->peer_dev >= 0 ? qw(q)->devs[q->peer_dev] : NULL;
	if (pd && q->attr.dest_qp_num >= SIM_QPN_BASE &&
	    q->attr.dest_qp_num - SIM_QPN_BASE < pd->nqps)
		peer = pd->qps[q->attr.dest_qp_num - SIM_QPN_BASE];
	if (peer && peer->out_nresp)
		return 0;
	*deadline = q->deadline;
	return 1;
}

void sim_qp_timeout(struct sim_qp *q)
{
	qw(q)->stats.timeouts++;
	sim_trace(qw(q), TAG("TOUT"), q->qp.qp_num, q->retry_left);
	if (!q->retry_left) {
		sim_sq_fail(q, IBV_WC_RETRY_EXC_ERR);
		return;
	}
	q->retry_left--;
	sim_rewind(q, q->sq_head);
	q->deadline = qw(q)->now + sim_qp_timeout_ticks(&q->qp);
}

void sim_qp_rnr_fire(struct sim_qp *q)
{
	sim_trace(qw(q), TAG("RNRT"), q->qp.qp_num, q->rnr_left);
	q->rnr_wait = false;
	q->deadline = qw(q)->now + sim_qp_timeout_ticks(&q->qp);
}

/* --- responder ------------------------------------------------------------ */

static void sim_resp_fail(struct sim_qp *dq, struct sim_pkt *p, uint8_t kind,
			  enum ibv_wc_status req_st)
{
	sim_trace(qw(dq), TAG("RERR"), dq->qp.qp_num, req_st);
	sim_respond(dq, kind, p->psn, NULL, 0, 0, req_st);
	dq->qp.state = IBV_QPS_ERR;
	dq->attr.qp_state = IBV_QPS_ERR;
	if (kind == SIM_PKT_NAK_ACCESS)
		sim_async(dq->ctx, IBV_EVENT_QP_ACCESS_ERR, &dq->qp, 0);
	else
		sim_async(dq->ctx, IBV_EVENT_QP_REQ_ERR, &dq->qp, 0);
	sim_qp_flush(dq);
}

/* Executes the request at the expected PSN. Returns false if it was not
 * executed (RNR or error), true if epsn may advance. */
static bool sim_execute(struct sim_qp *dq, struct sim_pkt *p)
{
	enum ibv_wr_opcode op = p->op;
	bool need_rwqe = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM ||
			 op == IBV_WR_RDMA_WRITE_WITH_IMM;
	uint8_t *dst = NULL;

	if (need_rwqe && !sim_rq_peek(dq)) {
		qw(dq)->stats.rnr_naks++;
		sim_trace(qw(dq), TAG("RNR "), dq->qp.qp_num, p->psn);
		sim_respond(dq, SIM_PKT_NAK_RNR, p->psn, NULL, 0, 0,
			    dq->attr.min_rnr_timer);
		dq->nak_sent = true;
		return false;
	}
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		if (p->len) {
			dst = sim_remote(dq, p->rkey, p->raddr, p->len,
					 IBV_ACCESS_REMOTE_WRITE);
			if (!dst) {
				sim_resp_fail(dq, p, SIM_PKT_NAK_ACCESS,
					      IBV_WC_REM_ACCESS_ERR);
				return false;
			}
			memcpy(dst, p->payload, p->len);
		}
		break;
	case IBV_WR_RDMA_READ: {
		uint8_t *data = NULL;

		if (p->len) {
			const uint8_t *src = sim_remote(dq, p->rkey, p->raddr, p->len,
							IBV_ACCESS_REMOTE_READ);
			if (!src) {
				sim_resp_fail(dq, p, SIM_PKT_NAK_ACCESS,
					      IBV_WC_REM_ACCESS_ERR);
				return false;
			}
			data = malloc(p->len);
			if (!data)
				abort();
			memcpy(data, src, p->len);
		}
		sim_respond(dq, SIM_PKT_READ_RESP, p->psn, data, p->len, 0, 0);
		return true;
	}
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD: {
		uint64_t orig;
		unsigned slot = p->psn % SIM_ATOMIC_CACHE;

		if (p->raddr & 7) {
			sim_resp_fail(dq, p, SIM_PKT_NAK_INV, IBV_WC_REM_INV_REQ_ERR);
			return false;
		}
		dst = sim_remote(dq, p->rkey, p->raddr, 8, IBV_ACCESS_REMOTE_ATOMIC);
		if (!dst) {
			sim_resp_fail(dq, p, SIM_PKT_NAK_ACCESS, IBV_WC_REM_ACCESS_ERR);
			return false;
		}
		memcpy(&orig, dst, 8);
		if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
			uint64_t v = orig + p->cmp;

			memcpy(dst, &v, 8);
		} else if (orig == p->cmp) {
			memcpy(dst, &p->swp, 8);
		}
		dq->acache[slot].psn = p->psn;
		dq->acache[slot].orig = orig;
		dq->acache[slot].valid = true;
		sim_respond(dq, SIM_PKT_ATOMIC_RESP, p->psn, NULL, 0, orig, 0);
		return true;
	}
	default:
		break;
	}
	if (need_rwqe) {
		struct sim_rwqe *r = sim_rq_peek(dq);
		uint64_t room = 0;
		struct ibv_wc wc;

		memset(&wc, 0, sizeof(wc));
		if (op != IBV_WR_RDMA_WRITE_WITH_IMM) {
			for (unsigned i = 0; i < r->num_sge; i++)
				room += r->sge[i].length;
			if (room < p->len) {
				sim_rq_take(dq);
				sim_recv_flush_wc(dq, r, IBV_WC_LOC_LEN_ERR);
				sim_resp_fail(dq, p, SIM_PKT_NAK_INV,
					      IBV_WC_REM_INV_REQ_ERR);
				return false;
			}
			if (!sim_scatter(dq, r->sge, r->num_sge, p->payload,
					 p->len)) {
				sim_rq_take(dq);
				sim_recv_flush_wc(dq, r, IBV_WC_LOC_PROT_ERR);
				sim_resp_fail(dq, p, SIM_PKT_NAK_INV,
					      IBV_WC_REM_OP_ERR);
				return false;
			}
		}
		wc.wr_id = r->wr_id;
		sim_rq_take(dq);
		wc.status = IBV_WC_SUCCESS;
		wc.opcode = op == IBV_WR_RDMA_WRITE_WITH_IMM ?
			    IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
		wc.byte_len = p->len;
		wc.qp_num = dq->qp.qp_num;
		wc.src_qp = p->src_qpn;
		if (op != IBV_WR_SEND) {
			wc.wc_flags = IBV_WC_WITH_IMM;
			wc.imm_data = p->imm;
		}
		sim_cq_push((struct sim_cq *)dq->qp.recv_cq, &wc, p->solicited);
	}
	sim_respond(dq, SIM_PKT_ACK, p->psn, NULL, 0, 0, 0);
	return true;
}

static void sim_responder_rx(struct sim_qp *dq, struct sim_pkt *p)
{
	struct sim_world *w = qw(dq);
	int32_t d;

	if (dq->qp.state != IBV_QPS_RTR && dq->qp.state != IBV_QPS_RTS &&
	    dq->qp.state != IBV_QPS_SQD)
		return;
	d = sim_psn_diff(p->psn, dq->epsn);
	if (d > 0) {
		if (!dq->nak_sent) {
			w->stats.seq_naks++;
			dq->nak_sent = true;
			sim_respond(dq, SIM_PKT_NAK_SEQ, dq->epsn, NULL, 0, 0, 0);
		}
		return;
	}
	if (d < 0 && w->opts.reexecute_duplicates) {
		sim_trace(w, TAG("REEX"), dq->qp.qp_num, p->psn);
		sim_execute(dq, p);
		return;
	}
	if (d < 0) {
		/* duplicate: answer without executing again */
		w->stats.dup_requests++;
		sim_trace(w, TAG("DUP "), dq->qp.qp_num, p->psn);
		if (p->op == IBV_WR_RDMA_READ) {
			uint8_t *data = NULL;
			const uint8_t *src = p->len ?
				sim_remote(dq, p->rkey, p->raddr, p->len,
					   IBV_ACCESS_REMOTE_READ) : NULL;

			if (p->len && !src)
				return;
			if (p->len) {
				data = malloc(p->len);
				if (!data)
					abort();
				memcpy(data, src, p->len);
			}
			sim_respond(dq, SIM_PKT_READ_RESP, p->psn, data, p->len,
				    0, 0);
		} else if (p->op == IBV_WR_ATOMIC_CMP_AND_SWP ||
			   p->op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
			unsigned slot = p->psn % SIM_ATOMIC_CACHE;

			if (dq->acache[slot].valid && dq->acache[slot].psn == p->psn)
				sim_respond(dq, SIM_PKT_ATOMIC_RESP, p->psn, NULL, 0,
					    dq->acache[slot].orig, 0);
		} else {
			sim_respond(dq, SIM_PKT_ACK, p->psn, NULL, 0, 0, 0);
		}
		return;
	}
	if (!sim_execute(dq, p))
		return;
	w->stats.executed++;
	sim_trace(w, TAG("EXEC"), (uint64_t)dq->dev->gidx << 32 | dq->qp.qp_num,
		  p->psn);
	dq->epsn = (dq->epsn + 1) & SIM_PSN_MASK;
	dq->nak_sent = false;
	if (dq->dev->die_after_exec > 0 && --dq->dev->die_after_exec == 0)
		sim_dev_kill(dq->dev, 0);
}

/* --- delivery ------------------------------------------------------------- */

void sim_qp_deliver(struct sim_qp *q)
{
	struct sim_world *w = qw(q);
	struct sim_pkt p = q->out[q->out_head];
	struct sim_dev *dd = p.dst_dev >= 0 ? w->devs[p.dst_dev] : NULL;
	struct sim_qp *dq = NULL;
	bool req = p.kind == SIM_PKT_REQ;
	bool drop = false;

	q->out_head = (q->out_head + 1) % q->out_cap;
	q->out_count--;
	if (req)
		q->out_nreq--;
	else
		q->out_nresp--;

	if (!sim_path_ok(w, q->dev, dd)) {
		drop = true;
	} else if (req && q->drop_req) {
		q->drop_req--;
		drop = true;
	} else if (!req && q->drop_resp) {
		q->drop_resp--;
		drop = true;
	} else {
		uint32_t ppm = req ? w->opts.drop_req_ppm : w->opts.drop_resp_ppm;

		if (ppm && sim_rand(w) % 1000000 < ppm)
			drop = true;
	}
	if (!drop && p.dst_qpn >= SIM_QPN_BASE &&
	    p.dst_qpn - SIM_QPN_BASE < dd->nqps)
		dq = dd->qps[p.dst_qpn - SIM_QPN_BASE];
	/* RC: a QP only hears its connected peer */
	if (dq && (dq->attr.dest_qp_num != p.src_qpn ||
		   dq->peer_dev != (int)q->dev->gidx))
		dq = NULL;
	if (drop || !dq) {
		w->stats.dropped++;
		sim_trace(w, TAG("DROP"), (uint64_t)q->dev->gidx << 32 | q->qp.qp_num,
			  (uint64_t)p.kind << 32 | p.psn);
	} else {
		w->stats.delivered++;
		if (req)
			sim_responder_rx(dq, &p);
		else
			sim_requester_rx(dq, &p);
	}
	free(p.payload);
}
