/*
 * Unit tests of the simulated RNIC's UD QPs and address handles (rnic/ud.c):
 * a datagram delivered at the post with its GRH, the sender's QPN and its
 * immediate; lost, with the send still successful, on a Q_Key mismatch, a
 * cut link, a dead port, no receive posted or a QP not ready; the UD state
 * machine's attribute rules.
 */
#include "sim_fixture.h"

#define QKEY 0x11223344u

/* A UD QP on ep's PD and CQ, at RTS. */
static struct ibv_qp *ud_qp(struct sim_ep *ep)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = ep->cq, .recv_cq = ep->cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ep->v->create_qp(ep->pd, &ia);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };

	assert_non_null(qp);
	assert_int_equal(qp->qp_type, IBV_QPT_UD);
	/* INIT wants the Q_Key; the RC attributes are refused */
	assert_int_equal(ep->v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT),
			 EINVAL);
	assert_int_equal(ep->v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
							  IBV_QP_QKEY | IBV_QP_ACCESS_FLAGS),
			 EINVAL);
	assert_int_equal(ep->v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
							  IBV_QP_QKEY),
			 0);
	a.qp_state = IBV_QPS_RTR;
	assert_int_equal(ep->v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_DEST_QPN), EINVAL);
	assert_int_equal(ep->v->modify_qp(qp, &a, IBV_QP_STATE), 0);
	a.qp_state = IBV_QPS_RTS;
	assert_int_equal(ep->v->modify_qp(qp, &a, IBV_QP_STATE), EINVAL); /* (no SQ PSN) */
	assert_int_equal(ep->v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
	return qp;
}

static int ud_recv(struct sim_ep *ep, struct ibv_qp *qp, uint64_t id, size_t off)
{
	struct ibv_sge sge = { (uintptr_t)ep->buf + off, 40 + 64, ep->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(qp, &wr, &bad);
}

static int ud_send(struct sim_ep *ep, struct ibv_qp *qp, struct ibv_ah *ah, uint32_t qpn,
		   uint32_t qkey, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)ep->buf, len, ep->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
				  .imm_data = 0x5a }, *bad;

	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = qkey;
	return ibv_post_send(qp, &wr, &bad);
}

static void test_ud(void **state)
{
	struct fx *f = *state;
	struct ibv_qp *qa = ud_qp(&f->a), *qb = ud_qp(&f->b);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1 };
	struct ibv_ah *ah;
	struct ibv_wc wc[4];

	assert_int_equal(f->b.v->query_gid(f->b.ctx, 1, 1, &aa.grh.dgid), 0);
	aa.grh.sgid_index = 1;
	ah = f->a.v->create_ah(f->a.pd, &aa);
	assert_non_null(ah);
	memcpy(f->a.buf, "datagram", 8);
	assert_int_equal(ud_recv(&f->b, qb, 77, 1024), 0);
	assert_int_equal(ud_send(&f->a, qa, ah, qb->qp_num, QKEY, 8), 0);
	/* delivered at the post, no step of the world */
	assert_int_equal(ibv_poll_cq(f->b.cq, 4, wc), 1);
	assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
	assert_int_equal(wc[0].opcode, IBV_WC_RECV);
	assert_int_equal(wc[0].wr_id, 77);
	assert_int_equal(wc[0].byte_len, 40 + 8);
	assert_int_equal(wc[0].src_qp, qa->qp_num);
	assert_true(wc[0].wc_flags & IBV_WC_GRH);
	assert_true(wc[0].wc_flags & IBV_WC_WITH_IMM);
	assert_int_equal(wc[0].imm_data, 0x5a);
	assert_memory_equal(f->b.buf + 1024 + 40, "datagram", 8);
	assert_int_equal(ibv_poll_cq(f->a.cq, 4, wc), 1);
	assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
	assert_int_equal(wc[0].opcode, IBV_WC_SEND);

	/* lost: a wrong Q_Key, no receive posted, another QP number */
	assert_int_equal(ud_send(&f->a, qa, ah, qb->qp_num, QKEY + 1, 8), 0);
	assert_int_equal(ud_send(&f->a, qa, ah, f->b.qp->qp_num, QKEY, 8), 0);
	assert_int_equal(ud_send(&f->a, qa, ah, qb->qp_num, QKEY, 8), 0); /* (no receive) */
	assert_int_equal(ibv_poll_cq(f->b.cq, 4, wc), 0);
	assert_int_equal(ibv_poll_cq(f->a.cq, 4, wc), 3); /* (each send succeeds) */

	/* lost on a cut link, delivered again once it is restored */
	struct sim_dev *da = sim_dev_of_context(f->a.ctx), *db = sim_dev_of_context(f->b.ctx);

	assert_int_equal(ud_recv(&f->b, qb, 78, 1024), 0);
	sim_link_cut(da, db);
	assert_int_equal(ud_send(&f->a, qa, ah, qb->qp_num, QKEY, 8), 0);
	assert_int_equal(ibv_poll_cq(f->b.cq, 4, wc), 0);
	sim_link_restore(da, db);
	sim_dev_kill(db, 0);
	assert_int_equal(ud_send(&f->a, qa, ah, qb->qp_num, QKEY, 8), 0);
	assert_int_equal(ibv_poll_cq(f->b.cq, 4, wc), 0);
	sim_dev_revive(db);
	assert_int_equal(ud_send(&f->a, qa, ah, qb->qp_num, QKEY, 8), 0);
	assert_int_equal(ibv_poll_cq(f->b.cq, 4, wc), 1);
	assert_int_equal(wc[0].wr_id, 78);
	assert_int_equal(ibv_poll_cq(f->a.cq, 4, wc), 3);
	/* larger than the receive: lost, the receive kept */
	assert_int_equal(ud_recv(&f->b, qb, 79, 1024), 0);
	assert_int_equal(ud_send(&f->a, qa, ah, qb->qp_num, QKEY, 100), 0);
	assert_int_equal(ibv_poll_cq(f->b.cq, 4, wc), 0);
	assert_int_equal(ud_send(&f->a, qa, ah, qb->qp_num, QKEY, 64), 0);
	assert_int_equal(ibv_poll_cq(f->b.cq, 4, wc), 1);
	assert_int_equal(wc[0].wr_id, 79);
	assert_int_equal(ibv_poll_cq(f->a.cq, 4, wc), 2);

	/* a QP not at RTR cannot receive, one not at RTS cannot send */
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RESET };

	assert_int_equal(f->b.v->modify_qp(qb, &a, IBV_QP_STATE), 0);
	assert_int_equal(ud_send(&f->a, qa, ah, qb->qp_num, QKEY, 8), 0);
	assert_int_equal(ibv_poll_cq(f->b.cq, 4, wc), 0);
	assert_int_equal(ud_send(&f->b, qb, ah, qa->qp_num, QKEY, 8), EINVAL);
	assert_int_equal(f->a.v->modify_qp(qa, &a, IBV_QP_STATE), 0);
	assert_int_equal(f->a.v->destroy_ah(ah), 0);
	aa.is_global = 0;
	assert_null(f->a.v->create_ah(f->a.pd, &aa)); /* (RoCE: a GRH) */
	assert_int_equal(f->a.v->destroy_qp(qa), 0);
	assert_int_equal(f->b.v->destroy_qp(qb), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_ud, fx_setup, fx_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
