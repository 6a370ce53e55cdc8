/*
 * What the application does is honoured at any state of SHIFT's failover
 * machine (shift/fo/apperr.c, shift/verbs.c): its own ibv_modify_qp to ERR
 * or RESET, ibv_query_qp, destroy_qp during a failback, async error events
 * of its own making; retry_cnt changed only on QPs SHIFT protects; and no
 * wr_id value is SHIFT's (the application may use any, after failovers
 * too). Simulated RNIC, two hosts with two NICs, SHIFT inline.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <cmocka.h>

#include "sim_pair.h"
#include "shift/dp/ctx.h"

static struct sim_pair pair;
static struct sim_ep a, b;

static int setup(void **state)
{
	(void)state;
	sim_pair_open(&pair, &a, &b, "appctl", 0);
	sim_pair_connect(&pair);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	sim_pair_close(&pair);
	return 0;
}

struct seen {
	int n;
	struct ibv_wc wc[128];
};

static void poll_all(struct sim_ep *e, struct seen *s)
{
	while (s->n < 128 && ibv_poll_cq(e->cq, 1, &s->wc[s->n]) == 1)
		s->n++;
}

static void rounds(int n, struct seen *sa, struct seen *sb)
{
	for (int r = 0; r < n; r++) {
		sim_world_step(pair.world);
		shift_rnic_pass_all();
		poll_all(&a, sa);
		poll_all(&b, sb);
	}
}

static void send_wr(struct sim_ep *e, uint64_t id, int slot, bool sig)
{
	struct ibv_sge sge = { (uintptr_t)e->buf + 64 * slot, 64, e->mr->lkey };
	struct ibv_send_wr *bad, wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1,
					.opcode = IBV_WR_SEND,
					.send_flags = sig ? IBV_SEND_SIGNALED : 0 };

	memset(e->buf + 64 * slot, (int)(id & 0x7f), 64);
	assert_int_equal(ibv_post_send(e->qp, &wr, &bad), 0);
}

static void write_wr(uint64_t id, int slot, bool sig)
{
	struct ibv_sge sge = { (uintptr_t)a.buf + 64 * slot, 64, a.mr->lkey };
	struct ibv_send_wr *bad, wr = {
		.wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = sig ? IBV_SEND_SIGNALED : 0,
		.wr.rdma = { .remote_addr = (uintptr_t)b.buf + 64 * slot, .rkey = b.mr->rkey },
	};

	assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
}

static void recv_wr(struct sim_ep *e, uint64_t id, int slot)
{
	struct ibv_sge sge = { (uintptr_t)e->buf + 8192 + 64 * slot, 64, e->mr->lkey };
	struct ibv_recv_wr *bad, wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 };

	assert_int_equal(ibv_post_recv(e->qp, &wr, &bad), 0);
}

/* The QP's state as the application reads it, and as the device has it. */
static int app_state(struct sim_ep *e)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;

	memset(&attr, 0, sizeof(attr));
	assert_int_equal(shift_verbs.query_qp(e->qp, &attr, IBV_QP_STATE, &init), 0);
	return attr.qp_state;
}

static int dev_state(struct sim_ep *e)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;

	memset(&attr, 0, sizeof(attr));
	assert_int_equal(sim_lower_world(pair.world)->query_qp(e->qp, &attr, IBV_QP_STATE, &init), 0);
	return attr.qp_state;
}

/* A's NIC dies under 4 sends; A fails over (the sends complete on the
 * backup), B keeps 8 receives more for later. */
static void fail_over_a(struct seen *sa, struct seen *sb)
{
	for (int i = 0; i < 12; i++)
		recv_wr(&b, 500 + i, i);
	for (int i = 0; i < 4; i++)
		send_wr(&a, 700 + i, i, true);
	sim_dev_kill(sim_host_dev(pair.host[0], 0), 0);
	rounds(3000, sa, sb);
	assert_int_equal(sa->n, 4);
	assert_int_equal(sb->n, 4);
	assert_int_equal(shift_dqp_of_qp(a.qp)->failovers, 1);
	assert_int_not_equal(shift_dqp_of_qp(a.qp)->send_state, SHIFT_SEND_DEFAULT);
}

/* ---- ibv_modify_qp(ERR / RESET) at any state ---------------------------- */

/* On a failed-over QP: its receives (posted on the backup) flush to the
 * application, in order; the QP stays in ERR (SHIFT's failback used to
 * reset it back to RTS), and SHIFT runs nothing on it any more. */
static void test_modify_err_on_failed_over_qp(void **state)
{
	struct seen sa = { 0 }, sb = { 0 };
	struct shift_dqp *da = shift_dqp_of_qp(a.qp);
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	(void)state;

	fail_over_a(&sa, &sb);
	for (int i = 0; i < 5; i++)
		recv_wr(&a, 900 + i, i);
	rounds(50, &sa, &sb);
	assert_int_equal(app_state(&a), IBV_QPS_RTS); /* as plain would say */
	assert_int_equal(shift_verbs.modify_qp(a.qp, &err, IBV_QP_STATE), 0);
	sim_dev_revive(sim_host_dev(pair.host[0], 0));
	rounds(3000, &sa, &sb);
	assert_int_equal(sa.n, 4 + 5);
	for (int i = 0; i < 5; i++) {
		assert_int_equal(sa.wc[4 + i].wr_id, 900 + i);
		assert_int_equal(sa.wc[4 + i].status, IBV_WC_WR_FLUSH_ERR);
		assert_int_equal(sa.wc[4 + i].qp_num, a.qp->qp_num);
	}
	assert_int_equal(da->send_state, SHIFT_SEND_UNPROTECTED);
	assert_int_equal(da->failbacks, 0);
	assert_int_equal(app_state(&a), IBV_QPS_ERR);
	assert_int_equal(dev_state(&a), IBV_QPS_ERR);
	/* later posts flush as plain's do on a QP in ERR */
	recv_wr(&a, 950, 7);
	rounds(10, &sa, &sb);
	assert_int_equal(sa.n, 10);
	assert_int_equal(sa.wc[9].wr_id, 950);
	assert_int_equal(sa.wc[9].status, IBV_WC_WR_FLUSH_ERR);
}

/* RESET on a failed-over QP: the WRs SHIFT had vanish with no completion,
 * as a reset's do, and the QP stays in RESET. */
static void test_modify_reset_on_failed_over_qp(void **state)
{
	struct seen sa = { 0 }, sb = { 0 };
	struct ibv_qp_attr rst = { .qp_state = IBV_QPS_RESET };
	(void)state;

	fail_over_a(&sa, &sb);
	for (int i = 0; i < 3; i++)
		recv_wr(&a, 900 + i, i);
	rounds(20, &sa, &sb);
	assert_int_equal(shift_verbs.modify_qp(a.qp, &rst, IBV_QP_STATE), 0);
	sim_dev_revive(sim_host_dev(pair.host[0], 0));
	rounds(3000, &sa, &sb);
	assert_int_equal(sa.n, 4);
	assert_int_equal(app_state(&a), IBV_QPS_RESET);
	assert_int_equal(dev_state(&a), IBV_QPS_RESET);
	assert_int_equal(shift_dqp_of_qp(a.qp)->send_state, SHIFT_SEND_UNPROTECTED);
}

/* During a failback (the probe answered; A waits for a signaled WR to
 * fence with, its unsignaled writes outstanding): ERR flushes A's
 * receives and stops the failback. */
static void test_modify_err_during_failback(void **state)
{
	struct seen sa = { 0 }, sb = { 0 };
	struct shift_dqp *da = shift_dqp_of_qp(a.qp);
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	int r;
	(void)state;

	fail_over_a(&sa, &sb);
	for (int i = 0; i < 3; i++)
		recv_wr(&a, 900 + i, i);
	for (int i = 0; i < 3; i++)
		write_wr(800 + i, 16 + i, false);
	sim_dev_revive(sim_host_dev(pair.host[0], 0));
	for (r = 0; r < 4000 && da->send_state != SHIFT_SEND_WAIT_SIGNALED; r++)
		rounds(1, &sa, &sb);
	assert_int_equal(da->send_state, SHIFT_SEND_WAIT_SIGNALED);
	assert_int_equal(shift_verbs.modify_qp(a.qp, &err, IBV_QP_STATE), 0);
	rounds(3000, &sa, &sb);
	/* the receives flushed, in order, after any write's completion */
	int got = 0;

	for (int i = 4; i < sa.n; i++) {
		if (sa.wc[i].wr_id >= 900) {
			assert_int_equal(sa.wc[i].wr_id, 900 + got);
			assert_int_equal(sa.wc[i].status, IBV_WC_WR_FLUSH_ERR);
			got++;
		}
	}
	assert_int_equal(got, 3);
	assert_int_equal(da->send_state, SHIFT_SEND_UNPROTECTED);
	assert_int_equal(da->failbacks, 0);
	assert_int_equal(app_state(&a), IBV_QPS_ERR);
	assert_int_equal(dev_state(&a), IBV_QPS_ERR);
}

/* In the Default state: the provider flushes, as plain. */
static void test_modify_err_in_default(void **state)
{
	struct seen sa = { 0 }, sb = { 0 };
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	(void)state;

	for (int i = 0; i < 3; i++)
		recv_wr(&a, 900 + i, i);
	assert_int_equal(shift_verbs.modify_qp(a.qp, &err, IBV_QP_STATE), 0);
	rounds(200, &sa, &sb);
	assert_int_equal(sa.n, 3);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(sa.wc[i].wr_id, 900 + i);
		assert_int_equal(sa.wc[i].status, IBV_WC_WR_FLUSH_ERR);
	}
	assert_int_equal(shift_dqp_of_qp(a.qp)->send_state, SHIFT_SEND_UNPROTECTED);
	assert_int_equal(shift_dqp_of_qp(a.qp)->failovers, 0);
	assert_int_equal(app_state(&a), IBV_QPS_ERR);
}

/* destroy_qp while the failback waits for its fence: clean (ASan), and the
 * background passes after it do not touch the QP. */
static void test_destroy_during_failback(void **state)
{
	struct seen sa = { 0 }, sb = { 0 };
	struct shift_dqp *da = shift_dqp_of_qp(a.qp);
	int r;
	(void)state;

	fail_over_a(&sa, &sb);
	write_wr(800, 16, false);
	sim_dev_revive(sim_host_dev(pair.host[0], 0));
	for (r = 0; r < 4000 && da->send_state != SHIFT_SEND_WAIT_SIGNALED; r++)
		rounds(1, &sa, &sb);
	assert_int_equal(da->send_state, SHIFT_SEND_WAIT_SIGNALED);
	assert_int_equal(shift_verbs.destroy_qp(a.qp), 0);
	a.qp = NULL;
	for (r = 0; r < 300; r++) {
		sim_world_step(pair.world);
		shift_rnic_pass_all();
		poll_all(&b, &sb);
	}
}

/* ---- wr_ids: none is SHIFT's ------------------------------------------- */

/* After a failover and a failback (SHIFT ran its probe, notification and
 * control receive on the default QP), the application uses the values
 * SHIFT's own WRs once had: every completion reaches it. */
static void test_any_wr_id_after_failback(void **state)
{
	struct seen sa = { 0 }, sb = { 0 };
	struct shift_dqp *da = shift_dqp_of_qp(a.qp);
	(void)state;

	fail_over_a(&sa, &sb);
	sim_dev_revive(sim_host_dev(pair.host[0], 0));
	rounds(4000, &sa, &sb);
	assert_int_equal(da->send_state, SHIFT_SEND_DEFAULT);
	assert_int_equal(da->failbacks, 1);
	/* A's polls take the slow path, where completions are looked at one
	 * by one (as while any QP of the context is failed over): no pass
	 * sets it fast again meanwhile */
	shift_ctx_set_slow(shift_ctx_of(a.ctx), true);
	for (uint64_t k = 1; k <= 5; k++) {
		recv_wr(&a, 0x7ff0000000000000ull | k, (int)k);
		send_wr(&a, 0x7ff0000000000000ull | k, (int)k, true);
		send_wr(&b, 0x7ff0000000000000ull | k, 8 + (int)k, true);
	}
	for (int r = 0; r < 400; r++) {
		sim_world_step(pair.world);
		poll_all(&a, &sa);
		poll_all(&b, &sb);
	}
	assert_int_equal(sa.n, 4 + 10);
	assert_int_equal(sb.n, 4 + 5 + 5);
	int sends = 0, recvs = 0;

	for (int i = 4; i < sa.n; i++) {
		assert_int_equal(sa.wc[i].status, IBV_WC_SUCCESS);
		if (sa.wc[i].opcode & IBV_WC_RECV)
			assert_int_equal(sa.wc[i].wr_id, 0x7ff0000000000000ull | (uint64_t)++recvs);
		else
			assert_int_equal(sa.wc[i].wr_id, 0x7ff0000000000000ull | (uint64_t)++sends);
	}
	assert_int_equal(sends, 5);
	assert_int_equal(recvs, 5);
}

/* ---- retry_cnt, only on protected QPs ------------------------------------ */

static int dev_retry_cnt(struct ibv_qp *qp)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;

	memset(&attr, 0, sizeof(attr));
	assert_int_equal(sim_lower_world(pair.world)->query_qp(qp, &attr, IBV_QP_RETRY_CNT, &init), 0);
	return attr.retry_cnt;
}

static int app_retry_cnt(struct ibv_qp *qp)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;

	memset(&attr, 0, sizeof(attr));
	assert_int_equal(shift_verbs.query_qp(qp, &attr, IBV_QP_RETRY_CNT, &init), 0);
	return attr.retry_cnt;
}

/*
 * Devices that say they are soft-RoCE: a protected QP asking retry_cnt 7
 * gets 6 from SHIFT (rxe retries 7 for ever), and ibv_query_qp still says
 * 7; a QP on a device with no backup NIC (unprotected) keeps its 7.
 */
static void test_retry_cnt_only_on_protected_qps(void **state)
{
	struct sim_ep x, y;
	struct sim_ep_info ix, iy, ia, ib;
	struct ibv_qp_cap cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
				  .max_recv_sge = 1 };
	(void)state;

	/* (sim2_0 and sim3_0 have no backup NIC: they are not in the map) */
	test_setenv("SHIFT_BACKUP", "sim0_0:sim0_1,sim1_0:sim1_1");
	sim_pair_open(&pair, &a, &b, "appctl-rxe", 0);
	sim_world_set_vendor(pair.world, 0xffffff, 0); /* rxe's */
	sim_ep_close(&a);
	sim_ep_close(&b);
	assert_int_equal(sim_ep_open(&a, &shift_verbs, "sim0_0", 1 << 16, SIM_PAIR_ACCESS, &cap, 64, 0), 0);
	assert_int_equal(sim_ep_open(&b, &shift_verbs, "sim1_0", 1 << 16, SIM_PAIR_ACCESS, &cap, 64, 0), 0);
	sim_ep_info(&a, 1, &ia);
	sim_ep_info(&b, 2, &ib);
	pair.ia = ia;
	pair.ib = ib;
	sim_pair_connect(&pair);
	assert_int_equal(dev_retry_cnt(a.qp), 6);
	assert_int_equal(app_retry_cnt(a.qp), 7);

	/* hosts whose NICs have no backup: unprotected */
	struct sim_host *h3 = sim_host_create(pair.world, 1);
	struct sim_host *h4 = sim_host_create(pair.world, 1);

	assert_non_null(h3);
	assert_non_null(h4);
	assert_int_equal(sim_ep_open(&x, &shift_verbs, "sim2_0", 4096, SIM_PAIR_ACCESS, &cap, 64, 0), 0);
	assert_int_equal(sim_ep_open(&y, &shift_verbs, "sim3_0", 4096, SIM_PAIR_ACCESS, &cap, 64, 0), 0);
	for (int i = 0; i < 4; i++)
		shift_rnic_pass_all();
	sim_ep_info(&x, 3, &ix);
	sim_ep_info(&y, 4, &iy);
	assert_int_equal(sim_ep_connect(&x, &ix, &iy, NULL), 0);
	/* (an RNIC without a backup: the shadow record gave up, the QP has
	 * its data-path state: found unprotected from the record) */
	assert_int_equal(shift_shadow_qp_state(x.qp), SHIFT_SHADOW_UNPROTECTED);
	assert_int_equal(dev_retry_cnt(x.qp), 7);
	assert_int_equal(app_retry_cnt(x.qp), 7);
	sim_ep_close(&x);
	sim_ep_close(&y);
	sim_pair_close(&pair);
}

/* ---- async events ------------------------------------------------------ */

/* A's write with a bad rkey moves B's QP to ERR with QP_ACCESS_ERR: the
 * peer's application error, which B's application is told of. */
static void test_responder_access_event_reaches_app(void **state)
{
	struct seen sa = { 0 }, sb = { 0 };
	struct ibv_async_event ev;
	struct ibv_sge sge = { (uintptr_t)a.buf, 64, a.mr->lkey };
	struct ibv_send_wr *bad, wr = {
		.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)b.buf, .rkey = b.mr->rkey + 99 },
	};
	(void)state;

	recv_wr(&b, 500, 0);
	assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
	rounds(200, &sa, &sb);
	assert_int_equal(sa.n, 1);
	assert_int_equal(sa.wc[0].status, IBV_WC_REM_ACCESS_ERR);
	assert_int_equal(sb.n, 1);
	assert_int_equal(sb.wc[0].status, IBV_WC_WR_FLUSH_ERR);
	assert_int_equal(shift_verbs.get_async_event(b.ctx, &ev), 0);
	assert_int_equal(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
	assert_ptr_equal(ev.element.qp, b.qp);
	shift_verbs.ack_async_event(&ev);
	assert_int_equal(app_state(&b), IBV_QPS_ERR);
}

/* ---- completion events -------------------------------------------------- */

/*
 * An event-driven application whose QP is failed over (its receives on the
 * backup) arms its CQ and ends the QP (ERR): its receives' flushes, made
 * up by SHIFT, come with a completion event on its channel, as plain's
 * flushes would.
 */
static void test_event_after_ending_failed_over_qp(void **state)
{
	struct seen sa = { 0 }, sb = { 0 };
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	struct ibv_cq *cq;
	void *ctx;
	int fl;
	(void)state;

	sim_pair_open(&pair, &a, &b, "appctl-ch", SIM_EP_CHANNEL);
	sim_pair_connect(&pair);
	fail_over_a(&sa, &sb);
	for (int i = 0; i < 3; i++)
		recv_wr(&a, 900 + i, i);
	rounds(20, &sa, &sb);
	fl = fcntl(a.ch->fd, F_GETFL);
	assert_int_equal(fcntl(a.ch->fd, F_SETFL, fl | O_NONBLOCK), 0);
	/* (events of the traffic so far: taken, acked) */
	while (shift_verbs.get_cq_event(a.ch, &cq, &ctx) == 0)
		shift_verbs.ack_cq_events(cq, 1);
	assert_int_equal(errno, EAGAIN);
	assert_int_equal(ibv_req_notify_cq(a.cq, 0), 0);
	assert_int_equal(shift_verbs.modify_qp(a.qp, &err, IBV_QP_STATE), 0);
	for (int r = 0; r < 20; r++)
		sim_world_step(pair.world);
	assert_int_equal(shift_verbs.get_cq_event(a.ch, &cq, &ctx), 0);
	assert_ptr_equal(cq, a.cq);
	shift_verbs.ack_cq_events(cq, 1);
	poll_all(&a, &sa);
	assert_int_equal(sa.n, 4 + 3);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(sa.wc[4 + i].wr_id, 900 + i);
		assert_int_equal(sa.wc[4 + i].status, IBV_WC_WR_FLUSH_ERR);
	}
	assert_int_equal(fcntl(a.ch->fd, F_SETFL, fl), 0);
	sim_pair_close(&pair);
}

/* ---- quiet by default ---------------------------------------------------- */

/*
 * At the default log level a whole life (setup, traffic, a NIC failure, the
 * failover, the failback, teardown) writes one line to stderr per host: the
 * failover's warning. Nothing else.
 */
static void test_quiet_by_default(void **state)
{
	char path[] = "/tmp/shift-quiet-XXXXXX", buf[4096];
	int fd = mkstemp(path), saved = dup(2);
	struct seen sa = { 0 }, sb = { 0 };
	(void)state;

	assert_true(fd >= 0 && saved >= 0);
	unlink(path);
	test_unsetenv("SHIFT_LOG_LEVEL");
	fflush(stderr);
	dup2(fd, 2);
	sim_pair_open(&pair, &a, &b, "appctl-quiet", 0);
	sim_pair_connect(&pair);
	fail_over_a(&sa, &sb);
	sim_dev_revive(sim_host_dev(pair.host[0], 0));
	rounds(4000, &sa, &sb);
	assert_int_equal(shift_dqp_of_qp(a.qp)->failbacks, 1);
	sim_pair_close(&pair);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	close(fd);
	assert_true(n >= 0);
	buf[n] = '\0';
	print_message("stderr:\n%s", buf);
	int lines = 0;

	for (char *p = buf; (p = strchr(p, '\n')); p++)
		lines++;
	assert_int_equal(lines, 2);
	assert_non_null(strstr(buf, "shift: warn: "));
	assert_non_null(strstr(buf, "sim0_0 QP 256: failing over"));
	assert_non_null(strstr(buf, "sim1_0 QP 256: failing over"));
	assert_null(strstr(buf, "info"));
	test_setenv("SHIFT_LOG_LEVEL", "warn");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_modify_err_on_failed_over_qp, setup, teardown),
		cmocka_unit_test_setup_teardown(test_modify_reset_on_failed_over_qp, setup, teardown),
		cmocka_unit_test_setup_teardown(test_modify_err_during_failback, setup, teardown),
		cmocka_unit_test_setup_teardown(test_modify_err_in_default, setup, teardown),
		cmocka_unit_test_setup_teardown(test_destroy_during_failback, setup, teardown),
		cmocka_unit_test_setup_teardown(test_any_wr_id_after_failback, setup, teardown),
		cmocka_unit_test(test_retry_cnt_only_on_protected_qps),
		cmocka_unit_test_setup_teardown(test_responder_access_event_reaches_app, setup,
						teardown),
		cmocka_unit_test(test_event_after_ending_failed_over_qp),
		cmocka_unit_test(test_quiet_by_default),
	};

	test_setenv("SHIFT_LOG_LEVEL", "warn");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
