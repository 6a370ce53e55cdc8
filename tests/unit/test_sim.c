/*
 * Unit tests of the simulated RNIC's verbs surface: devices, ports, GIDs,
 * the verbs_context slots, PD/MR checks, every opcode moving real bytes
 * (send/recv, write, write-with-imm, read, fetch-add, compare-swap, inline,
 * SGE lists), signaled and unsignaled WRs, completion channels with
 * solicited and unsolicited arming, the QP state machine and its
 * attribute-mask rules, and extended CQ polling.
 */
#include <poll.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>

#include "sim_fixture.h"

static void test_devices(void **state)
{
	struct fx *f = *state;
	const struct shift_lower *v = sim_lower(f->h[1]);
	struct ibv_device **list;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	int n = 0;

	list = v->get_device_list(&n);
	assert_int_equal(n, 2);
	assert_string_equal(v->get_device_name(list[0]), "sim1_0");
	assert_string_equal(v->get_device_name(list[1]), "sim1_1");
	assert_null(list[2]);
	v->free_device_list(list);

	/* the world-wide table lists all four */
	list = sim_lower_world(f->w)->get_device_list(&n);
	assert_int_equal(n, 4);
	assert_string_equal(list[3]->name, "sim1_1");
	free(list);
	assert_ptr_equal(sim_dev_host(sim_dev_of_context(f->b.ctx)), f->h[1]);
	assert_int_equal(sim_dev_index(sim_dev_of_context(f->b.ctx)), 0);

	assert_int_equal(v->query_port(f->b.ctx, 1, &pa), 0);
	assert_int_equal(pa.state, IBV_PORT_ACTIVE);
	assert_int_equal(pa.link_layer, IBV_LINK_LAYER_ETHERNET);
	assert_int_equal(v->query_port(f->b.ctx, 2, &pa), EINVAL);
	assert_int_equal(v->query_gid(f->b.ctx, 1, 1, &gid), 0);
	assert_int_equal(gid.raw[10], 0xff);
	assert_int_equal(gid.raw[12], 10);
	assert_int_equal(gid.raw[13], 1);

	/* extended slots reached the verbs.h way */
	struct verbs_context *vctx = verbs_get_ctx_op(f->b.ctx, query_port);

	assert_non_null(vctx);
	memset(&pa, 0, sizeof(pa));
	assert_int_equal(vctx->query_port(f->b.ctx, 1, &pa, sizeof(pa)), 0);
	assert_int_equal(pa.state, IBV_PORT_ACTIVE);
	assert_non_null(verbs_get_ctx_op(f->b.ctx, create_qp_ex));
	struct ibv_device_attr_ex dx;

	assert_non_null(verbs_get_ctx_op(f->b.ctx, query_device_ex));
	assert_int_equal(vctx->query_device_ex(f->b.ctx, NULL, &dx, sizeof(dx)), 0);
	assert_int_equal(dx.orig_attr.phys_port_cnt, 1);
}

static void test_send_recv(void **state)
{
	struct fx *f = *state;
	struct ibv_wc wc;

	memcpy(f->a.buf, "hello, rdma", 12);
	assert_int_equal(fx_recv(&f->b, 7, 100, 64), 0);
	assert_int_equal(fx_post(&f->a, 1, IBV_WR_SEND, 0, 12, NULL, 0,
				 IBV_SEND_SIGNALED), 0);
	/* nothing moves until the world steps */
	assert_int_equal(fx_nwc(&f->b), 0);
	wc = fx_wc(f, &f->b);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.opcode, IBV_WC_RECV);
	assert_int_equal(wc.wr_id, 7);
	assert_int_equal(wc.byte_len, 12);
	assert_int_equal(wc.qp_num, f->b.qp->qp_num);
	assert_int_equal(wc.src_qp, f->a.qp->qp_num);
	assert_string_equal((char *)f->b.buf + 100, "hello, rdma");
	wc = fx_wc(f, &f->a);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.opcode, IBV_WC_SEND);
	assert_int_equal(wc.wr_id, 1);
}

static void test_write_imm_read(void **state)
{
	struct fx *f = *state;
	struct ibv_wc wc;

	memset(f->a.buf, 0xab, 256);
	/* unsignaled write, then a signaled write-with-imm */
	assert_int_equal(fx_post(&f->a, 1, IBV_WR_RDMA_WRITE, 0, 200, &f->b,
				 1000, 0), 0);
	assert_int_equal(fx_recv(&f->b, 9, 0, 0), 0);
	struct ibv_sge sge = { (uintptr_t)f->a.buf, 16, f->a.mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 2, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED, .imm_data = htobe32(0x1234),
	}, *bad;

	wr.wr.rdma.remote_addr = (uintptr_t)f->b.buf + 1200;
	wr.wr.rdma.rkey = f->b.mr->rkey;
	assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), 0);
	wc = fx_wc(f, &f->b);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
	assert_true(wc.wc_flags & IBV_WC_WITH_IMM);
	assert_int_equal(be32toh(wc.imm_data), 0x1234);
	assert_int_equal(wc.byte_len, 16);
	assert_int_equal(wc.wr_id, 9);
	for (int i = 0; i < 200; i++)
		assert_int_equal(f->b.buf[1000 + i], 0xab);
	/* the unsignaled write completes silently: only wr 2 shows */
	wc = fx_wc(f, &f->a);
	assert_int_equal(wc.wr_id, 2);
	assert_int_equal(wc.opcode, IBV_WC_RDMA_WRITE);
	assert_int_equal(fx_nwc(&f->a), 0);

	/* read back from B into A at offset 2048 */
	memset(f->b.buf + 3000, 0x5c, 64);
	assert_int_equal(fx_post(&f->a, 3, IBV_WR_RDMA_READ, 2048, 64, &f->b,
				 3000, IBV_SEND_SIGNALED), 0);
	wc = fx_wc(f, &f->a);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.opcode, IBV_WC_RDMA_READ);
	assert_int_equal(wc.byte_len, 64);
	for (int i = 0; i < 64; i++)
		assert_int_equal(f->a.buf[2048 + i], 0x5c);
}

static void test_atomics(void **state)
{
	struct fx *f = *state;
	struct ibv_sge sge = { (uintptr_t)f->a.buf + 8, 8, f->a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	uint64_t v = 40, got;
	struct ibv_wc wc;

	memcpy(f->b.buf + 64, &v, 8);
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.wr.atomic.remote_addr = (uintptr_t)f->b.buf + 64;
	wr.wr.atomic.rkey = f->b.mr->rkey;
	wr.wr.atomic.compare_add = 2;
	assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), 0);
	wc = fx_wc(f, &f->a);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.opcode, IBV_WC_FETCH_ADD);
	memcpy(&got, f->a.buf + 8, 8);
	assert_int_equal(got, 40);
	memcpy(&v, f->b.buf + 64, 8);
	assert_int_equal(v, 42);

	wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	wr.wr.atomic.compare_add = 42;
	wr.wr.atomic.swap = 7;
	assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), 0);
	wc = fx_wc(f, &f->a);
	assert_int_equal(wc.opcode, IBV_WC_COMP_SWAP);
	memcpy(&v, f->b.buf + 64, 8);
	assert_int_equal(v, 7);
	/* a failing compare leaves memory alone and returns the value */
	assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), 0);
	wc = fx_wc(f, &f->a);
	memcpy(&got, f->a.buf + 8, 8);
	assert_int_equal(got, 7);
	memcpy(&v, f->b.buf + 64, 8);
	assert_int_equal(v, 7);
	/* atomics need one 8-byte SGE */
	sge.length = 4;
	assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), EINVAL);
	assert_ptr_equal(bad, &wr);
}

static void test_inline_sge_list(void **state)
{
	struct fx *f = *state;
	char tmp[32] = "inline-data";
	struct ibv_sge sge = { (uintptr_t)tmp, 12, 0 /* lkey ignored */ };
	struct ibv_send_wr wr = {
		.wr_id = 1, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED,
	}, *bad;

	wr.wr.rdma.remote_addr = (uintptr_t)f->b.buf;
	wr.wr.rdma.rkey = f->b.mr->rkey;
	assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), 0);
	memset(tmp, 'X', sizeof(tmp)); /* reuse at once: inline was copied */
	assert_int_equal(fx_wc(f, &f->a).status, IBV_WC_SUCCESS);
	assert_string_equal((char *)f->b.buf, "inline-data");

	/* too long for max_inline_data (64) */
	sge.length = 65;
	assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), EINVAL);

	/* gather three SGEs into one receive scattered over two */
	struct ibv_sge g[3] = {
		{ (uintptr_t)f->a.buf + 0, 4, f->a.mr->lkey },
		{ (uintptr_t)f->a.buf + 100, 4, f->a.mr->lkey },
		{ (uintptr_t)f->a.buf + 200, 4, f->a.mr->lkey },
	};
	struct ibv_sge s[2] = {
		{ (uintptr_t)f->b.buf + 500, 6, f->b.mr->lkey },
		{ (uintptr_t)f->b.buf + 600, 10, f->b.mr->lkey },
	};
	struct ibv_recv_wr rwr = { .wr_id = 5, .sg_list = s, .num_sge = 2 },
			   *rbad;

	memcpy(f->a.buf + 0, "abcd", 4);
	memcpy(f->a.buf + 100, "efgh", 4);
	memcpy(f->a.buf + 200, "ijkl", 4);
	assert_int_equal(ibv_post_recv(f->b.qp, &rwr, &rbad), 0);
	wr.sg_list = g;
	wr.num_sge = 3;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = 0;
	assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), 0);
	struct ibv_wc wc = fx_wc(f, &f->b);

	assert_int_equal(wc.byte_len, 12);
	assert_memory_equal(f->b.buf + 500, "abcdef", 6);
	assert_memory_equal(f->b.buf + 600, "ghijkl", 6);
	/* too many SGEs for the QP's cap */
	struct ibv_sge many[5] = { 0 };

	wr.sg_list = many;
	wr.num_sge = 5;
	assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), EINVAL);
}

static void test_sq_sig_all_and_order(void **state)
{
	struct fx *f = *state;
	struct ibv_wc wc[16];

	/* unsignaled writes then a signaled one: one completion, last id */
	for (int i = 0; i < 10; i++)
		assert_int_equal(fx_post(&f->a, (uint64_t)i, IBV_WR_RDMA_WRITE,
					 0, 8, &f->b, (size_t)i * 8,
					 i == 9 ? IBV_SEND_SIGNALED : 0), 0);
	sim_world_run(f->w, 100000);
	assert_int_equal(ibv_poll_cq(f->a.cq, 16, wc), 1);
	assert_int_equal(wc[0].wr_id, 9);
	/* receives complete in posting order */
	for (int i = 0; i < 5; i++)
		assert_int_equal(fx_recv(&f->b, 100 + (uint64_t)i, 64u * (unsigned)i,
					 64), 0);
	for (int i = 0; i < 5; i++)
		assert_int_equal(fx_post(&f->a, (uint64_t)i, IBV_WR_SEND, 0, 8,
					 NULL, 0, IBV_SEND_SIGNALED), 0);
	sim_world_run(f->w, 100000);
	assert_int_equal(ibv_poll_cq(f->b.cq, 16, wc), 5);
	for (int i = 0; i < 5; i++)
		assert_int_equal(wc[i].wr_id, 100 + (uint64_t)i);
	assert_int_equal(ibv_poll_cq(f->a.cq, 16, wc), 5);
	for (int i = 0; i < 5; i++)
		assert_int_equal(wc[i].wr_id, (uint64_t)i);
}

static void test_mr_checks(void **state)
{
	struct fx *f = *state;
	const struct shift_lower *v = f->a.v;
	char buf[64];

	/* remote write without local write is refused */
	assert_null(v->reg_mr(f->a.pd, buf, sizeof(buf), IBV_ACCESS_REMOTE_WRITE));
	assert_int_equal(errno, EINVAL);
	struct ibv_mr *mr = v->reg_mr(f->a.pd, buf, sizeof(buf), 0);

	assert_non_null(mr);
	/* PD in use */
	assert_int_equal(v->dealloc_pd(f->a.pd), EBUSY);
	assert_int_equal(v->dereg_mr(mr), 0);
}

static void test_state_machine(void **state)
{
	struct fx *f = *state;
	const struct shift_lower *v = f->a.v;
	struct ibv_qp_init_attr ia = { .send_cq = f->a.cq, .recv_cq = f->a.cq,
				       .cap = { 8, 8, 1, 1, 0 },
				       .qp_type = IBV_QPT_RC };
	struct ibv_qp *qp = v->create_qp(f->a.pd, &ia);
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr qia;

	assert_non_null(qp);
	assert_int_equal(qp->state, IBV_QPS_RESET);
	memset(&a, 0, sizeof(a));
	/* RESET -> RTR is illegal */
	a.qp_state = IBV_QPS_RTR;
	assert_int_equal(v->modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
	/* RESET -> INIT needs PKEY_INDEX | PORT | ACCESS_FLAGS */
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	assert_int_equal(v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT), EINVAL);
	/* an attribute not allowed on this transition */
	assert_int_equal(v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT |
				      IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS |
				      IBV_QP_SQ_PSN), EINVAL);
	/* bad value */
	a.port_num = 2;
	assert_int_equal(v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT |
				      IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS),
			 EINVAL);
	a.port_num = 1;
	assert_int_equal(v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT |
				      IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS), 0);
	assert_int_equal(qp->state, IBV_QPS_INIT);
	/* posting sends in INIT fails, receives are fine */
	struct ibv_send_wr wr = { .opcode = IBV_WR_SEND }, *bad;

	assert_int_equal(ibv_post_send(qp, &wr, &bad), EINVAL);
	struct ibv_recv_wr rwr = { .wr_id = 77 }, *rbad;

	assert_int_equal(ibv_post_recv(qp, &rwr, &rbad), 0);
	/* INIT -> RTR without everything required */
	a.qp_state = IBV_QPS_RTR;
	assert_int_equal(v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_DEST_QPN),
			 EINVAL);
	/* RoCE needs a GRH */
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = f->ib.qpn;
	a.min_rnr_timer = 1;
	int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;

	assert_int_equal(v->modify_qp(qp, &a, rtr), EINVAL);
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.dgid = f->ib.gid;
	assert_int_equal(v->modify_qp(qp, &a, rtr), 0);
	/* CUR_STATE must match */
	a.qp_state = IBV_QPS_RTS;
	a.cur_qp_state = IBV_QPS_INIT;
	int rts = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
		  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;

	assert_int_equal(v->modify_qp(qp, &a, rts | IBV_QP_CUR_STATE), EINVAL);
	a.retry_cnt = 8;
	assert_int_equal(v->modify_qp(qp, &a, rts), EINVAL);
	a.retry_cnt = 3;
	assert_int_equal(v->modify_qp(qp, &a, rts), 0);
	/* RTS -> RTS with an optional attribute; not with a required-only */
	a.min_rnr_timer = 5;
	assert_int_equal(v->modify_qp(qp, &a, IBV_QP_MIN_RNR_TIMER), 0);
	assert_int_equal(v->modify_qp(qp, &a, IBV_QP_SQ_PSN), EINVAL);
	/* RTS -> SQD -> RTS */
	a.qp_state = IBV_QPS_SQD;
	a.en_sqd_async_notify = 1;
	assert_int_equal(v->modify_qp(qp, &a, IBV_QP_STATE |
				      IBV_QP_EN_SQD_ASYNC_NOTIFY), 0);
	assert_int_equal(qp->state, IBV_QPS_SQD);
	a.qp_state = IBV_QPS_RTS;
	assert_int_equal(v->modify_qp(qp, &a, IBV_QP_STATE), 0);
	assert_int_equal(v->query_qp(qp, &a, IBV_QP_STATE, &qia), 0);
	assert_int_equal(a.qp_state, IBV_QPS_RTS);
	assert_int_equal(a.retry_cnt, 3);
	assert_int_equal(a.min_rnr_timer, 5);
	/* -> ERR flushes the receive posted in INIT */
	a.qp_state = IBV_QPS_ERR;
	assert_int_equal(v->modify_qp(qp, &a, IBV_QP_STATE), 0);
	struct ibv_wc wc;

	assert_int_equal(ibv_poll_cq(f->a.cq, 1, &wc), 1);
	assert_int_equal(wc.wr_id, 77);
	assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
	/* posting in ERR completes with a flush at once */
	wr.wr_id = 78;
	assert_int_equal(ibv_post_send(qp, &wr, &bad), 0);
	assert_int_equal(ibv_poll_cq(f->a.cq, 1, &wc), 1);
	assert_int_equal(wc.wr_id, 78);
	assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
	/* ERR -> RTS illegal; ERR -> RESET fine */
	a.qp_state = IBV_QPS_RTS;
	assert_int_equal(v->modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
	a.qp_state = IBV_QPS_RESET;
	assert_int_equal(v->modify_qp(qp, &a, IBV_QP_STATE), 0);
	assert_int_equal(v->destroy_qp(qp), 0);
}

static void test_channel(void **state)
{
	struct fx *f = *state;
	struct pollfd pfd = { .fd = f->b.ch->fd, .events = POLLIN };
	struct ibv_cq *cq;
	void *cqctx;

	/* not armed: no event */
	assert_int_equal(fx_recv(&f->b, 1, 0, 64), 0);
	assert_int_equal(fx_post(&f->a, 1, IBV_WR_SEND, 0, 8, NULL, 0, 0), 0);
	sim_world_run(f->w, 10000);
	assert_int_equal(poll(&pfd, 1, 0), 0);
	assert_int_equal(fx_nwc(&f->b), 1);

	/* solicited only: an unsolicited receive does not wake */
	assert_int_equal(ibv_req_notify_cq(f->b.cq, 1), 0);
	assert_int_equal(fx_recv(&f->b, 2, 0, 64), 0);
	assert_int_equal(fx_post(&f->a, 2, IBV_WR_SEND, 0, 8, NULL, 0, 0), 0);
	sim_world_run(f->w, 10000);
	assert_int_equal(poll(&pfd, 1, 0), 0);
	assert_int_equal(fx_recv(&f->b, 3, 0, 64), 0);
	assert_int_equal(fx_post(&f->a, 3, IBV_WR_SEND, 0, 8, NULL, 0,
				 IBV_SEND_SOLICITED), 0);
	sim_world_run(f->w, 10000);
	assert_int_equal(poll(&pfd, 1, 0), 1);
	assert_int_equal(f->b.v->get_cq_event(f->b.ch, &cq, &cqctx), 0);
	assert_ptr_equal(cq, f->b.cq);
	assert_ptr_equal(cqctx, &f->b);
	f->b.v->ack_cq_events(cq, 1);
	assert_int_equal(poll(&pfd, 1, 0), 0);
	assert_int_equal(fx_nwc(&f->b), 2);

	/* any: the next completion wakes, once */
	assert_int_equal(ibv_req_notify_cq(f->b.cq, 0), 0);
	assert_int_equal(fx_recv(&f->b, 4, 0, 64), 0);
	assert_int_equal(fx_recv(&f->b, 5, 0, 64), 0);
	assert_int_equal(fx_post(&f->a, 4, IBV_WR_SEND, 0, 8, NULL, 0, 0), 0);
	assert_int_equal(fx_post(&f->a, 5, IBV_WR_SEND, 0, 8, NULL, 0, 0), 0);
	sim_world_run(f->w, 10000);
	assert_int_equal(f->b.v->get_cq_event(f->b.ch, &cq, &cqctx), 0);
	f->b.v->ack_cq_events(cq, 1);
	assert_int_equal(poll(&pfd, 1, 0), 0);
	/* non-blocking channel: EAGAIN when empty */
	fcntl(f->b.ch->fd, F_SETFL, O_NONBLOCK);
	assert_int_equal(f->b.v->get_cq_event(f->b.ch, &cq, &cqctx), -1);
	assert_int_equal(errno, EAGAIN);
}

static int fx_setup_ch(void **state)
{
	static struct fx f;

	*state = &f;
	return fx_setup_opts(&f, 2, NULL, SIM_EP_CHANNEL);
}

static void test_cq_ex(void **state)
{
	struct fx *f = *state;
	struct ibv_cq_init_attr_ex ca = { .cqe = 16,
					  .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_cq_ex *cx = ibv_create_cq_ex(f->a.ctx, &ca);
	struct ibv_poll_cq_attr pa = { 0 };

	assert_non_null(cx);
	/* a QP made through the create_qp_ex slot, on the ex CQ */
	struct verbs_context *vctx = verbs_get_ctx_op(f->a.ctx, create_qp_ex);
	struct ibv_qp_init_attr_ex ia = {
		.send_cq = ibv_cq_ex_to_cq(cx), .recv_cq = ibv_cq_ex_to_cq(cx),
		.cap = { 4, 4, 1, 1, 0 }, .qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD, .pd = f->a.pd,
	};
	struct ibv_qp *qp = vctx->create_qp_ex(f->a.ctx, &ia);

	assert_non_null(qp);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	struct ibv_recv_wr rwr = { .wr_id = 11 }, *rbad;

	assert_int_equal(f->a.v->modify_qp(qp, &a, IBV_QP_STATE), 0);
	assert_int_equal(ibv_post_recv(qp, &rwr, &rbad), 0);
	assert_int_equal(ibv_start_poll(cx, &pa), 0);
	assert_int_equal(cx->wr_id, 11);
	assert_int_equal(cx->status, IBV_WC_WR_FLUSH_ERR);
	assert_int_equal(ibv_wc_read_qp_num(cx), qp->qp_num);
	assert_int_equal(ibv_next_poll(cx), ENOENT);
	ibv_end_poll(cx);
	assert_int_equal(f->a.v->destroy_qp(qp), 0);
	assert_int_equal(f->a.v->destroy_cq(ibv_cq_ex_to_cq(cx)), 0);
}

/* A layer above (SHIFT) replaces ctx->ops with its own and calls the
 * sim's: everything must keep working. */
static int (*orig_post_send)(struct ibv_qp *, struct ibv_send_wr *,
			     struct ibv_send_wr **);
static int (*orig_poll_cq)(struct ibv_cq *, int, struct ibv_wc *);
static int n_wrapped;

static int wrap_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
			  struct ibv_send_wr **bad)
{
	n_wrapped++;
	return orig_post_send(qp, wr, bad);
}

static int wrap_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	n_wrapped++;
	return orig_poll_cq(cq, n, wc);
}

static void test_ops_swapped(void **state)
{
	struct fx *f = *state;

	orig_post_send = f->a.ctx->ops.post_send;
	orig_poll_cq = f->a.ctx->ops.poll_cq;
	f->a.ctx->ops.post_send = wrap_post_send;
	f->a.ctx->ops.poll_cq = wrap_poll_cq;
	n_wrapped = 0;
	memset(f->a.buf, 0x31, 64);
	assert_int_equal(fx_post(&f->a, 1, IBV_WR_RDMA_WRITE, 0, 64, &f->b, 0,
				 IBV_SEND_SIGNALED), 0);
	assert_int_equal(fx_wc(f, &f->a).status, IBV_WC_SUCCESS);
	assert_int_equal(n_wrapped, 2);
	assert_int_equal(f->b.buf[63], 0x31);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_devices, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_send_recv, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_write_imm_read, fx_setup,
						fx_teardown),
		cmocka_unit_test_setup_teardown(test_atomics, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_inline_sge_list, fx_setup,
						fx_teardown),
		cmocka_unit_test_setup_teardown(test_sq_sig_all_and_order, fx_setup,
						fx_teardown),
		cmocka_unit_test_setup_teardown(test_mr_checks, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_state_machine, fx_setup,
						fx_teardown),
		cmocka_unit_test_setup_teardown(test_channel, fx_setup_ch, fx_teardown),
		cmocka_unit_test_setup_teardown(test_cq_ex, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_ops_swapped, fx_setup,
						fx_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
