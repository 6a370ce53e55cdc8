/*
 * Exit, fork, destroy and setup with SHIFT's real per-RNIC threads running
 * (not inline): the simulated RNIC behind one lock (sim_locked.h), whose
 * hook stops a thread inside a verb at the moment a test wants.
 *
 * - exit() or a return from main while a thread replays an MR, with live
 *   objects, after destroying everything, or from an exit handler that
 *   tears the objects down: no crash (under ASan: no error, no leak), no
 *   hang. Each case runs in a child process of its own (this program
 *   re-executed with --exit-child), many times.
 * - fork() while a thread is inside a verb holding the provider's lock:
 *   the child uses verbs (its inherited objects as plain, new ones
 *   shadowed by its own thread) and exits; the parent carries on.
 * - the application deregisters an MR, rereg's one, destroys a QP, its CQ
 *   and PD while the thread is replaying them: every backup object goes
 *   too, no key stays in the store, nothing is used after it was freed.
 * - modify_qp to RTR and RTS while the peer's backup attributes never
 *   appear and the thread is stuck in its pass: as fast as plain.
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "kv/kv.h"
#include "shift/base/clock.h"
#include "shift/base/config.h"
#include "shift/shadow/exchange.h"
#include "shift/shadow/shadow.h"
#include "shift/shift.h"
#include "sim.h"
#include "sim_locked.h"
#include "ep.h"
#include "test_env.h"

/* ThreadSanitizer does not follow a child of a multi-threaded fork (its
 * lock graph and thread states stay the parent's: it reports what did not
 * happen). Under it the fork test checks the parent side only, its child
 * leaving at once; the plain and ASan builds run the child's checks. */
#if defined(__SANITIZE_THREAD__)
#define FORK_CHILD_CHECKED 0
#else
#define FORK_CHILD_CHECKED 1
#endif

/* verbs.h's inline fallbacks name this; SHIFT never takes it. */
int (ibv_query_port)(struct ibv_context *c, uint8_t p, struct _compat_ibv_port_attr *a)
{
	(void)c; (void)p; (void)a;
	abort();
}

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct sim_world *world;
static pthread_t main_thread;
static char kv_url[96];
static const struct ibv_qp_cap cap = {
	.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1,
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* A world of two hosts with two NICs each; SHIFT with its threads, the
 * system clock and an in-memory store of its own. */
static void world_open(const char *name)
{
	static int run;

	world = sim_world_create(NULL);
	sim_host_create(world, 2);
	sim_host_create(world, 2);
	shift_lower_set(sim_locked_lower(world));
	snprintf(kv_url, sizeof(kv_url), "mem://%s-%d-%d", name, (int)getpid(), run++);
	setenv("SHIFT_KV_URL", kv_url, 1);
	setenv("SHIFT_STATUS_DIR", "", 1);
	shift_config_load(NULL);
	shift_clock_set(NULL);
	main_thread = pthread_self();
}

static void world_close(void)
{
	__atomic_store_n(&sim_locked.hook, NULL, __ATOMIC_RELEASE);
	sim_world_destroy(world);
	world = NULL;
}

static bool off_main(void)
{
	return !pthread_equal(pthread_self(), main_thread);
}

/* Open e on device dev through SHIFT; 0 or an errno. */
static int ep_open(struct sim_ep *e, const char *dev)
{
	return sim_ep_open(e, &shift_verbs, dev, 4096, ACCESS, &cap, 64, 0);
}

static int pair_connect(struct sim_ep *a, struct sim_ep *b)
{
	struct sim_ep_info ia, ib;

	sim_ep_info(a, 100, &ia);
	sim_ep_info(b, 200, &ib);
	return sim_ep_connect(a, &ia, &ib, NULL) || sim_ep_connect(b, &ib, &ia, NULL);
}

/* Wait (up to ms) until qp's shadow is READY. */
static bool ready_within(struct ibv_qp *qp, unsigned ms)
{
	for (uint64_t end = now_ms() + ms; now_ms() < end; sleep_ms(5))
		if (shift_shadow_qp_state(qp) == SHIFT_SHADOW_READY)
			return true;
	return false;
}

/* Wait (up to ms) until the objects of kind k alive at the provider are n. */
static bool live_within(enum sim_locked_kind k, long n, unsigned ms)
{
	for (uint64_t end = now_ms() + ms; now_ms() < end; sleep_ms(5))
		if (sim_locked_live(k) == n)
			return true;
	return false;
}

/* One signaled 64-byte write from a to b, polled to its completion while
 * the test moves the network: 0, or -1. */
static int write_once(struct sim_ep *a, struct sim_ep *b, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)a->buf, .length = 64, .lkey = a->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)b->buf + 64, .rkey = b->mr->rkey },
	}, *bad;
	struct ibv_wc wc;

	memset(a->buf, (int)(wr_id & 0x7f), 64);
	if (ibv_post_send(a->qp, &wr, &bad))
		return -1;
	for (uint64_t end = now_ms() + 5000; now_ms() < end;) {
		sim_locked_enter();
		sim_world_step(world);
		sim_locked_leave();
		int n = ibv_poll_cq(a->cq, 1, &wc);
		if (n < 0)
			return -1;
		if (n == 1)
			return wc.status == IBV_WC_SUCCESS && wc.wr_id == wr_id &&
				       b->buf[64] == (uint8_t)(wr_id & 0x7f) ? 0 : -1;
	}
	return -1;
}

/* ---- exit ----------------------------------------------------------------
 * The child (this program, --exit-child VARIANT) connects a pair, registers
 * MRs and leaves while its thread is inside the backup registration of one
 * of them (the hook holds it there, with the provider's lock, for 20 ms). */

static sem_t in_reg;
static struct sim_ep xa, xb; /* static: reachable at exit (no false leak) */
static struct ibv_mr *xmr[32];
static char xbuf[32][4096];

static void exit_hook(const char *op, struct ibv_context *ctx, bool inside)
{
	(void)ctx;
	if (inside && off_main() && !strcmp(op, "reg_mr")) {
		sem_post(&in_reg);
		sleep_ms(20);
	}
}

static void exit_teardown(void)
{
	for (int i = 0; i < 32; i++)
		if (xmr[i])
			shift_verbs.dereg_mr(xmr[i]);
	sim_ep_close(&xa);
	sim_ep_close(&xb);
}

/* Leave while the thread replays: 0 return from main with everything
 * alive; 1 the MRs deregistered first; 2 everything destroyed and closed
 * first; 3 exit() with an exit handler of the application's, registered
 * after SHIFT's (it runs first), that tears everything down. */
static int exit_child(int variant)
{
	struct timespec ts;

	alarm(30); /* a hang is a failure */
	sem_init(&in_reg, 0, 0);
	world_open("exit");
	if (ep_open(&xa, "sim0_0") || ep_open(&xb, "sim1_0") || pair_connect(&xa, &xb))
		return 10;
	__atomic_store_n(&sim_locked.hook, exit_hook, __ATOMIC_RELEASE);
	for (int i = 0; i < 32; i++)
		if (!(xmr[i] = shift_verbs.reg_mr(xa.pd, xbuf[i], sizeof(xbuf[i]), ACCESS)))
			return 11;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 10;
	if (sem_timedwait(&in_reg, &ts))
		return 12; /* the thread never replayed an MR */
	switch (variant % 4) {
	case 1:
		for (int i = 0; i < 32; i++) {
			shift_verbs.dereg_mr(xmr[i]);
			xmr[i] = NULL;
		}
		break;
	case 2:
		exit_teardown();
		break;
	case 3:
		atexit(exit_teardown);
		exit(0);
	}
	return 0;
}

static void test_exit_while_replaying(void **state)
{
	char self[4096], arg[16];
	(void)state;

	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	assert_true(n > 0);
	self[n] = '\0';
	for (int i = 0; i < 24; i++) {
		int st;

		fflush(NULL);
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			snprintf(arg, sizeof(arg), "%d", i);
			execl(self, self, "--exit-child", arg, (char *)NULL);
			_exit(127);
		}
		assert_int_equal(waitpid(pid, &st, 0), pid);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			fail_msg("exit child %d (variant %d): %s %d", i, i % 4,
				 WIFEXITED(st) ? "exit status" : "killed by signal",
				 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	}
}

/* ---- fork ------------------------------------------------------------------ */

static sem_t in_pass;
static bool fork_trap;

/* The thread's pass polls the backup CQs: hold it there, with the
 * provider's lock, once the test arms the trap. */
static void fork_hook(const char *op, struct ibv_context *ctx, bool inside)
{
	(void)ctx;
	if (inside && off_main() && !strcmp(op, "poll_cq") &&
	    __atomic_exchange_n(&fork_trap, false, __ATOMIC_ACQ_REL)) {
		sem_post(&in_pass);
		sleep_ms(50);
	}
}

/* The child: its parent's objects work as plain ones, what it opens is
 * shadowed by a thread of its own, and it exits. Exit codes name what
 * failed. */
static int fork_child(struct sim_ep *a)
{
	struct sim_ep c, d;
	struct ibv_wc wc;

	alarm(30);
	if (shift_ctx_of(a->ctx))
		return 20; /* the parent's context is not SHIFT's here */
	if (a->ctx->ops.poll_cq != sim_lk_poll_cq || a->ctx->ops.post_send != sim_lk_post_send)
		return 21; /* ... its data path is the provider's */
	if (ibv_poll_cq(a->cq, 1, &wc) < 0)
		return 22;
	if (shift_shadow_qp_state(a->qp) != -ENOENT)
		return 23;
	main_thread = pthread_self();
	if (ep_open(&c, "sim0_0") || ep_open(&d, "sim1_0") || pair_connect(&c, &d))
		return 24;
	if (!ready_within(c.qp, 10000) || !ready_within(d.qp, 10000))
		return 25; /* the child's own threads shadow its own QPs */
	if (write_once(&c, &d, 77))
		return 26;
	sim_ep_close(&c);
	sim_ep_close(&d);
	return 0;
}

static void test_fork_while_a_thread_is_in_a_verb(void **state)
{
	struct sim_ep a, b;
	struct timespec ts;
	int st;
	(void)state;

	sem_init(&in_pass, 0, 0);
	world_open("fork");
	assert_int_equal(ep_open(&a, "sim0_0"), 0);
	assert_int_equal(ep_open(&b, "sim1_0"), 0);
	assert_int_equal(pair_connect(&a, &b), 0);
	assert_true(ready_within(a.qp, 10000));
	assert_true(ready_within(b.qp, 10000));
	__atomic_store_n(&sim_locked.hook, fork_hook, __ATOMIC_RELEASE);
	for (int round = 0; round < 3; round++) {
		__atomic_store_n(&fork_trap, true, __ATOMIC_RELEASE);
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 10;
		assert_int_equal(sem_timedwait(&in_pass, &ts), 0);
		/* a thread is inside the provider's poll, holding its lock */
		fflush(NULL);
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			if (!FORK_CHILD_CHECKED)
				_exit(0);
			exit(fork_child(&a)); /* exit(): its exit handlers run */
		}
		assert_int_equal(waitpid(pid, &st, 0), pid);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			fail_msg("fork child (round %d): %s %d", round,
				 WIFEXITED(st) ? "exit status" : "killed by signal",
				 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	}
	/* the parent's protection and data path carry on */
	assert_int_equal(shift_shadow_qp_state(a.qp), SHIFT_SHADOW_READY);
	assert_int_equal(write_once(&a, &b, 5), 0);
	sim_ep_close(&a);
	sim_ep_close(&b);
	world_close();
	sem_destroy(&in_pass);
}

/* ---- destroy while the thread replays ------------------------------------ */

static sem_t entered, go;
static const char *block_op;

/* Hold the thread just before its next call of block_op (not holding the
 * provider's lock) until the test lets it go. */
static void block_hook(const char *op, struct ibv_context *ctx, bool inside)
{
	(void)ctx;
	const char *want = __atomic_load_n(&block_op, __ATOMIC_ACQUIRE);

	if (!inside && want && off_main() && !strcmp(op, want) &&
	    __atomic_compare_exchange_n(&block_op, &want, NULL, false, __ATOMIC_ACQ_REL,
					__ATOMIC_ACQUIRE)) {
		sem_post(&entered);
		sem_wait(&go);
	}
}

/* The next call of op by a thread will hold it (before what causes it) ... */
static void block_at(const char *op)
{
	__atomic_store_n(&block_op, op, __ATOMIC_RELEASE);
}

/* ... and here the test waits until it does. */
static void wait_blocked(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 10;
	assert_int_equal(sem_timedwait(&entered, &ts), 0);
}

/* Is the backup rkey of (a's GID, rkey) in the store? */
static bool mr_published(struct ibv_context *ctx, uint32_t rkey)
{
	shift_kv *h;
	union ibv_gid gid;
	char key[SHIFT_EXCHANGE_KEY_MAX];
	void *v = NULL;
	size_t len;

	assert_int_equal(shift_kv_open(kv_url, "default", NULL, &h), 0);
	assert_int_equal(shift_lower->query_gid(ctx, 1, 1, &gid), 0);
	shift_exchange_mr_key(&gid, rkey, key, sizeof(key));
	int rc = shift_kv_get(h, key, &v, &len);
	free(v);
	shift_kv_close(h);
	return rc == 0;
}

/* Wait (up to ms) until the key of rkey is not in the store. */
static bool unpublished_within(struct ibv_context *ctx, uint32_t rkey, unsigned ms)
{
	for (uint64_t end = now_ms() + ms; now_ms() < end; sleep_ms(5))
		if (!mr_published(ctx, rkey))
			return true;
	return false;
}

/* e's MR, QP, CQ and PD destroyed while the thread is held (block_at),
 * then the thread let go: e's backups go, f's stay with f (qps, cqs, pds:
 * the provider's counts before e and f), then both closed. */
static void destroy_and_go(struct sim_ep *e, struct sim_ep *f, long qps, long cqs, long pds)
{
	assert_int_equal(shift_verbs.dereg_mr(e->mr), 0);
	assert_int_equal(shift_verbs.destroy_qp(e->qp), 0);
	assert_int_equal(shift_verbs.destroy_cq(e->cq), 0);
	assert_int_equal(shift_verbs.dealloc_pd(e->pd), 0);
	e->mr = NULL;
	e->qp = NULL;
	e->cq = NULL;
	e->pd = NULL;
	sem_post(&go);
	/* (f's QP, CQ and PD and their backups; the two service channels of
	 * each of e's and f's contexts (a UD QP, a CQ, a PD each) until they
	 * close) */
	assert_true(live_within(SIM_LK_QP, qps + 2 + 4, 5000));
	assert_true(live_within(SIM_LK_CQ, cqs + 2 + 4, 5000));
	assert_true(live_within(SIM_LK_PD, pds + 2 + 4, 5000));
	sim_ep_close(e);
	sim_ep_close(f);
	assert_true(live_within(SIM_LK_QP, qps, 5000));
}

/* SHIFT's own MRs of each of the two contexts: its page of key mailboxes
 * on the backup NIC (shadow/mbox.c) and the buffers of its two service
 * channels (svc.c) */
#define MBOX_MRS 6

static void test_destroy_while_replaying(void **state)
{
	static char buf[8][4096];
	struct sim_ep a, b, e, f;
	(void)state;

	sem_init(&entered, 0, 0);
	sem_init(&go, 0, 0);
	world_open("destroy");
	assert_int_equal(ep_open(&a, "sim0_0"), 0);
	assert_int_equal(ep_open(&b, "sim1_0"), 0);
	assert_int_equal(pair_connect(&a, &b), 0);
	assert_true(ready_within(a.qp, 10000));
	assert_true(ready_within(b.qp, 10000));
	/* each application object and its backup */
	assert_true(live_within(SIM_LK_MR, 4 + MBOX_MRS, 5000));
	__atomic_store_n(&sim_locked.hook, block_hook, __ATOMIC_RELEASE);

	/* dereg while the thread is about to register its backup */
	block_at("reg_mr");
	struct ibv_mr *m = shift_verbs.reg_mr(a.pd, buf[0], sizeof(buf[0]), ACCESS);
	uint32_t rkey = m->rkey;
	wait_blocked();
	assert_int_equal(shift_verbs.dereg_mr(m), 0);
	sem_post(&go);
	assert_true(live_within(SIM_LK_MR, 4 + MBOX_MRS, 5000));
	/* (the count is as before again before the thread, let go, has even made
	 * the backup: the key may be published a moment and reaped after;
	 * what must hold is that it does not stay) */
	assert_true(unpublished_within(a.ctx, rkey, 5000));

	/* a burst of MRs, each deregistered at once or after a moment, while
	 * the thread replays them */
	for (int i = 0; i < 200; i++) {
		m = shift_verbs.reg_mr(a.pd, buf[i % 8], sizeof(buf[0]), ACCESS);
		assert_non_null(m);
		if (i % 3)
			sleep_ms((unsigned)(i % 7));
		assert_int_equal(shift_verbs.dereg_mr(m), 0);
	}
	assert_true(live_within(SIM_LK_MR, 4 + MBOX_MRS, 5000));

	/* rereg: the backup follows the new registration */
	m = shift_verbs.reg_mr(a.pd, buf[1], sizeof(buf[1]), ACCESS);
	for (uint64_t end = now_ms() + 5000; !shift_shadow_mr_backup(m) && now_ms() < end;)
		sleep_ms(5);
	assert_non_null(shift_shadow_mr_backup(m));
	assert_true(mr_published(a.ctx, m->rkey));
	block_at("reg_mr");
	assert_int_equal(shift_verbs.rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf[2],
					      sizeof(buf[2]), 0), 0);
	wait_blocked();
	sem_post(&go);
	for (uint64_t end = now_ms() + 5000; now_ms() < end; sleep_ms(5)) {
		struct ibv_mr *bk = shift_shadow_mr_backup(m);

		if (bk && bk->addr == (void *)buf[2])
			break;
	}
	assert_ptr_equal(shift_shadow_mr_backup(m)->addr, buf[2]);
	assert_true(live_within(SIM_LK_MR, 6 + MBOX_MRS, 5000));
	assert_true(mr_published(a.ctx, m->rkey));
	assert_int_equal(shift_verbs.dereg_mr(m), 0);
	assert_true(live_within(SIM_LK_MR, 4 + MBOX_MRS, 5000));

	/* a QP, its CQ, MR and PD destroyed while the thread is about to
	 * create the QP's backup */
	long qps = sim_locked_live(SIM_LK_QP), cqs = sim_locked_live(SIM_LK_CQ);
	long pds = sim_locked_live(SIM_LK_PD);
	block_at("create_qp");
	assert_int_equal(ep_open(&e, "sim0_0"), 0);
	assert_int_equal(ep_open(&f, "sim1_0"), 0);
	wait_blocked(); /* (e's thread or f's) */
	assert_int_equal(pair_connect(&e, &f), 0);
	destroy_and_go(&e, &f, qps, cqs, pds);

	/* a protected QP (with its key mailbox), its CQ and PD destroyed while
	 * the thread is reaping an MR that died before them: the QP is not
	 * among what that pass took, so neither are its CQ and PD (their
	 * backups would still be busy with its backup, its mailbox's page
	 * freed under it) */
	assert_int_equal(ep_open(&e, "sim0_0"), 0);
	assert_int_equal(ep_open(&f, "sim1_0"), 0);
	assert_int_equal(pair_connect(&e, &f), 0);
	assert_true(ready_within(e.qp, 10000));
	m = shift_verbs.reg_mr(e.pd, buf[3], sizeof(buf[3]), ACCESS);
	for (uint64_t end = now_ms() + 5000; !shift_shadow_mr_backup(m) && now_ms() < end;)
		sleep_ms(5);
	assert_non_null(shift_shadow_mr_backup(m));
	block_at("dereg_mr");
	assert_int_equal(shift_verbs.dereg_mr(m), 0);
	wait_blocked();
	destroy_and_go(&e, &f, qps, cqs, pds);

	/* everything destroyed: nothing stays at the provider */
	sim_ep_close(&a);
	sim_ep_close(&b);
	for (int k = 0; k < SIM_LK_KINDS; k++)
		assert_int_equal(sim_locked_live((enum sim_locked_kind)k), 0);
	world_close();
	sem_destroy(&entered);
	sem_destroy(&go);
}

/* ---- setup never waits for the peer --------------------------------------- */

static unsigned stall_ms;

/* The thread's pass is slow: each of its calls into the provider on the
 * way to a backup QP takes stall_ms (not holding the provider's lock: the
 * thread is slow, the provider is not). */
static void slow_hook(const char *op, struct ibv_context *ctx, bool inside)
{
	static const char *const slow[] = { "alloc_pd", "create_cq", "create_qp", "modify_qp",
					    "query_gid", "query_port", "poll_cq" };

	(void)ctx;
	if (inside || !off_main())
		return;
	for (unsigned i = 0; i < sizeof(slow) / sizeof(slow[0]); i++)
		if (!strcmp(op, slow[i]))
			sleep_ms(__atomic_load_n(&stall_ms, __ATOMIC_RELAXED));
}

/* Microseconds of INIT, RTR, RTS through v towards a peer QPN that never
 * publishes anything. */
static void connect_timed(const struct shift_lower *v, struct sim_ep *e, double us[3])
{
	struct sim_ep_info me, peer;
	struct ibv_qp_attr a;
	int masks[3] = {
		IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
		IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
		IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
	};
	enum ibv_qp_state to[3] = { IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS };

	sim_ep_info(e, 1, &me);
	peer = me;
	peer.qpn = 0xabcde; /* nobody's */
	for (int k = 0; k < 3; k++) {
		memset(&a, 0, sizeof(a));
		a.qp_state = to[k];
		a.port_num = 1;
		a.qp_access_flags = ACCESS;
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = peer.gid;
		a.ah_attr.grh.sgid_index = 1;
		a.ah_attr.grh.hop_limit = 1;
		a.ah_attr.port_num = 1;
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = peer.qpn;
		a.max_dest_rd_atomic = 1;
		a.min_rnr_timer = 12;
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 1;
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		assert_int_equal(v->modify_qp(e->qp, &a, masks[k]), 0);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		us[k] = (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
		/* the thread's pass starts on the kick, and is slow */
		sleep_ms(k == 0 ? 30 : 1);
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static void test_modify_qp_never_waits_for_the_peer(void **state)
{
	enum { ROUNDS = 5 };
	double shift_us[3][ROUNDS], plain_us[3][ROUNDS];
	(void)state;

	world_open("setup");
	__atomic_store_n(&stall_ms, 100, __ATOMIC_RELEASE);
	__atomic_store_n(&sim_locked.hook, slow_hook, __ATOMIC_RELEASE);
	for (int i = 0; i < ROUNDS; i++) {
		struct sim_ep e, p;
		double us[3];

		assert_int_equal(ep_open(&e, "sim0_0"), 0);
		connect_timed(&shift_verbs, &e, us);
		for (int k = 0; k < 3; k++)
			shift_us[k][i] = us[k];
		/* unprotected until the peer's record appears: it never does */
		assert_int_equal(shift_shadow_qp_state(e.qp), SHIFT_SHADOW_PENDING);
		assert_int_equal(sim_ep_open(&p, shift_lower, "sim0_0", 4096, ACCESS, &cap, 64, 0), 0);
		connect_timed(shift_lower, &p, us);
		for (int k = 0; k < 3; k++)
			plain_us[k][i] = us[k];
		sim_ep_close(&p);
		sim_ep_close(&e);
	}
	for (int k = 0; k < 3; k++) {
		qsort(shift_us[k], ROUNDS, sizeof(double), cmp_double);
		qsort(plain_us[k], ROUNDS, sizeof(double), cmp_double);
		print_message("modify_qp to %s: SHIFT %.1f us, plain %.1f us (medians of %d; the "
			      "thread's pass %u ms per verb)\n", k == 0 ? "INIT" : k == 1 ? "RTR" : "RTS",
			      shift_us[k][ROUNDS / 2], plain_us[k][ROUNDS / 2], ROUNDS, stall_ms);
		/* a wait for the thread or the peer would cost 100 ms or more */
		assert_true(shift_us[k][ROUNDS / 2] < 50000.0);
	}
	world_close();
}

static int teardown(void **state)
{
	(void)state;
	if (world)
		world_close();
	test_env_restore();
	return 0;
}

static int setup(void **state)
{
	(void)state;
	/* world_open() sets these: saved here to be put back */
	test_setenv("SHIFT_KV_URL", "mem://unset");
	test_setenv("SHIFT_STATUS_DIR", "");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "--exit-child"))
		return exit_child(atoi(argv[2]));

	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_exit_while_replaying, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fork_while_a_thread_is_in_a_verb, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_destroy_while_replaying, setup, teardown),
		cmocka_unit_test_setup_teardown(test_modify_qp_never_waits_for_the_peer, setup,
						teardown),
	};
	return test_env_run_group_tests(tests);
}
