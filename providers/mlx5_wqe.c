/*
 * mlx5 WQEs read back into mirror entries (mlx5_wqe.h). Written from the
 * documented format (mlx5dv.h's segment structures and opcodes); every
 * field is checked against what SHIFT recorded at the post, and a WQE that
 * does not check out is not used.
 */
#include "providers/mlx5_wqe.h"

#include <endian.h>
#include <string.h>

#define SEG 16u                 /* segments are 16-byte units */
#define MAX_DS 63u              /* the control segment's 6-bit size */

static bool pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

int shift_mlx5_nwq_init(struct shift_nwq *q, const struct mlx5dv_qp *dv, uint32_t qpn)
{
	memset(q, 0, sizeof(*q));
	if (!dv->dbrec || !dv->sq.buf || dv->sq.stride != MLX5_SEND_WQE_BB || !pow2(dv->sq.wqe_cnt) ||
	    dv->sq.wqe_cnt > 0x8000)
		return -1;
	if (dv->rq.wqe_cnt && (!dv->rq.buf || !pow2(dv->rq.wqe_cnt) || !pow2(dv->rq.stride) ||
			       dv->rq.stride < SEG || dv->rq.wqe_cnt > 0x8000))
		return -1;
	q->format = "mlx5";
	q->qpn = qpn;
	q->sq_buf = dv->sq.buf;
	q->sq_cnt = dv->sq.wqe_cnt;
	q->sq_bb = dv->sq.stride;
	q->rq_buf = dv->rq.wqe_cnt ? dv->rq.buf : NULL;
	q->rq_cnt = dv->rq.wqe_cnt;
	q->rq_stride = dv->rq.stride;
	q->sq_dbrec = (const volatile uint32_t *)&dv->dbrec[MLX5_SND_DBR];
	q->rq_dbrec = (const volatile uint32_t *)&dv->dbrec[MLX5_RCV_DBR];
	q->read_send = shift_mlx5_read_send;
	q->read_recv = shift_mlx5_read_recv;
	return 0;
}

/* len bytes at byte off of the WQE at idx, the queue's end wrapping to its
 * start */
static void sq_copy(const struct shift_nwq *q, uint32_t idx, uint32_t off, void *dst, uint32_t len)
{
	uint32_t size = q->sq_cnt * q->sq_bb;
	uint32_t at = ((idx & (q->sq_cnt - 1)) * q->sq_bb + off) & (size - 1);
	uint32_t first = size - at < len ? size - at : len;

	memcpy(dst, q->sq_buf + at, first);
	memcpy((uint8_t *)dst + first, q->sq_buf, len - first);
}

static uint32_t be32_at(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return be32toh(v);
}

static uint64_t be64_at(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return be64toh(v);
}

/* the verbs opcode of an mlx5 send opcode (-1: none SHIFT posts again) */
static int verbs_op(unsigned op)
{
	switch (op) {
	case MLX5_OPCODE_RDMA_WRITE: return IBV_WR_RDMA_WRITE;
	case MLX5_OPCODE_RDMA_WRITE_IMM: return IBV_WR_RDMA_WRITE_WITH_IMM;
	case MLX5_OPCODE_SEND: return IBV_WR_SEND;
	case MLX5_OPCODE_SEND_IMM: return IBV_WR_SEND_WITH_IMM;
	case MLX5_OPCODE_SEND_INVAL: return IBV_WR_SEND_WITH_INV;
	case MLX5_OPCODE_RDMA_READ: return IBV_WR_RDMA_READ;
	case MLX5_OPCODE_ATOMIC_CS: return IBV_WR_ATOMIC_CMP_AND_SWP;
	case MLX5_OPCODE_ATOMIC_FA: return IBV_WR_ATOMIC_FETCH_AND_ADD;
	default: return -1;
	}
}

/* The data part, segments s .. ds - 1: one inline segment, or data
 * segments. */
static int read_data(const struct shift_nwq *q, uint32_t idx, unsigned s, unsigned ds,
		     struct shift_swqe *e, uint32_t max_sge, uint32_t max_inline)
{
	uint8_t seg[SEG];

	e->num_sge = 0;
	e->inline_len = 0;
	if (s == ds)
		return 0; /* (no data: a zero-length WR) */
	sq_copy(q, idx, s * SEG, seg, SEG);
	if (be32_at(seg) & MLX5_INLINE_SEG) {
		uint32_t len = be32_at(seg) & ~MLX5_INLINE_SEG;

		if (!(e->send_flags & IBV_SEND_INLINE) || len > max_inline ||
		    4 + len > (ds - s) * SEG)
			return -1;
		sq_copy(q, idx, s * SEG + 4, &e->sge[max_sge], len);
		e->inline_len = len;
		return 0;
	}
	if (e->send_flags & IBV_SEND_INLINE)
		return -1;
	for (; s < ds; s++) {
		if (e->num_sge == max_sge)
			return -1;
		sq_copy(q, idx, s * SEG, seg, SEG);
		e->sge[e->num_sge].length = be32_at(seg);
		e->sge[e->num_sge].lkey = be32_at(seg + 4);
		e->sge[e->num_sge].addr = be64_at(seg + 8);
		e->num_sge++;
	}
	return 0;
}

static int read_send(const struct shift_nwq *q, uint32_t idx, struct shift_swqe *e,
		     uint32_t max_sge, uint32_t max_inline)
{
	uint8_t c[SEG], seg[SEG];
	uint32_t w0, w1, imm;
	unsigned ds, s = 1;
	int op;

	sq_copy(q, idx, 0, c, SEG);
	w0 = be32_at(c);
	w1 = be32_at(c + 4);
	ds = w1 & 0x3f;
	op = verbs_op(w0 & 0xff);
	/* the WQE posted at idx, of this QP, of the opcode recorded, of a
	 * size the queue holds, signaled if the WR was */
	if (((w0 >> 8) & 0xffff) != (idx & 0xffff) || (w1 >> 8) != q->qpn || !ds ||
	    ds * SEG > q->sq_cnt * q->sq_bb || op < 0 || (unsigned)op != e->opcode ||
	    ((e->send_flags & IBV_SEND_SIGNALED) && !(c[11] & MLX5_WQE_CTRL_CQ_UPDATE)))
		return -1;
	memcpy(&imm, c + 12, 4);
	/* (the immediate as posted, big-endian; the key to invalidate in
	 * host order, as struct ibv_send_wr holds it) */
	e->imm = op == IBV_WR_SEND_WITH_INV ? be32toh(imm) : imm;
	e->remote_addr = 0;
	e->rkey = 0;
	e->compare_add = e->swap = 0;
	if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_RDMA_READ ||
	    shift_wr_is_atomic((unsigned)op)) {
		if (s >= ds)
			return -1;
		sq_copy(q, idx, s++ * SEG, seg, SEG);
		e->remote_addr = be64_at(seg);
		e->rkey = be32_at(seg + 8);
	}
	if (shift_wr_is_atomic((unsigned)op)) {
		if (s >= ds)
			return -1;
		sq_copy(q, idx, s++ * SEG, seg, SEG);
		if (op == IBV_WR_ATOMIC_CMP_AND_SWP) {
			e->swap = be64_at(seg);
			e->compare_add = be64_at(seg + 8);
		} else {
			e->compare_add = be64_at(seg);
		}
	}
	return read_data(q, idx, s, ds, e, max_sge, max_inline);
}

int shift_mlx5_read_send(const struct shift_nwq *q, uint32_t idx, struct shift_swqe *e,
			 uint32_t max_sge, uint32_t max_inline)
{
	if (!read_send(q, idx, e, max_sge, max_inline))
		return 0;
	/* (still native, as recorded) */
	e->num_sge = SHIFT_WQE_NATIVE;
	e->imm = idx;
	return -1;
}

int shift_mlx5_read_recv(const struct shift_nwq *q, uint32_t idx, struct shift_rwqe *e,
			 uint32_t max_sge)
{
	const uint8_t *w = q->rq_buf + (size_t)(idx & (q->rq_cnt - 1)) * q->rq_stride;
	uint32_t n = 0;

	if (!q->rq_cnt)
		return -1;
	for (uint32_t k = 0; k < q->rq_stride / SEG; k++) {
		const uint8_t *seg = w + k * SEG;

		if (be32_at(seg + 4) == MLX5_INVALID_LKEY)
			break;
		if (n == max_sge)
			return -1;
		e->sge[n].length = be32_at(seg);
		e->sge[n].lkey = be32_at(seg + 4);
		e->sge[n].addr = be64_at(seg + 8);
		n++;
	}
	e->num_sge = n;
	return 0;
}
