/*
 * The Default-state chain path of post_send (shift/dp/post.c,
 * post_send_chain): a chain of one-SGE WRITE/SEND/READ WRs, inline or not,
 * is mirrored one by one under one lock and posted once, and the mirror
 * holds what the general path would: every field, the inline bytes (the
 * application's buffer reused right after), the signaled and per-opcode
 * counts. A chain the path cannot take (an atomic in it, two SGEs) goes
 * to the general path with nothing counted twice; a WR the provider
 * refuses mid-chain is forgotten from there on, the ones before it kept.
 * A single inline WR of up to 64 bytes takes its own path
 * (post_send_inline) and is mirrored the same way, every length; so do a
 * single send and a single receive of several SGEs (post_send_sges,
 * post_recv_sges).
 * Through ibv_post_send on the simulated pair, then every WR completes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "sim_pair.h"
#include "shift/dp/ctx.h"

static struct sim_ep a, b;
static struct sim_pair pair;

static struct ibv_sge sg[4];
static struct ibv_send_wr wr[4];

/* WR i of the chain: opcode op, flags, 1 SGE of len bytes at A's buf + 256 i. */
static struct ibv_send_wr *mk(int i, enum ibv_wr_opcode op, unsigned flags, uint32_t len)
{
	sg[i] = (struct ibv_sge){ .addr = (uintptr_t)a.buf + 256 * i, .length = len,
				  .lkey = a.mr->lkey };
	wr[i] = (struct ibv_send_wr){ .wr_id = 900 + i, .sg_list = &sg[i], .num_sge = 1,
				      .opcode = op, .send_flags = flags, .imm_data = 0x1234 + i };
	wr[i].wr.rdma.remote_addr = (uintptr_t)b.buf + 4096 + 256 * i;
	wr[i].wr.rdma.rkey = b.mr->rkey;
	if (i)
		wr[i - 1].next = &wr[i];
	return &wr[i];
}

static uint32_t posted(const struct shift_dqp *d)
{
	uint32_t n = 0;

	for (int i = 0; i < (int)(sizeof(d->posted_by_op) / sizeof(d->posted_by_op[0])); i++)
		n += d->posted_by_op[i];
	return n;
}

/* Poll A's CQ until n completions came, all successful. */
static void drain(int n)
{
	struct ibv_wc wc;

	sim_world_run_until_idle(pair.world);
	for (int got = 0; got < n;) {
		int k = sim_pair_poll1("A", &a, &wc);

		if (!k) {
			sim_world_run_until_idle(pair.world);
			continue;
		}
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		got += k;
	}
}

static void post_recvs(int n)
{
	for (int i = 0; i < n; i++) {
		struct ibv_sge s = { .addr = (uintptr_t)b.buf + 32768, .length = 256,
				     .lkey = b.mr->lkey };
		struct ibv_recv_wr r = { .wr_id = 100 + i, .sg_list = &s, .num_sge = 1 }, *bad;

		assert_int_equal(ibv_post_recv(b.qp, &r, &bad), 0);
	}
}

static void test_chain_mirrored(void **state)
{
	struct ibv_send_wr *bad = NULL;
	(void)state;

	sim_pair_open(&pair, &a, &b, "chain", 0);
	sim_pair_connect(&pair);
	struct shift_dqp *d = shift_dqp_of_qp(a.qp);
	uint64_t h = d->sq_head, sig = d->sig_head;
	uint32_t n0 = posted(d), w0 = d->posted_by_op[IBV_WR_RDMA_WRITE];

	post_recvs(2);
	mk(0, IBV_WR_RDMA_WRITE, 0, 64);
	mk(1, IBV_WR_SEND_WITH_IMM, IBV_SEND_SIGNALED, 48);
	mk(2, IBV_WR_RDMA_READ, 0, 32);
	mk(3, IBV_WR_SEND, IBV_SEND_INLINE | IBV_SEND_SIGNALED, 32);
	memset(a.buf + 768, 0x5a, 32);
	assert_int_equal(ibv_post_send(a.qp, wr, &bad), 0);
	memset(a.buf + 768, 0, 32); /* the application reuses its inline buffer */

	assert_int_equal(d->sq_head, h + 4);
	assert_int_equal(d->sig_head, sig + 2);
	assert_int_equal(posted(d), n0 + 4);
	assert_int_equal(d->posted_by_op[IBV_WR_RDMA_WRITE], w0 + 1);
	for (int i = 0; i < 4; i++) {
		const struct shift_swqe *e = shift_dqp_swqe(d, h + i);

		assert_int_equal(e->wr_id, 900 + i);
		assert_int_equal(e->opcode, wr[i].opcode);
		assert_int_equal(e->send_flags, wr[i].send_flags);
		assert_int_equal(e->num_sge, 1);
		assert_int_equal(e->imm, 0x1234 + i);
		assert_int_equal(e->remote_addr, wr[i].wr.rdma.remote_addr);
		assert_int_equal(e->rkey, b.mr->rkey);
		assert_memory_equal(&e->sge[0], &sg[i], sizeof(sg[i]));
	}
	const struct shift_swqe *e = shift_dqp_swqe(d, h + 3);

	assert_int_equal(e->inline_len, 32);
	for (int i = 0; i < 32; i++)
		assert_int_equal(((const uint8_t *)&e->sge[d->max_send_sge])[i], 0x5a);
	drain(2);
	sim_pair_close(&pair);
}

/* An atomic, or two SGEs, in the chain: the general path, counted once. */
static void test_chain_general(void **state)
{
	struct ibv_send_wr *bad = NULL;
	(void)state;

	sim_pair_open(&pair, &a, &b, "chaing", 0);
	sim_pair_connect(&pair);
	struct shift_dqp *d = shift_dqp_of_qp(a.qp);
	uint64_t h = d->sq_head, sig = d->sig_head;
	uint32_t n0 = posted(d);

	mk(0, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 64);
	mk(1, IBV_WR_RDMA_WRITE, 0, 64);
	mk(2, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_SEND_SIGNALED, 8);
	wr[2].wr.atomic.remote_addr = (uintptr_t)b.buf + 8192;
	wr[2].wr.atomic.compare_add = 5;
	wr[2].wr.atomic.rkey = b.mr->rkey;
	assert_int_equal(ibv_post_send(a.qp, wr, &bad), 0);
	assert_int_equal(d->sq_head, h + 3);
	assert_int_equal(d->sig_head, sig + 2);
	assert_int_equal(posted(d), n0 + 3);
	assert_int_equal(d->posted_by_op[IBV_WR_ATOMIC_FETCH_AND_ADD], 1);
	assert_int_equal(shift_dqp_swqe(d, h + 2)->compare_add, 5);
	drain(2);

	h = d->sq_head;
	sig = d->sig_head;
	mk(0, IBV_WR_RDMA_WRITE, 0, 64);
	mk(1, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 64);
	wr[1].next = NULL;
	wr[1].num_sge = 2;
	sg[2] = sg[1];
	assert_int_equal(ibv_post_send(a.qp, wr, &bad), 0);
	assert_int_equal(d->sq_head, h + 2);
	assert_int_equal(d->sig_head, sig + 1);
	assert_int_equal(shift_dqp_swqe(d, h + 1)->num_sge, 2);
	drain(1);
	sim_pair_close(&pair);
}

/* The provider refuses the third WR: the first two are posted and kept,
 * the rest forgotten, and the refusal is the application's. */
static void test_chain_refused(void **state)
{
	struct ibv_send_wr *bad = NULL;
	(void)state;

	sim_pair_open(&pair, &a, &b, "chainr", 0);
	sim_pair_connect(&pair);
	struct shift_dqp *d = shift_dqp_of_qp(a.qp);
	uint64_t h = d->sq_head, sig = d->sig_head;
	uint32_t n0 = posted(d);

	mk(0, IBV_WR_RDMA_WRITE, 0, 64);
	mk(1, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 64);
	mk(2, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 0x80000001u); /* over 2 GiB: refused */
	mk(3, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 64);
	int rc = ibv_post_send(a.qp, wr, &bad);

	assert_int_not_equal(rc, 0);
	assert_ptr_equal(bad, &wr[2]);
	assert_int_equal(d->sq_head, h + 2);
	assert_int_equal(d->sig_head, sig + 1);
	assert_int_equal(posted(d), n0 + 2);
	assert_int_equal(d->send_state, SHIFT_SEND_DEFAULT);
	drain(1);
	sim_pair_close(&pair);
}

/* Single inline WRs of 0..64 bytes (the single-inline path: copied in
 * blocks, every length a different split) and 65 (more than the QP
 * takes: the general path, which cannot mirror it and leaves the QP
 * unprotected; the provider refuses it, nothing is kept). */
static void test_inline_single(void **state)
{
	struct ibv_send_wr *bad = NULL;
	(void)state;

	sim_pair_open(&pair, &a, &b, "chaini", 0);
	sim_pair_connect(&pair);
	struct shift_dqp *d = shift_dqp_of_qp(a.qp);

	post_recvs(32); /* (for the odd lengths' WRITE_WITH_IMM) */
	for (uint32_t len = 0; len <= 64; len++) {
		uint64_t h = d->sq_head;
		uint8_t *src = a.buf + 512;
		/* signaled every 8th: the mirror retires as the QP completes */
		unsigned sig = len % 8 == 7 ? IBV_SEND_SIGNALED : 0;

		for (uint32_t i = 0; i < 80; i++)
			src[i] = (uint8_t)(len * 7 + i + 1);
		mk(0, len & 1 ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
		   IBV_SEND_INLINE | sig, len);
		sg[0].addr = (uintptr_t)src;
		assert_int_equal(ibv_post_send(a.qp, wr, &bad), 0);
		memset(src, 0, 80); /* reused at once */
		assert_int_equal(d->sq_head, h + 1);
		const struct shift_swqe *e = shift_dqp_swqe(d, h);
		const uint8_t *got = (const uint8_t *)&e->sge[d->max_send_sge];

		assert_int_equal(e->wr_id, 900);
		assert_int_equal(e->opcode, wr[0].opcode);
		assert_int_equal(e->send_flags, IBV_SEND_INLINE | sig);
		assert_int_equal(e->num_sge, 1);
		assert_int_equal(e->remote_addr, wr[0].wr.rdma.remote_addr);
		assert_int_equal(e->inline_len, len);
		for (uint32_t i = 0; i < len; i++)
			assert_int_equal(got[i], (uint8_t)(len * 7 + i + 1));
		if (sig)
			drain(1);
	}
	uint64_t h = d->sq_head;

	mk(0, IBV_WR_RDMA_WRITE, IBV_SEND_INLINE | IBV_SEND_SIGNALED, 65);
	assert_int_not_equal(ibv_post_send(a.qp, wr, &bad), 0);
	assert_int_equal(d->sq_head, h);
	sim_pair_close(&pair);
}

/* One WRITE and one receive of 2 SGEs (the QPs take 2): every SGE in
 * the mirror, in order; a 2-SGE inline WRITE: the general path, the same
 * entry. */
static void test_sges_single(void **state)
{
	struct ibv_send_wr *bad = NULL;
	struct ibv_recv_wr *rbad = NULL;
	(void)state;

	sim_pair_open(&pair, &a, &b, "chains", 0);
	sim_pair_connect(&pair);
	struct shift_dqp *d = shift_dqp_of_qp(a.qp), *db = shift_dqp_of_qp(b.qp);

	for (int inl = 0; inl < 2; inl++) {
		uint64_t h = d->sq_head, sig = d->sig_head;
		uint32_t n0 = posted(d);

		mk(0, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED | (inl ? IBV_SEND_INLINE : 0), 16);
		struct ibv_sge two[2] = { sg[0], { .addr = (uintptr_t)a.buf + 2048, .length = 24,
						   .lkey = a.mr->lkey } };

		wr[0].sg_list = two;
		wr[0].num_sge = 2;
		assert_int_equal(ibv_post_send(a.qp, wr, &bad), 0);
		assert_int_equal(d->sq_head, h + 1);
		assert_int_equal(d->sig_head, sig + 1);
		assert_int_equal(posted(d), n0 + 1);
		const struct shift_swqe *e = shift_dqp_swqe(d, h);

		assert_int_equal(e->wr_id, 900);
		assert_int_equal(e->num_sge, 2);
		assert_int_equal(e->opcode, IBV_WR_RDMA_WRITE);
		assert_int_equal(e->remote_addr, wr[0].wr.rdma.remote_addr);
		assert_int_equal(e->rkey, b.mr->rkey);
		assert_memory_equal(e->sge, two, sizeof(two));
		if (inl)
			assert_int_equal(e->inline_len, 40);
		drain(1);
	}
	uint64_t rh = db->rq_head;
	struct ibv_sge rs[2] = { { .addr = (uintptr_t)b.buf + 100, .length = 10, .lkey = b.mr->lkey },
				 { .addr = (uintptr_t)b.buf + 300, .length = 30, .lkey = b.mr->lkey } };
	struct ibv_recv_wr r = { .wr_id = 77, .sg_list = rs, .num_sge = 2 };

	assert_int_equal(ibv_post_recv(b.qp, &r, &rbad), 0);
	assert_int_equal(db->rq_head, rh + 1);
	const struct shift_rwqe *re = shift_dqp_rwqe(db, rh);

	assert_int_equal(re->wr_id, 77);
	assert_int_equal(re->num_sge, 2);
	assert_memory_equal(re->sge, rs, sizeof(rs));
	/* a SEND fills it: both SGEs, in order */
	mk(0, IBV_WR_SEND, IBV_SEND_SIGNALED, 40);
	memset(a.buf, 0xab, 40);
	assert_int_equal(ibv_post_send(a.qp, wr, &bad), 0);
	drain(1);
	struct ibv_wc wc;

	sim_world_run_until_idle(pair.world);
	assert_int_equal(sim_pair_poll1("B", &b, &wc), 1);
	assert_int_equal(wc.wr_id, 77);
	assert_int_equal(wc.byte_len, 40);
	for (int i = 0; i < 10; i++)
		assert_int_equal(b.buf[100 + i], 0xab);
	for (int i = 0; i < 30; i++)
		assert_int_equal(b.buf[300 + i], 0xab);
	sim_pair_close(&pair);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chain_mirrored),
		cmocka_unit_test(test_chain_general),
		cmocka_unit_test(test_chain_refused),
		cmocka_unit_test(test_inline_single),
		cmocka_unit_test(test_sges_single),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
