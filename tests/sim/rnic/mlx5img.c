/*
 * The simulated RNIC's mlx5 mode (sim_world_opts.mlx5): besides its own
 * queues, each QP writes every posted WR into send and receive buffers in
 * the mlx5 WQE format, publishes its producer counters in a doorbell
 * record, and describes all three through an mlx5dv_init_obj of its own,
 * as the mlx5 provider does. The devices then report Mellanox's vendor id,
 * so SHIFT takes them for mlx5 and reads failed QPs' WQEs back from these
 * buffers (providers/mlx5_wqe.c): every campaign can run the native path.
 *
 * The encoder follows the documented format and mlx5's own choices where
 * the format leaves one: zero-length SGEs are skipped, a receive shorter
 * than the stride ends with a segment of the invalid lkey, the inline data
 * of a WR is one segment, segments wrap from the buffer's end to its start,
 * a reset sets both counters back to 0. The sim executes from its own
 * queues; these buffers are what SHIFT reads, so a mismatch between the two
 * sides shows as lost or corrupt data in the campaigns.
 */
#include "sim_int.h"

#include <endian.h>
#include <errno.h>
#include <infiniband/mlx5dv.h>
#include <stdlib.h>
#include <string.h>

#define BB 64u
#define SEG 16u

static uint32_t pow2_at_least(uint32_t n)
{
	uint32_t p = 1;

	while (p < n)
		p <<= 1;
	return p;
}

/* the largest WQE of q, in 16-byte units */
static uint32_t max_ds(const struct sim_qp *q)
{
	uint32_t data = q->cap.max_send_sge;
	uint32_t inl = (4 + q->cap.max_inline_data + SEG - 1) / SEG;

	return 3 + (data > inl ? data : inl); /* ctrl, raddr, atomic, data */
}

int sim_img_init(struct sim_qp *q)
{
	uint32_t bbs = (max_ds(q) * SEG + BB - 1) / BB;

	if (!q->dev->w->opts.mlx5)
		return 0;
	q->img_sq_cnt = pow2_at_least(q->sq_cap * bbs);
	q->img_sq = calloc(q->img_sq_cnt, BB);
	if (!q->srq) {
		q->img_rq_stride = pow2_at_least(q->cap.max_recv_sge * SEG);
		q->img_rq_cnt = pow2_at_least(q->rq_cap);
		q->img_rq = calloc(q->img_rq_cnt, q->img_rq_stride);
	}
	q->img_db = calloc(2, sizeof(uint32_t));
	if (!q->img_sq || !q->img_db || (!q->srq && !q->img_rq)) {
		sim_img_free(q);
		return -1;
	}
	return 0;
}

void sim_img_free(struct sim_qp *q)
{
	free(q->img_sq);
	free(q->img_rq);
	free(q->img_db);
	q->img_sq = q->img_rq = NULL;
	q->img_db = NULL;
}

void sim_img_reset(struct sim_qp *q)
{
	q->img_cur = q->img_rq_head = 0;
	if (q->img_db)
		q->img_db[0] = q->img_db[1] = 0;
}

/* 16-byte segment number s of the WQE starting at block idx */
static uint8_t *seg_at(struct sim_qp *q, uint32_t idx, uint32_t s)
{
	uint32_t size = q->img_sq_cnt * BB;

	return q->img_sq + (((idx & (q->img_sq_cnt - 1)) * BB + s * SEG) & (size - 1));
}

static void put32(uint8_t *p, uint32_t v)
{
	v = htobe32(v);
	memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
	v = htobe64(v);
	memcpy(p, &v, 8);
}

static uint8_t mlx5_op(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE: return MLX5_OPCODE_RDMA_WRITE;
	case IBV_WR_RDMA_WRITE_WITH_IMM: return MLX5_OPCODE_RDMA_WRITE_IMM;
	case IBV_WR_SEND: return MLX5_OPCODE_SEND;
	case IBV_WR_SEND_WITH_IMM: return MLX5_OPCODE_SEND_IMM;
	case IBV_WR_SEND_WITH_INV: return MLX5_OPCODE_SEND_INVAL;
	case IBV_WR_RDMA_READ: return MLX5_OPCODE_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP: return MLX5_OPCODE_ATOMIC_CS;
	case IBV_WR_ATOMIC_FETCH_AND_ADD: return MLX5_OPCODE_ATOMIC_FA;
	default: return MLX5_OPCODE_NOP;
	}
}

/* inline bytes from segment s on, byte 4 of it first; the segments used */
static uint32_t put_inline(struct sim_qp *q, uint32_t idx, uint32_t s, const struct ibv_send_wr *wr)
{
	uint32_t len = 0, off = 4;

	for (int i = 0; i < wr->num_sge; i++) {
		const uint8_t *src = (const uint8_t *)(uintptr_t)wr->sg_list[i].addr;

		for (uint32_t k = 0; k < wr->sg_list[i].length; k++, off++)
			seg_at(q, idx, s + off / SEG)[off % SEG] = src[k];
		len += wr->sg_list[i].length;
	}
	if (!len)
		return 0;
	put32(seg_at(q, idx, s), len | MLX5_INLINE_SEG);
	return (4 + len + SEG - 1) / SEG;
}

void sim_img_send(struct sim_qp *q, const struct ibv_send_wr *wr)
{
	uint32_t idx = q->img_cur, s = 1;
	uint8_t *c, fm = 0;

	if (!q->img_sq)
		return;
	c = seg_at(q, idx, 0);
	memset(c, 0, SEG);
	if (wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
	    wr->opcode == IBV_WR_RDMA_READ || wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
	    wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		uint8_t *r = seg_at(q, idx, s++);
		bool at = wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
			  wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;

		memset(r, 0, SEG);
		put64(r, at ? wr->wr.atomic.remote_addr : wr->wr.rdma.remote_addr);
		put32(r + 8, at ? wr->wr.atomic.rkey : wr->wr.rdma.rkey);
		if (at) {
			uint8_t *a = seg_at(q, idx, s++);

			memset(a, 0, SEG);
			if (wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP) {
				put64(a, wr->wr.atomic.swap);
				put64(a + 8, wr->wr.atomic.compare_add);
			} else {
				put64(a, wr->wr.atomic.compare_add);
			}
		}
	}
	if (wr->send_flags & IBV_SEND_INLINE) {
		s += put_inline(q, idx, s, wr);
	} else {
		for (int i = 0; i < wr->num_sge; i++) {
			uint8_t *d;

			if (!wr->sg_list[i].length)
				continue;
			d = seg_at(q, idx, s++);
			put32(d, wr->sg_list[i].length);
			put32(d + 4, wr->sg_list[i].lkey);
			put64(d + 8, wr->sg_list[i].addr);
		}
	}
	if ((wr->send_flags & IBV_SEND_SIGNALED) || q->sq_sig_all)
		fm |= MLX5_WQE_CTRL_CQ_UPDATE;
	if (wr->send_flags & IBV_SEND_SOLICITED)
		fm |= MLX5_WQE_CTRL_SOLICITED;
	if (wr->send_flags & IBV_SEND_FENCE)
		fm |= MLX5_WQE_CTRL_FENCE;
	put32(c, ((idx & 0xffff) << 8) | mlx5_op(wr->opcode));
	put32(c + 4, (q->qp.qp_num << 8) | s);
	c[11] = fm;
	if (wr->opcode == IBV_WR_SEND_WITH_INV)
		put32(c + 12, wr->invalidate_rkey);
	else if (wr->opcode == IBV_WR_SEND_WITH_IMM || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
		memcpy(c + 12, &wr->imm_data, 4);
	q->img_cur = (idx + (s * SEG + BB - 1) / BB) & 0xffff;
}

void sim_img_send_done(struct sim_qp *q)
{
	if (q->img_db)
		__atomic_store_n(&q->img_db[MLX5_SND_DBR], htobe32(q->img_cur & 0xffff),
				 __ATOMIC_RELEASE);
}

void sim_img_recv(struct sim_qp *q, const struct ibv_recv_wr *wr)
{
	uint8_t *w;
	uint32_t n = 0;

	if (!q->img_rq)
		return;
	w = q->img_rq + (size_t)(q->img_rq_head & (q->img_rq_cnt - 1)) * q->img_rq_stride;
	for (int i = 0; i < wr->num_sge; i++) {
		if (!wr->sg_list[i].length)
			continue;
		put32(w + n * SEG, wr->sg_list[i].length);
		put32(w + n * SEG + 4, wr->sg_list[i].lkey);
		put64(w + n * SEG + 8, wr->sg_list[i].addr);
		n++;
	}
	if (n < q->img_rq_stride / SEG) {
		memset(w + n * SEG, 0, SEG);
		put32(w + n * SEG + 4, MLX5_INVALID_LKEY);
	}
	q->img_rq_head = (q->img_rq_head + 1) & 0xffff;
	__atomic_store_n(&q->img_db[MLX5_RCV_DBR], htobe32(q->img_rq_head), __ATOMIC_RELEASE);
}

int sim_mlx5dv_init_obj(struct mlx5dv_obj *obj, uint64_t obj_type)
{
	struct sim_qp *q;

	if (obj_type != MLX5DV_OBJ_QP || !obj->qp.in || !obj->qp.out)
		return EOPNOTSUPP;
	q = (struct sim_qp *)obj->qp.in;
	if (!q->img_sq)
		return EOPNOTSUPP;
	memset(obj->qp.out, 0, sizeof(*obj->qp.out));
	obj->qp.out->dbrec = (__be32 *)q->img_db;
	obj->qp.out->sq.buf = q->img_sq;
	obj->qp.out->sq.wqe_cnt = q->img_sq_cnt;
	obj->qp.out->sq.stride = BB;
	obj->qp.out->rq.buf = q->img_rq;
	obj->qp.out->rq.wqe_cnt = q->img_rq_cnt;
	obj->qp.out->rq.stride = q->img_rq_stride;
	return 0;
}
