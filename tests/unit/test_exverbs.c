/*
 * Extended verbs through SHIFT on the simulated RNIC: CQs from
 * ibv_create_cq_ex polled with ibv_start_poll / ibv_next_poll /
 * ibv_end_poll and ibv_wc_read_*, QPs from ibv_create_qp_ex posted with
 * ibv_wr_* (shift/dp/cqex.c, shift/dp/qpex.c).
 *
 * The main test runs one application twice: once on the plain simulated
 * RNIC without a fault, once through SHIFT with A's default NIC dying,
 * coming back (failback) and both backup NICs dying afterwards. Each side
 * must see exactly the completions the plain run saw (wr_id, status,
 * opcode, byte_len where it means something, immediate, own QP), in the
 * same order, and both buffers must end up byte for byte the same.
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
#include "shift/dp/cqex.h"
#include "shift/dp/qpex.h"

#define MAXC 256

/* verbs.h's inline ibv_create_qp_ex names this for a PD-only comp_mask,
 * which these tests never pass. */
struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	(void)pd;
	(void)attr;
	fail_msg("legacy ibv_create_qp reached");
	return NULL;
}

/* What an application sees of one completion, as compared across runs. */
struct seen {
	uint64_t wr_id;
	int status, opcode;
	uint32_t byte_len;	/* receives, reads and atomics only */
	uint32_t imm;		/* with IBV_WC_WITH_IMM only */
	unsigned wc_flags;
	bool own_qp;		/* the completion names the polling QP */
};

struct app {
	struct sim_world *w;
	struct sim_host *h[2];
	struct sim_ep a, b;
	bool shift;
	struct sim_pair pair;
	struct seen sa[MAXC], sb[MAXC];
	int na, nb;
	unsigned sessions;	/* poll sessions that returned a completion */
};

/* One poll session of up to 3 completions (start_poll, next_poll, ...,
 * end_poll), every field the CQ's wc_flags (the standard ones) give. */
static int poll_ex(struct app *p, struct sim_ep *e, struct seen *out, int room)
{
	struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
	struct ibv_cq_ex *cq = e->cqx;
	int n = 0, rc = ibv_start_poll(cq, &attr);

	if (rc == ENOENT)
		return 0; /* (no session: no end_poll) */
	assert_int_equal(rc, 0);
	p->sessions++;
	do {
		struct seen *s = &out[n];
		int op = (int)ibv_wc_read_opcode(cq);

		if (n == room)
			fail_msg("more completions than expected");
		memset(s, 0, sizeof(*s));
		s->wr_id = cq->wr_id;
		s->status = cq->status;
		s->own_qp = ibv_wc_read_qp_num(cq) == e->qp->qp_num;
		if (s->status == IBV_WC_SUCCESS) {
			s->opcode = op;
			s->wc_flags = ibv_wc_read_wc_flags(cq);
			if ((op & IBV_WC_RECV) || op == IBV_WC_RDMA_READ || op == IBV_WC_FETCH_ADD ||
			    op == IBV_WC_COMP_SWAP)
				s->byte_len = ibv_wc_read_byte_len(cq);
			if (s->wc_flags & IBV_WC_WITH_IMM)
				s->imm = be32toh(ibv_wc_read_imm_data(cq));
		} else {
			fail_msg("error completion: wr_id %llu status %d",
				 (unsigned long long)s->wr_id, s->status);
		}
		n++;
	} while (n < 3 && !(rc = ibv_next_poll(cq)));
	assert_true(rc == 0 || rc == ENOENT);
	ibv_end_poll(cq);
	return n;
}

/* Network, SHIFT's background pass, both applications' polls, for a fixed
 * number of rounds (the recovery probe runs every few passes). */
static void rounds(struct app *p, int n)
{
	for (int r = 0; r < n; r++) {
		sim_world_step(p->w);
		if (p->shift)
			shift_rnic_pass_all();
		p->na += poll_ex(p, &p->a, p->sa + p->na, MAXC - p->na);
		p->nb += poll_ex(p, &p->b, p->sb + p->nb, MAXC - p->nb);
	}
}

static void app_open(struct app *p, bool shift)
{
	struct ibv_qp_cap cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 2,
				  .max_recv_sge = 2, .max_inline_data = 64 };
	struct sim_ep_info ia, ib;

	memset(p, 0, sizeof(*p));
	p->shift = shift;
	if (shift) {
		sim_pair_open(&p->pair, &p->a, &p->b, "exverbs", SIM_EP_EX);
		sim_pair_connect(&p->pair);
		p->w = p->pair.world;
		p->h[0] = p->pair.host[0];
		p->h[1] = p->pair.host[1];
		return;
	}
	p->w = sim_world_create(NULL);
	p->h[0] = sim_host_create(p->w, 2);
	p->h[1] = sim_host_create(p->w, 2);
	assert_int_equal(sim_ep_open(&p->a, sim_lower(p->h[0]), "sim0_0", 1 << 16, SIM_PAIR_ACCESS,
				     &cap, 256, SIM_EP_EX), 0);
	assert_int_equal(sim_ep_open(&p->b, sim_lower(p->h[1]), "sim1_0", 1 << 16, SIM_PAIR_ACCESS,
				     &cap, 256, SIM_EP_EX), 0);
	sim_ep_info(&p->a, 1, &ia);
	sim_ep_info(&p->b, 2, &ib);
	assert_int_equal(sim_ep_connect(&p->a, &ia, &ib, NULL), 0);
	assert_int_equal(sim_ep_connect(&p->b, &ib, &ia, NULL), 0);
}

static void app_close(struct app *p)
{
	if (p->shift) {
		sim_pair_close(&p->pair);
		return;
	}
	sim_ep_close(&p->a);
	sim_ep_close(&p->b);
	sim_world_destroy(p->w);
}

/* B's receives (ibv_post_recv: there is no ibv_wr_* for receives). */
static void post_b_recvs(struct app *p, int from, int n)
{
	for (int i = from; i < from + n; i++) {
		struct ibv_sge rs = { .addr = (uintptr_t)p->b.buf + 8192 + 128 * (i % 32),
				      .length = 128, .lkey = p->b.mr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 500 + i, .sg_list = &rs, .num_sge = 1 }, *bad;

		assert_int_equal(ibv_post_recv(p->b.qp, &rwr, &bad), 0);
	}
}

/*
 * One batch of A's, through ibv_wr_*: k selects the contents, every kind
 * of builder SHIFT mirrors. The inline payloads come from a stack buffer
 * that is overwritten as soon as each setter returns (the library must
 * have copied it).
 */
static void batch(struct app *p, int k)
{
	struct ibv_qp_ex *q = p->a.qpx;
	uint8_t *buf = p->a.buf;
	uint32_t lk = p->a.mr->lkey, rk = p->b.mr->rkey;
	uint64_t rb = (uintptr_t)p->b.buf;
	uint8_t tmp[48];
	uint64_t id = 1000 + 100 * (uint64_t)k;

	for (int i = 0; i < 1024; i++)
		buf[1024 * k + i] = (uint8_t)(k * 37 + i);
	ibv_wr_start(q);
	for (int i = 0; i < 4; i++) { /* writes, every other one signaled */
		q->wr_id = id++;
		q->wr_flags = i & 1 ? IBV_SEND_SIGNALED : 0;
		ibv_wr_rdma_write(q, rk, rb + 1024 * k + 128 * i);
		ibv_wr_set_sge(q, lk, (uintptr_t)buf + 1024 * k + 128 * i, 128);
	}
	q->wr_id = id++;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write_imm(q, rk, rb + 1024 * k + 512, htobe32(0xab00u + (unsigned)k));
	ibv_wr_set_sge(q, lk, (uintptr_t)buf + 1024 * k + 512, 64);
	q->wr_id = id++;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(q);
	memset(tmp, 'a' + k, sizeof(tmp));
	ibv_wr_set_inline_data(q, tmp, 40);
	memset(tmp, 0xee, sizeof(tmp)); /* reused at once */
	q->wr_id = id++;
	q->wr_flags = 0;
	ibv_wr_send_imm(q, htobe32(0xcd00u + (unsigned)k));
	struct ibv_sge two[2] = {
		{ .addr = (uintptr_t)buf + 1024 * k + 600, .length = 30, .lkey = lk },
		{ .addr = (uintptr_t)buf + 1024 * k + 700, .length = 20, .lkey = lk },
	};
	ibv_wr_set_sge_list(q, 2, two);
	q->wr_id = id++;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(q, rk, rb + 60000);
	ibv_wr_set_sge(q, lk, (uintptr_t)buf + 32768 + 256 * k, 200);
	q->wr_id = id++;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(q, rk, rb + 1024 * k + 800);
	struct ibv_data_buf parts[2] = { { tmp, 8 }, { tmp + 8, 8 } };
	memset(tmp, 'A' + k, 16);
	ibv_wr_set_inline_data_list(q, 2, parts);
	memset(tmp, 0xee, sizeof(tmp));
	assert_int_equal(ibv_wr_complete(q), 0);
}

static void fill_read_source(struct app *p)
{
	for (int i = 0; i < 256; i++)
		p->b.buf[60000 + i] = (uint8_t)(255 - i);
}

enum fault { NONE, NIC_DIES, LINK_CUT };

static void fault_on(struct app *p, enum fault f)
{
	if (f == NIC_DIES)
		sim_dev_kill(sim_host_dev(p->h[0], 0), 0); /* SHIFT sees the port go down */
	else if (f == LINK_CUT) /* the port stays up: an error completion */
		sim_link_cut(sim_host_dev(p->h[0], 0), sim_host_dev(p->h[1], 0));
}

static void fault_off(struct app *p, enum fault f)
{
	if (f == NIC_DIES)
		sim_dev_revive(sim_host_dev(p->h[0], 0));
	else if (f == LINK_CUT)
		sim_link_restore(sim_host_dev(p->h[0], 0), sim_host_dev(p->h[1], 0));
}

/* The application; fault: the default path fails after batch 1 is posted
 * (batch 2 goes into it, batch 3 while failed over), comes back, and after
 * the failback both backup NICs die (batch 4 must run on the default
 * path). */
static void scenario(struct app *p, enum fault fault)
{
	fill_read_source(p);
	post_b_recvs(p, 0, 24);
	batch(p, 0);
	rounds(p, 200);
	batch(p, 1);
	fault_on(p, fault);
	batch(p, 2);
	rounds(p, 600);
	batch(p, 3);
	rounds(p, 600);
	fault_off(p, fault);
	rounds(p, 4000);
	if (fault) {
		sim_dev_kill(sim_host_dev(p->h[0], 1), 0);
		sim_dev_kill(sim_host_dev(p->h[1], 1), 0);
	}
	batch(p, 4);
	rounds(p, 600);
}

static void assert_same(const struct seen *x, int nx, const struct seen *y, int ny, const char *who)
{
	if (nx != ny)
		fail_msg("%s: %d completions through SHIFT, %d plain", who, nx, ny);
	for (int i = 0; i < nx; i++)
		if (memcmp(&x[i], &y[i], sizeof(x[i])))
			fail_msg("%s: completion %d differs: wr_id %llu/%llu status %d/%d opcode %d/%d "
				 "byte_len %u/%u imm %x/%x flags %x/%x own %d/%d", who, i,
				 (unsigned long long)x[i].wr_id, (unsigned long long)y[i].wr_id,
				 x[i].status, y[i].status, x[i].opcode, y[i].opcode, x[i].byte_len,
				 y[i].byte_len, x[i].imm, y[i].imm, x[i].wc_flags, y[i].wc_flags,
				 x[i].own_qp, y[i].own_qp);
}

static void failover_failback_as_plain(enum fault fault)
{
	static struct app plain, sh;

	app_open(&plain, false);
	scenario(&plain, NONE);
	assert_int_equal(plain.na, 5 * 6);
	assert_int_equal(plain.nb, 5 * 3);

	app_open(&sh, true);
	struct shift_dqp *da = shift_dqp_of_qp(sh.a.qp);

	assert_non_null(da);
	scenario(&sh, fault);
	assert_same(sh.sa, sh.na, plain.sa, plain.na, "A");
	assert_same(sh.sb, sh.nb, plain.sb, plain.nb, "B");
	assert_memory_equal(sh.a.buf, plain.a.buf, 1 << 16);
	assert_memory_equal(sh.b.buf, plain.b.buf, 1 << 16);
	/* it did fail over and back, and ended protected with nothing left */
	assert_int_equal(da->failovers, 1);
	assert_int_equal(da->failbacks, 1);
	assert_true(da->retransmitted > 0);
	assert_int_equal(da->send_state, SHIFT_SEND_DEFAULT);
	shift_dqp_sync(da);
	assert_int_equal(da->sq_tail, da->sq_head);
	app_close(&sh);
	app_close(&plain);
}

static void test_nic_death_as_plain(void **state)
{
	(void)state;
	failover_failback_as_plain(NIC_DIES);
}

static void test_link_cut_as_plain(void **state)
{
	(void)state;
	failover_failback_as_plain(LINK_CUT);
}

/*
 * The Default path retires what ibv_start_poll returns: many more
 * signaled WRs than the mirror holds, polled only through the extended
 * API, leave the QP protected (before, the mirror overflowed).
 */
static void test_default_polls_retire(void **state)
{
	static struct app p;
	(void)state;

	app_open(&p, true);
	struct shift_dqp *da = shift_dqp_of_qp(p.a.qp), *db = shift_dqp_of_qp(p.b.qp);

	fill_read_source(&p);
	for (int r = 0; r < 40; r++) {
		p.na = p.nb = 0;
		post_b_recvs(&p, 0, 3);
		batch(&p, r % 5);
		rounds(&p, 300);
		assert_int_equal(p.na, 6);
		assert_int_equal(p.nb, 3);
	}
	assert_int_equal(da->send_state, SHIFT_SEND_DEFAULT);
	assert_int_equal(db->send_state, SHIFT_SEND_DEFAULT);
	shift_dqp_sync(da);
	assert_int_equal(da->sq_tail, da->sq_head);
	assert_int_equal(da->sq_head, 40 * 9);
	assert_int_equal(db->rq_tail, db->rq_head);
	assert_int_equal(da->failovers, 0);
	app_close(&p);
}

/* Aborted and refused batches leave the mirror as it was; the refusal is
 * the application's (the QP is healthy), and the QP stays protected. */
static void test_abort_and_refusal(void **state)
{
	static struct app p;
	struct ibv_qp_ex *q;
	uint8_t big[100] = { 0 };
	(void)state;

	app_open(&p, true);
	q = p.a.qpx;
	struct shift_dqp *da = shift_dqp_of_qp(p.a.qp);
	uint64_t head = da->sq_head;
	struct ibv_sge three[3] = {
		{ (uintptr_t)p.a.buf, 8, p.a.mr->lkey }, { (uintptr_t)p.a.buf + 8, 8, p.a.mr->lkey },
		{ (uintptr_t)p.a.buf + 16, 8, p.a.mr->lkey },
	};

	ibv_wr_start(q);
	q->wr_id = 1;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(q, p.b.mr->rkey, (uintptr_t)p.b.buf);
	ibv_wr_set_sge(q, p.a.mr->lkey, (uintptr_t)p.a.buf, 8);
	ibv_wr_abort(q);
	assert_int_equal(da->sq_head, head);

	ibv_wr_start(q); /* more SGEs than the QP takes (2) */
	q->wr_id = 2;
	ibv_wr_rdma_write(q, p.b.mr->rkey, (uintptr_t)p.b.buf);
	ibv_wr_set_sge_list(q, 3, three);
	assert_int_not_equal(ibv_wr_complete(q), 0);
	assert_int_equal(da->sq_head, head);

	ibv_wr_start(q); /* more inline data than the QP takes (64) */
	q->wr_id = 3;
	ibv_wr_send(q);
	ibv_wr_set_inline_data(q, big, sizeof(big));
	assert_int_not_equal(ibv_wr_complete(q), 0);
	assert_int_equal(da->sq_head, head);
	assert_int_equal(da->send_state, SHIFT_SEND_DEFAULT);

	rounds(&p, 100);
	assert_int_equal(p.na, 0); /* nothing of those went out */
	ibv_wr_start(q);
	q->wr_id = 4;
	q->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(q, p.b.mr->rkey, (uintptr_t)p.b.buf);
	ibv_wr_set_sge(q, p.a.mr->lkey, (uintptr_t)p.a.buf, 8);
	assert_int_equal(ibv_wr_complete(q), 0);
	assert_int_equal(da->sq_head, head + 1);
	rounds(&p, 100);
	assert_int_equal(p.na, 1);
	assert_int_equal(p.sa[0].wr_id, 4);
	app_close(&p);
}

/* An extended CQ SHIFT cannot answer for (a completion timestamp) stays
 * the provider's, and its QPs run unprotected; so does a QP created for an
 * operation SHIFT cannot mirror. */
static void test_unprotectable_left_alone(void **state)
{
	static struct app p;
	(void)state;

	app_open(&p, true);
	struct ibv_cq_init_attr_ex ca = {
		.cqe = 64, .wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
	};
	struct ibv_cq_ex *ts = ibv_create_cq_ex(p.a.ctx, &ca);

	assert_non_null(ts);
	assert_true(shift_cqx_blocks(ibv_cq_ex_to_cq(ts)));
	assert_ptr_not_equal(ts->start_poll, p.a.cqx->start_poll); /* the sim's, not SHIFT's */
	assert_false(shift_cqx_blocks(p.a.cq));

	struct ibv_qp_init_attr_ex qa = {
		.send_cq = ibv_cq_ex_to_cq(ts), .recv_cq = ibv_cq_ex_to_cq(ts),
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC, .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = p.a.pd, .send_ops_flags = IBV_QP_EX_WITH_SEND,
	};
	struct ibv_qp *q1 = ibv_create_qp_ex(p.a.ctx, &qa);

	assert_non_null(q1);
	assert_null(shift_dqp_of_qp(q1));
	struct ibv_qp_init_attr ia = { .send_cq = ibv_cq_ex_to_cq(ts), .recv_cq = ibv_cq_ex_to_cq(ts),
				       .cap = qa.cap, .qp_type = IBV_QPT_RC };
	struct ibv_qp *q2 = shift_verbs.create_qp(p.a.pd, &ia);

	assert_non_null(q2);
	assert_null(shift_dqp_of_qp(q2));

	qa.send_cq = qa.recv_cq = p.a.cq; /* a CQ SHIFT polls, but send_inv */
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV;
	struct ibv_qp *q3 = ibv_create_qp_ex(p.a.ctx, &qa);

	assert_non_null(q3);
	assert_null(shift_dqp_of_qp(q3));
	assert_null(shift_qpx_forget(q3)); /* its builders are the provider's */

	qa.send_ops_flags = IBV_QP_EX_WITH_SEND; /* and the same without: protected */
	struct ibv_qp *q4 = ibv_create_qp_ex(p.a.ctx, &qa);

	assert_non_null(q4);
	assert_non_null(shift_dqp_of_qp(q4));
	assert_ptr_not_equal(ibv_qp_to_qp_ex(q4)->wr_start, ibv_qp_to_qp_ex(q3)->wr_start);

	assert_int_equal(shift_verbs.destroy_qp(q1), 0);
	assert_int_equal(shift_verbs.destroy_qp(q2), 0);
	assert_int_equal(shift_verbs.destroy_qp(q3), 0);
	assert_int_equal(shift_verbs.destroy_qp(q4), 0);
	assert_int_equal(shift_verbs.destroy_cq(ibv_cq_ex_to_cq(ts)), 0);
	app_close(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_nic_death_as_plain),
		cmocka_unit_test(test_link_cut_as_plain),
		cmocka_unit_test(test_default_polls_retire),
		cmocka_unit_test(test_abort_and_refusal),
		cmocka_unit_test(test_unprotectable_left_alone),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
