/*
 * Give-ups after a QP left the Default state (issue #18): a failover that
 * cannot go on once the default QP is stopped must fail the connection as
 * plain libibverbs would, never leave the application waiting. Every WR
 * the application posted completes exactly once, with an error, its own
 * wr_id, in order; both ends end with their QP in ERR; and it all happens
 * within a bounded number of rounds.
 *
 * The give-ups are forced on A: B's NIC dies with B's send outstanding, B
 * fails over first and its handshake message reaches A's backup QP, A's
 * writes time out; then, before A's application polls (which makes A fail
 * over), A's backup QP is made unable to take A's WRs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "kv/kv.h"
#include "sim_pair.h"

static struct sim_world *world;
static struct sim_host *host[2];
static struct sim_ep a, b;
static struct sim_pair pair;

static int setup(void **state)
{
	(void)state;
	sim_pair_open(&pair, &a, &b, "giveup", 0);
	world = pair.world;
	host[0] = pair.host[0];
	host[1] = pair.host[1];
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	sim_pair_close(&pair);
	return 0;
}

/* A's and B's QPs with a send queue of max_send (both through SHIFT). */
static void connect_with(unsigned max_send)
{
	struct shift_qp_info qi;

	for (int k = 0; k < 2; k++) {
		struct sim_ep *e = k ? &b : &a;
		struct ibv_qp_init_attr qa = {
			.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = max_send, .max_recv_wr = 16, .max_send_sge = 1,
				 .max_recv_sge = 1 },
		};

		shift_verbs.destroy_qp(e->qp);
		e->qp = shift_verbs.create_qp(e->pd, &qa);
		assert_non_null(e->qp);
	}
	sim_ep_info(&a, 1, &pair.ia);
	sim_ep_info(&b, 2, &pair.ib);
	sim_pair_connect(&pair);
	assert_int_equal(shift_shadow_qp_info(b.qp, &qi), 0);
	assert_int_equal(qi.state, SHIFT_SHADOW_READY);
}

static void post_recv(struct sim_ep *e, uint64_t wr_id, int slot)
{
	struct ibv_sge sge = { .addr = (uintptr_t)e->buf + 64 * slot, .length = 64, .lkey = e->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;

	assert_int_equal(ibv_post_recv(e->qp, &wr, &bad), 0);
}

static void post_send(struct sim_ep *e, uint64_t wr_id, int slot)
{
	struct ibv_sge sge = { .addr = (uintptr_t)e->buf + 64 * slot, .length = 64, .lkey = e->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;

	assert_int_equal(ibv_post_send(e->qp, &wr, &bad), 0);
}

/* A signaled RDMA WRITE of 64 bytes from A to B. */
static void post_write(uint64_t wr_id, int slot)
{
	struct ibv_sge sge = { .addr = (uintptr_t)a.buf + 64 * slot, .length = 64, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)b.buf + 8192 + 64 * slot, .rkey = b.mr->rkey },
	}, *bad;

	assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
}

/* One round: the network, SHIFT's background pass, B's poll (and A's if
 * poll_a); completions appended to wa / wb. */
static void round_once(bool poll_a, struct ibv_wc *wa, int *na, struct ibv_wc *wb, int *nb)
{
	for (int i = 0; i < 8; i++)
		sim_world_step(world);
	shift_rnic_pass_all();
	while (poll_a && *na < 32 && sim_pair_poll1("A", &a, wa + *na))
		(*na)++;
	while (*nb < 32 && sim_pair_poll1("B", &b, wb + *nb))
		(*nb)++;
}

static uint64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;

	assert_int_equal(shift_verbs.query_qp(qp, &qa, IBV_QP_STATE, &qi), 0);
	return qa.qp_state;
}

/*
 * B's NIC dies with B's send (700) outstanding; B fails over and its
 * handshake message lands in A's backup CQ, A's writes time out (A has
 * not polled yet). A's application has nwr writes (1000...) and nrecv
 * receives (600...) outstanding. Returns with A about to fail over.
 */
static void until_a_follows(int nwr, int nrecv, struct ibv_wc *wb, int *nb)
{
	/* (B's error may come at any time from here) */
	sim_pair_expect_errors(nwr + nrecv + 1);
	struct shift_dqp *da = shift_dqp_of_qp(a.qp), *db = shift_dqp_of_qp(b.qp);
	int na = 0;

	for (int i = 0; i < nrecv; i++)
		post_recv(&a, 600 + i, i);
	post_send(&b, 700, 0);
	sim_dev_kill(sim_host_dev(host[1], 0), 0);
	for (int r = 0; r < 100000 && db->send_state == SHIFT_SEND_DEFAULT; r++)
		round_once(false, NULL, &na, wb, nb);
	assert_int_not_equal(db->send_state, SHIFT_SEND_DEFAULT);
	for (int i = 0; i < nwr; i++)
		post_write(1000 + i, i);
	/* the network alone (no pass, no poll of A's): B's message reaches
	 * A's backup QP, A's writes time out on the dead path */
	sim_world_run(world, 1000000);
	assert_int_equal(da->send_state, SHIFT_SEND_DEFAULT);
}

/*
 * After the give-up: rounds (A polling too) until both applications have
 * every completion and both QPs are in ERR, at most 5 s. A gets its nwr
 * writes (the first with the path's error, the rest flushed, in order) and
 * its receives flushed; B its send with an error. Each exactly once.
 */
static void assert_both_fail(int nwr, int nrecv, struct ibv_wc *wb, int *nb)
{
	struct ibv_wc wa[32];
	int na = 0, ns = 0, nr = 0;
	uint64_t end = now_ms() + 5000;

	while (now_ms() < end && (na < nwr + nrecv || *nb < 1 || qp_state(a.qp) != IBV_QPS_ERR ||
				  qp_state(b.qp) != IBV_QPS_ERR))
		round_once(true, wa, &na, wb, nb);
	for (int r = 0; r < 50; r++) /* (nothing more comes) */
		round_once(true, wa, &na, wb, nb);
	assert_int_equal(na, nwr + nrecv);
	for (int k = 0; k < na; k++) {
		assert_int_equal(wa[k].qp_num, a.qp->qp_num);
		assert_int_not_equal(wa[k].status, IBV_WC_SUCCESS);
		if (wa[k].opcode & IBV_WC_RECV) {
			assert_int_equal(wa[k].wr_id, 600 + nr);
			assert_int_equal(wa[k].status, IBV_WC_WR_FLUSH_ERR);
			nr++;
			continue;
		}
		assert_int_equal(wa[k].wr_id, 1000 + ns);
		assert_int_equal(wa[k].status, ns ? IBV_WC_WR_FLUSH_ERR : IBV_WC_RETRY_EXC_ERR);
		ns++;
	}
	assert_int_equal(ns, nwr);
	assert_int_equal(nr, nrecv);
	assert_int_equal(*nb, 1);
	assert_int_equal(wb[0].wr_id, 700);
	assert_int_equal(wb[0].qp_num, b.qp->qp_num);
	assert_int_not_equal(wb[0].status, IBV_WC_SUCCESS);
	assert_int_equal(qp_state(a.qp), IBV_QPS_ERR);
	assert_int_equal(qp_state(b.qp), IBV_QPS_ERR);
}

/*
 * handshake.c (retransmission): A's backup QP refuses a WR after it took
 * the ones before it (its send queue is full: A's application posted as
 * many WRs as the default QP took, SHIFT's room included). The WRs already
 * on the backup QP complete once (not again from the backup), the rest
 * after them.
 */
static void test_backup_refuses_retransmit(void **state)
{
	struct ibv_wc wb[32];
	int nb = 0;
	(void)state;

	/* (without key mailboxes: SHIFT's room is then its handshake's two
	 * WRs, which these four writes overflow) */
	shift_config.key_mailbox = false;
	connect_with(2);
	until_a_follows(4, 1, wb, &nb);
	assert_both_fail(4, 1, wb, &nb);
	shift_config.key_mailbox = true;
}

/* A's backup QP went to ERR (a provider that refuses posts there): A
 * cannot repost its receives on it (start.c, fo_finish_start). */
static void test_backup_refuses_receive(void **state)
{
	struct ibv_wc wb[32];
	int nb = 0;
	struct shift_qp_info qi;
	struct ibv_qp_attr e = { .qp_state = IBV_QPS_ERR };
	(void)state;

	connect_with(8);
	sim_world_set_refuse_posts_in_err(world, 1);
	until_a_follows(3, 2, wb, &nb);
	assert_int_equal(shift_shadow_qp_info(a.qp, &qi), 0);
	assert_int_equal(shift_lower->modify_qp(qi.bk, &e, IBV_QP_STATE), 0);
	assert_both_fail(3, 2, wb, &nb);
}

/* The same with no receive to repost: A cannot send its handshake message
 * (start.c, fo_send_my_ctrl). */
static void test_handshake_message_refused(void **state)
{
	struct ibv_wc wb[32];
	int nb = 0;
	struct shift_qp_info qi;
	struct ibv_qp_attr e = { .qp_state = IBV_QPS_ERR };
	struct shift_dqp *da;
	(void)state;

	connect_with(8);
	da = shift_dqp_of_qp(a.qp);
	sim_world_set_refuse_posts_in_err(world, 1);
	until_a_follows(3, 0, wb, &nb);
	assert_int_equal(da->rq_head, da->rq_tail); /* (nothing to repost) */
	assert_int_equal(shift_shadow_qp_info(a.qp, &qi), 0);
	assert_int_equal(shift_lower->modify_qp(qi.bk, &e, IBV_QP_STATE), 0);
	assert_both_fail(3, 0, wb, &nb);
}

/*
 * work.c (episode_expired): A fails over and its handshake message reaches
 * B's backup QP, but B's SHIFT never answers (its process is stuck: no
 * pass of B's runs, B's application never polls). Within the handshake
 * bound (SHIFT_FAILOVER_MS; 512 passes of A's logical clock here) A's writes complete in error, in
 * order, once each, and A's QP ends in ERR: a wait for ever before.
 */
static void test_unanswered_handshake_ends(void **state)
{
	struct ibv_wc wa[32];
	int na = 0;
	struct shift_dqp *da;
	struct shift_rnic *ra = shift_rnic_of(a.ctx);
	(void)state;

	shift_config.handshake_wait_ms = 512; /* (passes: the logical clock) */
	connect_with(8);
	da = shift_dqp_of_qp(a.qp);
	sim_pair_expect_errors(3);
	for (int i = 0; i < 3; i++)
		post_write(1000 + i, i);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	/* A only: its passes and polls; B's stay still */
	for (int r = 0; r < 20000 && (na < 3 || qp_state(a.qp) != IBV_QPS_ERR); r++) {
		for (int i = 0; i < 8; i++)
			sim_world_step(world);
		shift_rnic_pass(ra);
		while (na < 32 && sim_pair_poll1("A", &a, wa + na))
			na++;
	}
	assert_true(da->failovers >= 1);
	assert_int_equal(na, 3);
	for (int k = 0; k < na; k++) {
		assert_int_equal(wa[k].wr_id, 1000 + k);
		assert_int_not_equal(wa[k].status, IBV_WC_SUCCESS);
	}
	assert_int_equal(qp_state(a.qp), IBV_QPS_ERR);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_backup_refuses_retransmit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_backup_refuses_receive, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unanswered_handshake_ends, setup, teardown),
		cmocka_unit_test_setup_teardown(test_handshake_message_refused, setup, teardown),
	};
	return test_env_run_group_tests(tests);
}
