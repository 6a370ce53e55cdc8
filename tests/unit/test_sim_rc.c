/*
 * Unit tests of the simulated RNIC's RC semantics under faults: retry
 * budget to IBV_WC_RETRY_EXC_ERR with QP -> ERR and flushes on both queues,
 * RNR NAK and rnr_retry, remote access and local protection errors, async
 * events on a real fd, the two traces of the failover trilemma (request
 * lost before execution vs executed with its ACK lost), the receiver NIC
 * dying after executing, link cuts shorter and longer than the retry
 * budget, PSN wrap-around, SQ drain, and determinism of the trace hash.
 */
#include <poll.h>
#include <unistd.h>

#include "sim_fixture.h"

static struct ibv_async_event fx_async(struct sim_ep *ep)
{
	struct pollfd pfd = { .fd = ep->ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;

	assert_int_equal(poll(&pfd, 1, 0), 1);
	assert_int_equal(ep->v->get_async_event(ep->ctx, &ev), 0);
	ep->v->ack_async_event(&ev);
	return ev;
}

static int async_pending(struct sim_ep *ep)
{
	struct pollfd pfd = { .fd = ep->ctx->async_fd, .events = POLLIN };

	return poll(&pfd, 1, 0);
}

static void test_retry_exceeded_flush(void **state)
{
	struct fx *f = *state;
	struct ibv_wc wc[8];

	assert_int_equal(fx_recv(&f->a, 50, 0, 64), 0);
	sim_dev_kill(sim_host_dev(f->h[1], 0), 0);
	assert_int_equal(fx_async(&f->b).event_type, IBV_EVENT_PORT_ERR);
	for (int i = 0; i < 3; i++)
		assert_int_equal(fx_post(&f->a, (uint64_t)i, IBV_WR_RDMA_WRITE, 0,
					 64, &f->b, 0, i == 1 ? 0 : IBV_SEND_SIGNALED),
				 0);
	sim_world_run_until_idle(f->w);
	assert_int_equal(f->a.qp->state, IBV_QPS_ERR);
	/* error on the first, then every WQE flushed (unsignaled too), then
	 * the receive queue */
	assert_int_equal(ibv_poll_cq(f->a.cq, 8, wc), 4);
	assert_int_equal(wc[0].wr_id, 0);
	assert_int_equal(wc[0].status, IBV_WC_RETRY_EXC_ERR);
	assert_int_equal(wc[1].wr_id, 1);
	assert_int_equal(wc[1].status, IBV_WC_WR_FLUSH_ERR);
	assert_int_equal(wc[2].wr_id, 2);
	assert_int_equal(wc[2].status, IBV_WC_WR_FLUSH_ERR);
	assert_int_equal(wc[3].wr_id, 50);
	assert_int_equal(wc[3].status, IBV_WC_WR_FLUSH_ERR);
	/* 1 try + retry_cnt (7) retries */
	assert_int_equal(sim_world_stats(f->w)->timeouts, 8);
	/* the budget is (retry_cnt + 1) timeouts */
	assert_true(sim_world_now(f->w) >= 8 * sim_qp_timeout_ticks(f->a.qp));
	sim_dev_revive(sim_host_dev(f->h[1], 0));
	assert_int_equal(fx_async(&f->b).event_type, IBV_EVENT_PORT_ACTIVE);
}

static void test_rnr(void **state)
{
	struct fx *f = *state;
	struct ibv_wc wc;

	/* rnr_retry 7: waits forever, succeeds once a receive shows up */
	assert_int_equal(fx_post(&f->a, 1, IBV_WR_SEND, 0, 8, NULL, 0,
				 IBV_SEND_SIGNALED), 0);
	sim_world_run(f->w, 200);
	assert_true(sim_world_stats(f->w)->rnr_naks >= 2);
	assert_int_equal(fx_nwc(&f->a), 0);
	assert_int_equal(fx_recv(&f->b, 9, 0, 64), 0);
	wc = fx_wc(f, &f->a);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	wc = fx_wc(f, &f->b);
	assert_int_equal(wc.wr_id, 9);
	/* write-with-imm needs a receive too, and is not executed without */
	struct fx g;
	struct sim_ep_conn c = { 14, 7, 2, 1, 16, 0 };

	assert_int_equal(fx_setup_opts(&g, 5, &c, 0), 0);
	memset(g.a.buf, 0x77, 16);
	assert_int_equal(fx_post(&g.a, 1, IBV_WR_RDMA_WRITE_WITH_IMM, 0, 16,
				 &g.b, 0, IBV_SEND_SIGNALED), 0);
	wc = fx_wc(&g, &g.a);
	assert_int_equal(wc.status, IBV_WC_RNR_RETRY_EXC_ERR);
	assert_int_equal(g.a.qp->state, IBV_QPS_ERR);
	assert_int_equal(sim_world_stats(g.w)->rnr_naks, 3);
	assert_int_equal(g.b.buf[0], 0);
	fx_teardown((void **)&(struct fx *){ &g });
}

static void test_remote_access(void **state)
{
	struct fx *f = *state;
	struct ibv_wc wc;

	/* out of the MR's bounds */
	assert_int_equal(fx_post(&f->a, 1, IBV_WR_RDMA_WRITE, 0, 64, &f->b,
				 4096 - 32, IBV_SEND_SIGNALED), 0);
	assert_int_equal(fx_post(&f->a, 2, IBV_WR_RDMA_WRITE, 0, 64, &f->b, 0,
				 IBV_SEND_SIGNALED), 0);
	wc = fx_wc(f, &f->a);
	assert_int_equal(wc.wr_id, 1);
	assert_int_equal(wc.status, IBV_WC_REM_ACCESS_ERR);
	wc = fx_wc(f, &f->a);
	assert_int_equal(wc.wr_id, 2);
	assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
	assert_int_equal(f->a.qp->state, IBV_QPS_ERR);
	assert_int_equal(f->b.qp->state, IBV_QPS_ERR);
	assert_int_equal(fx_async(&f->b).event_type, IBV_EVENT_QP_ACCESS_ERR);
}

static void test_access_flags(void **state)
{
	struct fx *f = *state;
	const struct shift_lower *v = f->b.v;
	uint64_t ro[4] = { 1, 2, 3, 4 };
	struct ibv_mr *mr = v->reg_mr(f->b.pd, ro, sizeof(ro),
				      IBV_ACCESS_REMOTE_READ);
	struct ibv_sge sge = { (uintptr_t)f->a.buf, 8, f->a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_READ,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.wr.rdma.remote_addr = (uintptr_t)&ro[2];
	wr.wr.rdma.rkey = mr->rkey;
	assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), 0);
	assert_int_equal(fx_wc(f, &f->a).status, IBV_WC_SUCCESS);
	assert_int_equal(*(uint64_t *)f->a.buf, 3);
	/* a fetch-add on a read-only MR is a remote access error */
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.wr.atomic.remote_addr = (uintptr_t)&ro[0];
	wr.wr.atomic.rkey = mr->rkey;
	wr.wr.atomic.compare_add = 1;
	assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), 0);
	assert_int_equal(fx_wc(f, &f->a).status, IBV_WC_REM_ACCESS_ERR);
	assert_int_equal(ro[0], 1);
	assert_int_equal(v->dereg_mr(mr), 0);
}

static void test_local_prot(void **state)
{
	struct fx *f = *state;
	struct ibv_sge sge = { (uintptr_t)f->a.buf, 8, f->a.mr->lkey + 1 };
	struct ibv_send_wr wr = { .wr_id = 3, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE }, *bad;

	assert_int_equal(fx_post(&f->a, 1, IBV_WR_RDMA_WRITE, 0, 8, &f->b, 0,
				 IBV_SEND_SIGNALED), 0);
	wr.wr.rdma.remote_addr = (uintptr_t)f->b.buf;
	wr.wr.rdma.rkey = f->b.mr->rkey;
	assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), 0);
	/* the good one completes first, in order, then the bad one */
	struct ibv_wc wc = fx_wc(f, &f->a);

	assert_int_equal(wc.wr_id, 1);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	wc = fx_wc(f, &f->a);
	assert_int_equal(wc.wr_id, 3);
	assert_int_equal(wc.status, IBV_WC_LOC_PROT_ERR);
}

/* Trace 1 of the trilemma: the request is lost before execution. RC
 * retransmits; the receive is consumed once. */
static void test_request_lost(void **state)
{
	struct fx *f = *state;
	uint64_t ctr = 0;

	memcpy(f->b.buf + 64, &ctr, 8);
	assert_int_equal(fx_recv(&f->b, 1, 0, 64), 0);
	assert_int_equal(fx_recv(&f->b, 2, 0, 64), 0);
	sim_qp_drop_next(f->a.qp, 0, 2);
	assert_int_equal(fx_post(&f->a, 1, IBV_WR_SEND, 0, 8, NULL, 0,
				 IBV_SEND_SIGNALED), 0);
	struct ibv_sge sge = { (uintptr_t)f->a.buf + 8, 8, f->a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.wr.atomic.remote_addr = (uintptr_t)f->b.buf + 64;
	wr.wr.atomic.rkey = f->b.mr->rkey;
	wr.wr.atomic.compare_add = 1;
	assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), 0);
	sim_world_run_until_idle(f->w);
	assert_int_equal(fx_nwc(&f->a), 2);
	assert_int_equal(fx_nwc(&f->b), 1);
	memcpy(&ctr, f->b.buf + 64, 8);
	assert_int_equal(ctr, 1);
	assert_int_equal(sim_world_stats(f->w)->executed, 2);
	assert_true(sim_world_stats(f->w)->dropped >= 2);
}

/* Trace 2: executed, ACK lost. The retransmission is a duplicate the
 * responder answers without executing again: the receive is not consumed
 * twice and the atomic is not applied twice (replay cache). */
static void test_ack_lost(void **state)
{
	struct fx *f = *state;
	uint64_t ctr = 10, got = 0;

	memcpy(f->b.buf + 64, &ctr, 8);
	assert_int_equal(fx_recv(&f->b, 1, 0, 64), 0);
	assert_int_equal(fx_recv(&f->b, 2, 0, 64), 0);
	sim_qp_drop_next(f->b.qp, 1, 2);
	assert_int_equal(fx_post(&f->a, 1, IBV_WR_SEND, 0, 8, NULL, 0,
				 IBV_SEND_SIGNALED), 0);
	struct ibv_sge sge = { (uintptr_t)f->a.buf + 8, 8, f->a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.wr.atomic.remote_addr = (uintptr_t)f->b.buf + 64;
	wr.wr.atomic.rkey = f->b.mr->rkey;
	wr.wr.atomic.compare_add = 5;
	assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), 0);
	sim_world_run_until_idle(f->w);
	assert_int_equal(fx_nwc(&f->a), 2);
	assert_int_equal(fx_nwc(&f->b), 1);
	memcpy(&ctr, f->b.buf + 64, 8);
	assert_int_equal(ctr, 15);
	memcpy(&got, f->a.buf + 8, 8);
	assert_int_equal(got, 10);
	assert_int_equal(sim_world_stats(f->w)->executed, 2);
	assert_true(sim_world_stats(f->w)->dup_requests >= 1);
}

/* The receiver NIC executes, then dies before its ACK leaves: data landed
 * at the receiver, the sender only sees a retry-exceeded error. */
static void test_receiver_dies_after_exec(void **state)
{
	struct fx *f = *state;

	memset(f->a.buf, 0x42, 32);
	sim_dev_kill_after_exec(sim_host_dev(f->h[1], 0), 1);
	assert_int_equal(fx_post(&f->a, 1, IBV_WR_RDMA_WRITE, 0, 32, &f->b, 100,
				 IBV_SEND_SIGNALED), 0);
	struct ibv_wc wc = fx_wc(f, &f->a);

	assert_int_equal(wc.status, IBV_WC_RETRY_EXC_ERR);
	for (int i = 0; i < 32; i++)
		assert_int_equal(f->b.buf[100 + i], 0x42);
	assert_false(sim_dev_alive(sim_host_dev(f->h[1], 0)));
}

static void test_link_cut(void **state)
{
	struct fx *f = *state;
	struct sim_dev *da = sim_host_dev(f->h[0], 0);
	struct sim_dev *db = sim_host_dev(f->h[1], 0);
	uint64_t budget = 8 * sim_qp_timeout_ticks(f->a.qp);
	struct sim_world *w = f->w;

	/* a cut shorter than the retry budget is ridden out */
	sim_world_schedule_fault(w, sim_world_now(w), SIM_FAULT_CUT, da, db, 0);
	sim_world_schedule_fault(w, sim_world_now(w) + budget / 2,
				 SIM_FAULT_RESTORE, da, db, 0);
	assert_int_equal(fx_post(&f->a, 1, IBV_WR_RDMA_WRITE, 0, 8, &f->b, 0,
				 IBV_SEND_SIGNALED), 0);
	assert_int_equal(fx_wc(f, &f->a).status, IBV_WC_SUCCESS);
	assert_true(sim_world_stats(w)->timeouts >= 1);
	/* the other device pair is not affected by the cut */
	/* a longer one is not */
	sim_link_cut(da, db);
	assert_int_equal(fx_post(&f->a, 2, IBV_WR_RDMA_WRITE, 0, 8, &f->b, 0,
				 IBV_SEND_SIGNALED), 0);
	assert_int_equal(fx_wc(f, &f->a).status, IBV_WC_RETRY_EXC_ERR);
	/* no port event on a link cut */
	assert_int_equal(async_pending(&f->a), 0);
}

static void test_fatal_events(void **state)
{
	struct fx *f = *state;
	struct ibv_async_event ev;

	assert_int_equal(fx_recv(&f->b, 4, 0, 64), 0);
	sim_dev_kill(sim_host_dev(f->h[1], 0), 1);
	assert_int_equal(fx_async(&f->b).event_type, IBV_EVENT_PORT_ERR);
	assert_int_equal(fx_async(&f->b).event_type, IBV_EVENT_DEVICE_FATAL);
	assert_int_equal(f->b.qp->state, IBV_QPS_ERR);
	struct ibv_wc wc;

	assert_int_equal(ibv_poll_cq(f->b.cq, 1, &wc), 1);
	assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
	/* a fatal device refuses new resources */
	assert_null(f->b.v->open_device(sim_dev_ibv(sim_host_dev(f->h[1], 0))));
	sim_dev_revive(sim_host_dev(f->h[1], 0));
	assert_int_equal(fx_async(&f->b).event_type, IBV_EVENT_PORT_ACTIVE);

	sim_qp_inject_fatal(f->a.qp);
	ev = fx_async(&f->a);
	assert_int_equal(ev.event_type, IBV_EVENT_QP_FATAL);
	assert_ptr_equal(ev.element.qp, f->a.qp);
	assert_int_equal(f->a.qp->events_completed, 1);
}

static void test_psn_wrap(void **state)
{
	struct fx f;
	(void)state;

	assert_int_equal(fx_setup_opts(&f, 9, NULL, 0), 0);
	/* reconnect A->B with PSNs just below 2^24 */
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RESET };

	assert_int_equal(f.a.v->modify_qp(f.a.qp, &a, IBV_QP_STATE), 0);
	assert_int_equal(f.b.v->modify_qp(f.b.qp, &a, IBV_QP_STATE), 0);
	sim_ep_info(&f.a, 0xfffffe, &f.ia);
	sim_ep_info(&f.b, 0xfffffd, &f.ib);
	assert_int_equal(sim_ep_connect(&f.a, &f.ia, &f.ib, NULL), 0);
	assert_int_equal(sim_ep_connect(&f.b, &f.ib, &f.ia, NULL), 0);
	sim_qp_drop_next(f.a.qp, 0, 1);
	for (int i = 0; i < 6; i++)
		assert_int_equal(fx_post(&f.a, (uint64_t)i, IBV_WR_RDMA_WRITE, 0,
					 8, &f.b, 0, IBV_SEND_SIGNALED), 0);
	sim_world_run_until_idle(f.w);
	assert_int_equal(fx_nwc(&f.a), 6);
	assert_int_equal(sim_world_stats(f.w)->executed, 6);
	fx_teardown((void **)&(struct fx *){ &f });
}

static void test_sqd_drain(void **state)
{
	struct fx *f = *state;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_SQD,
				 .en_sqd_async_notify = 1 };

	assert_int_equal(fx_post(&f->a, 1, IBV_WR_RDMA_WRITE, 0, 8, &f->b, 0,
				 IBV_SEND_SIGNALED), 0);
	sim_world_step(f->w);	/* transmitted, not acknowledged */
	assert_int_equal(f->a.v->modify_qp(f->a.qp, &a, IBV_QP_STATE |
					   IBV_QP_EN_SQD_ASYNC_NOTIFY), 0);
	/* posted in SQD: held */
	assert_int_equal(fx_post(&f->a, 2, IBV_WR_RDMA_WRITE, 0, 8, &f->b, 0,
				 IBV_SEND_SIGNALED), 0);
	sim_world_run_until_idle(f->w);
	assert_int_equal(fx_async(&f->a).event_type, IBV_EVENT_SQ_DRAINED);
	assert_int_equal(fx_nwc(&f->a), 1);
	a.qp_state = IBV_QPS_RTS;
	assert_int_equal(f->a.v->modify_qp(f->a.qp, &a, IBV_QP_STATE), 0);
	sim_world_run_until_idle(f->w);
	assert_int_equal(fx_nwc(&f->a), 1);
}

/* The backup NICs of the same hosts keep working while the defaults are
 * dead: a second connection sim0_1 <-> sim1_1 carries traffic. */
static void test_backup_devices(void **state)
{
	struct fx *f = *state;
	struct sim_ep a2, b2;
	struct sim_ep_info i2a, i2b;
	struct ibv_qp_cap cap = { 16, 16, 1, 1, 0 };

	sim_dev_kill(sim_host_dev(f->h[0], 0), 1);
	assert_int_equal(sim_ep_open(&a2, sim_lower(f->h[0]), "sim0_1", 256,
				     ACC_ALL, &cap, 64, 0), 0);
	assert_int_equal(sim_ep_open(&b2, sim_lower(f->h[1]), "sim1_1", 256,
				     ACC_ALL, &cap, 64, 0), 0);
	sim_ep_info(&a2, 1, &i2a);
	sim_ep_info(&b2, 2, &i2b);
	assert_int_equal(sim_ep_connect(&a2, &i2a, &i2b, NULL), 0);
	assert_int_equal(sim_ep_connect(&b2, &i2b, &i2a, NULL), 0);
	memset(a2.buf, 0x99, 16);
	assert_int_equal(fx_post(&a2, 1, IBV_WR_RDMA_WRITE, 0, 16, &b2, 0,
				 IBV_SEND_SIGNALED), 0);
	sim_world_run_until_idle(f->w);
	struct ibv_wc wc;

	assert_int_equal(ibv_poll_cq(a2.cq, 1, &wc), 1);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(b2.buf[15], 0x99);
	/* the default pair is flushed */
	assert_int_equal(f->a.qp->state, IBV_QPS_ERR);
	sim_ep_close(&a2);
	sim_ep_close(&b2);
}

static uint64_t run_mix(uint64_t seed)
{
	struct fx f;
	uint64_t h;

	assert_int_equal(fx_setup_opts(&f, seed, NULL, 0), 0);
	for (int i = 0; i < 20; i++) {
		assert_int_equal(fx_recv(&f.b, (uint64_t)i, 0, 64), 0);
		assert_int_equal(fx_post(&f.a, (uint64_t)i, i % 3 ? IBV_WR_SEND :
					 IBV_WR_RDMA_READ, 0, 8, &f.b, 0,
					 IBV_SEND_SIGNALED), 0);
		assert_int_equal(fx_post(&f.b, (uint64_t)i, IBV_WR_RDMA_WRITE,
					 0, 8, &f.a, 8, IBV_SEND_SIGNALED), 0);
	}
	sim_qp_drop_next(f.a.qp, 0, 1);
	sim_qp_drop_next(f.b.qp, 1, 1);
	sim_world_run_until_idle(f.w);
	h = sim_world_hash(f.w);
	fx_teardown((void **)&(struct fx *){ &f });
	return h;
}

static void test_determinism(void **state)
{
	(void)state;
	assert_int_equal(run_mix(77), run_mix(77));
	assert_int_not_equal(run_mix(77), run_mix(78));
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)
	const struct CMUnitTest tests[] = {
		T(test_retry_exceeded_flush),
		T(test_rnr),
		T(test_remote_access),
		T(test_access_flags),
		T(test_local_prot),
		T(test_request_lost),
		T(test_ack_lost),
		T(test_receiver_dies_after_exec),
		T(test_link_cut),
		T(test_fatal_events),
		cmocka_unit_test(test_psn_wrap),
		T(test_sqd_drain),
		T(test_backup_devices),
		cmocka_unit_test(test_determinism),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
