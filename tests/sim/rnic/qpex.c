/*
 * The ibv_qp_ex work-request builders of the simulated RNIC (ibv_wr_start,
 * ibv_wr_send, ibv_wr_rdma_write, ..., ibv_wr_set_sge, ibv_wr_set_inline_data,
 * ibv_wr_complete, ibv_wr_abort) for QPs created with
 * IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, and ibv_qp_to_qp_ex, which the simulated
 * RNIC provides in place of libibverbs' own (tests never link the real one).
 *
 * The builders collect the batch as struct ibv_send_wr in the QP's build
 * area (inline bytes copied at once: the caller may reuse its buffer as soon
 * as the setter returns); ibv_wr_complete posts the whole batch with
 * sim_post_send. As with rdma-core's providers, a bad argument (too many
 * SGEs, too much inline data, more WRs than the queue holds) makes
 * ibv_wr_complete fail and post nothing; the builder of an operation the QP
 * was not created for is NULL. SEND_WITH_INV is accepted at creation but
 * fails at complete (no memory windows here).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sim_int.h"

struct sim_wr_build {
	struct ibv_send_wr *wr;		/* sq_cap entries */
	struct ibv_sge *sge;		/* max_send_sge per entry */
	uint8_t *inl;			/* max_inline_data per entry */
	unsigned n;			/* WRs built since wr_start */
	int err;			/* the first bad argument */
	bool open;			/* between wr_start and complete/abort */
};

#define SIM_QPX_OPS (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | \
		     IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |           \
		     IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |  \
		     IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV)

static struct sim_qp *to_qp(struct ibv_qp_ex *x)
{
	return (struct sim_qp *)x;
}

struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	struct sim_qp *q = (struct sim_qp *)qp;

	return q->ex ? &q->qpx : NULL;
}

/* A new WR of the batch with the QP's wr_id and wr_flags, or NULL (the
 * batch is full: complete fails). */
static struct ibv_send_wr *new_wr(struct ibv_qp_ex *x, enum ibv_wr_opcode op)
{
	struct sim_qp *q = to_qp(x);
	struct sim_wr_build *b = q->build;
	struct ibv_send_wr *wr;

	if (!b->open || b->err)
		return NULL;
	if (b->n == q->sq_cap) {
		b->err = ENOMEM;
		return NULL;
	}
	wr = &b->wr[b->n];
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = x->wr_id;
	wr->send_flags = x->wr_flags & ~(unsigned)IBV_SEND_INLINE;
	wr->opcode = op;
	wr->sg_list = &b->sge[(size_t)b->n * q->cap.max_send_sge];
	b->n++;
	return wr;
}

/* The WR the setters apply to: the last one built. */
static struct ibv_send_wr *last_wr(struct ibv_qp_ex *x)
{
	struct sim_wr_build *b = to_qp(x)->build;

	if (!b->open || b->err)
		return NULL;
	if (!b->n) {
		b->err = EINVAL;
		return NULL;
	}
	return &b->wr[b->n - 1];
}

static void qx_rdma(struct ibv_qp_ex *x, enum ibv_wr_opcode op, uint32_t rkey,
		    uint64_t raddr, __be32 imm)
{
	struct ibv_send_wr *wr = new_wr(x, op);

	if (!wr)
		return;
	wr->wr.rdma.rkey = rkey;
	wr->wr.rdma.remote_addr = raddr;
	wr->imm_data = imm;
}

static void qx_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr)
{
	qx_rdma(x, IBV_WR_RDMA_WRITE, rkey, raddr, 0);
}

static void qx_write_imm(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr, __be32 imm)
{
	qx_rdma(x, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, raddr, imm);
}

static void qx_read(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr)
{
	qx_rdma(x, IBV_WR_RDMA_READ, rkey, raddr, 0);
}

static void qx_send(struct ibv_qp_ex *x)
{
	new_wr(x, IBV_WR_SEND);
}

static void qx_send_imm(struct ibv_qp_ex *x, __be32 imm)
{
	struct ibv_send_wr *wr = new_wr(x, IBV_WR_SEND_WITH_IMM);

	if (wr)
		wr->imm_data = imm;
}

static void qx_atomic(struct ibv_qp_ex *x, enum ibv_wr_opcode op, uint32_t rkey,
		      uint64_t raddr, uint64_t cmp_add, uint64_t swap)
{
	struct ibv_send_wr *wr = new_wr(x, op);

	if (!wr)
		return;
	wr->wr.atomic.rkey = rkey;
	wr->wr.atomic.remote_addr = raddr;
	wr->wr.atomic.compare_add = cmp_add;
	wr->wr.atomic.swap = swap;
}

static void qx_cas(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr, uint64_t cmp,
		   uint64_t swap)
{
	qx_atomic(x, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, raddr, cmp, swap);
}

static void qx_fadd(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr, uint64_t add)
{
	qx_atomic(x, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, raddr, add, 0);
}

/* Accepted at creation (a layer above may decide on it), never executed:
 * the simulated RNIC has no memory windows to invalidate. */
static void qx_send_inv(struct ibv_qp_ex *x, uint32_t rkey)
{
	(void)rkey;
	if (new_wr(x, IBV_WR_SEND))
		to_qp(x)->build->err = EOPNOTSUPP;
}

static void qx_set_sge_list(struct ibv_qp_ex *x, size_t n, const struct ibv_sge *sg)
{
	struct sim_qp *q = to_qp(x);
	struct ibv_send_wr *wr = last_wr(x);

	if (!wr)
		return;
	if (n > q->cap.max_send_sge) {
		q->build->err = EINVAL;
		return;
	}
	memcpy(wr->sg_list, sg, n * sizeof(*sg));
	wr->num_sge = (int)n;
	wr->send_flags &= ~(unsigned)IBV_SEND_INLINE;
}

static void qx_set_sge(struct ibv_qp_ex *x, uint32_t lkey, uint64_t addr, uint32_t len)
{
	struct ibv_sge sge = { .addr = addr, .length = len, .lkey = lkey };

	qx_set_sge_list(x, 1, &sge);
}

static void qx_set_inline_list(struct ibv_qp_ex *x, size_t n, const struct ibv_data_buf *bufs)
{
	struct sim_qp *q = to_qp(x);
	struct ibv_send_wr *wr = last_wr(x);
	size_t len = 0;
	uint8_t *dst;

	if (!wr)
		return;
	dst = q->build->inl + (size_t)(wr - q->build->wr) * q->cap.max_inline_data;
	for (size_t i = 0; i < n; i++) {
		if (len + bufs[i].length > q->cap.max_inline_data) {
			q->build->err = EINVAL;
			return;
		}
		memcpy(dst + len, bufs[i].addr, bufs[i].length);
		len += bufs[i].length;
	}
	wr->sg_list[0].addr = (uintptr_t)dst;
	wr->sg_list[0].length = (uint32_t)len;
	wr->sg_list[0].lkey = 0;
	wr->num_sge = 1;
	wr->send_flags |= IBV_SEND_INLINE;
}

static void qx_set_inline(struct ibv_qp_ex *x, void *addr, size_t len)
{
	struct ibv_data_buf buf = { .addr = addr, .length = len };

	qx_set_inline_list(x, 1, &buf);
}

static void qx_start(struct ibv_qp_ex *x)
{
	struct sim_wr_build *b = to_qp(x)->build;

	b->n = 0;
	b->err = 0;
	b->open = true;
}

static int qx_complete(struct ibv_qp_ex *x)
{
	struct sim_wr_build *b = to_qp(x)->build;
	struct ibv_send_wr *bad = NULL;
	int rc;

	if (!b->open)
		return EINVAL;
	b->open = false;
	if (b->err)
		return b->err;
	if (!b->n)
		return 0;
	for (unsigned i = 0; i + 1 < b->n; i++)
		b->wr[i].next = &b->wr[i + 1];
	b->wr[b->n - 1].next = NULL;
	rc = sim_post_send(&x->qp_base, b->wr, &bad);
	b->n = 0;
	return rc;
}

static void qx_abort(struct ibv_qp_ex *x)
{
	struct sim_wr_build *b = to_qp(x)->build;

	b->n = 0;
	b->open = false;
}

int sim_qp_ex_init(struct sim_qp *q, uint64_t ops)
{
	struct ibv_qp_ex *x = &q->qpx;
	struct sim_wr_build *b;

	if (ops & ~(uint64_t)SIM_QPX_OPS)
		return EOPNOTSUPP;
	b = calloc(1, sizeof(*b));
	if (!b)
		return ENOMEM;
	b->wr = calloc(q->sq_cap, sizeof(*b->wr));
	b->sge = calloc((size_t)q->sq_cap * q->cap.max_send_sge, sizeof(*b->sge));
	b->inl = malloc((size_t)q->sq_cap * (q->cap.max_inline_data ? q->cap.max_inline_data : 1));
	if (!b->wr || !b->sge || !b->inl) {
		free(b->wr);
		free(b->sge);
		free(b->inl);
		free(b);
		return ENOMEM;
	}
	q->build = b;
	q->ex = true;
	x->wr_rdma_write = ops & IBV_QP_EX_WITH_RDMA_WRITE ? qx_write : NULL;
	x->wr_rdma_write_imm = ops & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM ? qx_write_imm : NULL;
	x->wr_send = ops & IBV_QP_EX_WITH_SEND ? qx_send : NULL;
	x->wr_send_imm = ops & IBV_QP_EX_WITH_SEND_WITH_IMM ? qx_send_imm : NULL;
	x->wr_rdma_read = ops & IBV_QP_EX_WITH_RDMA_READ ? qx_read : NULL;
	x->wr_atomic_cmp_swp = ops & IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP ? qx_cas : NULL;
	x->wr_atomic_fetch_add = ops & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD ? qx_fadd : NULL;
	x->wr_send_inv = ops & IBV_QP_EX_WITH_SEND_WITH_INV ? qx_send_inv : NULL;
	x->wr_set_sge = qx_set_sge;
	x->wr_set_sge_list = qx_set_sge_list;
	x->wr_set_inline_data = qx_set_inline;
	x->wr_set_inline_data_list = qx_set_inline_list;
	x->wr_start = qx_start;
	x->wr_complete = qx_complete;
	x->wr_abort = qx_abort;
	return 0;
}

void sim_qp_ex_free(struct sim_qp *q)
{
	if (!q->build)
		return;
	free(q->build->wr);
	free(q->build->sge);
	free(q->build->inl);
	free(q->build);
	q->build = NULL;
}
