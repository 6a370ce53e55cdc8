/*
 * Unit tests of failover (shift/failover.c) on the simulated RNIC: two
 * hosts with two NICs, the application on NIC 0 of each through SHIFT, the
 * default NIC of host A killed mid-traffic. The application must see every
 * completion it expects, with its own wr_ids and QP number, no error, and
 * the bytes at the peer; an atomic in flight must surface as an error
 * instead; QP error events of a failed-over QP must not reach it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "kv/kv.h"
#include "sim_pair.h"
#include "shift/dp/ctx.h"
#include "shift/shadow/exchange.h"
#include "shift/shadow/svc.h"
#include "shift/shadow/types.h"

static struct sim_world *world;
static struct sim_host *host[2];
static struct sim_ep a, b;

static struct sim_pair pair;

static int setup(void **state)
{
	(void)state;
	sim_pair_open(&pair, &a, &b, "failover", 0);
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

/* Run the network, SHIFT's background pass and both applications' polls
 * until nothing moves; collect what each application sees. A poll error,
 * an error completion the test did not announce (sim_pair_expect_errors)
 * or more completions than fit fail the test. */
static int drive(struct ibv_wc *wa, int max_a, int *na, struct ibv_wc *wb, int max_b, int *nb)
{
	int idle = 0;

	while (idle < 3) {
		int moved = 0;

		moved += sim_world_step(world) != 0;
		shift_rnic_pass_all();
		if (sim_pair_poll1("A", &a, wa + *na)) {
			if (*na == max_a - 1)
				fail_msg("A: more than %d completions", max_a - 1);
			(*na)++;
			moved++;
		}
		if (sim_pair_poll1("B", &b, wb + *nb)) {
			if (*nb == max_b - 1)
				fail_msg("B: more than %d completions", max_b - 1);
			(*nb)++;
			moved++;
		}
		idle = moved ? 0 : idle + 1;
	}
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

/* A signaled fetch-and-add of 1 (wr_id 42) from A on B's buffer at 4096. */
static void post_fetch_add_42(void)
{
	struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = 8, .lkey = a.mr->lkey };
	struct ibv_send_wr *bad, wr = {
		.wr_id = 42, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.atomic = { .remote_addr = (uintptr_t)b.buf + 4096, .compare_add = 1,
			       .rkey = b.mr->rkey },
	};

	assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
}

/* B's application posts receives from..to-1 of 64 bytes (wr_id 500 + i). */
static void post_b_recvs_from(int from, int to)
{
	for (int i = from; i < to; i++) {
		struct ibv_sge rs = { .addr = (uintptr_t)b.buf + 64 * i, .length = 64, .lkey = b.mr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 500 + i, .sg_list = &rs, .num_sge = 1 }, *bad_r;

		assert_int_equal(ibv_post_recv(b.qp, &rwr, &bad_r), 0);
	}
}

static void post_b_recvs(int n)
{
	post_b_recvs_from(0, n);
}

/* n writes of post_write(i, i % 4 == 3) done: every signaled one completed
 * to A, in order, successfully, as posted, and the bytes are at B. */
static void assert_writes_done(const struct ibv_wc *wa, int na, int n)
{
	assert_int_equal(na, n / 4);
	for (int k = 0; k < na; k++) {
		assert_int_equal(wa[k].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[k].wr_id, 1000 + 4 * k + 3);
		assert_int_equal(wa[k].qp_num, a.qp->qp_num);
	}
	for (int i = 0; i < n; i++)
		for (int j = 0; j < 256; j++)
			assert_int_equal(b.buf[256 * i + j], 'a' + i % 26);
}

static void test_writes_survive_nic_death(void **state)
{
	struct ibv_wc wa[128], wb[128];
	int na = 0, nb = 0;
	(void)state;

	for (int i = 0; i < 8; i++)
		post_write(i, i % 4 == 3);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	for (int i = 8; i < 16; i++)
		post_write(i, i % 4 == 3);
	drive(wa, 128, &na, wb, 128, &nb);
	assert_writes_done(wa, na, 16);
	assert_int_equal(nb, 0);
}

static void test_sends_survive_with_receives_in_order(void **state)
{
	struct ibv_wc wa[128], wb[128];
	int na = 0, nb = 0;
	struct ibv_send_wr *bad_s;
	(void)state;

	post_b_recvs(12);
	for (int i = 0; i < 12; i++) {
		struct ibv_sge ss = { .addr = (uintptr_t)a.buf + 64 * i, .length = 64, .lkey = a.mr->lkey };
		struct ibv_send_wr swr = { .wr_id = 700 + i, .sg_list = &ss, .num_sge = 1,
					   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
		memset(a.buf + 64 * i, 'A' + i, 64);
		assert_int_equal(ibv_post_send(a.qp, &swr, &bad_s), 0);
		if (i == 4)
			sim_dev_kill(sim_host_dev(host[1], 0), 0); /* the receiver's NIC */
	}
	drive(wa, 128, &na, wb, 128, &nb);
	assert_int_equal(na, 12);
	assert_int_equal(nb, 12);
	for (int i = 0; i < 12; i++) {
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[i].wr_id, 700 + i);
		assert_int_equal(wb[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wb[i].wr_id, 500 + i); /* each receive once, in order */
		assert_int_equal(wb[i].qp_num, b.qp->qp_num);
		assert_int_equal(b.buf[64 * i], 'A' + i);
	}
}

/*
 * Failed-post detection. With a provider that refuses posts on a QP in ERR,
 * A's device fails (its QPs go to ERR; nothing outstanding, so no error
 * completion) and
 * the application posts more writes: the posts succeed, the QP fails over
 * on the refusal, and every write lands and completes once.
 */
static void test_refused_post_on_failed_qp_fails_over(void **state)
{
	struct ibv_wc wa[128], wb[128];
	int na = 0, nb = 0;
	(void)state;

	sim_world_set_refuse_posts_in_err(world, 1);
	for (int i = 0; i < 4; i++)
		post_write(i, i == 3);
	drive(wa, 128, &na, wb, 128, &nb);
	assert_int_equal(na, 1);
	sim_dev_kill(sim_host_dev(host[0], 0), 1);
	for (int i = 4; i < 12; i++)
		post_write(i, i % 4 == 3); /* (asserts the post succeeds) */
	drive(wa, 128, &na, wb, 128, &nb);
	assert_writes_done(wa, na, 12);
	assert_int_equal(nb, 0);
}

/* The same for receives: B's device fails with nothing posted; B's
 * receives are refused, kept, and consumed on the backup by A's sends, in
 * order. */
static void test_refused_recv_on_failed_qp_fails_over(void **state)
{
	struct ibv_wc wa[128], wb[128];
	int na = 0, nb = 0;
	struct ibv_send_wr *bad_s;
	(void)state;

	sim_world_set_refuse_posts_in_err(world, 1);
	sim_dev_kill(sim_host_dev(host[1], 0), 1);
	post_b_recvs(6); /* (asserts the posts succeed) */
	for (int i = 0; i < 6; i++) {
		struct ibv_sge ss = { .addr = (uintptr_t)a.buf + 64 * i, .length = 64, .lkey = a.mr->lkey };
		struct ibv_send_wr swr = { .wr_id = 700 + i, .sg_list = &ss, .num_sge = 1,
					   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
		memset(a.buf + 64 * i, 'A' + i, 64);
		assert_int_equal(ibv_post_send(a.qp, &swr, &bad_s), 0);
	}
	drive(wa, 128, &na, wb, 128, &nb);
	assert_int_equal(na, 6);
	assert_int_equal(nb, 6);
	for (int i = 0; i < 6; i++) {
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[i].wr_id, 700 + i);
		assert_int_equal(wb[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wb[i].wr_id, 500 + i);
		assert_int_equal(b.buf[64 * i], 'A' + i);
	}
}

/* A refusal on a QP that has not failed (here an opcode the provider does
 * not support) is the application's: the error as without SHIFT, the
 * mirror unchanged (the next WRs and a later failover are unaffected). */
static void test_refused_post_on_healthy_qp_is_the_apps(void **state)
{
	struct ibv_wc wa[128], wb[128];
	int na = 0, nb = 0;
	struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = 8, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 99, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED },
			   *bad = NULL;
	(void)state;

	sim_world_set_refuse_posts_in_err(world, 1);
	assert_int_equal(ibv_post_send(a.qp, &wr, &bad), EINVAL);
	assert_ptr_equal(bad, &wr);
	for (int i = 0; i < 4; i++)
		post_write(i, i == 3);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	for (int i = 4; i < 8; i++)
		post_write(i, i == 7);
	drive(wa, 128, &na, wb, 128, &nb);
	assert_int_equal(na, 2);
	assert_int_equal(wa[0].wr_id, 1003);
	assert_int_equal(wa[1].wr_id, 1007);
	assert_int_equal(wa[0].status, IBV_WC_SUCCESS);
	assert_int_equal(wa[1].status, IBV_WC_SUCCESS);
	for (int i = 0; i < 8; i++)
		assert_int_equal(b.buf[256 * i], 'a' + i % 26);
}

/*
 * An RDMA READ executed at the peer whose response was lost, then a SEND
 * the peer executed whose ACK was lost, then the NIC dies: the handshake
 * counts the SEND as executed, so it is not sent again, but the READ's
 * data never arrived: it must be read again, and complete before the SEND.
 */
static void test_read_before_executed_send_is_read_again(void **state)
{
	struct ibv_wc wa[16], wb[16];
	int na = 0, nb = 0;
	struct ibv_send_wr *bad;
	(void)state;

	post_b_recvs(2);
	memset(b.buf + 8192, 0x5a, 512);
	memset(a.buf + 8192, 0, 512);
	struct ibv_sge rs = { .addr = (uintptr_t)a.buf + 8192, .length = 512, .lkey = a.mr->lkey };
	struct ibv_send_wr rd = { .wr_id = 900, .sg_list = &rs, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = (uintptr_t)b.buf + 8192,
					       .rkey = b.mr->rkey } };
	struct ibv_sge ss = { .addr = (uintptr_t)a.buf, .length = 64, .lkey = a.mr->lkey };
	struct ibv_send_wr sd = { .wr_id = 901, .sg_list = &ss, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };

	memset(a.buf, 'S', 64);
	sim_qp_drop_next(b.qp, 1, 2); /* the READ's response, the SEND's ACK */
	assert_int_equal(ibv_post_send(a.qp, &rd, &bad), 0);
	assert_int_equal(ibv_post_send(a.qp, &sd, &bad), 0);
	for (int i = 0; i < 6; i++)
		sim_world_step(world);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	drive(wa, 16, &na, wb, 16, &nb);
	assert_int_equal(nb, 1); /* the SEND once */
	assert_int_equal(wb[0].wr_id, 500);
	assert_int_equal(b.buf[0], 'S');
	assert_int_equal(na, 2);
	assert_int_equal(wa[0].wr_id, 900); /* in order */
	assert_int_equal(wa[0].status, IBV_WC_SUCCESS);
	assert_int_equal(wa[0].opcode, IBV_WC_RDMA_READ);
	assert_int_equal(wa[1].wr_id, 901);
	assert_int_equal(wa[1].opcode, IBV_WC_SEND);
	for (int i = 0; i < 512; i++)
		assert_int_equal(a.buf[8192 + i], 0x5a); /* the data is here */
}

/* Network, background passes and both applications' polls for a fixed
 * number of rounds: the recovery probe runs every few passes, so waiting
 * for "idle" is not enough here. Polls fail the test as in drive(). */
static void drive_rounds(int rounds, struct ibv_wc *wa, int max_a, int *na, struct ibv_wc *wb,
			 int max_b, int *nb)
{
	for (int r = 0; r < rounds; r++) {
		sim_world_step(world);
		shift_rnic_pass_all();
		if (*na < max_a && sim_pair_poll1("A", &a, wa + *na))
			(*na)++;
		if (*nb < max_b && sim_pair_poll1("B", &b, wb + *nb))
			(*nb)++;
	}
}

static void post_sends(int from, int to)
{
	for (int i = from; i < to; i++) {
		struct ibv_sge ss = { .addr = (uintptr_t)a.buf + 64 * i, .length = 64, .lkey = a.mr->lkey };
		struct ibv_send_wr swr = { .wr_id = 700 + i, .sg_list = &ss, .num_sge = 1,
					   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
		memset(a.buf + 64 * i, 'A' + i, 64);
		assert_int_equal(ibv_post_send(a.qp, &swr, &bad), 0);
	}
}

/*
 * Failover, recovery, failback: after the default NIC comes back, both
 * directions return to the default QPs and the backups are re-armed. Proof
 * that later traffic really runs on the default NICs: both backup NICs are
 * killed before it is posted, and it still completes, in order, with the
 * receives the application posted while failed over.
 */
static void test_failback_after_recovery(void **state)
{
	struct ibv_wc wa[64], wb[64];
	int na = 0, nb = 0;
	(void)state;

	post_b_recvs(24);
	post_sends(0, 4);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	post_sends(4, 8);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 8);
	assert_int_equal(nb, 8);
	struct shift_dqp *da = shift_dqp_of_qp(a.qp), *db = shift_dqp_of_qp(b.qp);
	assert_non_null(da);
	assert_non_null(db);
	assert_int_equal(da->failovers, 1);
	assert_int_not_equal(da->send_state, SHIFT_SEND_DEFAULT);

	sim_dev_revive(sim_host_dev(host[0], 0));
	drive_rounds(4000, wa, 64, &na, wb, 64, &nb);
	assert_int_equal(da->send_state, SHIFT_SEND_DEFAULT);
	assert_int_equal(da->recv_state, SHIFT_RECV_DEFAULT);
	assert_int_equal(db->send_state, SHIFT_SEND_DEFAULT);
	assert_int_equal(db->recv_state, SHIFT_RECV_DEFAULT);
	assert_int_equal(da->failbacks, 1);
	assert_false(da->need_rearm);
	assert_false(db->need_rearm);

	sim_dev_kill(sim_host_dev(host[0], 1), 0);
	sim_dev_kill(sim_host_dev(host[1], 1), 0);
	post_sends(8, 16);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 16);
	assert_int_equal(nb, 16);
	for (int i = 0; i < 16; i++) {
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[i].wr_id, 700 + i);
		assert_int_equal(wb[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wb[i].wr_id, 500 + i);
		assert_int_equal(wb[i].qp_num, b.qp->qp_num);
		assert_int_equal(b.buf[64 * i], 'A' + i);
	}
	assert_int_equal(da->failovers, 1);
}

/* Like setup(), but B's application leaves its QP at RTR: it only
 * receives (a perftest write or read server does the same). */
static int setup_b_rtr(void **state)
{
	struct sim_ep_conn rtr = { 14, 7, 7, 12, 16, 1 };
	struct shift_qp_info qi;

	(void)state;
	sim_pair_open(&pair, &a, &b, "failover", 0);
	world = pair.world;
	host[0] = pair.host[0];
	host[1] = pair.host[1];
	assert_int_equal(sim_ep_connect(&a, &pair.ia, &pair.ib, NULL), 0);
	assert_int_equal(sim_ep_connect(&b, &pair.ib, &pair.ia, &rtr), 0);
	for (int i = 0; i < 4; i++)
		shift_rnic_pass_all();
	assert_int_equal(shift_shadow_qp_info(a.qp, &qi), 0);
	assert_int_equal(qi.state, SHIFT_SHADOW_READY);
	return 0;
}

/*
 * After a failback towards a peer that never sends (so never notifies),
 * SHIFT's own receive for a notification stays posted on the default QP.
 * When the application then ends the connection itself (modify to ERR, as
 * a disconnect does), that receive's flush must not reach it: it would see
 * a completion with a wr_id it never posted (the checker's "completion
 * with an unknown wr_id" at the end of a soft-RoCE run).
 */
static void test_disconnect_after_failback_hides_shift_wrs(void **state)
{
	struct ibv_wc wa[64], wb[64];
	int na = 0, nb = 0;
	(void)state;

	for (int i = 0; i < 8; i++)
		post_write(i, i % 4 == 3);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 2);
	sim_dev_revive(sim_host_dev(host[0], 0));
	drive_rounds(4000, wa, 64, &na, wb, 64, &nb);
	struct shift_dqp *da = shift_dqp_of_qp(a.qp);
	assert_int_equal(da->failovers, 1);
	assert_int_equal(da->failbacks, 1);
	assert_int_equal(da->send_state, SHIFT_SEND_DEFAULT);
	for (int i = 8; i < 16; i++)
		post_write(i, i % 4 == 3);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 4);

	/* A's application disconnects: nothing of its own is outstanding */
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	assert_int_equal(shift_verbs.modify_qp(a.qp, &err, IBV_QP_STATE), 0);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 4);
	for (int i = 0; i < na; i++) {
		assert_int_equal(wa[i].wr_id, 1000 + 4 * i + 3);
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
	}
	assert_int_equal(nb, 0);
	for (int i = 0; i < 16; i++)
		assert_int_equal(b.buf[256 * i], 'a' + i % 26);
}

static void post_reads(int from, int to)
{
	for (int i = from; i < to; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)a.buf + 8192 + 64 * i, .length = 64,
				       .lkey = a.mr->lkey };
		struct ibv_send_wr wr = {
			.wr_id = 900 + i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
			.send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = (uintptr_t)b.buf + 64 * i, .rkey = b.mr->rkey },
		}, *bad;
		memset(b.buf + 64 * i, 'r' + i % 8, 64);
		assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
	}
}

/*
 * Read failback on soft-RoCE: A's default QP fails with READs outstanding
 * and, as rxe does, its completer stays "inside a read response" across
 * the reset (sim opts.rxe_stale_read): the first ACK it gets completes its
 * WR with success and fails the QP. With a WRITE probe that was the probe,
 * and the notification after it was flushed: a new failover every time,
 * never back. SHIFT's empty READ first clears it: one failover, one
 * failback, and later reads complete on the default NICs (backups dead).
 */
static void test_read_failback_after_stale_read_state(void **state)
{
	struct ibv_wc wa[64], wb[8];
	int na = 0, nb = 0;
	(void)state;

	sim_world_set_rxe_stale_read(world, 1);
	post_reads(0, 6);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	post_reads(6, 10);
	drive(wa, 64, &na, wb, 8, &nb);
	assert_int_equal(na, 10);
	struct shift_dqp *da = shift_dqp_of_qp(a.qp), *db = shift_dqp_of_qp(b.qp);
	assert_non_null(da);
	assert_non_null(db);
	assert_int_equal(da->failovers, 1);
	assert_true(da->dflt_rd_stale);

	sim_dev_revive(sim_host_dev(host[0], 0));
	drive_rounds(4000, wa, 64, &na, wb, 8, &nb);
	assert_int_equal(da->send_state, SHIFT_SEND_DEFAULT);
	assert_int_equal(db->send_state, SHIFT_SEND_DEFAULT);
	assert_int_equal(da->failovers, 1);
	assert_int_equal(da->failbacks, 1);
	assert_false(da->dflt_rd_stale);
	assert_false(da->need_rearm);

	sim_dev_kill(sim_host_dev(host[0], 1), 0);
	sim_dev_kill(sim_host_dev(host[1], 1), 0);
	post_reads(10, 20);
	drive(wa, 64, &na, wb, 8, &nb);
	assert_int_equal(na, 20);
	assert_int_equal(nb, 0);
	for (int i = 0; i < 20; i++) {
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[i].wr_id, 900 + i);
		assert_int_equal(wa[i].qp_num, a.qp->qp_num);
		assert_memory_equal(a.buf + 8192 + 64 * i, b.buf + 64 * i, 64);
	}
	assert_int_equal(da->failovers, 1);
}

/*
 * A port that goes DOWN with no error completion at all (soft-RoCE on a cut
 * link retries for ever): the background thread's port watch alone fails
 * the QP over. No network step runs between the kill and the check, so no
 * timeout and no error completion can have started it.
 */
static void test_port_down_fails_over_without_error(void **state)
{
	struct ibv_wc wa[128], wb[128];
	int na = 0, nb = 0;
	struct shift_dqp *da = shift_dqp_of_qp(a.qp);
	(void)state;

	assert_non_null(da);
	for (int i = 0; i < 8; i++)
		post_write(i, i % 4 == 3);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	uint64_t errs = sim_world_stats(world)->err_completions;

	/* watch off: passes alone change nothing */
	unsigned saved = shift_config.port_down_ms;
	shift_config.port_down_ms = 0;
	for (int i = 0; i < 6; i++)
		shift_rnic_pass_all();
	assert_int_equal(da->send_state, SHIFT_SEND_DEFAULT);
	assert_int_equal(da->failovers, 0);

	/* watch on (8 passes of the logical clock, tests/sim/fixture/shift_inline.h) */
	shift_config.port_down_ms = saved ? saved : 8;
	for (int i = 0; i < 10; i++)
		shift_rnic_pass_all();
	assert_int_not_equal(da->send_state, SHIFT_SEND_DEFAULT);
	assert_int_equal(da->failovers, 1);
	assert_int_equal(sim_world_stats(world)->err_completions, errs);

	for (int i = 8; i < 16; i++)
		post_write(i, i % 4 == 3);
	drive(wa, 128, &na, wb, 128, &nb);
	assert_int_equal(na, 4);
	for (int k = 0; k < na; k++) {
		assert_int_equal(wa[k].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[k].wr_id, 1000 + 4 * k + 3);
	}
	for (int i = 0; i < 16; i++)
		for (int j = 0; j < 256; j++)
			assert_int_equal(b.buf[256 * i + j], 'a' + i % 26);
	shift_config.port_down_ms = saved;
}

/*
 * The peer starts beside me: A's port goes down, and A's record of the
 * failover it starts reaches B as a datagram ahead of A's handshake
 * message. With no network step at all (the simulated RNIC delivers a
 * datagram at its post, an RC message only when the network runs), B's QP
 * has left the Default state, in failover 1 like A's; without datagrams it
 * waits for A's message. Then every write arrives, once, in order.
 */
static void port_down_peer_starts(bool datagrams)
{
	struct ibv_wc wa[128], wb[128];
	int na = 0, nb = 0;
	struct shift_dqp *da = shift_dqp_of_qp(a.qp), *db = shift_dqp_of_qp(b.qp);
	unsigned saved = shift_config.port_down_ms;

	assert_non_null(da);
	assert_non_null(db);
	for (int i = 0; i < 8; i++)
		post_write(i, i % 4 == 3);
	drive(wa, 128, &na, wb, 128, &nb);
	assert_int_equal(na, 2);
	if (!datagrams) {
		for (int k = 0; k < SHIFT_SVC_PATHS; k++)
			db->shadow->svc_ok[k] = da->shadow->svc_ok[k] = false;
	}
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	shift_config.port_down_ms = saved ? saved : 8;
	for (int i = 0; i < 12; i++)
		shift_rnic_pass_all();
	assert_int_equal(da->failovers, 1);
	assert_int_not_equal(da->send_state, SHIFT_SEND_DEFAULT);
	if (datagrams) {
		assert_int_equal(db->failovers, 1);
		assert_int_not_equal(db->send_state, SHIFT_SEND_DEFAULT);
	} else {
		assert_int_equal(db->failovers, 0);
		assert_int_equal(db->send_state, SHIFT_SEND_DEFAULT);
	}
	for (int i = 8; i < 16; i++)
		post_write(i, i % 4 == 3);
	drive(wa, 128, &na, wb, 128, &nb);
	assert_int_equal(db->failovers, 1);
	assert_writes_done(wa, na, 16);
	shift_config.port_down_ms = saved;
}

/*
 * A start that gives up after its record went out: A's write with a bad
 * rkey failed (its error still in A's CQ, B's QP in ERR as the responder,
 * as plain) when A's port goes down. A's record reaches B, whose QP joins;
 * A's drain then finds the application's error and gives the QP up. A
 * tells B (ABORT), so neither end waits: A's application gets the remote
 * access error and its later WRs flushed, B's its receives flushed, as
 * plain; B's QP is not left failed over for a failover A never did.
 */
static void test_port_down_start_given_up_after_its_record(void **state)
{
	struct ibv_wc wa[64], wb[64];
	int na = 0, nb = 0;
	struct shift_dqp *da = shift_dqp_of_qp(a.qp), *db = shift_dqp_of_qp(b.qp);
	unsigned saved = shift_config.port_down_ms;
	struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = 64, .lkey = a.mr->lkey };
	struct ibv_send_wr *bad, wr = {
		.wr_id = 77, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)b.buf, .rkey = b.mr->rkey + 1000 },
	};
	(void)state;

	post_b_recvs(4);
	assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
	for (int i = 0; i < 200; i++)
		sim_world_step(world); /* (no pass, no poll: the error waits in A's CQ) */
	unsigned long sent = shift_stats.dgrams_sent;

	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	shift_config.port_down_ms = saved ? saved : 8;
	for (int i = 0; i < 12; i++)
		shift_rnic_pass_all();
	assert_true(shift_stats.dgrams_sent > sent); /* (A's record of its start) */
	assert_int_equal(da->send_state, SHIFT_SEND_UNPROTECTED);
	sim_pair_expect_errors(5);
	drive(wa, 64, &na, wb, 64, &nb);
	shift_config.port_down_ms = saved;
	assert_int_equal(na, 1);
	assert_int_equal(wa[0].wr_id, 77);
	assert_int_equal(wa[0].status, IBV_WC_REM_ACCESS_ERR);
	assert_int_equal(nb, 4);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(wb[i].wr_id, 500 + i);
		assert_int_equal(wb[i].status, IBV_WC_WR_FLUSH_ERR);
	}
	assert_int_not_equal(db->send_state, SHIFT_SEND_FALLBACK);
	assert_int_not_equal(db->send_state, SHIFT_SEND_WAIT_SIGNALED);
}

static void test_port_down_peer_starts_beside(void **state)
{
	(void)state;
	port_down_peer_starts(true);
}

static void test_port_down_peer_waits_without_datagrams(void **state)
{
	(void)state;
	port_down_peer_starts(false);
}

/*
 * Repeated cycles: fail over, fail back, fail over again on the re-armed
 * backup, fail back again. Every send completes once, in order, on both
 * sides, with the bytes at the receiver.
 */
static void test_failover_failback_twice(void **state)
{
	struct ibv_wc wa[64], wb[64];
	int na = 0, nb = 0;
	struct shift_dqp *da = shift_dqp_of_qp(a.qp), *db = shift_dqp_of_qp(b.qp);
	(void)state;

	post_b_recvs(32);
	for (int cycle = 0; cycle < 2; cycle++) {
		int base = 16 * cycle;

		post_sends(base, base + 4);
		sim_dev_kill(sim_host_dev(host[0], 0), 0);
		post_sends(base + 4, base + 8);
		drive(wa, 64, &na, wb, 64, &nb);
		assert_int_equal(na, base + 8);
		assert_int_equal(nb, base + 8);
		assert_int_equal(da->failovers, cycle + 1);
		sim_dev_revive(sim_host_dev(host[0], 0));
		drive_rounds(4000, wa, 64, &na, wb, 64, &nb);
		assert_int_equal(da->failbacks, cycle + 1);
		assert_false(da->need_rearm);
		assert_false(db->need_rearm);
		post_sends(base + 8, base + 16);
		drive(wa, 64, &na, wb, 64, &nb);
		assert_int_equal(na, base + 16);
		assert_int_equal(nb, base + 16);
	}
	for (int i = 0; i < 32; i++) {
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[i].wr_id, 700 + i);
		assert_int_equal(wb[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wb[i].wr_id, 500 + i);
		assert_int_equal(b.buf[64 * i], 'A' + i);
	}
}

/*
 * The default NIC fails again in the middle of a failback: A's sends are
 * back on the default QP (more posted there) while its backup QP still
 * serves the last failover (not re-armed). Both ends move to backups reset
 * for a second failover, agreed through the KV store; every send completes
 * once, in order, with its bytes at B, and no error reaches either side.
 * Then the NIC recovers for good: both directions come back again.
 */
static void test_fails_again_during_failback(void **state)
{
	struct ibv_wc wa[64], wb[64];
	int na = 0, nb = 0, r;
	struct shift_dqp *da = shift_dqp_of_qp(a.qp), *db = shift_dqp_of_qp(b.qp);
	(void)state;

	post_b_recvs(40);
	post_sends(0, 4);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	post_sends(4, 8);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 8);
	assert_int_equal(nb, 8);
	assert_int_equal(da->failovers, 1);

	sim_dev_revive(sim_host_dev(host[0], 0));
	/* until A's sends are back but its backup is not re-armed yet */
	for (r = 0; r < 4000 && !(da->send_state == SHIFT_SEND_DEFAULT && da->need_rearm); r++) {
		sim_world_step(world);
		shift_rnic_pass_all();
	}
	assert_true(r < 4000);
	assert_int_equal(da->failbacks, 1);
	post_sends(8, 16); /* on the default QP */
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	drive_rounds(4000, wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 16);
	assert_int_equal(nb, 16);
	assert_int_equal(da->failovers, 2);
	assert_int_equal(db->failovers, 2);
	assert_int_not_equal(da->send_state, SHIFT_SEND_UNPROTECTED);
	assert_int_not_equal(db->send_state, SHIFT_SEND_UNPROTECTED);

	sim_dev_revive(sim_host_dev(host[0], 0));
	drive_rounds(4000, wa, 64, &na, wb, 64, &nb);
	assert_int_equal(da->send_state, SHIFT_SEND_DEFAULT);
	assert_int_equal(db->recv_state, SHIFT_RECV_DEFAULT);
	assert_false(da->need_rearm);
	assert_false(db->need_rearm);
	post_sends(16, 24);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 24);
	assert_int_equal(nb, 24);
	for (int i = 0; i < 24; i++) {
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[i].wr_id, 700 + i);
		assert_int_equal(wb[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wb[i].wr_id, 500 + i);
		assert_int_equal(b.buf[64 * i], 'A' + i);
	}
}

/*
 * A bad request of the peer's application (IBA class C: a WRITE with a key
 * B does not grant) reaching B while B's failback notification is in
 * flight: B's QP goes to ERR with no error completion of its own, and the
 * notification flushes. That flush is no failure of the path (B's device
 * works): the connection fails for B's application as plain's would, its
 * receives flushed and its QP in ERR, with no new failover. A's backup NIC
 * is dead, so A's ABORT would never reach a B that failed over again (the
 * campaign's "QP state 3 after the application's error", --backup-faults
 * --app-errors, seed 1294800).
 */
static void test_peer_bad_request_flushes_notification(void **state)
{
	struct ibv_wc wa[64], wb[64];
	int na = 0, nb = 0, r;
	struct shift_dqp *da = shift_dqp_of_qp(a.qp), *db = shift_dqp_of_qp(b.qp);
	struct ibv_sge ar = { .addr = (uintptr_t)a.buf + 8192, .length = 64, .lkey = a.mr->lkey };
	struct ibv_recv_wr arw = { .wr_id = 600, .sg_list = &ar, .num_sge = 1 }, *bad_r;
	struct ibv_sge bs = { .addr = (uintptr_t)b.buf + 8192, .length = 64, .lkey = b.mr->lkey };
	struct ibv_send_wr bsw = { .wr_id = 800, .sg_list = &bs, .num_sge = 1, .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_sge ws = { .addr = (uintptr_t)a.buf, .length = 64, .lkey = a.mr->lkey };
	struct ibv_send_wr bw = {
		.wr_id = 900, .sg_list = &ws, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)b.buf, .rkey = b.mr->rkey ^ 0x5a5a00 },
	};
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	(void)state;

	/* (B's application sends too: B notifies at its failback) */
	assert_int_equal(ibv_post_recv(a.qp, &arw, &bad_r), 0);
	assert_int_equal(ibv_post_send(b.qp, &bsw, &bad), 0);
	post_b_recvs(24);
	post_sends(0, 4);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 5);
	assert_int_equal(nb, 5);
	assert_int_equal(db->failovers, 1);

	sim_dev_revive(sim_host_dev(host[0], 0));
	/* until B's notification is posted (A's sends are back) */
	for (r = 0; r < 4000; r++) {
		sim_world_step(world);
		shift_rnic_pass_all();
		if (db->send_state == SHIFT_SEND_WAIT_DRAINED && db->notify_inflight &&
		    da->send_state == SHIFT_SEND_DEFAULT)
			break;
	}
	assert_true(r < 4000);
	/* its ACK lost: the bad WRITE reaches B before it completes */
	sim_qp_drop_next(a.qp, 1, 1);
	assert_int_equal(ibv_post_send(a.qp, &bw, &bad), 0);
	sim_dev_kill(sim_host_dev(host[0], 1), 0);
	sim_pair_expect_errors(1 + 20); /* (checked below) */
	drive_rounds(4000, wa, 64, &na, wb, 64, &nb);
	drive(wa, 64, &na, wb, 64, &nb);
	print_message("A %d completions, B %d; B send %d fo %lu\n", na, nb, db->send_state,
		      db->failovers);
	assert_int_equal(db->failovers, 1); /* (no new failover) */
	assert_int_equal(db->send_state, SHIFT_SEND_UNPROTECTED);
	assert_int_equal(na, 6);
	assert_int_equal(wa[5].wr_id, 900);
	assert_int_equal(wa[5].status, IBV_WC_REM_ACCESS_ERR);
	assert_int_equal(nb, 5 + 20);
	for (int i = 5; i < nb; i++) {
		assert_int_equal(wb[i].wr_id, 500 + i - 1);
		assert_int_equal(wb[i].status, IBV_WC_WR_FLUSH_ERR);
	}
	assert_int_equal(shift_verbs.query_qp(a.qp, &qa, IBV_QP_STATE, &qi), 0);
	assert_int_equal(qa.qp_state, IBV_QPS_ERR);
	assert_int_equal(shift_verbs.query_qp(b.qp, &qa, IBV_QP_STATE, &qi), 0);
	assert_int_equal(qa.qp_state, IBV_QPS_ERR);
}

/*
 * A second failover with the KV store down. After a full failback both
 * ends' backups are re-armed for failover 2, and each end's record says
 * so. The store then goes down and the default NIC dies again. The end
 * that fails over must know that the peer's backup is reset for failover
 * 2 before it sends its handshake message there. A peer in the Default
 * state reads records only when poked, through the store. With datagrams
 * (SHIFT_DATAGRAMS=1, fo/dgram.c) each record also went to the peer's
 * service channel at the re-arm, so failover 2 needs nothing of the store:
 * every send arrives once and in order, with no error. Without them the
 * failover waits for the store until SHIFT_FAILOVER_MS and then fails the
 * connection with plain's errors (the connections the --kv-faults
 * campaigns counted as lost).
 */
static void second_failover_store_down(bool dgrams)
{
	struct ibv_wc wa[64], wb[64];
	int na = 0, nb = 0;
	struct shift_dqp *da = shift_dqp_of_qp(a.qp), *db = shift_dqp_of_qp(b.qp);
	const char *url = getenv("SHIFT_KV_URL");
	unsigned long taken = shift_stats.dgrams_taken, refused = shift_stats.dgrams_refused;

	post_b_recvs(32);
	post_sends(0, 4);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 4);
	sim_dev_revive(sim_host_dev(host[0], 0));
	drive_rounds(4000, wa, 64, &na, wb, 64, &nb);
	assert_int_equal(da->failbacks, 1);
	assert_false(da->need_rearm);
	assert_false(db->need_rearm);
	/* (each end's re-arm record reached the other as a datagram) */
	if (dgrams)
		assert_true(shift_stats.dgrams_taken - taken >= 2);
	else
		assert_int_equal(shift_stats.dgrams_taken - taken, 0);

	assert_non_null(url);
	assert_int_equal(shift_kv_mem_set_down(url + strlen("mem://"), true), 0);
	if (!dgrams)
		sim_pair_expect_errors(64); /* (checked below) */
	post_sends(4, 12);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	/* (SHIFT_FAILOVER_MS is 1000 here: past it a failover that cannot
	 * finish has failed the connection) */
	drive_rounds(3000, wa, 64, &na, wb, 64, &nb);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(shift_kv_mem_set_down(url + strlen("mem://"), false), 0);
	print_message("datagrams %d: A %d completions, B %d; A send %d fo %lu; B recv %d fo %lu; "
		      "taken %lu refused %lu\n", dgrams, na, nb, da->send_state, da->failovers,
		      db->recv_state, db->failovers, shift_stats.dgrams_taken - taken,
		      shift_stats.dgrams_refused - refused);
	assert_int_equal(shift_stats.dgrams_refused, refused);
	if (!dgrams) {
		/* plain's failure: A's sends 4..11 in error, the QP unprotected */
		assert_int_equal(da->send_state, SHIFT_SEND_UNPROTECTED);
		assert_int_equal(na, 12);
		for (int i = 4; i < 12; i++)
			assert_int_not_equal(wa[i].status, IBV_WC_SUCCESS);
		return;
	}
	assert_int_equal(da->failovers, 2);
	assert_int_equal(db->failovers, 2);
	assert_int_equal(na, 12);
	assert_int_equal(nb, 12);
	for (int i = 0; i < 12; i++) {
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[i].wr_id, 700 + i);
		assert_int_equal(wb[i].wr_id, 500 + i);
		assert_int_equal(b.buf[64 * i], 'A' + i);
	}
}

static int setup_fast_bound(void **state)
{
	test_setenv("SHIFT_FAILOVER_MS", "1000");
	return setup(state);
}

static int setup_no_dgrams(void **state)
{
	test_setenv("SHIFT_DATAGRAMS", "0");
	return setup_fast_bound(state);
}

static void test_second_failover_store_down(void **state)
{
	(void)state;
	second_failover_store_down(true);
}

static void test_second_failover_store_down_no_datagrams(void **state)
{
	(void)state;
	second_failover_store_down(false);
}

/*
 * The backup NIC dies during the failback, after the default path came
 * back (stage: 0 the probe answered, 1 sends held behind the fence, 2
 * sends back but the backup not re-armed): whatever is still on the backup
 * must reach the peer through the default path, once and in order.
 */
static void backup_dies_in_failback(int stage)
{
	struct ibv_wc wa[64], wb[64];
	int na = 0, nb = 0, r;
	struct shift_dqp *da = shift_dqp_of_qp(a.qp), *db = shift_dqp_of_qp(b.qp);

	post_b_recvs(40);
	post_sends(0, 4);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	post_sends(4, 8);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 8);
	assert_int_equal(nb, 8);
	sim_dev_revive(sim_host_dev(host[0], 0));
	int next = 8;

	if (stage == 1)
		post_sends(next, next + 2), next += 2; /* outstanding at the probe */
	for (r = 0; r < 4000; r++) {
		if (stage == 0 && da->dflt == SHIFT_DFLT_OK)
			break;
		if (stage == 1 && da->send_state == SHIFT_SEND_WAIT_DRAINED)
			break;
		if (stage == 2 && da->send_state == SHIFT_SEND_DEFAULT && da->need_rearm)
			break;
		if (stage == 1 && da->send_state == SHIFT_SEND_WAIT_SIGNALED)
			post_sends(next, next + 1), next++; /* the fence */
		shift_rnic_pass_all();
		if (stage == 1 && da->send_state == SHIFT_SEND_WAIT_DRAINED)
			break; /* (before the fence can complete) */
		sim_world_step(world);
	}
	assert_true(r < 4000);
	/* the fence's completion may be what is lost now */
	post_sends(next, 20);
	sim_dev_kill(sim_host_dev(host[0], 1), 0);
	drive_rounds(6000, wa, 64, &na, wb, 64, &nb);
	print_message("stage %d: A %d completions, B %d; A send %d recv %d fo %lu fb %lu; B send %d recv %d\n",
		      stage, na, nb, da->send_state, da->recv_state, da->failovers, da->failbacks,
		      db->send_state, db->recv_state);
	if (getenv("DUMP"))
		for (int i = 0; i < nb || i < na; i++)
			print_message("  a %lx %d   b %lx %d\n", (unsigned long)wa[i].wr_id, wa[i].status,
				      (unsigned long)wb[i].wr_id, wb[i].status);
	assert_int_equal(na, 20);
	assert_int_equal(nb, 20);
	for (int i = 0; i < 20; i++) {
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wb[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wb[i].wr_id, 500 + i);
		assert_int_equal(b.buf[64 * i], 'A' + i);
	}
	assert_int_equal(da->send_state, SHIFT_SEND_DEFAULT);
	assert_int_equal(db->recv_state, SHIFT_RECV_DEFAULT);
}

static void test_backup_dies_after_probe(void **state)
{
	(void)state;
	backup_dies_in_failback(0);
}

static void test_backup_dies_behind_fence(void **state)
{
	(void)state;
	backup_dies_in_failback(1);
}

static void test_backup_dies_before_rearm(void **state)
{
	(void)state;
	backup_dies_in_failback(2);
}

/*
 * A fails over alone (B only receives, so its QP never notices A's NIC),
 * and A's backup NIC dies before A's handshake message reaches B: B would
 * never learn of the failover, and B's default QP, never reset, would even
 * answer a probe of the default path (as a duplicate). A pokes B through
 * the KV store instead of probing; B's next poke read finds A's record and
 * follows the failover; both ends then go back to the default QPs once A's
 * NIC is back, and every send arrives once and in order. Without the poke
 * (SHIFT_POKE_MS=0) A's record still reaches B as a datagram on the
 * default path once A's default NIC is back (fo/dgram.c), and B follows
 * it the same way. Without either (and SHIFT_DATAGRAMS=0) A can only give
 * up: the application sees the error.
 */
static void one_sided_double_fault(bool poke, bool fails)
{
	struct ibv_wc wa[64], wb[64];
	int na = 0, nb = 0, r;
	struct shift_dqp *da = shift_dqp_of_qp(a.qp), *db = shift_dqp_of_qp(b.qp);

	if (!poke) {
		test_setenv("SHIFT_POKE_MS", "0");
		shift_inline_load();
	}
	if (fails)
		sim_pair_expect_errors(4); /* A's sends 4..7, flushed: checked below */
	post_b_recvs(40);
	post_sends(0, 4);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 4);
	/* (the datagram of A's start, fo_dgram_starting(), lost: A's backup
	 * channel off until its backup NIC is dead, which would lose it too) */
	bool bk_svc = da->shadow->svc_ok[SHIFT_SVC_BACKUP];

	da->shadow->svc_ok[SHIFT_SVC_BACKUP] = false;
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	post_sends(4, 8);
	/* until A starts its failover: its handshake message is posted, not
	 * delivered yet; then A's backup NIC dies too */
	for (r = 0; r < 4000 && da->failovers == 0; r++)
		drive_rounds(1, wa, 64, &na, wb, 64, &nb);
	assert_true(r < 4000);
	sim_dev_kill(sim_host_dev(host[0], 1), 0);
	da->shadow->svc_ok[SHIFT_SVC_BACKUP] = bk_svc;
	sim_dev_revive(sim_host_dev(host[0], 0));
	assert_int_equal(db->failovers, 0);
	drive_rounds(6000, wa, 64, &na, wb, 64, &nb);
	test_env_restore_var("SHIFT_POKE_MS");
	shift_inline_load();
	print_message("poke %d: A %d completions, B %d; A send %d fo %lu fb %lu; B send %d recv %d fo %lu\n",
		      poke, na, nb, da->send_state, da->failovers, da->failbacks, db->send_state,
		      db->recv_state, db->failovers);
	if (fails) {
		/* (the sends A had posted come back flushed) */
		assert_int_equal(na, 8);
		for (int i = 4; i < 8; i++)
			assert_int_not_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(db->failovers, 0);
		return;
	}
	assert_int_equal(na, 8);
	assert_int_equal(nb, 8);
	for (int i = 0; i < 8; i++) {
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[i].wr_id, 700 + i);
		assert_int_equal(wb[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wb[i].wr_id, 500 + i);
		assert_int_equal(b.buf[64 * i], 'A' + i);
	}
	assert_true(db->failovers >= 1);
	assert_int_equal(da->failovers, db->failovers);
	assert_int_equal(da->send_state, SHIFT_SEND_DEFAULT);
	assert_int_equal(db->recv_state, SHIFT_RECV_DEFAULT);
	/* and the default path carries what follows */
	post_sends(8, 12);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 12);
	assert_int_equal(nb, 12);
	for (int i = 8; i < 12; i++) {
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wb[i].wr_id, 500 + i);
		assert_int_equal(b.buf[64 * i], 'A' + i);
	}
	/* A's backup is re-armed only once its NIC is back (a reset while it
	 * is down would fail and leave the QP unprotected) */
	assert_true(da->need_rearm);
	assert_false(db->need_rearm);
	sim_dev_revive(sim_host_dev(host[0], 1));
	drive_rounds(200, wa, 64, &na, wb, 64, &nb);
	assert_false(da->need_rearm);
	assert_int_equal(da->send_state, SHIFT_SEND_DEFAULT);
}

static void test_peer_follows_failover_it_never_saw(void **state)
{
	(void)state;
	one_sided_double_fault(true, false);
}

static void test_without_poke_one_sided_double_fault_by_datagram(void **state)
{
	(void)state;
	one_sided_double_fault(false, false);
}

static void test_without_poke_or_datagrams_one_sided_double_fault_fails(void **state)
{
	(void)state;
	one_sided_double_fault(false, true);
}

/*
 * While failed over, B's backup QP alone fails (a fatal error no packet
 * explains, as rxe's stale read-response state produces after a lost
 * first packet): B sees its backup fail, A only stops hearing from it.
 * Waiting for the other to start a new failover, both would give up; B
 * starts one itself after a grace, A follows it through the KV store, and
 * every send arrives once and in order with no error for either
 * application.
 */
static void test_backup_qp_fails_alone(void **state)
{
	struct ibv_wc wa[64], wb[64];
	int na = 0, nb = 0;
	struct shift_dqp *da = shift_dqp_of_qp(a.qp), *db = shift_dqp_of_qp(b.qp);
	(void)state;

	test_setenv("SHIFT_PROBE_MS", "0"); /* no failback: stay on the backups */
	shift_inline_load();
	post_b_recvs(40);
	post_sends(0, 4);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	post_sends(4, 8);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 8);
	assert_int_equal(nb, 8);
	assert_int_equal(da->failovers, 1);
	assert_int_equal(db->failovers, 1);
	assert_non_null(db->bk);

	sim_qp_inject_fatal(db->bk);
	post_sends(8, 16);
	drive_rounds(3000, wa, 64, &na, wb, 64, &nb);
	test_env_restore_var("SHIFT_PROBE_MS");
	shift_inline_load();
	assert_int_equal(na, 16);
	assert_int_equal(nb, 16);
	assert_true(db->failovers >= 2);
	assert_int_equal(da->failovers, db->failovers);
	assert_int_not_equal(da->send_state, SHIFT_SEND_UNPROTECTED);
	assert_int_not_equal(db->send_state, SHIFT_SEND_UNPROTECTED);
	for (int i = 0; i < 16; i++) {
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[i].wr_id, 700 + i);
		assert_int_equal(wb[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wb[i].wr_id, 500 + i);
		assert_int_equal(b.buf[64 * i], 'A' + i);
	}
}

/*
 * A provider that refuses posts on a QP in ERR: one end's backup QP fails
 * while failed over, with nothing of its own outstanding there (so no
 * error completion tells), and its application posts: A's sends (on_a), or
 * B's receives. The posts must succeed (a provider that takes and flushes
 * the WRs lets them), the WRs wait in the mirror, the refusal is taken as
 * the backup's failure, and the next episode delivers them: every send
 * once, in order, into its receive. (Before, the post failed with EIO: the
 * campaign's read workload found it, seed 779882 with --refuse-err-posts
 * --backup-faults; without the background pass taking the refusal, the
 * WRs would wait for ever.)
 */
static void backup_refuses_posts(bool on_a)
{
	struct ibv_wc wa[64], wb[64];
	int na = 0, nb = 0;
	struct shift_dqp *da = shift_dqp_of_qp(a.qp), *db = shift_dqp_of_qp(b.qp);
	struct shift_dqp *dr = on_a ? da : db;
	struct ibv_qp_attr e = { .qp_state = IBV_QPS_ERR };

	test_setenv("SHIFT_PROBE_MS", "0"); /* no failback: stay on the backups */
	shift_inline_load();
	sim_world_set_refuse_posts_in_err(world, 1);
	post_b_recvs(4);
	post_sends(0, 4);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 4);
	assert_int_equal(nb, 4);
	assert_int_equal(da->failovers, 1);
	assert_int_equal(db->failovers, 1);
	assert_non_null(dr->bk);

	assert_int_equal(shift_lower->modify_qp(dr->bk, &e, IBV_QP_STATE), 0);
	if (on_a) {
		post_sends(4, 12); /* (asserts each post succeeds) */
		assert_true(da->bk_refused);
		post_b_recvs_from(4, 12);
	} else {
		post_b_recvs_from(4, 12); /* (the same) */
		assert_true(db->bk_refused);
		post_sends(4, 12);
	}
	drive_rounds(3000, wa, 64, &na, wb, 64, &nb);
	test_env_restore_var("SHIFT_PROBE_MS");
	shift_inline_load();
	assert_int_equal(na, 12);
	assert_int_equal(nb, 12);
	assert_true(dr->failovers >= 2);
	assert_false(dr->bk_refused);
	assert_int_equal(da->failovers, db->failovers);
	assert_int_not_equal(da->send_state, SHIFT_SEND_UNPROTECTED);
	assert_int_not_equal(db->send_state, SHIFT_SEND_UNPROTECTED);
	for (int i = 0; i < 12; i++) {
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[i].wr_id, 700 + i);
		assert_int_equal(wb[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wb[i].wr_id, 500 + i);
		assert_int_equal(b.buf[64 * i], 'A' + i);
	}
}

static void test_backup_refuses_sends_while_failed_over(void **state)
{
	(void)state;
	backup_refuses_posts(true);
}

static void test_backup_refuses_receives_while_failed_over(void **state)
{
	(void)state;
	backup_refuses_posts(false);
}

/* While failed over, a WR the backup's provider refuses on a backup QP
 * that works (here an atomic of 4 bytes) is the application's error: its
 * post fails, the backup is not taken as failed, and the connection goes
 * on on the backup. */
static void test_backup_refusing_bad_wr_is_the_apps(void **state)
{
	struct ibv_wc wa[64], wb[64];
	int na = 0, nb = 0;
	struct shift_dqp *da = shift_dqp_of_qp(a.qp);
	struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = 4, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 99, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.atomic = { .remote_addr = (uintptr_t)b.buf + 4096, .compare_add = 1,
						 .rkey = b.mr->rkey } },
			   *bad = NULL;
	(void)state;

	test_setenv("SHIFT_PROBE_MS", "0"); /* no failback: stay on the backups */
	shift_inline_load();
	sim_world_set_refuse_posts_in_err(world, 1);
	post_b_recvs(8);
	post_sends(0, 4);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 4);
	assert_int_equal(da->failovers, 1);
	assert_int_not_equal(ibv_post_send(a.qp, &wr, &bad), 0);
	assert_ptr_equal(bad, &wr);
	assert_false(da->bk_refused);
	post_sends(4, 8);
	drive_rounds(500, wa, 64, &na, wb, 64, &nb);
	test_env_restore_var("SHIFT_PROBE_MS");
	shift_inline_load();
	assert_int_equal(na, 8);
	assert_int_equal(nb, 8);
	assert_int_equal(da->failovers, 1);
	assert_false(da->bk_error);
	for (int i = 0; i < 8; i++) {
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[i].wr_id, 700 + i);
		assert_int_equal(wb[i].wr_id, 500 + i);
	}
}

/* The status file shiftctl reads: per QP, the data path's send and
 * receive states, failover and failback counts, WRs retransmitted, the
 * backup generation and the time of the last switch; and one line of the
 * process's counters (shiftctl stats), as they are. */
static void test_status_shows_failover(void **state)
{
	struct ibv_wc wa[64], wb[64];
	int na = 0, nb = 0;
	char dir[] = "/tmp/shift-status-XXXXXX", path[512], line[2048];
	(void)state;

	assert_non_null(mkdtemp(dir));
	for (int i = 0; i < 8; i++)
		post_write(i, i % 4 == 3);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 2);

	struct shift_rnic *r = shift_rnic_of(a.qp->context);
	assert_non_null(r);
	snprintf(shift_config.status_dir, sizeof(shift_config.status_dir), "%s", dir);
	shift_status_write(r);
	shift_config.status_dir[0] = '\0';
	snprintf(path, sizeof(path), "%s/shift-%d-%s.status", dir, (int)getpid(), "sim0_0");
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	bool seen = false, stats = false;
	while (fgets(line, sizeof(line), f)) {
		unsigned qpn, gen;
		const char *c = strstr(line, " contexts_attached="), *q = strstr(line, " qps_ready=");

		if (!strncmp(line, "#stats ", 7)) {
			assert_false(stats);
			stats = true;
			assert_non_null(c);
			assert_non_null(q);
			assert_int_equal(strtoul(c + 19, NULL, 10), shift_stats.contexts_attached);
			struct shift_shadow_stats sh;

			shift_shadow_stats_get(&sh);
			assert_int_equal(strtoul(q + 11, NULL, 10), sh.qps_ready);
			assert_true(shift_stats.contexts_attached >= 2);
			assert_non_null(strstr(line, " dgrams_sent="));
			assert_non_null(strstr(line, " mbox_asked="));
			assert_non_null(strstr(line, " wqes_read_back="));
			assert_int_equal(line[strlen(line) - 1], '\n');
			continue;
		}
		char ss[16], rs[16];
		unsigned long fo, fb, retx;
		unsigned long long last;

		if (sscanf(line, "%*d %*s %u %*s %*s %*s %*u %*s %*u %15s %15s %lu %lu %lu %u %llu", &qpn,
			   ss, rs, &fo, &fb, &retx, &gen, &last) != 8 || qpn != a.qp->qp_num)
			continue;
		seen = true;
		assert_string_not_equal(ss, "default");
		assert_string_equal(rs, "fallback");
		assert_int_equal(fo, 1);
		assert_int_equal(fb, 0);
		assert_true(retx >= 1);
		assert_int_equal(gen, 0);
		assert_true(last > 0);
	}
	fclose(f);
	unlink(path);
	rmdir(dir);
	assert_true(seen);
	assert_true(stats);
}

/* Read path into buf (at most size - 1 bytes); "" if it cannot be opened. */
static void slurp(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "r");
	size_t n = 0;

	if (f) {
		n = fread(buf, 1, size - 1, f);
		fclose(f);
	}
	buf[n] = '\0';
}

/* Links another user planted as the status file and its temp file: the
 * status is written beside them, their targets stay untouched. */
static void test_status_symlink_untouched(void **state)
{
	char dir[] = "/tmp/shift-status-XXXXXX", vdir[] = "/tmp/shift-victim-XXXXXX";
	char victim[512], link1[512], link2[600], buf[4096];
	struct shift_rnic *r = shift_rnic_of(a.qp->context);
	(void)state;

	assert_non_null(r);
	assert_non_null(mkdtemp(dir));
	assert_non_null(mkdtemp(vdir));
	snprintf(victim, sizeof(victim), "%s/victim", vdir);
	FILE *f = fopen(victim, "w");
	assert_non_null(f);
	fputs("precious\n", f);
	fclose(f);
	snprintf(link1, sizeof(link1), "%s/shift-%d-sim0_0.status", dir, (int)getpid());
	snprintf(link2, sizeof(link2), "%s.tmp", link1);
	assert_int_equal(symlink(victim, link1), 0);
	assert_int_equal(symlink(victim, link2), 0);
	snprintf(shift_config.status_dir, sizeof(shift_config.status_dir), "%s", dir);
	shift_status_write(r);
	shift_config.status_dir[0] = '\0';
	slurp(victim, buf, sizeof(buf));
	assert_string_equal(buf, "precious\n");
	slurp(link1, buf, sizeof(buf)); /* now the real status file */
	assert_non_null(strstr(buf, "sim0_0"));
	unlink(link1);
	unlink(link2);
	unlink(victim);
	rmdir(dir);
	rmdir(vdir);
}

/* A status directory owned by another user, or writable by others, is
 * refused: nothing written in it. */
static void test_status_foreign_dir_refused(void **state)
{
	char dir[] = "/tmp/shift-status-XXXXXX", path[512];
	struct shift_rnic *r = shift_rnic_of(a.qp->context);
	(void)state;

	assert_non_null(r);
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/shift-%d-sim0_0.status", dir, (int)getpid());
	assert_int_equal(chmod(dir, 0777), 0);
	snprintf(shift_config.status_dir, sizeof(shift_config.status_dir), "%s", dir);
	shift_status_write(r);
	assert_int_equal(access(path, F_OK), -1);
	if (geteuid() == 0) {
		assert_int_equal(chmod(dir, 0700), 0);
		assert_int_equal(chown(dir, 4242, 4242), 0);
		shift_status_write(r);
		assert_int_equal(access(path, F_OK), -1);
	}
	shift_config.status_dir[0] = '\0';
	unlink(path);
	rmdir(dir);
}

/* A QP destroyed while failed over: later background passes must not
 * touch its freed state (ASan catches a use after free here). */
static void test_destroy_failed_over_qp(void **state)
{
	struct ibv_wc wa[128], wb[128];
	int na = 0, nb = 0;
	(void)state;

	for (int i = 0; i < 8; i++)
		post_write(i, i % 4 == 3);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	drive(wa, 128, &na, wb, 128, &nb);
	assert_int_equal(na, 2);
	struct shift_dqp *da = shift_dqp_of_qp(a.qp);
	assert_non_null(da);
	assert_int_equal(da->failovers, 1);
	assert_int_equal(shift_verbs.destroy_qp(a.qp), 0);
	a.qp = NULL;
	sim_dev_revive(sim_host_dev(host[0], 0));
	for (int i = 0; i < 64; i++) {
		sim_world_step(world);
		shift_rnic_pass_all();
	}
}

/* e's failover record in the KV store (what its peer reads): 1 if it
 * says the connection ended, 0 if it does not, -1 if there is none. */
static int record_closed(const struct sim_ep *e)
{
	struct shift_dqp *d = shift_dqp_of_qp(e->qp);
	struct shift_ctx *s = shift_ctx_of(e->ctx);
	struct shift_ep_value ev;
	char key[SHIFT_EXCHANGE_KEY_MAX];
	void *val = NULL;
	size_t len = 0;

	assert_non_null(d);
	assert_non_null(s);
	assert_true(shift_exchange_ep_key(&d->shadow->my_key, key, sizeof(key)) > 0);
	if (shift_kv_get(s->rnic->kv, key, &val, &len))
		return -1;
	int rc = shift_exchange_ep_decode_ex(val, len, &ev);

	free(val);
	assert_int_equal(rc, 0);
	return ev.closed;
}

static void test_atomic_in_flight_surfaces(void **state)
{
	struct ibv_wc wa[128], wb[128];
	int na = 0, nb = 0;
	(void)state;

	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	post_fetch_add_42();
	sim_pair_expect_errors(1); /* the fetch-add's, checked below */
	drive(wa, 128, &na, wb, 128, &nb);
	assert_true(na >= 1);
	assert_int_equal(wa[0].wr_id, 42);
	assert_int_not_equal(wa[0].status, IBV_WC_SUCCESS); /* the application is told */
	uint64_t v;
	memcpy(&v, b.buf + 4096, 8);
	assert_true(v <= 1); /* never applied twice */
	/* A's connection failed at its first failover (failovers 0): its
	 * record says so, for a peer whose ABORT did not arrive */
	assert_int_equal(record_closed(&a), 1);
}

static void test_qp_fatal_hidden(void **state)
{
	struct ibv_async_event ev;
	(void)state;

	/* QP_FATAL on a protected QP is SHIFT's business; the port event that
	 * follows is the application's */
	sim_qp_inject_fatal(a.qp);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	assert_int_equal(shift_verbs.get_async_event(a.ctx, &ev), 0);
	assert_int_equal(ev.event_type, IBV_EVENT_PORT_ERR);
	shift_verbs.ack_async_event(&ev);
}

/* A second connection a2 <-> b2 on the same PDs and CQs as a <-> b. */
static struct sim_ep a2, b2;

static void open_conn_cap(struct ibv_qp_cap cap)
{
	struct sim_ep_info ia, ib;

	a2 = a;
	b2 = b;
	for (int k = 0; k < 2; k++) {
		struct sim_ep *e = k ? &b2 : &a2;
		struct ibv_qp_init_attr qa = { .send_cq = e->cq, .recv_cq = e->cq, .cap = cap,
					       .qp_type = IBV_QPT_RC };

		e->qp = shift_verbs.create_qp(e->pd, &qa);
		assert_non_null(e->qp);
	}
	sim_ep_info(&a2, 3, &ia);
	sim_ep_info(&b2, 4, &ib);
	assert_int_equal(sim_ep_connect(&a2, &ia, &ib, NULL), 0);
	assert_int_equal(sim_ep_connect(&b2, &ib, &ia, NULL), 0);
	for (int i = 0; i < 4; i++)
		shift_rnic_pass_all();
	struct shift_qp_info qi;
	assert_int_equal(shift_shadow_qp_info(b2.qp, &qi), 0);
	assert_int_equal(qi.state, SHIFT_SHADOW_READY);
}

static void open_second_conn(void)
{
	open_conn_cap((struct ibv_qp_cap){ .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 2,
					   .max_recv_sge = 2, .max_inline_data = 64 });
}

static int teardown2(void **state)
{
	shift_verbs.destroy_qp(a2.qp);
	shift_verbs.destroy_qp(b2.qp);
	return teardown(state);
}

static void post_recv_on(struct sim_ep *e, struct ibv_qp *qp, uint64_t wr_id, int slot)
{
	struct ibv_sge sge = { .addr = (uintptr_t)e->buf + 64 * slot, .length = 64, .lkey = e->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;

	assert_int_equal(ibv_post_recv(qp, &wr, &bad), 0);
}

static void post_send_on(struct sim_ep *e, struct ibv_qp *qp, uint64_t wr_id, int slot)
{
	struct ibv_sge sge = { .addr = (uintptr_t)e->buf + 64 * slot, .length = 64, .lkey = e->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;

	memset(e->buf + 64 * slot, (int)(wr_id & 0xff), 64);
	assert_int_equal(ibv_post_send(qp, &wr, &bad), 0);
}

/*
 * Batched reads of the peers' failover records: A's NIC dies under two
 * connections; while both are failed over, each pass reads both peer
 * records in one KV command (ep_prefetch). Both connections still deliver
 * every send once and come back to the default NIC.
 */
static void test_peer_records_read_in_batches(void **state)
{
	struct ibv_wc wa[64], wb[64];
	int na = 0, nb = 0;
	(void)state;

	open_second_conn();
	for (int i = 0; i < 4; i++) {
		post_recv_on(&b, b.qp, 500 + i, i);
		post_recv_on(&b2, b2.qp, 600 + i, 8 + i);
	}
	unsigned long cmds = shift_stats.ep_read_commands, recs = shift_stats.ep_records_read;

	for (int i = 0; i < 2; i++) {
		post_send_on(&a, a.qp, 700 + i, i);
		post_send_on(&a2, a2.qp, 800 + i, 8 + i);
	}
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	for (int i = 2; i < 4; i++) {
		post_send_on(&a, a.qp, 700 + i, i);
		post_send_on(&a2, a2.qp, 800 + i, 8 + i);
	}
	drive(wa, 64, &na, wb, 64, &nb);
	assert_int_equal(na, 8);
	assert_int_equal(nb, 8);
	struct shift_dqp *d1 = shift_dqp_of_qp(a.qp), *d2 = shift_dqp_of_qp(a2.qp);
	assert_int_equal(d1->failovers, 1);
	assert_int_equal(d2->failovers, 1);
	sim_dev_revive(sim_host_dev(host[0], 0));
	drive_rounds(4000, wa, 64, &na, wb, 64, &nb);
	assert_int_equal(d1->send_state, SHIFT_SEND_DEFAULT);
	assert_int_equal(d2->send_state, SHIFT_SEND_DEFAULT);
	assert_false(d1->need_rearm);
	assert_false(d2->need_rearm);
	/* each send once, in order, on each connection */
	uint64_t next1 = 500, next2 = 600;
	for (int k = 0; k < nb; k++) {
		assert_int_equal(wb[k].status, IBV_WC_SUCCESS);
		if (wb[k].qp_num == b.qp->qp_num)
			assert_int_equal(wb[k].wr_id, next1++);
		else
			assert_int_equal(wb[k].wr_id, next2++);
	}
	assert_int_equal(next1, 504);
	assert_int_equal(next2, 604);
	/* the QPs of a context read their peers' records together (a QP
	 * alone, or one starting an episode, reads its own): fewer commands */
	cmds = shift_stats.ep_read_commands - cmds;
	recs = shift_stats.ep_records_read - recs;
	print_message("peer records read: %lu in %lu KV commands\n", recs, cmds);
	assert_true(recs >= 8);
	assert_true(3 * cmds <= 2 * recs); /* one each: cmds == recs */
}

/*
 * The rest of a polled batch. B's CQ holds, in order: the flushes of QP 1
 * (its failure), two receive completions of QP 2, then QP 2's flushes. The
 * application polls 5: the batch is QP 1's flushes and QP 2's first receive.
 * QP 1's error starts its failover, which drains the CQ: QP 2's second
 * receive and its error come out of the provider while QP 2's first receive
 * is still in the unfiltered batch. Before the fix the drain filtered the
 * CQ before the rest of the batch: the application got receive 201 before
 * 200, and QP 2's failover read its receive counter (1) without counting
 * receive 200, reposted 201 on the backup QP and told the peer 1 while the
 * peer had seen both sends acknowledged: the next send completed 201 again.
 */
static void test_drain_takes_rest_of_batch_first(void **state)
{
	struct ibv_wc wa[128], wb[128];
	int na = 0, nb = 0, n;
	(void)state;

	open_second_conn();
	for (int i = 0; i < 4; i++)
		post_recv_on(&b, b.qp, 100 + i, i);
	for (int i = 0; i < 4; i++)
		post_recv_on(&b, b2.qp, 200 + i, 8 + i);
	sim_qp_inject_fatal(b.qp); /* QP 1's receives flush first */
	post_send_on(&a, a2.qp, 300, 0);
	post_send_on(&a, a2.qp, 301, 1);
	/* the sender sees both sends acknowledged; B does not poll yet */
	for (int it = 0; na < 2 && it < 10000; it++) {
		sim_world_step(world);
		n = ibv_poll_cq(a.cq, 1, wa + na);
		assert_true(n >= 0);
		if (n) {
			assert_int_equal(wa[na].status, IBV_WC_SUCCESS);
			na++;
		}
	}
	assert_int_equal(wa[0].wr_id, 300);
	assert_int_equal(wa[1].wr_id, 301);
	while (sim_world_step(world))
		;
	/* (B's NIC is down when B polls: the flushes are a device failure's,
	 * not the application's) */
	sim_dev_kill(sim_host_dev(host[1], 0), 0);
	sim_qp_inject_fatal(b2.qp); /* QP 2's remaining receives flush */
	n = ibv_poll_cq(b.cq, 5, wb);
	assert_true(n >= 0);
	nb = n;
	drive(wa, 128, &na, wb, 128, &nb);
	/* one more message on connection 2, over the backup */
	post_send_on(&a, a2.qp, 302, 2);
	drive(wa, 128, &na, wb, 128, &nb);

	assert_int_equal(na, 3);
	assert_int_equal(wa[2].wr_id, 302);
	assert_int_equal(wa[2].status, IBV_WC_SUCCESS);
	assert_int_equal(nb, 3);
	for (int k = 0; k < nb; k++) {
		assert_int_equal(wb[k].status, IBV_WC_SUCCESS);
		assert_int_equal(wb[k].qp_num, b2.qp->qp_num);
		assert_int_equal(wb[k].wr_id, 200 + k); /* in order, each once */
		assert_int_equal(b.buf[64 * (8 + k)], 300 + k - 256);
	}
}

/*
 * The atomic boundary is judged after the drain. A's fetch-add completed
 * (its completion waits, unpolled, in A's CQ) when B's QP fails and B's
 * handshake message reaches A. Before the fix A's failover counted the
 * fetch-add as in flight because its completion had not been polled yet,
 * gave up and aborted the connection: A saw the fetch-add succeed and the
 * connection fail anyway, B got a flush error. Now the drain retires it and
 * the connection fails over.
 */
static void test_atomic_completed_in_cq_is_not_in_flight(void **state)
{
	struct ibv_wc wa[128], wb[128];
	int na = 0, nb = 0;
	(void)state;

	post_fetch_add_42();
	post_recv_on(&b, b.qp, 88, 0);
	while (sim_world_step(world))
		; /* the fetch-add is done; A does not poll */
	sim_qp_inject_fatal(b.qp);
	sim_dev_kill(sim_host_dev(host[1], 0), 0); /* (a device failure's) */
	/* B fails over; A's side answers from SHIFT's background pass */
	for (int i = 0; i < 64; i++) {
		sim_world_step(world);
		shift_rnic_pass_all();
		if (sim_pair_poll1("B", &b, wb + nb))
			nb++;
	}
	drive(wa, 128, &na, wb, 128, &nb);
	post_send_on(&a, a.qp, 43, 1);
	drive(wa, 128, &na, wb, 128, &nb);

	assert_int_equal(na, 2);
	assert_int_equal(wa[0].wr_id, 42);
	assert_int_equal(wa[0].status, IBV_WC_SUCCESS);
	assert_int_equal(wa[1].wr_id, 43);
	assert_int_equal(wa[1].status, IBV_WC_SUCCESS);
	assert_int_equal(nb, 1);
	assert_int_equal(wb[0].wr_id, 88);
	assert_int_equal(wb[0].status, IBV_WC_SUCCESS);
	uint64_t v;
	memcpy(&v, b.buf + 4096, 8);
	assert_int_equal(v, 1);
}

/*
 * A send queue of one WR (ibv_rc_pingpong's): the backup QP must have room
 * for SHIFT's handshake message (and the empty READ before it) next to the
 * application's one outstanding WR. The receiver's NIC dies with a send in
 * flight; the peer starts the handshake, so A retransmits while its own
 * handshake message may still be outstanding. Every send completes once.
 */
static void test_send_queue_of_one(void **state)
{
	struct ibv_wc wa[32], wb[32];
	int na = 0, nb = 0;
	(void)state;

	open_conn_cap((struct ibv_qp_cap){ .max_send_wr = 1, .max_recv_wr = 8, .max_send_sge = 1,
					   .max_recv_sge = 1 });
	for (int i = 0; i < 6; i++)
		post_recv_on(&b2, b2.qp, 500 + i, i);
	for (int i = 0; i < 6; i++) {
		post_send_on(&a2, a2.qp, 700 + i, 8 + i);
		if (i == 1)
			sim_dev_kill(sim_host_dev(host[1], 0), 0);
		drive(wa, 32, &na, wb, 32, &nb);
		assert_int_equal(na, i + 1);
		assert_int_equal(wa[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wa[i].wr_id, 700 + i);
	}
	assert_int_equal(nb, 6);
	for (int i = 0; i < 6; i++) {
		assert_int_equal(wb[i].status, IBV_WC_SUCCESS);
		assert_int_equal(wb[i].wr_id, 500 + i);
		assert_int_equal(wb[i].qp_num, b2.qp->qp_num);
		assert_int_equal((unsigned char)b2.buf[64 * i], (700 + i) & 0xff);
	}
}

/*
 * A WR the backup QP cannot carry (here a write to memory the peer
 * registered outside SHIFT, so it has no backup key; the same as a memory
 * window's rkey): the failover is abandoned before any WR moves and the
 * application gets what plain would, at once: the first outstanding write
 * fails with the path's error, the rest are flushed, each with its wr_id,
 * and the QP is left in the error state. Nothing hangs.
 */
static void test_uncarried_wr_fails_connection(void **state)
{
	struct ibv_wc wa[32], wb[32];
	int na = 0, nb = 0;
	struct ibv_mr *raw = shift_lower->reg_mr(b.pd, b.buf + 8192, 4096,
						 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	(void)state;

	assert_non_null(raw);
	for (int i = 0; i < 3; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)a.buf + 64 * i, .length = 64, .lkey = a.mr->lkey };
		struct ibv_send_wr wr = {
			.wr_id = 1100 + i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
			.send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = (uintptr_t)b.buf + 8192 + 64 * i, .rkey = raw->rkey },
		}, *bad;
		assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
	}
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	sim_pair_expect_errors(3);
	drive(wa, 32, &na, wb, 32, &nb);
	assert_int_equal(na, 3);
	assert_int_equal(wa[0].status, IBV_WC_RETRY_EXC_ERR);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(wa[i].wr_id, 1100 + i);
		assert_int_equal(wa[i].qp_num, a.qp->qp_num);
		if (i)
			assert_int_equal(wa[i].status, IBV_WC_WR_FLUSH_ERR);
	}
	assert_int_equal(shift_verbs.query_qp(a.qp, &qa, IBV_QP_STATE, &qi), 0);
	assert_int_equal(qa.qp_state, IBV_QPS_ERR);
	assert_int_equal(shift_lower->dereg_mr(raw), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_writes_survive_nic_death, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sends_survive_with_receives_in_order, setup, teardown),
		cmocka_unit_test_setup_teardown(test_atomic_in_flight_surfaces, setup, teardown),
		cmocka_unit_test_setup_teardown(test_qp_fatal_hidden, setup, teardown),
		cmocka_unit_test_setup_teardown(test_read_before_executed_send_is_read_again, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_refused_post_on_failed_qp_fails_over, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_refused_recv_on_failed_qp_fails_over, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_refused_post_on_healthy_qp_is_the_apps, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_failback_after_recovery, setup, teardown),
		cmocka_unit_test_setup_teardown(test_read_failback_after_stale_read_state, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_port_down_fails_over_without_error, setup, teardown),
		cmocka_unit_test_setup_teardown(test_port_down_peer_starts_beside, setup, teardown),
		cmocka_unit_test_setup_teardown(test_port_down_start_given_up_after_its_record, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_port_down_peer_waits_without_datagrams, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_disconnect_after_failback_hides_shift_wrs,
						setup_b_rtr, teardown),
		cmocka_unit_test_setup_teardown(test_destroy_failed_over_qp, setup, teardown),
		cmocka_unit_test_setup_teardown(test_failover_failback_twice, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fails_again_during_failback, setup, teardown),
		cmocka_unit_test_setup_teardown(test_peer_bad_request_flushes_notification, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_backup_qp_fails_alone, setup, teardown),
		cmocka_unit_test_setup_teardown(test_backup_refuses_sends_while_failed_over, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_backup_refuses_receives_while_failed_over,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_backup_refusing_bad_wr_is_the_apps, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_backup_dies_after_probe, setup, teardown),
		cmocka_unit_test_setup_teardown(test_backup_dies_behind_fence, setup, teardown),
		cmocka_unit_test_setup_teardown(test_backup_dies_before_rearm, setup, teardown),
		cmocka_unit_test_setup_teardown(test_peer_follows_failover_it_never_saw, setup, teardown),
		cmocka_unit_test_setup_teardown(test_second_failover_store_down, setup_fast_bound,
						teardown),
		cmocka_unit_test_setup_teardown(test_second_failover_store_down_no_datagrams,
						setup_no_dgrams, teardown),
		cmocka_unit_test_setup_teardown(test_without_poke_one_sided_double_fault_by_datagram,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_without_poke_or_datagrams_one_sided_double_fault_fails, setup_no_dgrams,
			teardown),
		cmocka_unit_test_setup_teardown(test_status_shows_failover, setup, teardown),
		cmocka_unit_test_setup_teardown(test_status_symlink_untouched, setup, teardown),
		cmocka_unit_test_setup_teardown(test_status_foreign_dir_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_drain_takes_rest_of_batch_first, setup, teardown2),
		cmocka_unit_test_setup_teardown(test_peer_records_read_in_batches, setup, teardown2),
		cmocka_unit_test_setup_teardown(test_send_queue_of_one, setup, teardown2),
		cmocka_unit_test_setup_teardown(test_uncarried_wr_fails_connection, setup, teardown),
		cmocka_unit_test_setup_teardown(test_atomic_completed_in_cq_is_not_in_flight, setup,
						teardown),
	};
	return test_env_run_group_tests(tests);
}
