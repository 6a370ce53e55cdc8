/*
 * providers/mlx5_wqe.c: mlx5 WQEs read back into mirror entries, on WQE
 * buffers built here byte by byte from the format (mlx5dv.h): every send
 * opcode SHIFT posts again (write, write with immediate, send, send with
 * immediate, send with invalidate, read, compare-and-swap, fetch-and-add),
 * every segment kind (control, remote address, atomic, data, inline), a
 * WQE spanning two basic blocks, one wrapping from the end of the queue to
 * its start with inline data crossing it, a 16-bit index past its wrap;
 * receives of 0, 2 and all SGEs; and every check that refuses a WQE that
 * is not the one posted (index, QP number, opcode, signaled flag, inline
 * flag, size), leaving the entry as recorded.
 */
#include <endian.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "providers/mlx5_wqe.h"

#define QPN 0x1234u
#define BLOCKS 4u
#define MAX_SGE 4u
#define MAX_INLINE 128u

static uint8_t sq[BLOCKS * 64] __attribute__((aligned(64)));
static uint8_t rq[4 * 64] __attribute__((aligned(64)));
static uint32_t dbrec[2];
static struct shift_nwq q;
static union {
	struct shift_swqe e;
	uint8_t room[sizeof(struct shift_swqe) + MAX_SGE * sizeof(struct ibv_sge) + MAX_INLINE];
} s;
static union {
	struct shift_rwqe e;
	uint8_t room[sizeof(struct shift_rwqe) + MAX_SGE * sizeof(struct ibv_sge)];
} r;

static void b32(uint8_t *p, uint32_t v)
{
	v = htobe32(v);
	memcpy(p, &v, 4);
}

static void b64(uint8_t *p, uint64_t v)
{
	v = htobe64(v);
	memcpy(p, &v, 8);
}

/* segment k of the WQE at block idx (the queue wraps) */
static uint8_t *seg(uint32_t idx, uint32_t k)
{
	return sq + (((idx % BLOCKS) * 64 + k * 16) % sizeof(sq));
}

static void ctrl(uint32_t idx, uint8_t op, uint32_t ds, uint8_t fm, uint32_t imm_raw)
{
	uint8_t *c = seg(idx, 0);

	memset(c, 0, 16);
	b32(c, ((idx & 0xffff) << 8) | op);
	b32(c + 4, (QPN << 8) | ds);
	c[11] = fm;
	memcpy(c + 12, &imm_raw, 4);
}

static void raddr(uint32_t idx, uint32_t k, uint64_t addr, uint32_t rkey)
{
	memset(seg(idx, k), 0, 16);
	b64(seg(idx, k), addr);
	b32(seg(idx, k) + 8, rkey);
}

static void data(uint32_t idx, uint32_t k, uint32_t len, uint32_t lkey, uint64_t addr)
{
	b32(seg(idx, k), len);
	b32(seg(idx, k) + 4, lkey);
	b64(seg(idx, k) + 8, addr);
}

/* the entry as a native post records it */
static struct shift_swqe *recorded(unsigned opcode, unsigned flags, uint32_t idx)
{
	memset(&s, 0xee, sizeof(s));
	s.e.wr_id = 77;
	s.e.num_sge = SHIFT_WQE_NATIVE;
	s.e.opcode = opcode;
	s.e.send_flags = flags;
	s.e.imm = idx;
	return &s.e;
}

static int read_back(struct shift_swqe *e)
{
	return q.read_send(&q, e->imm, e, MAX_SGE, MAX_INLINE);
}

static int setup(void **state)
{
	struct mlx5dv_qp dv = { .dbrec = (__be32 *)dbrec };
	(void)state;

	memset(sq, 0, sizeof(sq));
	memset(rq, 0, sizeof(rq));
	dv.sq.buf = sq;
	dv.sq.wqe_cnt = BLOCKS;
	dv.sq.stride = 64;
	dv.rq.buf = rq;
	dv.rq.wqe_cnt = 4;
	dv.rq.stride = 64;
	return shift_mlx5_nwq_init(&q, &dv, QPN);
}

static void test_write_and_imm(void **state)
{
	struct shift_swqe *e = recorded(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 0);
	uint32_t imm = htobe32(0xabcdef01);
	(void)state;

	ctrl(0, MLX5_OPCODE_RDMA_WRITE, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
	raddr(0, 1, 0x1122334455667788ull, 0x99);
	data(0, 2, 4096, 0x42, 0x7000);
	assert_int_equal(read_back(e), 0);
	assert_int_equal(e->wr_id, 77);
	assert_int_equal(e->num_sge, 1);
	assert_int_equal(e->remote_addr, 0x1122334455667788ull);
	assert_int_equal(e->rkey, 0x99);
	assert_int_equal(e->sge[0].addr, 0x7000);
	assert_int_equal(e->sge[0].length, 4096);
	assert_int_equal(e->sge[0].lkey, 0x42);
	assert_int_equal(e->inline_len, 0);

	/* with immediate, two data segments, unsignaled: at block 1 */
	e = recorded(IBV_WR_RDMA_WRITE_WITH_IMM, 0, 1);
	ctrl(1, MLX5_OPCODE_RDMA_WRITE_IMM, 4, 0, imm);
	raddr(1, 1, 0x5000, 7);
	data(1, 2, 10, 1, 0x100);
	data(1, 3, 20, 2, 0x200);
	assert_int_equal(read_back(e), 0);
	assert_int_equal(e->imm, imm); /* (as posted: big-endian) */
	assert_int_equal(e->num_sge, 2);
	assert_int_equal(e->sge[1].addr, 0x200);
	assert_int_equal(e->sge[1].length, 20);
	assert_int_equal(e->sge[1].lkey, 2);
}

static void test_send_kinds_and_read(void **state)
{
	struct shift_swqe *e;
	uint32_t imm = htobe32(5);
	(void)state;

	e = recorded(IBV_WR_SEND, IBV_SEND_SIGNALED, 2);
	ctrl(2, MLX5_OPCODE_SEND, 2, MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_SOLICITED, 0);
	data(2, 1, 64, 3, 0x300);
	assert_int_equal(read_back(e), 0);
	assert_int_equal(e->num_sge, 1);
	assert_int_equal(e->rkey, 0);

	e = recorded(IBV_WR_SEND_WITH_IMM, 0, 2);
	ctrl(2, MLX5_OPCODE_SEND_IMM, 2, 0, imm);
	assert_int_equal(read_back(e), 0);
	assert_int_equal(e->imm, imm);

	/* the key to invalidate: host order, as struct ibv_send_wr has it */
	e = recorded(IBV_WR_SEND_WITH_INV, 0, 2);
	ctrl(2, MLX5_OPCODE_SEND_INVAL, 2, 0, htobe32(0x4321));
	assert_int_equal(read_back(e), 0);
	assert_int_equal(e->imm, 0x4321);

	e = recorded(IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, 3);
	ctrl(3, MLX5_OPCODE_RDMA_READ, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
	raddr(3, 1, 0xfeed0000, 0x55);
	data(3, 2, 512, 9, 0x900);
	assert_int_equal(read_back(e), 0);
	assert_int_equal(e->remote_addr, 0xfeed0000);
	assert_int_equal(e->sge[0].length, 512);

	/* a zero-length write: no data segment */
	e = recorded(IBV_WR_RDMA_WRITE, 0, 0);
	ctrl(0, MLX5_OPCODE_RDMA_WRITE, 2, 0, 0);
	raddr(0, 1, 0x10, 1);
	assert_int_equal(read_back(e), 0);
	assert_int_equal(e->num_sge, 0);
}

static void test_atomics(void **state)
{
	struct shift_swqe *e = recorded(IBV_WR_ATOMIC_CMP_AND_SWP, IBV_SEND_SIGNALED, 0);
	(void)state;

	ctrl(0, MLX5_OPCODE_ATOMIC_CS, 4, MLX5_WQE_CTRL_CQ_UPDATE, 0);
	raddr(0, 1, 0x8000, 0x66);
	b64(seg(0, 2), 0x1111111111111111ull);     /* swap */
	b64(seg(0, 2) + 8, 0x2222222222222222ull); /* compare */
	data(0, 3, 8, 4, 0x4000);
	assert_int_equal(read_back(e), 0);
	assert_int_equal(e->swap, 0x1111111111111111ull);
	assert_int_equal(e->compare_add, 0x2222222222222222ull);
	assert_int_equal(e->remote_addr, 0x8000);
	assert_int_equal(e->rkey, 0x66);
	assert_int_equal(e->sge[0].length, 8);

	e = recorded(IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_SEND_SIGNALED, 1);
	ctrl(1, MLX5_OPCODE_ATOMIC_FA, 4, MLX5_WQE_CTRL_CQ_UPDATE, 0);
	raddr(1, 1, 0x8008, 0x66);
	b64(seg(1, 2), 3);
	b64(seg(1, 2) + 8, 0);
	data(1, 3, 8, 4, 0x4008);
	assert_int_equal(read_back(e), 0);
	assert_int_equal(e->compare_add, 3);
	assert_int_equal(e->swap, 0);
}

/* inline bytes from segment k of the WQE at idx, after its byte count */
static void inline_bytes(uint32_t idx, uint32_t k, const uint8_t *p, uint32_t len)
{
	b32(seg(idx, k), len | MLX5_INLINE_SEG);
	for (uint32_t i = 0, off = 4; i < len; i++, off++)
		seg(idx, k + off / 16)[off % 16] = p[i];
}

static void test_inline_across_blocks_and_wrap(void **state)
{
	uint8_t pay[100];
	struct shift_swqe *e;
	(void)state;

	for (unsigned i = 0; i < sizeof(pay); i++)
		pay[i] = (uint8_t)(i * 7 + 1);
	/* 60 bytes at block 0: ctrl, raddr, inline (4 + 60 = 64 bytes, 4
	 * segments): 6 segments, the WQE spans blocks 0 and 1 */
	e = recorded(IBV_WR_RDMA_WRITE, IBV_SEND_INLINE | IBV_SEND_SIGNALED, 0);
	ctrl(0, MLX5_OPCODE_RDMA_WRITE, 6, MLX5_WQE_CTRL_CQ_UPDATE, 0);
	raddr(0, 1, 0xa000, 3);
	inline_bytes(0, 2, pay, 60);
	assert_int_equal(read_back(e), 0);
	assert_int_equal(e->inline_len, 60);
	assert_int_equal(e->num_sge, 0);
	assert_memory_equal(&e->sge[MAX_SGE], pay, 60);

	/* 100 bytes of a send at block 3, the last: its segments 4.. are at
	 * the start of the queue, the data crossing the end */
	e = recorded(IBV_WR_SEND, IBV_SEND_INLINE, 3);
	ctrl(3, MLX5_OPCODE_SEND, 1 + (4 + 100 + 15) / 16, 0, 0);
	inline_bytes(3, 1, pay, 100);
	assert_int_equal(read_back(e), 0);
	assert_int_equal(e->inline_len, 100);
	assert_memory_equal(&e->sge[MAX_SGE], pay, 100);

	/* data segments wrapping the same way, the 16-bit index past its
	 * own wrap (0xffff: block 3) */
	e = recorded(IBV_WR_RDMA_WRITE, 0, 0xffff);
	ctrl(0xffff, MLX5_OPCODE_RDMA_WRITE, 6, 0, 0);
	raddr(0xffff, 1, 0xb000, 4);
	for (unsigned k = 0; k < 4; k++)
		data(0xffff, 2 + k, 100 + k, k, 0x1000 * (k + 1));
	assert_int_equal(read_back(e), 0);
	assert_int_equal(e->num_sge, 4);
	assert_int_equal(e->sge[3].length, 103);
	assert_int_equal(e->sge[3].addr, 0x4000);
}

/* a refused WQE leaves the entry as recorded */
static void refused(struct shift_swqe *e, uint32_t idx)
{
	assert_int_equal(read_back(e), -1);
	assert_int_equal(e->num_sge, SHIFT_WQE_NATIVE);
	assert_int_equal(e->imm, idx);
	assert_int_equal(e->wr_id, 77);
}

static void test_refusals(void **state)
{
	uint8_t pay[8] = { 0 };
	(void)state;

	ctrl(1, MLX5_OPCODE_RDMA_WRITE, 3, MLX5_WQE_CTRL_CQ_UPDATE, 0);
	raddr(1, 1, 0x10, 1);
	data(1, 2, 8, 1, 0x20);
	/* the slot reused: the WQE is index 5's, not 1's */
	refused(recorded(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 5), 5);
	/* another opcode recorded */
	refused(recorded(IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, 1), 1);
	/* signaled, and the WQE asks for no completion */
	ctrl(1, MLX5_OPCODE_RDMA_WRITE, 3, 0, 0);
	refused(recorded(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1), 1);
	/* inline recorded, data segments found (and the reverse) */
	refused(recorded(IBV_WR_RDMA_WRITE, IBV_SEND_INLINE, 1), 1);
	inline_bytes(1, 2, pay, 8);
	refused(recorded(IBV_WR_RDMA_WRITE, 0, 1), 1);
	/* inline longer than the entry holds, or than its segments */
	b32(seg(1, 2), (MAX_INLINE + 1) | MLX5_INLINE_SEG);
	refused(recorded(IBV_WR_RDMA_WRITE, IBV_SEND_INLINE, 1), 1);
	b32(seg(1, 2), 40 | MLX5_INLINE_SEG); /* 4 + 40 > 16 */
	refused(recorded(IBV_WR_RDMA_WRITE, IBV_SEND_INLINE, 1), 1);
	/* another QP's WQE */
	b32(seg(1, 0) + 4, ((QPN + 1) << 8) | 3);
	refused(recorded(IBV_WR_RDMA_WRITE, 0, 1), 1);
	/* no size, a size above the queue's, more SGEs than the entry holds */
	ctrl(1, MLX5_OPCODE_RDMA_WRITE, 0, 0, 0);
	refused(recorded(IBV_WR_RDMA_WRITE, 0, 1), 1);
	ctrl(1, MLX5_OPCODE_RDMA_WRITE, 17, 0, 0);
	refused(recorded(IBV_WR_RDMA_WRITE, 0, 1), 1);
	ctrl(1, MLX5_OPCODE_SEND, 1 + MAX_SGE + 1, 0, 0);
	for (unsigned k = 1; k <= MAX_SGE + 1; k++)
		data(1, k, 1, 1, 1);
	refused(recorded(IBV_WR_SEND, 0, 1), 1);
	/* an opcode SHIFT does not post again (local invalidate) */
	ctrl(1, MLX5_OPCODE_LOCAL_INVAL, 2, 0, 0);
	refused(recorded(IBV_WR_LOCAL_INV, 0, 1), 1);
	/* a remote-address opcode whose WQE has no room for the segment */
	ctrl(1, MLX5_OPCODE_RDMA_READ, 1, 0, 0);
	refused(recorded(IBV_WR_RDMA_READ, 0, 1), 1);
}

static void recv_data(uint32_t idx, uint32_t k, uint32_t len, uint32_t lkey, uint64_t addr)
{
	uint8_t *p = rq + (idx % 4) * 64 + k * 16;

	b32(p, len);
	b32(p + 4, lkey);
	b64(p + 8, addr);
}

static void test_receives(void **state)
{
	(void)state;

	/* two SGEs, then the end mark */
	recv_data(1, 0, 100, 5, 0x1000);
	recv_data(1, 1, 200, 6, 0x2000);
	recv_data(1, 2, 0, MLX5_INVALID_LKEY, 0);
	r.e.num_sge = SHIFT_WQE_NATIVE;
	assert_int_equal(q.read_recv(&q, 1, &r.e, MAX_SGE), 0);
	assert_int_equal(r.e.num_sge, 2);
	assert_int_equal(r.e.sge[1].addr, 0x2000);
	assert_int_equal(r.e.sge[1].length, 200);
	assert_int_equal(r.e.sge[1].lkey, 6);
	/* none (NCCL's zero-SGE receive), at index 6 (slot 2) */
	recv_data(2, 0, 0, MLX5_INVALID_LKEY, 0);
	assert_int_equal(q.read_recv(&q, 6, &r.e, MAX_SGE), 0);
	assert_int_equal(r.e.num_sge, 0);
	/* the whole stride: no end mark */
	for (unsigned k = 0; k < 4; k++)
		recv_data(3, k, 10 + k, k, 0x100 * k);
	assert_int_equal(q.read_recv(&q, 3, &r.e, MAX_SGE), 0);
	assert_int_equal(r.e.num_sge, 4);
	assert_int_equal(r.e.sge[3].length, 13);
	/* more than the entry holds */
	r.e.num_sge = SHIFT_WQE_NATIVE;
	assert_int_equal(q.read_recv(&q, 3, &r.e, 3), -1);
	assert_int_equal(r.e.num_sge, SHIFT_WQE_NATIVE);
}

static void test_descriptions(void **state)
{
	struct mlx5dv_qp dv = { .dbrec = (__be32 *)dbrec };
	struct shift_nwq x;
	(void)state;

	dv.sq.buf = sq;
	dv.sq.wqe_cnt = BLOCKS;
	dv.sq.stride = 64;
	assert_int_equal(shift_mlx5_nwq_init(&x, &dv, QPN), 0);
	assert_int_equal(x.rq_cnt, 0); /* (a QP on an SRQ) */
	assert_ptr_equal(x.sq_dbrec, &dbrec[MLX5_SND_DBR]);
	assert_ptr_equal(x.rq_dbrec, &dbrec[MLX5_RCV_DBR]);
	dbrec[MLX5_SND_DBR] = htobe32(0x12345);
	assert_int_equal(shift_nwq_index(x.sq_dbrec), 0x2345);
	dv.sq.stride = 128;
	assert_int_equal(shift_mlx5_nwq_init(&x, &dv, QPN), -1);
	dv.sq.stride = 64;
	dv.sq.wqe_cnt = 3;
	assert_int_equal(shift_mlx5_nwq_init(&x, &dv, QPN), -1);
	dv.sq.wqe_cnt = BLOCKS;
	dv.rq.wqe_cnt = 4;
	dv.rq.stride = 24;
	dv.rq.buf = rq;
	assert_int_equal(shift_mlx5_nwq_init(&x, &dv, QPN), -1);
	dv.rq.stride = 32;
	assert_int_equal(shift_mlx5_nwq_init(&x, &dv, QPN), 0);
	dv.dbrec = NULL;
	assert_int_equal(shift_mlx5_nwq_init(&x, &dv, QPN), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_write_and_imm, setup),
		cmocka_unit_test_setup(test_send_kinds_and_read, setup),
		cmocka_unit_test_setup(test_atomics, setup),
		cmocka_unit_test_setup(test_inline_across_blocks_and_wrap, setup),
		cmocka_unit_test_setup(test_refusals, setup),
		cmocka_unit_test_setup(test_receives, setup),
		cmocka_unit_test(test_descriptions),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
