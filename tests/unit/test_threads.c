/*
 * Failover with SHIFT's real threads (issue #19, item 8): the per-RNIC
 * background threads run their passes on their own (not inline), the
 * application's thread posts and polls, and A's default NIC dies in the
 * middle. Under ThreadSanitizer (the TSan unit tier) this is the run that
 * sees the background pass, its KV share (fo/kvq.c: records written, the
 * peer's keys read, held sends released) and the application's slow poll
 * touch the same QPs for real.
 *
 * Every write completes successfully, once, in order, with its data at
 * the peer; the peer's application never polls (its background thread
 * answers the handshake).
 */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "shift/base/clock.h"
#include "shift/base/config.h"
#include "shift/shadow/shadow.h"
#include "shift/shift.h"
#include "shift/dp/ctx.h"
#include "shift/dp/poll.h"
#include "shift/dp/state.h"
#include "sim.h"
#include "sim_locked.h"
#include "ep.h"
#include "test_env.h"

/* verbs.h's inline fallbacks name this; SHIFT never takes it. */
int (ibv_query_port)(struct ibv_context *c, uint8_t p, struct _compat_ibv_port_attr *a)
{
	(void)c; (void)p; (void)a;
	abort();
}

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define WRITES 120
#define KILL_AT 40

static const struct ibv_qp_cap cap = {
	.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1,
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void step(struct sim_world *w)
{
	sim_locked_enter();
	sim_world_step(w);
	sim_locked_leave();
}

/* Write i (64 bytes of i's pattern at offset 64 * (i % 32)), polled to its
 * completion while this thread moves the network: the completion. */
static struct ibv_wc write_one(struct sim_world *w, struct sim_ep *a, struct sim_ep *b, unsigned i)
{
	size_t off = 64u * (i % 32u);
	struct ibv_sge sge = { .addr = (uintptr_t)a->buf + off, .length = 64, .lkey = a->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1000 + i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)b->buf + 2048 + off, .rkey = b->mr->rkey },
	}, *bad;
	struct ibv_wc wc = { .status = IBV_WC_GENERAL_ERR, .wr_id = 0 };

	memset(a->buf + off, (int)(i & 0x7f) + 1, 64);
	assert_int_equal(ibv_post_send(a->qp, &wr, &bad), 0);
	for (uint64_t end = now_ms() + 10000; now_ms() < end;) {
		step(w);
		int n = ibv_poll_cq(a->cq, 1, &wc);

		assert_true(n >= 0);
		if (n == 1)
			return wc;
	}
	fail_msg("write %u: no completion within 10 s", i);
	return wc;
}

struct pair {
	struct sim_world *w;
	struct sim_host *h0;
	struct sim_ep a, b;
};

/* A world, A on sim0_0 and B on sim1_0 through SHIFT with its threads,
 * connected and shadowed (READY). */
static void pair_open(struct pair *p, const char *name)
{
	struct sim_ep_info ia, ib;
	char url[96];

	p->w = sim_world_create(NULL);
	p->h0 = sim_host_create(p->w, 2);
	sim_host_create(p->w, 2);
	shift_lower_set(sim_locked_lower(p->w));
	snprintf(url, sizeof(url), "mem://%s-%d", name, (int)getpid());
	test_setenv("SHIFT_KV_URL", url);
	test_setenv("SHIFT_STATUS_DIR", "");
	shift_config_load(NULL);
	shift_clock_set(NULL);
	assert_false(shift_config.inline_passes);
	assert_int_equal(sim_ep_open(&p->a, &shift_verbs, "sim0_0", 4096, ACCESS, &cap, 64, 0), 0);
	assert_int_equal(sim_ep_open(&p->b, &shift_verbs, "sim1_0", 4096, ACCESS, &cap, 64, 0), 0);
	sim_ep_info(&p->a, 100, &ia);
	sim_ep_info(&p->b, 200, &ib);
	assert_int_equal(sim_ep_connect(&p->a, &ia, &ib, NULL), 0);
	assert_int_equal(sim_ep_connect(&p->b, &ib, &ia, NULL), 0);
	for (uint64_t end = now_ms() + 5000;
	     (shift_shadow_qp_state(p->a.qp) != SHIFT_SHADOW_READY ||
	      shift_shadow_qp_state(p->b.qp) != SHIFT_SHADOW_READY) && now_ms() < end;)
		step(p->w);
	assert_int_equal(shift_shadow_qp_state(p->a.qp), SHIFT_SHADOW_READY);
	assert_int_equal(shift_shadow_qp_state(p->b.qp), SHIFT_SHADOW_READY);
}

static void pair_close(struct pair *p)
{
	sim_ep_close(&p->a);
	sim_ep_close(&p->b);
	sim_world_destroy(p->w);
	test_env_restore();
}

static void kill_default_nic(struct pair *p)
{
	sim_locked_enter();
	sim_dev_kill(sim_host_dev(p->h0, 0), 0);
	sim_locked_leave();
}

static void test_writes_survive_nic_death_with_real_threads(void **state)
{
	struct pair p;
	uint64_t t_kill = 0, t_back = 0;
	(void)state;

	/* (A's application polls throughout: its own poll fails over on the
	 * error completion; the port watch has its own tests below) */
	test_setenv("SHIFT_PORT_DOWN_MS", "0");
	pair_open(&p, "threads");
	for (unsigned i = 0; i < WRITES; i++) {
		if (i == KILL_AT) {
			kill_default_nic(&p);
			t_kill = now_ms();
		}
		struct ibv_wc wc = write_one(p.w, &p.a, &p.b, i);

		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		assert_int_equal(wc.wr_id, 1000 + i);
		assert_int_equal((uint8_t)p.b.buf[2048 + 64u * (i % 32u)], (uint8_t)((i & 0x7f) + 1));
		if (i == KILL_AT)
			t_back = now_ms();
	}
	print_message("%d writes, A's default NIC dead from write %d on: the first after it "
		      "completed %llu ms later\n", WRITES, KILL_AT,
		      (unsigned long long)(t_back - t_kill));
	pair_close(&p);
}

/* An idle QP (nothing outstanding: no error completion will ever come)
 * whose port dies: the device's PORT_ERR event wakes A's thread, which
 * fails the QP over at once, not after SHIFT_PORT_DOWN_MS (set to 20 s
 * here); then a write goes through on the backup. */
static void test_port_event_fails_idle_qp_over_at_once(void **state)
{
	struct pair p;
	(void)state;

	test_setenv("SHIFT_PORT_DOWN_MS", "20000");
	pair_open(&p, "portev");
	assert_int_equal(shift_config.port_down_ms, 20000);
	struct shift_dqp *d = shift_dqp_of_qp(p.a.qp);

	assert_non_null(d);
	uint64_t t0 = now_ms();

	kill_default_nic(&p);
	while (__atomic_load_n(&d->send_state, __ATOMIC_RELAXED) == SHIFT_SEND_DEFAULT &&
	       now_ms() - t0 < 10000) {
		step(p.w);
		usleep(1000);
	}
	uint64_t took = now_ms() - t0;

	print_message("idle QP failed over %llu ms after its port died (SHIFT_PORT_DOWN_MS "
		      "20000)\n", (unsigned long long)took);
	assert_true(took < 5000);
	struct ibv_wc wc = write_one(p.w, &p.a, &p.b, 7);

	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	pair_close(&p);
}

/* The same with an application that spins on its CQ, as NCCL's proxy
 * thread does: never asleep, and never inside the fast path for long,
 * so the failover does not wait for it (before stop 40 a time-based
 * grace did, ended early only by marks the slow poll left). */
static void test_port_event_with_spinning_poller(void **state)
{
	struct pair p;
	(void)state;

	test_setenv("SHIFT_PORT_DOWN_MS", "20000");
	pair_open(&p, "portspin");
	struct shift_dqp *d = shift_dqp_of_qp(p.a.qp);
	struct ibv_wc wc;

	assert_non_null(d);
	uint64_t t0 = now_ms();

	kill_default_nic(&p);
	/* (a poll takes the simulator's lock, and a thread that waits for
	 * it sleeps: nearly all the time spent spinning outside it, as a real
	 * provider's poll never sleeps) */
	while (__atomic_load_n(&d->send_state, __ATOMIC_ACQUIRE) == SHIFT_SEND_DEFAULT &&
	       now_ms() - t0 < 10000) {
		step(p.w);
		assert_int_equal(ibv_poll_cq(p.a.cq, 1, &wc), 0);
		for (uint64_t t = now_ms(); now_ms() - t < 50;)
			;
	}
	uint64_t took = now_ms() - t0;

	print_message("idle QP of a spinning poller failed over %llu ms after its port died\n",
		      (unsigned long long)took);
	/* (~15 ms; with a time-based grace of 5 s and no marks, 1.8-2.9 s) */
	assert_true(took < 1000);
	wc = write_one(p.w, &p.a, &p.b, 7);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	pair_close(&p);
}

/* The passive peer (B never polls) answers A's handshake when its backup
 * CQ's completion event wakes its thread, not at its idle period: with
 * SHIFT_IDLE_MS at 10 s, the write A's failover moves completes within
 * 2 s (scheduling; it took 10 s and more with the thread asleep on its
 * timer). */
static void test_passive_peer_answers_on_completion_event(void **state)
{
	struct pair p;
	(void)state;

	test_setenv("SHIFT_IDLE_MS", "10000");
	test_setenv("SHIFT_PORT_DOWN_MS", "0"); /* (A polls: as in the first test) */
	pair_open(&p, "bkev");
	assert_int_equal(shift_config.idle_ms, 10000);
	for (unsigned i = 0; i < 4; i++)
		assert_int_equal(write_one(p.w, &p.a, &p.b, i).status, IBV_WC_SUCCESS);
	/* (both threads asleep on their idle period by now) */
	usleep(300 * 1000);
	kill_default_nic(&p);
	uint64_t t0 = now_ms();
	struct ibv_wc wc = write_one(p.w, &p.a, &p.b, 4);
	uint64_t took = now_ms() - t0;

	print_message("the first write after A's NIC died completed %llu ms later "
		      "(SHIFT_IDLE_MS 10000)\n", (unsigned long long)took);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.wr_id, 1004);
	assert_true(took < 2000);
	pair_close(&p);
}

/* CPU time (utime + stime, clock ticks) of every thread but the caller. */
static long others_cpu_ticks(void)
{
	char path[300], buf[1024];
	long sum = 0;
	DIR *dir = opendir("/proc/self/task");
	struct dirent *e;
	long me = (long)syscall(SYS_gettid);

	assert_non_null(dir);
	while ((e = readdir(dir))) {
		if (e->d_name[0] == '.' || atol(e->d_name) == me)
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/stat", e->d_name);
		FILE *f = fopen(path, "r");

		if (!f)
			continue;
		size_t n = fread(buf, 1, sizeof(buf) - 1, f);

		fclose(f);
		buf[n] = '\0';
		char *p = strrchr(buf, ')');
		unsigned long ut = 0, st = 0;

		/* after ") ": state and 10 more fields, then utime and stime */
		if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
				&st) == 2)
			sum += (long)(ut + st);
	}
	closedir(dir);
	return sum;
}

/* Nothing fails: the RNICs' threads sleep (SHIFT_IDLE_MS, port events,
 * backup completions), they do not spin. Over 2 s idle they use less than
 * 5% of one CPU (a thread that never slept used 100% here). */
static void test_idle_threads_sleep(void **state)
{
	struct pair p;
	(void)state;

	pair_open(&p, "idle");
	usleep(300 * 1000); /* (replay done) */
	long t0 = others_cpu_ticks(), hz = sysconf(_SC_CLK_TCK);

	usleep(2000 * 1000);
	long used = others_cpu_ticks() - t0;

	print_message("idle for 2 s: SHIFT's threads used %ld ms of CPU\n", used * 1000 / hz);
	assert_true(used * 1000 / hz < 100);
	pair_close(&p);
}

static void revive_default_nic(struct pair *p)
{
	sim_locked_enter();
	sim_dev_revive(sim_host_dev(p->h0, 0));
	sim_locked_leave();
}

/* Writes through flaps of A's default NIC with the real threads: each
 * death fails the QP over, each revival lets the probe (every 50 ms here)
 * bring it back and the fence switch it back to the default QP, while the
 * application keeps writing. Every write completes successfully, once, in
 * order, with its data at the peer; at least two failovers and one
 * failback happened (under TSan: the whole cycle with real threads). */
static void test_flaps_with_real_threads(void **state)
{
	struct pair p;
	unsigned i = 0;
	(void)state;

	test_setenv("SHIFT_PROBE_MS", "50");
	test_setenv("SHIFT_PORT_DOWN_MS", "0"); /* (A polls: as in the first test) */
	pair_open(&p, "flaps");
	struct shift_dqp *d = shift_dqp_of_qp(p.a.qp);

	assert_non_null(d);
	for (int cycle = 0; cycle < 3; cycle++) {
		kill_default_nic(&p);
		for (unsigned k = 0; k < 20; k++, i++) {
			struct ibv_wc wc = write_one(p.w, &p.a, &p.b, i);

			assert_int_equal(wc.status, IBV_WC_SUCCESS);
			assert_int_equal(wc.wr_id, 1000 + i);
		}
		revive_default_nic(&p);
		/* writing on until the QP is back on its default QP (or 3 s) */
		for (uint64_t end = now_ms() + 3000;
		     (__atomic_load_n(&d->send_state, __ATOMIC_RELAXED) != SHIFT_SEND_DEFAULT ||
		      __atomic_load_n(&d->failbacks, __ATOMIC_RELAXED) < (unsigned long)cycle + 1) &&
		     now_ms() < end; i++) {
			struct ibv_wc wc = write_one(p.w, &p.a, &p.b, i);

			assert_int_equal(wc.status, IBV_WC_SUCCESS);
			assert_int_equal(wc.wr_id, 1000 + i);
			assert_int_equal((uint8_t)p.b.buf[2048 + 64u * (i % 32u)],
					 (uint8_t)((i & 0x7f) + 1));
			usleep(2000);
		}
	}
	print_message("%u writes through 3 flaps: %lu failovers, %lu failbacks\n", i,
		      d->failovers, d->failbacks);
	assert_true(d->failovers >= 2);
	assert_true(d->failbacks >= 1);
	pair_close(&p);
}

/*
 * A poll that took completions from the provider and was preempted before
 * it counted them (held here in the provider's poll_cq, after its return:
 * sim_locked's "poll_cq returned"), while A's port dies and A's thread
 * fails the QP over. The failover must wait for that poll to leave the
 * fast path (dp/poll.h): judged before, the four writes it holds look
 * outstanding and are written again on the backup, and the application
 * gets their completions twice. A time-based grace (20 ms) let the
 * failover go after 20 ms of a thread held longer.
 */
static __thread bool held_poller_here; /* (set by that poller's thread) */
static int held_armed, held_in, held_go;

static void hold_hook(const char *op, struct ibv_context *ctx, bool inside)
{
	int one = 1;

	(void)ctx;
	(void)inside;
	if (strcmp(op, "poll_cq returned") || !held_poller_here ||
	    !__atomic_compare_exchange_n(&held_armed, &one, 0, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE))
		return;
	__atomic_store_n(&held_in, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&held_go, __ATOMIC_ACQUIRE))
		usleep(1000);
}

struct held_poll {
	struct sim_ep *a;
	struct ibv_wc wc[8];
	int n;
};

static void *held_poller(void *arg)
{
	struct held_poll *h = arg;

	held_poller_here = true;
	h->n = ibv_poll_cq(h->a->cq, 8, h->wc);
	return NULL;
}

/*
 * fork() while that poll is inside: the child's next context on the same
 * slot starts with no poll counted inside (else its first failover would
 * wait for ever for a thread the child does not have). Under TSan the
 * child leaves at once (ThreadSanitizer does not follow a child of a
 * multi-threaded fork).
 */
static void fork_while_held(void)
{
	int st;

	fflush(NULL);
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		struct sim_ep c;

		alarm(30);
#if !defined(__SANITIZE_THREAD__)
		if (sim_ep_open(&c, &shift_verbs, "sim0_0", 4096, ACCESS, &cap, 64, 0))
			_exit(30);
		struct shift_ctx *s = shift_ctx_of(c.ctx);

		if (!s || s->slot != 0)
			_exit(31); /* (the slot the parent's A had) */
		_exit(*shift_dp_poll_busy(s) & INT_MAX ? 32 : 0);
#else
		(void)c;
		_exit(0);
#endif
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_failover_waits_for_a_poll_inside(void **state)
{
	struct pair p;
	struct held_poll h = { .n = -1 };
	unsigned seen[4] = { 0 };
	(void)state;

	test_setenv("SHIFT_PORT_DOWN_MS", "20000");
	pair_open(&p, "heldpoll");
	struct shift_dqp *d = shift_dqp_of_qp(p.a.qp);

	assert_non_null(d);
	h.a = &p.a;
	for (unsigned i = 0; i < 4; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)p.a.buf + 64u * i, .length = 64,
				       .lkey = p.a.mr->lkey };
		struct ibv_send_wr wr = {
			.wr_id = 1000 + i, .sg_list = &sge, .num_sge = 1,
			.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = (uintptr_t)p.b.buf + 2048 + 64u * i,
				     .rkey = p.b.mr->rkey },
		}, *bad;

		memset(p.a.buf + 64u * i, (int)i + 1, 64);
		assert_int_equal(ibv_post_send(p.a.qp, &wr, &bad), 0);
	}
	for (unsigned i = 0; i < 200; i++)
		step(p.w); /* (the four complete in A's CQ, unpolled) */
	__atomic_store_n(&held_armed, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&held_in, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&held_go, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&sim_locked.hook, hold_hook, __ATOMIC_RELEASE);
	pthread_t t;

	assert_int_equal(pthread_create(&t, NULL, held_poller, &h), 0);
	for (uint64_t end = now_ms() + 5000; !__atomic_load_n(&held_in, __ATOMIC_ACQUIRE);) {
		assert_true(now_ms() < end);
		usleep(1000);
	}
	kill_default_nic(&p);
	for (uint64_t end = now_ms() + 300; now_ms() < end;) {
		step(p.w);
		usleep(1000);
	}
	/* the failover has not judged while the poll holds the four */
	assert_int_equal(__atomic_load_n(&d->send_state, __ATOMIC_ACQUIRE), SHIFT_SEND_DEFAULT);
	fork_while_held();
	__atomic_store_n(&held_go, 1, __ATOMIC_RELEASE);
	assert_int_equal(pthread_join(t, NULL), 0);
	__atomic_store_n(&sim_locked.hook, NULL, __ATOMIC_RELEASE);
	assert_int_equal(h.n, 4);
	for (int i = 0; i < h.n; i++) {
		assert_int_equal(h.wc[i].status, IBV_WC_SUCCESS);
		assert_true(h.wc[i].wr_id >= 1000 && h.wc[i].wr_id < 1004);
		seen[h.wc[i].wr_id - 1000]++;
	}
	uint64_t t0 = now_ms();

	while (__atomic_load_n(&d->send_state, __ATOMIC_ACQUIRE) == SHIFT_SEND_DEFAULT &&
	       now_ms() - t0 < 5000) {
		struct ibv_wc wc;

		step(p.w);
		assert_int_equal(ibv_poll_cq(p.a.cq, 1, &wc), 0);
		usleep(1000);
	}
	print_message("failed over %llu ms after the held poll left\n",
		      (unsigned long long)(now_ms() - t0));
	assert_int_not_equal(__atomic_load_n(&d->send_state, __ATOMIC_ACQUIRE), SHIFT_SEND_DEFAULT);
	/* the next write completes, and none of the four comes again */
	for (uint64_t end = now_ms() + 10000;;) {
		struct ibv_wc wc = write_one(p.w, &p.a, &p.b, 4);

		if (wc.wr_id == 1004) {
			assert_int_equal(wc.status, IBV_WC_SUCCESS);
			break;
		}
		assert_true(wc.wr_id >= 1000 && wc.wr_id < 1004);
		seen[wc.wr_id - 1000]++;
		assert_true(now_ms() < end);
	}
	for (unsigned i = 0; i < 4; i++)
		assert_int_equal(seen[i], 1);
	pair_close(&p);
}

/*
 * A failover while the application's post is inside the provider's
 * post_send (holding SHIFT's post_lock): soft-RoCE transmits a post's data
 * inside that call, retransmitting for as long as the QP lives. The hook
 * stands for that: the post stays inside until its QP is in ERR (3 s at
 * most). The failover must move the QP to ERR without waiting for the
 * post (it waited for post_lock first until stop 45: here 3 s, on the
 * testbed up to 14 ms), and the write must still complete once, with its
 * data, on the backup, whether the provider then takes the post (and
 * flushes it) or refuses it (refuse_posts_in_err). Meanwhile the
 * application's query_qp says RTS, as before the failover (not SHIFT's
 * ERR: the failover waits for this post's post_lock all along).
 */
static __thread bool inside_poster_here;
static struct ibv_qp *inside_qp;
static int inside_armed, inside_in, inside_saw_err, inside_state = -1;

static void inside_hook(const char *op, struct ibv_context *ctx, bool inside)
{
	int one = 1;

	(void)ctx;
	if (strcmp(op, "post_send") || inside || !inside_poster_here ||
	    !__atomic_compare_exchange_n(&inside_armed, &one, 0, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE))
		return;
	__atomic_store_n(&inside_in, 1, __ATOMIC_RELEASE);
	for (uint64_t end = now_ms() + 3000; now_ms() < end;) {
		sim_locked_enter();
		bool err = inside_qp->state == IBV_QPS_ERR;

		sim_locked_leave();
		if (err) {
			struct ibv_qp_attr a;
			struct ibv_qp_init_attr ia;

			if (!shift_verbs.query_qp(inside_qp, &a, IBV_QP_STATE, &ia))
				__atomic_store_n(&inside_state, (int)a.qp_state, __ATOMIC_RELEASE);
			__atomic_store_n(&inside_saw_err, 1, __ATOMIC_RELEASE);
			return;
		}
		usleep(1000);
	}
}

struct inside_post {
	struct sim_ep *a, *b;
	int rc;
};

/* A's write wr_id of A's first 64 bytes to B's at 2048: the post's rc. */
static int post_write(struct inside_post *ip, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)ip->a->buf, .length = 64, .lkey = ip->a->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)ip->b->buf + 2048, .rkey = ip->b->mr->rkey },
	}, *bad;

	return ibv_post_send(ip->a->qp, &wr, &bad);
}

static void *inside_poster(void *arg)
{
	struct inside_post *ip = arg;

	inside_poster_here = true;
	ip->rc = post_write(ip, 2000);
	return NULL;
}

static void stops_a_post_inside(bool refuse)
{
	struct pair p;
	struct inside_post ip = { .rc = -1 };
	unsigned seen = 0;

	test_setenv("SHIFT_PORT_DOWN_MS", "20000");
	pair_open(&p, refuse ? "insiderefused" : "insidepost");
	sim_locked_enter();
	sim_world_set_refuse_posts_in_err(p.w, refuse);
	sim_locked_leave();
	struct shift_dqp *d = shift_dqp_of_qp(p.a.qp);

	assert_non_null(d);
	memset(p.a.buf, 0x5a, 64);
	ip.a = &p.a;
	ip.b = &p.b;
	inside_qp = p.a.qp;
	__atomic_store_n(&inside_in, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&inside_saw_err, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&inside_state, -1, __ATOMIC_RELEASE);
	__atomic_store_n(&inside_armed, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&sim_locked.hook, inside_hook, __ATOMIC_RELEASE);
	pthread_t t;

	assert_int_equal(pthread_create(&t, NULL, inside_poster, &ip), 0);
	for (uint64_t end = now_ms() + 5000; !__atomic_load_n(&inside_in, __ATOMIC_ACQUIRE);) {
		assert_true(now_ms() < end);
		usleep(1000);
	}
	uint64_t t0 = now_ms();

	kill_default_nic(&p);
	assert_int_equal(pthread_join(t, NULL), 0);
	uint64_t took = now_ms() - t0;

	__atomic_store_n(&sim_locked.hook, NULL, __ATOMIC_RELEASE);
	print_message("the post inside the provider (%s) saw its QP in ERR after %llu ms\n",
		      refuse ? "refusing" : "taking", (unsigned long long)took);
	assert_true(__atomic_load_n(&inside_saw_err, __ATOMIC_ACQUIRE));
	assert_int_equal(__atomic_load_n(&inside_state, __ATOMIC_ACQUIRE), IBV_QPS_RTS);
	assert_int_equal(ip.rc, 0);
	/* the write completes once, successfully, with its data at B (and
	 * nothing else comes: the next write's completion is the next) */
	for (uint64_t end = now_ms() + 10000; now_ms() < end && !seen;) {
		struct ibv_wc wc;

		step(p.w);
		int n = ibv_poll_cq(p.a.cq, 1, &wc);

		assert_true(n >= 0);
		if (n) {
			assert_int_equal(wc.wr_id, 2000);
			assert_int_equal(wc.status, IBV_WC_SUCCESS);
			seen++;
		}
	}
	assert_int_equal(seen, 1);
	assert_int_not_equal(__atomic_load_n(&d->send_state, __ATOMIC_ACQUIRE), SHIFT_SEND_DEFAULT);
	assert_int_equal((uint8_t)p.b.buf[2048], 0x5a);
	struct ibv_wc wc = write_one(p.w, &p.a, &p.b, 5);

	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.wr_id, 1005);
	pair_close(&p);
}

static void test_failover_stops_a_post_inside(void **state)
{
	(void)state;
	stops_a_post_inside(false);
}

static void test_failover_stops_a_refused_post_inside(void **state)
{
	(void)state;
	stops_a_post_inside(true);
}

/*
 * A start that finds the application's own error: A's port dies while the
 * error of A's write with a bad rkey waits in its CQ, unpolled. A's thread
 * starts a failover, drains the CQ, finds the application's error, and
 * gives up: no failover, the QP unprotected, everything as plain gives it.
 * A send another application thread posted while that start drained (the
 * posts are held then) never reached the provider. It must complete
 * flushed, after the error, as plain flushes a post on a QP in ERR. Before
 * stop 45 it never completed. The hook holds the drain's first poll until
 * that post has returned.
 */
static __thread bool window_app_thread;
static struct shift_dqp *window_d;
static int window_armed, window_posted;

static void window_hook(const char *op, struct ibv_context *ctx, bool inside)
{
	int one = 1;

	(void)ctx;
	if (strcmp(op, "poll_cq") || inside || window_app_thread || !window_d ||
	    __atomic_load_n(&window_d->send_state, __ATOMIC_ACQUIRE) == SHIFT_SEND_DEFAULT ||
	    !__atomic_compare_exchange_n(&window_armed, &one, 2, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE))
		return;
	for (uint64_t end = now_ms() + 3000;
	     !__atomic_load_n(&window_posted, __ATOMIC_ACQUIRE) && now_ms() < end;)
		usleep(1000);
}

static void *window_poster(void *arg)
{
	struct inside_post *ip = arg;

	window_app_thread = true;
	for (uint64_t end = now_ms() + 5000;
	     __atomic_load_n(&window_armed, __ATOMIC_ACQUIRE) != 2 && now_ms() < end;)
		usleep(500);
	ip->rc = post_write(ip, 3001);
	__atomic_store_n(&window_posted, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void test_app_error_flushes_a_post_held_by_its_start(void **state)
{
	struct pair p;
	struct inside_post ip = { .rc = -1 };
	unsigned err_seen = 0, flush_seen = 0;
	(void)state;

	test_setenv("SHIFT_PORT_DOWN_MS", "20000");
	pair_open(&p, "heldapperr");
	window_d = shift_dqp_of_qp(p.a.qp);
	assert_non_null(window_d);
	window_app_thread = true;
	ip.a = &p.a;
	ip.b = &p.b;
	struct ibv_sge sge = { .addr = (uintptr_t)p.a.buf, .length = 64, .lkey = p.a.mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 3000, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)p.b.buf + 2048, .rkey = p.b.mr->rkey + 77 },
	}, *bad;

	assert_int_equal(ibv_post_send(p.a.qp, &wr, &bad), 0);
	for (unsigned i = 0; i < 200; i++)
		step(p.w); /* (its error in A's CQ, unpolled) */
	__atomic_store_n(&window_posted, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&window_armed, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&sim_locked.hook, window_hook, __ATOMIC_RELEASE);
	pthread_t t;

	assert_int_equal(pthread_create(&t, NULL, window_poster, &ip), 0);
	kill_default_nic(&p);
	assert_int_equal(pthread_join(t, NULL), 0);
	__atomic_store_n(&sim_locked.hook, NULL, __ATOMIC_RELEASE);
	print_message("the start's drain %s the post\n",
		      __atomic_load_n(&window_armed, __ATOMIC_ACQUIRE) == 2 ? "held for" : "missed");
	assert_int_equal(__atomic_load_n(&window_armed, __ATOMIC_ACQUIRE), 2);
	assert_int_equal(ip.rc, 0);
	for (uint64_t end = now_ms() + 5000; now_ms() < end && !flush_seen;) {
		struct ibv_wc wc;

		step(p.w);
		int n = ibv_poll_cq(p.a.cq, 1, &wc);

		assert_true(n >= 0);
		if (!n)
			continue;
		if (wc.wr_id == 3000) {
			assert_int_equal(wc.status, IBV_WC_REM_ACCESS_ERR);
			err_seen++;
		} else {
			assert_int_equal(wc.wr_id, 3001);
			assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
			assert_int_equal(err_seen, 1); /* (after the error, as plain's) */
			flush_seen++;
		}
	}
	window_d = NULL;
	assert_int_equal(err_seen, 1);
	assert_int_equal(flush_seen, 1);
	pair_close(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_writes_survive_nic_death_with_real_threads),
		cmocka_unit_test(test_port_event_fails_idle_qp_over_at_once),
		cmocka_unit_test(test_port_event_with_spinning_poller),
		cmocka_unit_test(test_passive_peer_answers_on_completion_event),
		cmocka_unit_test(test_flaps_with_real_threads),
		cmocka_unit_test(test_idle_threads_sleep),
		cmocka_unit_test(test_failover_waits_for_a_poll_inside),
		cmocka_unit_test(test_failover_stops_a_post_inside),
		cmocka_unit_test(test_failover_stops_a_refused_post_inside),
		cmocka_unit_test(test_app_error_flushes_a_post_held_by_its_start),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
