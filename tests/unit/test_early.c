/*
 * Completions a fast poll hands over to the slow path (struct shift_early,
 * shift/fo/poll.c). A poll that found an error among the completions it
 * took from the provider waits for the slow path's locks holding them;
 * meanwhile the background pass may drain the same CQ for a failover. The
 * drain must take the handed-over ones first: they are older than anything
 * still in the provider's CQ. Before, it judged the failover on what was
 * left (the handed-over successes not counted: WRs they completed were
 * retransmitted; with an atomic in flight, the provider's own flushes went
 * to the application after SHIFT's: duplicate completions). Found by the
 * campaign with SHIFT's real threads (sim_campaign_threads_mix).
 *
 * Here the test is that poll: it takes A's completions with the provider's
 * own poll and links them in the context's early list as the poll does,
 * then runs the background pass that fails A's QP over (its port down).
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
#include "shift/dp/dqp.h"

static struct sim_world *world;
static struct sim_host *host[2];
static struct sim_ep a, b;
static struct sim_pair pair;

static int setup(void **state)
{
	(void)state;
	sim_pair_open(&pair, &a, &b, "early", 0);
	world = pair.world;
	host[0] = pair.host[0];
	host[1] = pair.host[1];
	sim_pair_connect(&pair);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	sim_pair_close(&pair);
	return 0;
}

static void post_write(int i, bool signaled)
{
	struct ibv_sge sge = { .addr = (uintptr_t)a.buf + 256 * i, .length = 256, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1000 + i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = signaled ? IBV_SEND_SIGNALED : 0,
		.wr.rdma = { .remote_addr = (uintptr_t)b.buf + 256 * i, .rkey = b.mr->rkey },
	}, *bad;

	memset(a.buf + 256 * i, 'a' + i % 26, 256);
	assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
}

/* Writes 0..7 complete at the provider (not polled); 8..15 are posted and
 * A's default NIC dies before they go out. The handed-over batch holds the
 * completions of 3 and 7. The port watch's failover drains A's CQ: it must
 * take the batch first, count 3 and 7 done, retransmit only 8..15, and the
 * application gets 1003, 1007, 1011, 1015 once each, in order. */
static void test_drain_takes_handed_over_completions_first(void **state)
{
	struct shift_ctx *s = shift_ctx_of(a.ctx);
	struct shift_dqp *d = shift_dqp_of_qp(a.qp);
	struct ibv_wc held[16], wa[32];
	int na = 0;
	(void)state;

	assert_non_null(s);
	assert_non_null(d);
	for (int i = 0; i < 8; i++)
		post_write(i, i % 4 == 3);
	for (int i = 0; i < 1000 && sim_world_step(world); i++)
		;
	for (int i = 8; i < 16; i++)
		post_write(i, i % 4 == 3);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);

	/* the fast poll: the provider's completions, then the handover */
	int n = s->poll_cq(a.cq, 16, held);

	assert_int_equal(n, 2);
	assert_int_equal(held[0].wr_id, 1003);
	assert_int_equal(held[1].wr_id, 1007);
	struct shift_early e = { .next = NULL, .cq = a.cq, .wc = held, .n = (unsigned)n };

	s->early = &e;
	/* the port watch fails the QP over (8 passes, shift_inline.h) */
	for (int i = 0; i < 12 && d->failovers == 0; i++)
		shift_rnic_pass_all();
	assert_int_equal(d->failovers, 1);
	assert_int_equal(e.taken, e.n); /* the drain took them */
	s->early = NULL;                 /* (the poll, once it has the locks) */

	for (int idle = 0; idle < 3;) {
		int moved = sim_world_step(world) != 0;

		shift_rnic_pass_all();
		if (sim_pair_poll1("A", &a, &wa[na])) {
			assert_true(na < 31);
			na++;
			moved = 1;
		}
		struct ibv_wc wb;

		moved |= sim_pair_poll1("B", &b, &wb);
		idle = moved ? 0 : idle + 1;
	}
	assert_int_equal(na, 4);
	for (int k = 0; k < na; k++) {
		assert_int_equal(wa[k].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[k].wr_id, 1000 + 4 * k + 3);
	}
	/* 8..15 went again, 0..7 did not (3 and 7 counted done) */
	assert_int_equal(d->retransmitted, 8);
	for (int i = 0; i < 16; i++)
		assert_int_equal(b.buf[256 * i], 'a' + i % 26);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_drain_takes_handed_over_completions_first, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
