/*
 * The Default-state poll (shift/dp/poll.c) retires what it returns: a
 * batch of completions of the QP it polled last, all successful, in one
 * go (retire_many); anything else through the loop. Either way each
 * receive completion retires one receive and each send completion one
 * signaled send: the counts here are exact, whatever the batch holds.
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

/* A writes n times into B (signaled); B sends m messages to A, which has
 * m receives posted. Nothing is polled. */
static void traffic(int n, int m)
{
	struct ibv_send_wr *bad;
	struct ibv_recv_wr *rbad;

	for (int i = 0; i < m; i++) {
		struct ibv_sge rs = { .addr = (uintptr_t)a.buf + 1024, .length = 64, .lkey = a.mr->lkey };
		struct ibv_recv_wr r = { .wr_id = 500 + i, .sg_list = &rs, .num_sge = 1 };
		struct ibv_sge ss = { .addr = (uintptr_t)b.buf, .length = 64, .lkey = b.mr->lkey };
		struct ibv_send_wr s = { .wr_id = 600 + i, .sg_list = &ss, .num_sge = 1,
					 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };

		assert_int_equal(ibv_post_recv(a.qp, &r, &rbad), 0);
		assert_int_equal(ibv_post_send(b.qp, &s, &bad), 0);
	}
	for (int i = 0; i < n; i++) {
		struct ibv_sge s = { .addr = (uintptr_t)a.buf, .length = 64, .lkey = a.mr->lkey };
		struct ibv_send_wr w = { .wr_id = 700 + i, .sg_list = &s, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
					 .wr.rdma = { .remote_addr = (uintptr_t)b.buf + 2048,
						      .rkey = b.mr->rkey } };

		assert_int_equal(ibv_post_send(a.qp, &w, &bad), 0);
	}
	sim_world_run_until_idle(pair.world);
}

static void test_batches_retire_exactly(void **state)
{
	struct ibv_wc wc[16];
	(void)state;

	sim_pair_open(&pair, &a, &b, "poll", 0);
	sim_pair_connect(&pair);
	struct shift_dqp *d = shift_dqp_of_qp(a.qp);

	assert_non_null(d);
	/* one completion: the poll now knows A's QP */
	traffic(1, 0);
	assert_int_equal(ibv_poll_cq(a.cq, 1, wc), 1);
	uint64_t rq = d->rq_tail, sig = d->sig_tail;

	/* 3 writes and 3 receives, polled 4 then 2 at a time: mixed batches
	 * of the cached QP */
	traffic(3, 3);
	assert_int_equal(ibv_poll_cq(a.cq, 4, wc), 4);
	assert_int_equal(ibv_poll_cq(a.cq, 4, wc + 4), 2);
	int recvs = 0;

	for (int i = 0; i < 6; i++) {
		assert_int_equal(wc[i].status, IBV_WC_SUCCESS);
		recvs += wc[i].opcode == IBV_WC_RECV;
	}
	assert_int_equal(recvs, 3);
	assert_true(d->rq_tail == rq + 3 && d->sig_tail == sig + 3);

	/* 9 at once: more than one batch takes, through the loop */
	traffic(5, 4);
	assert_int_equal(ibv_poll_cq(a.cq, 16, wc), 9);
	assert_true(d->rq_tail == rq + 7 && d->sig_tail == sig + 8);

	/* 8 at once: the largest batch taken in one go */
	traffic(5, 3);
	assert_int_equal(ibv_poll_cq(a.cq, 8, wc), 8);
	assert_true(d->rq_tail == rq + 10 && d->sig_tail == sig + 13);
	rq += 3;
	sig += 5;

	/* receives only */
	traffic(0, 3);
	assert_int_equal(ibv_poll_cq(a.cq, 16, wc), 3);
	assert_true(d->rq_tail == rq + 10 && d->sig_tail == sig + 8);
	/* B's sends, its first poll (no QP known yet): through the loop */
	assert_int_equal(ibv_poll_cq(b.cq, 16, wc), 3 + 4 + 3 + 3);
	sim_pair_close(&pair);
}

/* A second connected QP pair on the same contexts, A's side on A's CQ. */
static void open_second(struct sim_ep *a2, struct sim_ep *b2)
{
	struct ibv_qp_init_attr ia = { .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 64, .max_recv_wr = 64,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	struct sim_ep_info i2, j2;

	*a2 = a;
	*b2 = b;
	ia.send_cq = ia.recv_cq = a.cq;
	a2->qp = a.v->create_qp(a.pd, &ia);
	ia.send_cq = ia.recv_cq = b.cq;
	b2->qp = b.v->create_qp(b.pd, &ia);
	assert_non_null(a2->qp);
	assert_non_null(b2->qp);
	sim_ep_info(a2, 7, &i2);
	sim_ep_info(b2, 8, &j2);
	assert_int_equal(sim_ep_connect(a2, &i2, &j2, NULL), 0);
	assert_int_equal(sim_ep_connect(b2, &j2, &i2, NULL), 0);
	for (int i = 0; i < 4; i++)
		shift_rnic_pass_all();
}

/* n signaled writes from A's side of e into B's buffer. */
static void writes(struct sim_ep *e, int n)
{
	struct ibv_send_wr *bad;

	for (int i = 0; i < n; i++) {
		struct ibv_sge s = { .addr = (uintptr_t)a.buf, .length = 64, .lkey = a.mr->lkey };
		struct ibv_send_wr w = { .wr_id = 900 + i, .sg_list = &s, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
					 .wr.rdma = { .remote_addr = (uintptr_t)b.buf + 4096,
						      .rkey = b.mr->rkey } };

		assert_int_equal(ibv_post_send(e->qp, &w, &bad), 0);
	}
}

/*
 * A batch mixing two QPs of one CQ, one QP number's bits a subset of the
 * other's (the simulator numbers QPs in order: 0x100 and 0x101), the
 * cached QP being the one with more bits: every completion's QP ORed
 * together is then the cached QP's number, and only the AND tells the
 * other QP's completions apart. Each QP retires exactly its own.
 */
static void test_mixed_qps_retire_their_own(void **state)
{
	struct ibv_wc wc[16];
	struct sim_ep a2, b2;
	(void)state;

	sim_pair_open(&pair, &a, &b, "poll2", 0);
	sim_pair_connect(&pair);
	open_second(&a2, &b2);
	struct sim_ep *sup = &a, *sub = &a2;

	if ((a.qp->qp_num | a2.qp->qp_num) == a2.qp->qp_num) {
		sup = &a2;
		sub = &a;
	}
	assert_int_equal(sup->qp->qp_num | sub->qp->qp_num, sup->qp->qp_num);
	struct shift_dqp *ds = shift_dqp_of_qp(sup->qp), *dt = shift_dqp_of_qp(sub->qp);

	assert_non_null(ds);
	assert_non_null(dt);
	/* the poll caches sup's QP */
	writes(sup, 1);
	sim_world_run_until_idle(pair.world);
	assert_int_equal(ibv_poll_cq(a.cq, 1, wc), 1);
	assert_int_equal(wc[0].qp_num, sup->qp->qp_num);
	uint64_t s0 = ds->sig_tail, t0 = dt->sig_tail;

	writes(sub, 1);
	writes(sup, 2);
	sim_world_run_until_idle(pair.world);
	assert_int_equal(ibv_poll_cq(a.cq, 4, wc), 3);
	assert_int_equal(ds->sig_tail, s0 + 2);
	assert_int_equal(dt->sig_tail, t0 + 1);
	/* and sup's alone, after: still one batch, still exact */
	writes(sup, 3);
	sim_world_run_until_idle(pair.world);
	assert_int_equal(ibv_poll_cq(a.cq, 4, wc), 3);
	assert_int_equal(ds->sig_tail + dt->sig_tail, s0 + t0 + 6);
	for (int i = 0; i < 3; i++)
		assert_int_equal(wc[i].status, IBV_WC_SUCCESS);
	a.v->destroy_qp(a2.qp);
	b.v->destroy_qp(b2.qp);
	sim_pair_close(&pair);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_batches_retire_exactly),
		cmocka_unit_test(test_mixed_qps_retire_their_own),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
