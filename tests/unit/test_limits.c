/*
 * No limit the plain library lacks, and what the application does to its
 * objects honoured on their backups, on the simulated RNIC with SHIFT run
 * inline (shift_inline.h):
 * - more than 256 QPs of one context fail over together, each completes;
 * - a CQ the application resized: its backup holds as much, so a failover
 *   that brings every completion at once loses none;
 * - a CQ made at the device's largest size still gets its backup;
 * - an MR the application re-registered (its own side, and the peer's,
 *   across two failovers): the backup keys follow;
 * - a QP whose peer never published its backup attributes is unprotected,
 *   and a failure then reaches the application exactly as without SHIFT;
 * - a child after fork() has its parent's contexts as plain ones, their
 *   extended CQs and QPs with the provider's functions.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "kv/kv.h"
#include "sim_pair.h"

static struct sim_world *world;
static struct sim_host *host[2];
static char kvname[48];

static void world_open(const char *name)
{
	static int run;
	char url[96];

	world = sim_world_create(NULL);
	host[0] = sim_host_create(world, 2);
	host[1] = sim_host_create(world, 2);
	shift_lower_set(sim_lower_world(world));
	snprintf(kvname, sizeof(kvname), "%s%d", name, run++);
	snprintf(url, sizeof(url), "mem://%s", kvname);
	test_setenv("SHIFT_KV_URL", url);
	test_setenv("SHIFT_STATUS_DIR", "");
	shift_inline_load();
}

static int teardown(void **state)
{
	(void)state;
	assert_int_equal(shift_dqp_illegal_transitions(), 0);
	if (world)
		sim_world_destroy(world);
	world = NULL;
	test_env_restore();
	return 0;
}

static int connect_pair(struct sim_ep *a, struct sim_ep *b)
{
	struct sim_ep_info ia, ib;

	sim_ep_info(a, 100, &ia);
	sim_ep_info(b, 200, &ib);
	return sim_ep_connect(a, &ia, &ib, NULL) || sim_ep_connect(b, &ib, &ia, NULL);
}

static void passes(int n)
{
	for (int i = 0; i < n; i++)
		shift_rnic_pass_all();
}

/* The network and SHIFT's passes, no application poll, until nothing
 * moves: completions pile up wherever they land. */
static void run_unpolled(int rounds)
{
	for (int i = 0; i < rounds; i++) {
		sim_world_run(world, 1u << 20);
		shift_rnic_pass_all();
	}
}

static void post_write(struct sim_ep *a, struct sim_ep *b, struct ibv_qp *qp, int i,
		       uint32_t lkey, uint8_t *src)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src + 64 * i, .length = 64, .lkey = lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1000 + (uint64_t)i, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)b->buf + 64 * i, .rkey = b->mr->rkey },
	}, *bad;

	(void)a;
	memset(src + 64 * i, 'a' + i % 26, 64);
	assert_int_equal(ibv_post_send(qp, &wr, &bad), 0);
}

/* Poll a's CQ empty: the successful completions of wr_ids 1000.. in order
 * (an error completion fails the test); how many. */
static int poll_writes(struct sim_ep *a, int from)
{
	struct ibv_wc wc;
	int n = from;

	while (sim_pair_poll1("A", a, &wc) == 1) {
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		assert_int_equal(wc.wr_id, 1000 + (uint64_t)n);
		n++;
	}
	return n;
}

/*
 * The application creates its CQs small and resizes them before use (a
 * library growing its CQ with its connections). After the NIC dies, the
 * outstanding writes complete on the backup all at once while nobody
 * polls: the backup CQ must hold them, as the application's does.
 */
static void test_resize_cq_then_failover_keeps_every_completion(void **state)
{
	struct ibv_qp_cap cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1,
				  .max_recv_sge = 1 };
	struct sim_ep a, b;
	(void)state;

	world_open("resize");
	assert_int_equal(sim_ep_open(&a, &shift_verbs, "sim0_0", 1 << 14, SIM_PAIR_ACCESS, &cap, 8, 0), 0);
	assert_int_equal(sim_ep_open(&b, &shift_verbs, "sim1_0", 1 << 14, SIM_PAIR_ACCESS, &cap, 8, 0), 0);
	assert_int_equal(connect_pair(&a, &b), 0);
	passes(4);
	assert_int_equal(shift_shadow_qp_state(a.qp), SHIFT_SHADOW_READY);
	assert_int_equal(shift_verbs.resize_cq(a.cq, 128), 0);
	assert_int_equal(shift_verbs.resize_cq(b.cq, 128), 0);
	assert_true(a.cq->cqe >= 128);
	/* the backup grew before resize_cq returned */
	struct shift_cq *c = shift_shadow_cq_of(shift_rnic_of(a.ctx), a.cq);
	assert_non_null(c);
	assert_true(c->bk->cqe >= a.cq->cqe + 1);

	for (int i = 0; i < 64; i++)
		post_write(&a, &b, a.qp, i, a.mr->lkey, a.buf);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	run_unpolled(64);
	assert_int_equal(poll_writes(&a, 0), 64);
	for (int i = 0; i < 64; i++)
		assert_int_equal(b.buf[64 * i], 'a' + i % 26);
	assert_int_equal(shift_dqp_of_qp(a.qp)->failovers, 1);
	sim_ep_close(&a);
	sim_ep_close(&b);
}

/* A CQ of the device's largest size: its backup cannot have one entry
 * more, it gets the largest there is, and the QP on it is protected. */
static void test_cq_at_max_size_gets_its_backup(void **state)
{
	struct ibv_qp_cap cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
				  .max_recv_sge = 1 };
	struct ibv_device_attr da;
	struct sim_ep a, b;
	(void)state;

	world_open("maxcq");
	assert_int_equal(sim_ep_open(&b, &shift_verbs, "sim1_0", 1 << 14, SIM_PAIR_ACCESS, &cap, 64, 0), 0);
	assert_int_equal(shift_lower->query_device(b.ctx, &da), 0);
	assert_int_equal(sim_ep_open(&a, &shift_verbs, "sim0_0", 1 << 14, SIM_PAIR_ACCESS, &cap,
				     da.max_cqe, 0), 0);
	assert_int_equal(connect_pair(&a, &b), 0);
	passes(4);
	struct shift_cq *c = shift_shadow_cq_of(shift_rnic_of(a.ctx), a.cq);
	assert_non_null(c);
	assert_int_equal(c->state, SHIFT_SHADOW_READY);
	assert_int_equal(c->bk->cqe, da.max_cqe);
	assert_int_equal(shift_shadow_qp_state(a.qp), SHIFT_SHADOW_READY);
	for (int i = 0; i < 8; i++)
		post_write(&a, &b, a.qp, i, a.mr->lkey, a.buf);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	run_unpolled(64);
	assert_int_equal(poll_writes(&a, 0), 8);
	sim_ep_close(&a);
	sim_ep_close(&b);
}

/*
 * 300 QPs of one context, every one failed over at once when the NIC dies
 * (there is no cap on a context's failed-over QPs): each write completes,
 * successfully, and lands.
 */
static void test_hundreds_of_qps_fail_over_together(void **state)
{
	enum { N = 300 };
	struct ibv_qp_cap cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
				  .max_recv_sge = 1 };
	static struct sim_ep qa[N], qb[N];
	struct sim_ep a, b;
	(void)state;

	world_open("manyqps");
	assert_int_equal(sim_ep_open(&a, &shift_verbs, "sim0_0", 64 * N, SIM_PAIR_ACCESS, &cap, 4 * N, 0), 0);
	assert_int_equal(sim_ep_open(&b, &shift_verbs, "sim1_0", 64 * N, SIM_PAIR_ACCESS, &cap, 4 * N, 0), 0);
	for (int i = 0; i < N; i++) {
		struct ibv_qp_init_attr ia = { .send_cq = a.cq, .recv_cq = a.cq, .cap = cap,
					       .qp_type = IBV_QPT_RC };

		qa[i] = a;
		qb[i] = b;
		qa[i].qp = shift_verbs.create_qp(a.pd, &ia);
		ia.send_cq = ia.recv_cq = b.cq;
		qb[i].qp = shift_verbs.create_qp(b.pd, &ia);
		assert_non_null(qa[i].qp);
		assert_non_null(qb[i].qp);
		assert_int_equal(connect_pair(&qa[i], &qb[i]), 0);
	}
	passes(6);
	for (int i = 0; i < N; i++)
		assert_int_equal(shift_shadow_qp_state(qa[i].qp), SHIFT_SHADOW_READY);
	for (int i = 0; i < N; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)a.buf + 64 * i, .length = 64,
				       .lkey = a.mr->lkey };
		struct ibv_send_wr wr = {
			.wr_id = 5000 + (uint64_t)i, .sg_list = &sge, .num_sge = 1,
			.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = (uintptr_t)b.buf + 64 * i, .rkey = b.mr->rkey },
		}, *bad;

		memset(a.buf + 64 * i, 1 + i % 250, 64);
		assert_int_equal(ibv_post_send(qa[i].qp, &wr, &bad), 0);
	}
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	bool done[N] = { false };
	int got = 0;
	for (int r = 0; r < 20000 && got < N; r++) {
		struct ibv_wc wc;

		sim_world_step(world);
		shift_rnic_pass_all();
		while (sim_pair_poll1("A", &a, &wc) == 1) {
			assert_int_equal(wc.status, IBV_WC_SUCCESS);
			assert_true(wc.wr_id >= 5000 && wc.wr_id < 5000 + N);
			assert_false(done[wc.wr_id - 5000]);
			assert_int_equal(wc.qp_num, qa[wc.wr_id - 5000].qp->qp_num);
			done[wc.wr_id - 5000] = true;
			got++;
		}
	}
	assert_int_equal(got, N);
	for (int i = 0; i < N; i++) {
		assert_int_equal(b.buf[64 * i], 1 + i % 250);
		assert_int_equal(shift_dqp_of_qp(qa[i].qp)->failovers, 1);
	}
	for (int i = 0; i < N; i++) {
		assert_int_equal(shift_verbs.destroy_qp(qa[i].qp), 0);
		assert_int_equal(shift_verbs.destroy_qp(qb[i].qp), 0);
	}
	sim_ep_close(&a);
	sim_ep_close(&b);
}

/*
 * Re-registered MRs. A moves its MR to a new buffer (its lkey is now for
 * that one), B changes its MR's access flags (a new registration, whose
 * backup has a new rkey); two failovers, the second after B re-registers
 * again: every write reaches B through the current backups.
 */
static void test_rereg_mr_followed_across_failovers(void **state)
{
	struct ibv_qp_cap cap = { .max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 1,
				  .max_recv_sge = 1 };
	static uint8_t moved[1 << 14];
	struct sim_ep a, b;
	int n = 0, done = 0;
	(void)state;

	world_open("rereg");
	assert_int_equal(sim_ep_open(&a, &shift_verbs, "sim0_0", 1 << 14, SIM_PAIR_ACCESS, &cap, 64, 0), 0);
	assert_int_equal(sim_ep_open(&b, &shift_verbs, "sim1_0", 1 << 14, SIM_PAIR_ACCESS, &cap, 64, 0), 0);
	assert_int_equal(connect_pair(&a, &b), 0);
	passes(4);
	assert_int_equal(shift_verbs.rereg_mr(a.mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, moved,
					      sizeof(moved), 0), 0);
	struct shift_dqp *da = shift_dqp_of_qp(a.qp);
	for (int cycle = 0; cycle < 2; cycle++) {
		assert_int_equal(shift_verbs.rereg_mr(b.mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
						      SIM_PAIR_ACCESS), 0);
		passes(2);
		assert_non_null(shift_shadow_mr_backup(a.mr));
		assert_ptr_equal(shift_shadow_mr_backup(a.mr)->addr, moved);
		assert_non_null(shift_shadow_mr_backup(b.mr));
		for (int i = 0; i < 8; i++, n++)
			post_write(&a, &b, a.qp, n, a.mr->lkey, moved);
		sim_dev_kill(sim_host_dev(host[0], 0), 0);
		for (int r = 0; r < 4000 && done < n; r++) {
			sim_world_step(world);
			shift_rnic_pass_all();
			done = poll_writes(&a, done);
		}
		assert_int_equal(done, n);
		assert_int_equal(da->failovers, (unsigned long)cycle + 1);
		sim_dev_revive(sim_host_dev(host[0], 0));
		for (int r = 0; r < 4000; r++) {
			sim_world_step(world);
			shift_rnic_pass_all();
			assert_int_equal(poll_writes(&a, done), done);
		}
		assert_int_equal(da->failbacks, (unsigned long)cycle + 1);
	}
	for (int i = 0; i < n; i++)
		assert_int_equal(b.buf[64 * i], 'a' + i % 26);
	sim_ep_close(&a);
	sim_ep_close(&b);
}

/*
 * A connects through va to a peer without SHIFT (its backup attributes
 * never appear), writes 8 times, and its NIC dies: the completions A's
 * application polls (up to max), in order.
 */
static int fail_unshadowed(const struct shift_lower *va, struct ibv_wc *out, int max)
{
	struct ibv_qp_cap cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
				  .max_recv_sge = 1 };
	struct sim_ep a, b;
	int n = 0;

	world_open("unshadowed");
	assert_int_equal(sim_ep_open(&a, va, "sim0_0", 1 << 14, SIM_PAIR_ACCESS, &cap, 64, 0), 0);
	assert_int_equal(sim_ep_open(&b, shift_lower, "sim1_0", 1 << 14, SIM_PAIR_ACCESS, &cap, 64, 0), 0);
	assert_int_equal(connect_pair(&a, &b), 0);
	passes(16);
	if (va == &shift_verbs)
		assert_int_equal(shift_shadow_qp_state(a.qp), SHIFT_SHADOW_PENDING);
	for (int i = 0; i < 8; i++)
		post_write(&a, &b, a.qp, i, a.mr->lkey, a.buf);
	sim_dev_kill(sim_host_dev(host[0], 0), 0);
	sim_pair_expect_errors(max);
	for (int r = 0; r < 4000 && n < max; r++) {
		sim_world_step(world);
		shift_rnic_pass_all();
		n += sim_pair_poll1("A", &a, out + n);
	}
	sim_ep_close(&a);
	sim_ep_close(&b);
	sim_world_destroy(world);
	world = NULL;
	test_env_restore();
	return n;
}

/* Unprotected until the peer's record appears, and failing as plain:
 * the same completions (wr_id, status, opcode, QP) in the same order. */
static void test_unshadowed_qp_fails_as_plain(void **state)
{
	struct ibv_wc ws[16], wp[16];
	(void)state;

	int ns = fail_unshadowed(&shift_verbs, ws, 16);
	int np = fail_unshadowed(shift_lower, wp, 16);
	assert_int_equal(np, 8);
	assert_int_equal(ns, np);
	for (int i = 0; i < np; i++) {
		assert_int_equal(ws[i].wr_id, wp[i].wr_id);
		assert_int_equal(ws[i].status, wp[i].status);
		if (ws[i].status == IBV_WC_SUCCESS)
			assert_int_equal(ws[i].opcode, wp[i].opcode);
	}
	assert_int_equal(wp[0].status, IBV_WC_RETRY_EXC_ERR);
}

/* An extended CQ and an extended QP on pd's context (through verbs.h,
 * so through SHIFT on a context SHIFT took over). */
static void make_ex(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq_ex **cq,
		    struct ibv_qp **qp)
{
	struct ibv_cq_init_attr_ex ca = { .cqe = 64, .wc_flags = IBV_WC_STANDARD_FLAGS };

	*cq = ibv_create_cq_ex(ctx, &ca);
	assert_non_null(*cq);
	struct ibv_qp_init_attr_ex qa = {
		.send_cq = ibv_cq_ex_to_cq(*cq), .recv_cq = ibv_cq_ex_to_cq(*cq),
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC, .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd, .send_ops_flags = IBV_QP_EX_WITH_SEND,
	};
	*qp = ibv_create_qp_ex(ctx, &qa);
	assert_non_null(*qp);
}

/* The child's checks (exit code: what failed). */
static int fork_child_checks(struct sim_ep *a, struct ibv_cq_ex *cq, struct ibv_qp *qp,
			     struct ibv_cq_ex *plain_cq, struct ibv_qp *plain_qp)
{
	struct ibv_wc wc;

	if (shift_ctx_of(a->ctx) || shift_dqp_of_qp(a->qp) || shift_dqp_of_qp(qp))
		return 10;
	if (a->ctx->ops.poll_cq != plain_cq->context->ops.poll_cq ||
	    a->ctx->ops.post_send != plain_cq->context->ops.post_send)
		return 11;
	if (cq->start_poll != plain_cq->start_poll || cq->next_poll != plain_cq->next_poll)
		return 12;
	if (ibv_qp_to_qp_ex(qp)->wr_start != ibv_qp_to_qp_ex(plain_qp)->wr_start)
		return 13;
	if (ibv_poll_cq(a->cq, 1, &wc) < 0 || shift_verbs.destroy_qp(qp) ||
	    shift_verbs.destroy_cq(ibv_cq_ex_to_cq(cq)))
		return 14; /* (its parent's objects, destroyed as plain) */
	return 0;
}

/* fork(): the child's contexts are its parent's, so plain there, down to
 * the functions of their extended CQs and QPs; the parent's stay SHIFT's. */
static void test_fork_child_has_plain_objects(void **state)
{
	struct ibv_qp_cap cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
				  .max_recv_sge = 1 };
	struct sim_ep a, b, plain;
	struct ibv_cq_ex *cq, *plain_cq;
	struct ibv_qp *qp, *plain_qp;
	int st;
	(void)state;

	world_open("fork");
	assert_int_equal(sim_ep_open(&a, &shift_verbs, "sim0_0", 1 << 14, SIM_PAIR_ACCESS, &cap, 64, 0), 0);
	assert_int_equal(sim_ep_open(&b, &shift_verbs, "sim1_0", 1 << 14, SIM_PAIR_ACCESS, &cap, 64, 0), 0);
	assert_int_equal(sim_ep_open(&plain, shift_lower, "sim0_0", 1 << 14, SIM_PAIR_ACCESS, &cap, 64, 0), 0);
	assert_int_equal(connect_pair(&a, &b), 0);
	passes(4);
	make_ex(a.ctx, a.pd, &cq, &qp);
	make_ex(plain.ctx, plain.pd, &plain_cq, &plain_qp);
	assert_ptr_not_equal(cq->start_poll, plain_cq->start_poll); /* SHIFT's */
	assert_non_null(shift_dqp_of_qp(qp));
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(fork_child_checks(&a, cq, qp, plain_cq, plain_qp));
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	/* the parent's are SHIFT's still */
	assert_ptr_not_equal(cq->start_poll, plain_cq->start_poll);
	assert_non_null(shift_dqp_of_qp(qp));
	assert_non_null(shift_ctx_of(a.ctx));
	assert_int_equal(shift_verbs.destroy_qp(qp), 0);
	assert_int_equal(shift_verbs.destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
	assert_int_equal(shift_lower->destroy_qp(plain_qp), 0);
	assert_int_equal(shift_lower->destroy_cq(ibv_cq_ex_to_cq(plain_cq)), 0);
	sim_ep_close(&plain);
	sim_ep_close(&a);
	sim_ep_close(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_resize_cq_then_failover_keeps_every_completion, teardown),
		cmocka_unit_test_teardown(test_cq_at_max_size_gets_its_backup, teardown),
		cmocka_unit_test_teardown(test_hundreds_of_qps_fail_over_together, teardown),
		cmocka_unit_test_teardown(test_rereg_mr_followed_across_failovers, teardown),
		cmocka_unit_test_teardown(test_unshadowed_qp_fails_as_plain, teardown),
		cmocka_unit_test_teardown(test_fork_child_has_plain_objects, teardown),
	};
	return test_env_run_group_tests(tests);
}
