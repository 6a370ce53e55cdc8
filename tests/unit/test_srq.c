/*
 * QPs on a shared receive queue, through SHIFT on the simulated RNIC: the
 * simulator's SRQ itself (consumed in order, RNR when empty, the limit
 * event, destroy while in use), then failover (shift/fo/srq.c). Host A's
 * application has two RC QPs on one SRQ; host B's has one RC QP for each,
 * with receive queues of their own. B sends sequence-numbered messages on
 * both connections to A's SRQ, A writes to B. When A's path fails (its NIC,
 * or only one of its QPs), every message must reach one of the receives
 * A's application posted on the SRQ exactly once, with the right QP
 * number, length and bytes, in order per connection, and no error may
 * reach either application.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "kv/kv.h"
#include "sim_pair.h"
#include "shift/dp/dsrq.h"

#define NQP 2
#define MSG 48     /* bytes per message: "conn seq" and a pattern */
#define RBUF 64    /* bytes per receive */
#define NRECV 32   /* receives A's application keeps posted */

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_srq *srq; /* A only */
	struct ibv_qp *qp[NQP];
	uint8_t *buf;
	struct ibv_mr *mr;
};

static struct sim_world *world;
static struct sim_host *host[2];
static struct side A, B;
static int run;

/* what A's application saw, per connection */
static unsigned got[NQP];          /* messages received, in order */
static unsigned posted_recvs;      /* receives posted on the SRQ (wr_id 1000 + k) */
static uint8_t used[4096];         /* receive k completed (once) */

static void side_open(struct side *s, const char *dev, bool srq)
{
	struct ibv_device **l;
	int n = 0;

	l = shift_verbs.get_device_list(&n);
	for (int i = 0; i < n; i++)
		if (!strcmp(shift_verbs.get_device_name(l[i]), dev))
			s->ctx = shift_verbs.open_device(l[i]);
	shift_verbs.free_device_list(l);
	assert_non_null(s->ctx);
	s->pd = shift_verbs.alloc_pd(s->ctx);
	s->cq = shift_verbs.create_cq(s->ctx, 512, NULL, NULL, 0);
	s->buf = calloc(1, 1 << 16);
	s->mr = shift_verbs.reg_mr(s->pd, s->buf, 1 << 16, SIM_PAIR_ACCESS);
	assert_non_null(s->pd);
	assert_non_null(s->cq);
	assert_non_null(s->mr);
	if (srq) {
		struct ibv_srq_init_attr sa = { .attr = { .max_wr = 128, .max_sge = 1 } };

		s->srq = shift_verbs.create_srq(s->pd, &sa);
		assert_non_null(s->srq);
	}
	for (int i = 0; i < NQP; i++) {
		struct ibv_qp_init_attr ia = {
			.send_cq = s->cq, .recv_cq = s->cq, .srq = s->srq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 64, .max_recv_wr = srq ? 0 : 64, .max_send_sge = 1,
				 .max_recv_sge = 1 },
		};
		s->qp[i] = shift_verbs.create_qp(s->pd, &ia);
		assert_non_null(s->qp[i]);
	}
}

static void qp_connect(struct side *s, int i, struct side *peer)
{
	struct sim_ep e = { .v = &shift_verbs, .ctx = s->ctx, .qp = s->qp[i] };
	struct sim_ep f = { .v = &shift_verbs, .ctx = peer->ctx, .qp = peer->qp[i] };
	struct sim_ep_info me, them;

	sim_ep_info(&e, (s == &A ? 100 : 200) + i, &me);
	sim_ep_info(&f, (peer == &A ? 100 : 200) + i, &them);
	assert_int_equal(sim_ep_connect(&e, &me, &them, NULL), 0);
}

static void side_close(struct side *s)
{
	for (int i = 0; i < NQP; i++)
		if (s->qp[i])
			assert_int_equal(shift_verbs.destroy_qp(s->qp[i]), 0);
	if (s->srq)
		assert_int_equal(shift_verbs.destroy_srq(s->srq), 0);
	shift_verbs.dereg_mr(s->mr);
	shift_verbs.destroy_cq(s->cq);
	shift_verbs.dealloc_pd(s->pd);
	shift_verbs.close_device(s->ctx);
	free(s->buf);
	memset(s, 0, sizeof(*s));
}

static int setup(void **state)
{
	char url[64];

	(void)state;
	world = sim_world_create(NULL);
	host[0] = sim_host_create(world, 2);
	host[1] = sim_host_create(world, 2);
	shift_lower_set(sim_lower_world(world));
	snprintf(url, sizeof(url), "mem://srq%d", run++);
	test_setenv("SHIFT_KV_URL", url);
	test_setenv("SHIFT_STATUS_DIR", "");
	shift_inline_load();
	side_open(&A, "sim0_0", true);
	side_open(&B, "sim1_0", false);
	for (int i = 0; i < NQP; i++) {
		qp_connect(&A, i, &B);
		qp_connect(&B, i, &A);
	}
	for (int k = 0; k < 6; k++)
		shift_rnic_pass_all();
	for (int i = 0; i < NQP; i++) {
		struct shift_qp_info qi;

		assert_int_equal(shift_shadow_qp_info(A.qp[i], &qi), 0);
		assert_int_equal(qi.state, SHIFT_SHADOW_READY);
	}
	memset(got, 0, sizeof(got));
	memset(used, 0, sizeof(used));
	posted_recvs = 0;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	assert_int_equal(shift_dqp_illegal_transitions(), 0);
	side_close(&A);
	side_close(&B);
	sim_world_destroy(world);
	test_env_restore();
	return 0;
}

/* A's application posts n receives on its SRQ (receive k: wr_id 1000 + k,
 * RBUF bytes at k * RBUF). */
static void a_post_recvs(unsigned n)
{
	for (unsigned i = 0; i < n; i++, posted_recvs++) {
		unsigned k = posted_recvs;
		struct ibv_sge sge = { .addr = (uintptr_t)A.buf + (size_t)k * RBUF, .length = RBUF,
				       .lkey = A.mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 1000 + k, .sg_list = &sge, .num_sge = 1 }, *bad;

		assert_true(k < 1000);
		assert_int_equal(ibv_post_srq_recv(A.srq, &wr, &bad), 0);
	}
}

/* B sends message seq on connection c (a SEND of MSG bytes: c, seq, and a
 * pattern of both). */
static void b_send(int c, unsigned seq)
{
	uint8_t *p = B.buf + 32768 + (size_t)(c * 512 + seq % 64) * MSG;
	struct ibv_sge sge = { .addr = (uintptr_t)p, .length = MSG, .lkey = B.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 5000 + seq, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;

	p[0] = (uint8_t)c;
	memcpy(p + 1, &seq, sizeof(seq));
	for (int j = 5; j < MSG; j++)
		p[j] = (uint8_t)(c * 31 + seq * 7 + j);
	assert_int_equal(ibv_post_send(B.qp[c], &wr, &bad), 0);
}

/* One receive completion of A's application: the right QP, length and
 * bytes, in order on its connection, its receive used once. */
static void a_check(const struct ibv_wc *wc)
{
	unsigned k = (unsigned)(wc->wr_id - 1000), seq;
	const uint8_t *p = A.buf + (size_t)k * RBUF;
	int c = wc->qp_num == A.qp[0]->qp_num ? 0 : wc->qp_num == A.qp[1]->qp_num ? 1 : -1;

	assert_int_equal(wc->status, IBV_WC_SUCCESS);
	assert_int_equal(wc->opcode, IBV_WC_RECV);
	assert_true(k < posted_recvs);
	assert_int_equal(used[k], 0);
	used[k] = 1;
	assert_int_equal(wc->byte_len, MSG);
	assert_true(c >= 0);
	assert_int_equal(p[0], c);
	memcpy(&seq, p + 1, sizeof(seq));
	if (getenv("SRQ_TRACE")) fprintf(stderr, "A: recv k=%u qp=%u c=%d seq=%u got=%u\n", k, wc->qp_num, c, seq, got[c]);
	assert_int_equal(seq, got[c]);
	for (int j = 5; j < MSG; j++)
		assert_int_equal(p[j], (uint8_t)(c * 31 + seq * 7 + j));
	got[c]++;
}

/* Run the network, SHIFT's passes and both applications until nothing
 * moves. A checks each receive; B's sends must all succeed. Returns B's
 * send completions. */
static unsigned drive(void)
{
	unsigned bsent = 0;
	int idle = 0, quiet = 0;

	/* (a message waiting for a receive keeps the network busy with RNR
	 * retries: quiet counts steps without an application completion) */
	while (idle < 4 && quiet < 4000) {
		struct ibv_wc wc;
		int moved = sim_world_step(world) != 0;
		int app = 0;

		shift_rnic_pass_all();
		while (ibv_poll_cq(A.cq, 1, &wc) == 1) {
			moved = app = 1;
			if (wc.opcode & IBV_WC_RECV)
				a_check(&wc);
			else
				assert_int_equal(wc.status, IBV_WC_SUCCESS);
		}
		while (ibv_poll_cq(B.cq, 1, &wc) == 1) {
			moved = app = 1;
			assert_int_equal(wc.status, IBV_WC_SUCCESS);
			bsent++;
		}
		idle = moved ? 0 : idle + 1;
		quiet = app ? 0 : quiet + 1;
	}
	return bsent;
}

/* --- the simulator's SRQ ---------------------------------------------------- */

static void test_sim_srq_basics(void **state)
{
	struct ibv_srq_attr at;
	struct ibv_async_event ev;
	(void)state;

	/* one receive: the first message takes it, the second waits (RNR)
	 * until another is posted */
	a_post_recvs(1);
	b_send(0, 0);
	b_send(1, 0);
	assert_int_equal(drive(), 1);
	assert_int_equal(got[0] + got[1], 1);
	/* the limit: armed at 2, fires once when a take leaves fewer */
	at.srq_limit = 2;
	assert_int_equal(shift_verbs.modify_srq(A.srq, &at, IBV_SRQ_LIMIT), 0);
	assert_int_equal(shift_verbs.query_srq(A.srq, &at), 0);
	assert_int_equal(at.srq_limit, 2);
	a_post_recvs(2);
	assert_int_equal(drive(), 1); /* the waiting message: 1 left, below 2 */
	assert_int_equal(shift_verbs.get_async_event(A.ctx, &ev), 0);
	assert_int_equal(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
	assert_ptr_equal(ev.element.srq, A.srq);
	shift_verbs.ack_async_event(&ev);
	assert_int_equal(shift_verbs.query_srq(A.srq, &at), 0);
	assert_int_equal(at.srq_limit, 0);
	assert_int_equal(at.max_wr, 128);
	/* in use: not destroyed */
	assert_int_equal(shift_verbs.destroy_srq(A.srq), EBUSY);
	/* a QP on an SRQ has no receive queue of its own */
	struct ibv_sge sge = { .addr = (uintptr_t)A.buf, .length = 8, .lkey = A.mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	assert_int_equal(ibv_post_recv(A.qp[0], &wr, &bad), EINVAL);
}

/* --- failover --------------------------------------------------------------- */

static bool a_failed_over(int i)
{
	struct shift_dqp *d = shift_dqp_of_qp(A.qp[i]);

	assert_non_null(d);
	return d->failovers > 0 && d->send_state != SHIFT_SEND_UNPROTECTED;
}

/* A's QP i is back on its default QP in both directions. */
static bool a_back(int i)
{
	struct shift_dqp *d = shift_dqp_of_qp(A.qp[i]);

	return d->failbacks > 0 && d->send_state == SHIFT_SEND_DEFAULT &&
	       d->recv_state == SHIFT_RECV_DEFAULT;
}

/* Receives both connections consumed on the default SRQ are retired from
 * the mirror, so the backup path fills only the others: every message
 * arrives once, in order, into its own receive. */
static void run_traffic_with_fault(void (*fault)(void))
{
	a_post_recvs(NRECV);
	for (unsigned s = 0; s < 6; s++) {
		b_send(0, s);
		b_send(1, s);
	}
	assert_int_equal(drive(), 12);
	assert_int_equal(got[0], 6);
	assert_int_equal(got[1], 6);
	assert_int_equal(shift_dsrq_of(A.srq)->live, NRECV - 12);
	for (unsigned s = 6; s < 12; s++) {
		b_send(0, s);
		b_send(1, s);
	}
	fault();
	for (unsigned s = 12; s < 20; s++) {
		b_send(0, s);
		b_send(1, s);
	}
	a_post_recvs(8); /* (more than the 32 outstanding are needed) */
	assert_int_equal(drive(), 28);
	assert_int_equal(got[0], 20);
	assert_int_equal(got[1], 20);
	assert_true(a_failed_over(0));
	assert_true(a_failed_over(1));
	/* and later traffic too */
	a_post_recvs(8);
	b_send(0, 20);
	b_send(1, 20);
	assert_int_equal(drive(), 2);
	assert_int_equal(got[0], 21);
	assert_int_equal(got[1], 21);
}

static void kill_a_nic(void)
{
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
}

static void test_srq_receives_survive_nic_death(void **state)
{
	(void)state;
	run_traffic_with_fault(kill_a_nic);
}

/* Only A's first QP fails: the second stays in the Default state until
 * then (its receives on the default SRQ retired as they complete), and
 * fails over with it, since the SRQ's receives move as a whole. */
static void fatal_a_qp0(void)
{
	assert_false(a_failed_over(1));
	assert_int_equal(shift_dqp_of_qp(A.qp[1])->send_state, SHIFT_SEND_DEFAULT);
	sim_qp_inject_fatal(A.qp[0]);
}

static void test_srq_one_qp_fails_both_move(void **state)
{
	(void)state;
	run_traffic_with_fault(fatal_a_qp0);
	/* (the NIC works: SHIFT empties the default SRQ of the receives the
	 * backup path filled, and both QPs come back) */
	assert_false(shift_dsrq_of(A.srq)->moved);
	assert_true(a_back(0));
	assert_true(a_back(1));
}

/* After A's NIC comes back, the SRQ's receives go back to the default SRQ
 * (the stale WQEs there consumed by SHIFT first, none reaching the
 * application) and both QPs fail back; with both backup NICs dead then,
 * traffic still flows, on the default path. */
static void test_srq_failback_after_recovery(void **state)
{
	(void)state;
	run_traffic_with_fault(kill_a_nic);
	assert_true(shift_dsrq_of(A.srq)->moved);
	sim_dev_revive(sim_host_dev(host[0], 0));
	a_post_recvs(4);
	for (int k = 0; k < 40 && !(a_back(0) && a_back(1)); k++) {
		b_send(0, got[0]);
		drive();
		b_send(1, got[1]);
		drive();
		a_post_recvs(2);
	}
	assert_false(shift_dsrq_of(A.srq)->moved);
	assert_true(a_back(0));
	assert_true(a_back(1));
	sim_dev_kill(sim_host_dev(host[0], 1), 0);
	sim_dev_kill(sim_host_dev(host[1], 1), 0);
	a_post_recvs(8);
	for (unsigned k = 0; k < 4; k++) {
		b_send(0, got[0] + k);
		b_send(1, got[1] + k);
	}
	unsigned g0 = got[0], g1 = got[1];

	drive();
	assert_int_equal(got[0], g0 + 4);
	assert_int_equal(got[1], g1 + 4);
}

/* Messages that arrive on the backup path while A's application has no
 * receive posted wait for one, in order. */
static void test_srq_messages_wait_for_receives(void **state)
{
	(void)state;
	a_post_recvs(2);
	b_send(0, 0);
	b_send(1, 0);
	assert_int_equal(drive(), 2);
	kill_a_nic();
	for (unsigned s = 1; s < 5; s++) {
		b_send(0, s);
		b_send(1, s);
	}
	drive();
	assert_int_equal(got[0] + got[1], 2);
	a_post_recvs(3);
	drive();
	assert_int_equal(got[0] + got[1], 5);
	a_post_recvs(20);
	drive();
	assert_int_equal(got[0], 5);
	assert_int_equal(got[1], 5);
	/* (and some left waiting: destroying the QPs releases them) */
	for (unsigned s = 5; s < 20; s++)
		b_send(0, s);
	drive();
	assert_int_equal(got[0], 20);
	for (unsigned s = 20; s < 24; s++)
		b_send(1, s - 15);
	drive();
}

/* ibv_create_srq_ex's slot: a basic SRQ is mirrored like ibv_create_srq's. */
static void test_srq_ex_slot_mirrors_basic(void **state)
{
	struct verbs_context *v = verbs_get_ctx(A.ctx);
	struct ibv_srq_init_attr_ex ax = {
		.attr = { .max_wr = 16, .max_sge = 1 }, .comp_mask = IBV_SRQ_INIT_ATTR_PD |
		IBV_SRQ_INIT_ATTR_TYPE, .srq_type = IBV_SRQT_BASIC, .pd = A.pd,
	};
	(void)state;

	assert_non_null(v->create_srq_ex);
	struct ibv_srq *srq = v->create_srq_ex(A.ctx, &ax);
	assert_non_null(srq);
	assert_non_null(shift_dsrq_of(srq));
	assert_int_equal(shift_verbs.destroy_srq(srq), 0);
	assert_null(shift_dsrq_of(srq));
}

/* Once the SRQ's receives are on the backup path, a QP connected on it
 * would read the default SRQ's stale receives: SHIFT refuses it. */
static void test_srq_moved_refuses_new_connection(void **state)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = A.cq, .recv_cq = A.cq, .srq = A.srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_send_sge = 1 },
	};
	struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				  .qp_access_flags = IBV_ACCESS_LOCAL_WRITE };
	(void)state;

	a_post_recvs(4);
	kill_a_nic();
	b_send(0, 0);
	drive();
	assert_true(shift_dsrq_of(A.srq)->moved);
	/* (the NIC is back: the QP could be created and connected) */
	sim_dev_revive(sim_host_dev(host[0], 0));
	struct ibv_qp *qp = shift_verbs.create_qp(A.pd, &ia);
	assert_non_null(qp);
	assert_int_equal(shift_verbs.modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					       IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
	at.qp_state = IBV_QPS_RTR;
	assert_int_equal(shift_verbs.modify_qp(qp, &at, IBV_QP_STATE), EINVAL);
	assert_int_equal(shift_verbs.destroy_qp(qp), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_sim_srq_basics, setup, teardown),
		cmocka_unit_test_setup_teardown(test_srq_receives_survive_nic_death, setup, teardown),
		cmocka_unit_test_setup_teardown(test_srq_one_qp_fails_both_move, setup, teardown),
		cmocka_unit_test_setup_teardown(test_srq_failback_after_recovery, setup, teardown),
		cmocka_unit_test_setup_teardown(test_srq_messages_wait_for_receives, setup, teardown),
		cmocka_unit_test_setup_teardown(test_srq_moved_refuses_new_connection, setup, teardown),
		cmocka_unit_test_setup_teardown(test_srq_ex_slot_mirrors_basic, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
