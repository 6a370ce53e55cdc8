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

	/* receives only */
	traffic(0, 3);
	assert_int_equal(ibv_poll_cq(a.cq, 16, wc), 3);
	assert_true(d->rq_tail == rq + 10 && d->sig_tail == sig + 8);
	/* B's sends, its first poll (no QP known yet): through the loop */
	assert_int_equal(ibv_poll_cq(b.cq, 16, wc), 3 + 4 + 3);
	sim_pair_close(&pair);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_batches_retire_exactly),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
