/*
 * The backup QP grants the remote access the application's QP grants when
 * it matters, not when the backup went through INIT: librdmacm moves a QP
 * to INIT with REMOTE_WRITE only, and just before RTR again INIT -> INIT
 * with the READ/atomic access the CM negotiated. A backup replayed between
 * the two refused the peer's retransmitted RDMA READ after a failover
 * (rping on the testbed: "cq completion failed status 9", REM_INV_REQ on
 * rxe). Also: an RTS -> RTS access change reaches the backup.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "sim_pair.h"

static struct sim_ep a, b;
static struct sim_pair pair;

static void to_init(struct sim_ep *e, unsigned access)
{
	struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				  .qp_access_flags = access };

	assert_int_equal(e->v->modify_qp(e->qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						      IBV_QP_ACCESS_FLAGS), 0);
}

/* As librdmacm connects: INIT (write only), the backup replayed, INIT ->
 * INIT with READ, then RTR/RTS (sim_ep_connect's INIT again is the same
 * INIT -> INIT with every access). */
static void connect_like_rdmacm(void)
{
	sim_pair_open(&pair, &a, &b, "access", 0);
	to_init(&a, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	to_init(&b, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	for (int i = 0; i < 3; i++)
		shift_rnic_pass_all(); /* the backups go to INIT now */
	sim_pair_connect(&pair);
}

static int drive(struct ibv_wc *wa, int max_a)
{
	int na = 0, idle = 0;
	struct ibv_wc wb;

	while (idle < 3) {
		int moved = sim_world_step(pair.world) != 0;

		shift_rnic_pass_all();
		if (na < max_a && sim_pair_poll1("A", &a, wa + na)) {
			na++;
			moved++;
		}
		moved += sim_pair_poll1("B", &b, &wb);
		idle = moved ? 0 : idle + 1;
	}
	return na;
}

/* A's default NIC dies; A's READ of B's memory runs on the backups. */
static void read_after_failover(uint8_t pattern)
{
	struct ibv_wc wa[4];
	struct ibv_send_wr *bad;
	struct ibv_sge s = { .addr = (uintptr_t)a.buf + 8192, .length = 512, .lkey = a.mr->lkey };
	struct ibv_send_wr rd = { .wr_id = 77, .sg_list = &s, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = (uintptr_t)b.buf + 8192,
					       .rkey = b.mr->rkey } };

	memset(b.buf + 8192, pattern, 512);
	memset(a.buf + 8192, 0, 512);
	sim_dev_kill(sim_host_dev(pair.host[0], 0), 0);
	assert_int_equal(ibv_post_send(a.qp, &rd, &bad), 0);
	assert_int_equal(drive(wa, 4), 1);
	assert_int_equal(wa[0].wr_id, 77);
	assert_int_equal(wa[0].status, IBV_WC_SUCCESS);
	assert_int_equal(wa[0].opcode, IBV_WC_RDMA_READ);
	for (int i = 0; i < 512; i++)
		assert_int_equal(a.buf[8192 + i], pattern);
}

static void test_read_allowed_after_init_to_init(void **state)
{
	(void)state;
	connect_like_rdmacm();
	read_after_failover(0x3c);
	sim_pair_close(&pair);
}

/* B takes READ away at RTS, then grants it again: the backup follows
 * both changes (a READ while it is taken away is refused on the backup as
 * on the default QP). */
static void test_rts_access_change_followed(void **state)
{
	struct ibv_qp_attr at = { .qp_state = IBV_QPS_RTS };
	struct shift_qp_info qi;
	(void)state;

	sim_pair_open(&pair, &a, &b, "access", 0);
	sim_pair_connect(&pair);
	at.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	assert_int_equal(b.v->modify_qp(b.qp, &at, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS), 0);
	shift_rnic_pass_all();
	assert_int_equal(shift_shadow_qp_info(b.qp, &qi), 0);
	assert_int_equal(qi.state, SHIFT_SHADOW_READY);
	at.qp_access_flags = SIM_PAIR_ACCESS;
	assert_int_equal(b.v->modify_qp(b.qp, &at, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS), 0);
	shift_rnic_pass_all();
	read_after_failover(0xa5);
	sim_pair_close(&pair);
}

static void test_rts_access_taken_away_refuses_read(void **state)
{
	struct ibv_qp_attr at = { .qp_state = IBV_QPS_RTS,
				  .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE };
	struct ibv_send_wr *bad;
	struct ibv_wc wa[4];
	(void)state;

	sim_pair_open(&pair, &a, &b, "access", 0);
	sim_pair_connect(&pair);
	assert_int_equal(b.v->modify_qp(b.qp, &at, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS), 0);
	shift_rnic_pass_all();
	struct ibv_sge s = { .addr = (uintptr_t)a.buf, .length = 64, .lkey = a.mr->lkey };
	struct ibv_send_wr rd = { .wr_id = 78, .sg_list = &s, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = (uintptr_t)b.buf, .rkey = b.mr->rkey } };
	sim_dev_kill(sim_host_dev(pair.host[0], 0), 0);
	assert_int_equal(ibv_post_send(a.qp, &rd, &bad), 0);
	sim_pair_expect_errors(1);
	int n = drive(wa, 4);
	assert_true(n >= 1);
	assert_int_equal(wa[0].wr_id, 78);
	assert_int_not_equal(wa[0].status, IBV_WC_SUCCESS);
	assert_int_not_equal(wa[0].status, IBV_WC_WR_FLUSH_ERR);
	sim_pair_close(&pair);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_read_allowed_after_init_to_init),
		cmocka_unit_test(test_rts_access_change_followed),
		cmocka_unit_test(test_rts_access_taken_away_refuses_read),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
