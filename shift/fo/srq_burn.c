/*
 * Taking WQEs out of an application's SRQ (fo/srq.c): a loopback pair of
 * SHIFT's on the default NIC, one RC QP on the SRQ ("rx"), one connected
 * to it on the same port ("tx"). Each empty SEND from tx consumes the
 * SRQ's next WQE without writing its buffer; the completion on rx, SHIFT's
 * own, names the receive (shift_dsrq_burned()). So SHIFT can empty the
 * default SRQ of the WQEs whose buffers the backup path filled (before any
 * QP reads it again: failback), and take one receive out of it for a
 * message that arrived on a backup QP while other QPs read the SRQ.
 *
 * The pair is made on the SRQ's PD with a CQ of its own, reached through
 * the lower table and the provider's own data path (never the
 * application's: its ops are SHIFT's); its address is the port, GID index
 * and MTU an application QP on the SRQ uses. A failure (the NIC died
 * again) breaks it: it is destroyed and made again when next needed.
 */
#include "shift/fo/srq_int.h"

#define BURN_DEPTH 64

struct burner {
	struct shift_ctx *s;
	struct ibv_cq *cq;
	struct ibv_qp *rx, *tx;
	unsigned inflight;      /* SENDs posted, not completed */
	bool broken;
};

void shift_failover_srq_gone(struct shift_ctx *s, struct shift_dsrq *q)
{
	pthread_mutex_lock(&s->slow_lock);
	fo_srq_burner_destroy(q);
	pthread_mutex_unlock(&s->slow_lock);
}

void fo_srq_burner_destroy(struct shift_dsrq *q)
{
	struct burner *b = q->fo_burner;

	if (!b)
		return;
	if (b->tx)
		shift_lower->destroy_qp(b->tx);
	if (b->rx)
		shift_lower->destroy_qp(b->rx);
	if (b->cq)
		shift_lower->destroy_cq(b->cq);
	free(b);
	q->fo_burner = NULL;
}

/* Connect the pair on its port, as d's application connected d. */
static int burner_connect(struct burner *b, struct shift_ctx *s, struct shift_dqp *d)
{
	struct ibv_qp_attr app;
	struct ibv_ah_attr ah;
	struct ibv_port_attr pa;
	int mask;

	pthread_mutex_lock(&s->rnic->lock);
	app = d->shadow->attr;
	mask = d->shadow->attr_mask;
	pthread_mutex_unlock(&s->rnic->lock);
	uint8_t port = app.port_num ? app.port_num : 1;

	memset(&pa, 0, sizeof(pa));
	ah = app.ah_attr;
	ah.port_num = port;
	if (shift_lower->query_port(s->ibctx, port, &pa) ||
	    shift_lower->query_gid(s->ibctx, port, ah.grh.sgid_index, &ah.grh.dgid))
		return -1;
	ah.dlid = pa.lid;
	app.rnr_retry = 7; /* (a WQE the application consumes first: wait) */
	mask |= IBV_QP_RNR_RETRY;
	if (shift_qp_to_init(b->rx, &app, port) || shift_qp_to_init(b->tx, &app, port) ||
	    shift_qp_to_rtr(b->rx, &app, mask, &ah, app.path_mtu ? app.path_mtu : IBV_MTU_1024,
			    b->tx->qp_num, 0) ||
	    shift_qp_to_rtr(b->tx, &app, mask, &ah, app.path_mtu ? app.path_mtu : IBV_MTU_1024,
			    b->rx->qp_num, 0) ||
	    shift_qp_to_rts(b->tx, &app, mask, 0))
		return -1;
	return 0;
}

static struct burner *burner_of(struct shift_ctx *s, struct shift_dsrq *q, struct shift_dqp *d)
{
	struct burner *b = q->fo_burner;

	if (b && b->broken && !b->inflight)
		fo_srq_burner_destroy(q);
	b = q->fo_burner;
	if (b)
		return b->broken ? NULL : b;
	if (!d->shadow)
		return NULL;
	b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	b->s = s;
	b->cq = shift_lower->create_cq(s->ibctx, 2 * BURN_DEPTH + 2, NULL, NULL, 0);
	struct ibv_qp_init_attr rx = { .send_cq = b->cq, .recv_cq = b->cq, .srq = q->srq,
				       .cap = { .max_send_wr = 1, .max_send_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	struct ibv_qp_init_attr tx = { .send_cq = b->cq, .recv_cq = b->cq,
				       .cap = { .max_send_wr = BURN_DEPTH, .max_recv_wr = 1,
						.max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	q->fo_burner = b;
	if (!b->cq || !(b->rx = shift_lower->create_qp(q->srq->pd, &rx)) ||
	    !(b->tx = shift_lower->create_qp(q->srq->pd, &tx)) || burner_connect(b, s, d)) {
		shift_warn("%s: cannot make SHIFT's loopback pair on the SRQ (%s): its receives "
			   "stay on the backup path for now", q->dev, strerror(errno));
		b->broken = true;
		return NULL;
	}
	return b;
}

/* Post up to n empty SENDs (d: a QP on q, for the pair's address). The
 * number posted. */
unsigned fo_srq_burn(struct shift_ctx *s, struct shift_dsrq *q, struct shift_dqp *d, unsigned n)
{
	struct burner *b = burner_of(s, q, d);
	unsigned k = 0;

	for (; b && k < n && b->inflight < BURN_DEPTH; k++) {
		struct ibv_send_wr wr = { .wr_id = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;

		if (s->post_send(b->tx, &wr, &bad)) {
			b->broken = true;
			break;
		}
		b->inflight++;
	}
	return k;
}

/* SENDs in flight on q's pair. */
unsigned fo_srq_burning(const struct shift_dsrq *q)
{
	const struct burner *b = q->fo_burner;

	return b ? b->inflight : 0;
}

/* The pair's completions: each receive is a WQE out of the SRQ. */
void fo_srq_burn_poll(struct shift_dsrq *q)
{
	struct burner *b = q->fo_burner;
	struct ibv_wc wc[16];
	int n;

	while (b && (n = b->s->poll_cq(b->cq, 16, wc)) > 0) {
		for (int i = 0; i < n; i++) {
			if (wc[i].qp_num == b->rx->qp_num) {
				/* (an error too: a WQE the QP took is out) */
				shift_dsrq_burned(q, wc[i].wr_id);
				continue;
			}
			if (b->inflight)
				b->inflight--;
			if (wc[i].status != IBV_WC_SUCCESS) {
				b->broken = true;
				shift_debug("%s: SHIFT's loopback SEND failed (%d)", q->dev,
					    (int)wc[i].status);
			}
		}
	}
	if (b && b->broken && b->inflight) {
		/* (a broken pair's SENDs all complete, flushed, before it goes) */
		struct ibv_qp_attr e = { .qp_state = IBV_QPS_ERR };

		shift_lower->modify_qp(b->tx, &e, IBV_QP_STATE);
	}
}
