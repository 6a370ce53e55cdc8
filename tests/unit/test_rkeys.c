/*
 * The peer's backup rkeys come from the KV store through the background
 * pass only (issue #19, item 1): a failover on an application thread never
 * reads them. A WR whose key is not read yet is held, with the WRs after
 * it, and goes out once the background pass has read it; a key that cannot
 * be read within SHIFT_KV_WAIT_MS, or that the peer never published, fails
 * its WR as the default path would have: never a wait without bound.
 * Keys the QP used before its failure are read ahead, and so is every MR
 * the peer published (its MR index, shadow/mrindex.c); one of those is used
 * when the store cannot give it at the failover (gone, emptied, garbled).
 * A key in no record at all (memory the peer registered while the store
 * was gone) is asked of the peer over the backup path (its key mailbox).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "sim_pair.h"
#include "shift/dp/ctx.h"
#include "shift/base/clock.h"
#include "kv/kv.h"
#include "shift/shadow/exchange.h"
#include "shift/base/lower.h"
#include "shift/shadow/shadow.h"

static struct sim_ep a, b;
static struct sim_pair pair;
static char kvname[32];
static int run;
static unsigned long mrs_read0; /* peer MR records read ahead before the pair */

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void open_pair(void);

/* ... without key mailboxes (SHIFT_KEY_MAILBOX=0): what the KV store alone
 * gives a failover */
static void open_pair_kv_only(void)
{
	test_setenv("SHIFT_KEY_MAILBOX", "0");
	open_pair();
}

static void open_pair(void)
{
	struct shift_shadow_stats st;

	shift_shadow_stats_get(&st);
	mrs_read0 = st.peer_mrs_read;
	/* (sim_pair_open names the store "mem://rk<n>", n counting its calls) */
	sim_pair_open(&pair, &a, &b, "rk", 0);
	snprintf(kvname, sizeof(kvname), "rk%d", run++);
	sim_pair_connect(&pair);
}

/* Step the world, run SHIFT's background passes and poll A (up to max
 * completions into wa) and B, until A has max, nothing moves for `quiet`
 * rounds, or ms have passed (wall clock). */
static int drive(struct ibv_wc *wa, int max_a, int quiet, uint64_t ms)
{
	int na = 0, idle = 0;
	uint64_t end = now_ms() + ms;
	struct ibv_wc wb;

	while (na < max_a && idle < quiet && now_ms() < end) {
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

/* A's default NIC dies; A writes 512 bytes of pattern into B's memory
 * under rkey. */
static void write_after_failure(uint32_t rkey, uint8_t pattern)
{
	struct ibv_send_wr *bad;
	struct ibv_sge s = { .addr = (uintptr_t)a.buf + 4096, .length = 512, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 91, .sg_list = &s, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = (uintptr_t)b.buf + 4096, .rkey = rkey } };

	memset(a.buf + 4096, pattern, 512);
	memset(b.buf + 4096, 0, 512);
	sim_dev_kill(sim_host_dev(pair.host[0], 0), 0);
	assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
}

/* A second MR of B's over its whole buffer, registered now: the key of
 * memory A has never addressed. */
static struct ibv_mr *b_mr2(void)
{
	struct ibv_mr *mr = b.v->reg_mr(b.pd, b.buf, b.len,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					       IBV_ACCESS_REMOTE_READ);

	assert_non_null(mr);
	return mr;
}

static void assert_written(uint8_t pattern)
{
	for (int i = 0; i < 512; i++)
		assert_int_equal(b.buf[4096 + i], pattern);
}

/* ... and the write completes, its 512 bytes of pattern in B's memory. */
static void write_survives(uint32_t rkey, uint8_t pattern)
{
	struct ibv_wc wc[4];

	write_after_failure(rkey, pattern);
	assert_int_equal(drive(wc, 1, 1000000, 10000), 1);
	assert_int_equal(wc[0].wr_id, 91);
	assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
	assert_written(pattern);
}

/* SHIFT's log lines while it runs (stderr into a file; info level). */
static FILE *log_cap;
static int log_saved = -1;
static enum shift_log_level log_level_was;

static void log_capture(void)
{
	assert_non_null(log_cap = tmpfile());
	fflush(stderr);
	log_saved = dup(STDERR_FILENO);
	assert_true(log_saved >= 0);
	assert_true(dup2(fileno(log_cap), STDERR_FILENO) >= 0);
	log_level_was = shift_log_level;
	shift_log_level = SHIFT_LOG_INFO;
}

static void log_captured(char *buf, size_t size)
{
	size_t n;

	shift_log_level = log_level_was;
	fflush(stderr);
	dup2(log_saved, STDERR_FILENO);
	close(log_saved);
	rewind(log_cap);
	n = fread(buf, 1, size - 1, log_cap);
	buf[n] = '\0';
	fclose(log_cap);
}

/* The store is down while A fails over: the failover runs (its handshake
 * needs nothing from the store), the write waits for its key (of an MR B
 * registered while the store was down: in no index), no error reaches the
 * application; once the store is back, B publishes the MR (A's first read
 * after the store's return finds it absent: not published yet, read
 * again), the background pass reads the key and the write completes. */
static void test_write_waits_for_its_key(void **state)
{
	struct ibv_wc wc[4];
	unsigned long waited = shift_stats.rkeys_waited;
	static char log[1 << 16];
	(void)state;

	open_pair_kv_only();
	assert_int_equal(shift_kv_mem_set_down(kvname, true), 0);
	struct ibv_mr *mr2 = b_mr2();

	log_capture();
	write_after_failure(mr2->rkey, 0x5a);
	assert_int_equal(drive(wc, 4, 50, 2000), 0);
	assert_true(shift_stats.rkeys_waited > waited);
	assert_int_equal(b.buf[4096], 0); /* (not sent: held) */
	assert_int_equal(shift_kv_mem_set_down(kvname, false), 0);
	/* (A's pass runs before B's: A reads the key absent, B has not
	 * published it again yet; A reads it again, the write is not refused) */
	assert_int_equal(drive(wc, 4, 50, 5000), 1);
	log_captured(log, sizeof(log));
	assert_int_equal(wc[0].wr_id, 91);
	assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
	assert_written(0x5a);
	/* A's failover-timing line: its switch time (every WR reposted on
	 * the backup) counts the time its WR waited for the key, and says so;
	 * the wait for the peer's message came after A's own */
	char tag[64];
	unsigned long long sw, fb;
	unsigned start, wait, retx, post, held;

	snprintf(tag, sizeof(tag), "QP %u: failover-timing ", a.qp->qp_num);
	const char *t = strstr(log, tag);

	assert_non_null(t);
	assert_null(strstr(t + 1, tag)); /* (once) */
	assert_int_equal(sscanf(t, "QP %*u: failover-timing dev=%*s qp=%*u switch_us=%llu "
				   "fallback_us=%llu start_us=%u wait_us=%u retx_us=%u post_us=%u "
				   "held_us=%u", &sw, &fb, &start, &wait, &retx, &post, &held), 7);
	assert_true(held > 0);
	assert_true(sw >= held);
	assert_true(fb >= sw);
	assert_true(post <= retx + held);
	assert_non_null(strstr(log, "the rest held for the peer's backup keys after"));
	assert_int_equal(b.v->dereg_mr(mr2), 0);
	sim_pair_close(&pair);
}

/* The store stays down: after SHIFT_KV_WAIT_MS the write fails as one
 * whose key the peer does not have, not later and not never. */
static void test_key_unreadable_fails_in_bounded_time(void **state)
{
	struct ibv_wc wc[4];
	unsigned saved = shift_config.kv_wait_ms;
	(void)state;

	open_pair_kv_only();
	shift_config.kv_wait_ms = 200;
	assert_int_equal(shift_kv_mem_set_down(kvname, true), 0);
	struct ibv_mr *mr2 = b_mr2(); /* (in no index) */
	/* (SHIFT's clock: the simulator's, which its steps advance) */
	uint64_t t0 = shift_clock_ms();

	write_after_failure(mr2->rkey, 0x33);
	sim_pair_expect_errors(1);
	assert_int_equal(drive(wc, 1, 1000000, 10000), 1);
	uint64_t took = shift_clock_ms() - t0;

	print_message("the write failed after %llu ms (SHIFT_KV_WAIT_MS 200)\n",
		      (unsigned long long)took);
	assert_true(took >= 200 && took < 2000);
	assert_int_equal(wc[0].wr_id, 91);
	assert_int_not_equal(wc[0].status, IBV_WC_SUCCESS);
	assert_int_equal(b.buf[4096], 0);
	shift_config.kv_wait_ms = saved;
	assert_int_equal(shift_kv_mem_set_down(kvname, false), 0);
	assert_int_equal(b.v->dereg_mr(mr2), 0);
	sim_pair_close(&pair);
}

/* A write under a key B does not have fails, long before SHIFT_KV_WAIT_MS
 * (a minute here): told by the store (up, no mailboxes) or by B itself
 * (the store down, or up and without the record). */
static void bogus_key_refused_fast(bool store_down, bool mbox)
{
	struct ibv_wc wc[4];
	unsigned saved = shift_config.kv_wait_ms;
	unsigned long taken = shift_stats.mbox_taken;

	if (mbox)
		open_pair();
	else
		open_pair_kv_only();
	shift_config.kv_wait_ms = 60000;
	assert_int_equal(shift_kv_mem_set_down(kvname, store_down), 0);
	uint64_t t0 = shift_clock_ms();

	write_after_failure(b.mr->rkey + 4242, 0x77);
	sim_pair_expect_errors(1);
	assert_int_equal(drive(wc, 1, 1000000, 10000), 1);
	assert_true(shift_clock_ms() - t0 < 5000);
	assert_int_equal(wc[0].wr_id, 91);
	assert_int_not_equal(wc[0].status, IBV_WC_SUCCESS);
	assert_int_equal(b.buf[4096], 0);
	assert_true(mbox ? shift_stats.mbox_taken > taken : shift_stats.mbox_taken == taken);
	shift_config.kv_wait_ms = saved;
	assert_int_equal(shift_kv_mem_set_down(kvname, false), 0);
	sim_pair_close(&pair);
}

/* ... the store kept answering: it reads the key absent, at once */
static void test_key_never_published_refused_at_once(void **state)
{
	(void)state;
	bogus_key_refused_fast(false, false);
}

/* ... the store says absent, and B, asked over its key mailbox, too */
static void test_key_absent_everywhere_refused(void **state)
{
	(void)state;
	bogus_key_refused_fast(false, true);
}

/*
 * The store answers, without a record of B's MR: B registered it a moment
 * ago and its record is not in the store yet when A fails over (here B's
 * pass published it and the store lost it; A never read it ahead). The
 * store's "absent" is not taken for memory B lacks: A asks B over the key
 * mailbox, B has the MR shadowed, and the write completes with its data
 * (before stop 40: refused at once).
 */
static void test_key_not_in_the_store_yet_asked_of_the_peer(void **state)
{
	struct ibv_wc wc[4];
	unsigned long taken = shift_stats.mbox_taken;
	(void)state;

	open_pair();
	struct shift_rnic *rb = shift_ctx_of(b.ctx)->rnic;
	struct shift_qp *qb = shift_dqp_of_qp(b.qp)->shadow;
	struct shift_mr_value mv;
	struct ibv_mr *mr2 = b_mr2();

	/* (what B's mailbox would answer: not yet, until B's pass shadows
	 * it; never for a key B does not have) */
	assert_int_equal(shift_shadow_own_mr(rb, qb, mr2->rkey, &mv), -1);
	assert_int_equal(shift_shadow_own_mr(rb, qb, mr2->rkey + 4242, &mv), 0);
	for (int i = 0; i < 4; i++)
		shift_rnic_pass(rb); /* (B's passes only) */
	assert_int_equal(shift_shadow_own_mr(rb, qb, mr2->rkey, &mv), 1);
	assert_int_equal(shift_kv_mem_clear(kvname), 0);
	write_after_failure(mr2->rkey, 0x5e);
	assert_int_equal(drive(wc, 1, 1000000, 10000), 1);
	assert_int_equal(wc[0].wr_id, 91);
	assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
	assert_written(0x5e);
	assert_true(shift_stats.mbox_taken > taken);
	assert_int_equal(b.v->dereg_mr(mr2), 0);
	sim_pair_close(&pair);
}

/* The store is down while A fails over and writes into an MR B registered
 * while it was down (in no record, in no index): A's background thread
 * asks B's over the backup path (the key mailbox, fo/mbox.c), B's answers
 * with its backup key, and the write completes, every byte in place, well
 * within SHIFT_KV_WAIT_MS; the store stays down throughout. */
static void test_key_from_the_peer_store_down(void **state)
{
	struct ibv_wc wc[4];
	unsigned long asked = shift_stats.mbox_asked, taken = shift_stats.mbox_taken;
	unsigned long answered = shift_stats.mbox_answered;
	(void)state;

	open_pair();
	assert_int_equal(shift_kv_mem_set_down(kvname, true), 0);
	struct ibv_mr *mr2 = b_mr2();
	uint64_t t0 = shift_clock_ms();

	write_after_failure(mr2->rkey, 0x6c);
	assert_int_equal(drive(wc, 1, 1000000, 10000), 1);
	print_message("the write completed %llu ms after the failure (SHIFT_KV_WAIT_MS %u)\n",
		      (unsigned long long)(shift_clock_ms() - t0), shift_config.kv_wait_ms);
	assert_true(shift_clock_ms() - t0 < shift_config.kv_wait_ms);
	assert_int_equal(wc[0].wr_id, 91);
	assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
	assert_written(0x6c);
	assert_true(shift_stats.mbox_asked > asked);
	assert_true(shift_stats.mbox_answered > answered);
	assert_true(shift_stats.mbox_taken > taken);
	assert_int_equal(shift_kv_mem_set_down(kvname, false), 0);
	assert_int_equal(b.v->dereg_mr(mr2), 0);
	sim_pair_close(&pair);
}

/* ... the store is down: B answers through its key mailbox that it has
 * no such MR */
static void test_key_the_peer_lacks_refused(void **state)
{
	(void)state;
	bogus_key_refused_fast(true, true);
}

/* A writes into B under B's key on the default path, and the background
 * passes run until they have read that key ahead (at most 5 s). */
static void write_and_read_ahead(void)
{
	struct ibv_send_wr *bad;
	struct ibv_sge s = { .addr = (uintptr_t)a.buf, .length = 64, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 90, .sg_list = &s, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = (uintptr_t)b.buf, .rkey = b.mr->rkey } };
	struct ibv_wc wc[2];
	unsigned long read = shift_stats.rkeys_read;
	uint64_t end = now_ms() + 5000;

	assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
	assert_int_equal(drive(wc, 1, 1000000, 5000), 1);
	assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
	while (shift_stats.rkeys_read == read && now_ms() < end) {
		sim_world_step(pair.world);
		shift_rnic_pass_all();
	}
	assert_true(shift_stats.rkeys_read > read);
}

/* The key was read ahead, then the store goes (down: how) before A's NIC
 * dies: the failover's write uses the key read before at once (never held
 * for the store) and completes with its data, no error reaches the
 * application. */
static void earlier_key_used(bool down)
{
	unsigned long at_once = shift_stats.rkeys_at_once, waited = shift_stats.rkeys_waited;

	open_pair();
	write_and_read_ahead();
	if (down)
		assert_int_equal(shift_kv_mem_set_down(kvname, true), 0);
	else
		assert_int_equal(shift_kv_mem_clear(kvname), 0);
	write_survives(b.mr->rkey, 0x6b);
	assert_true(shift_stats.rkeys_at_once > at_once);
	assert_int_equal(shift_stats.rkeys_waited, waited);
	if (down)
		assert_int_equal(shift_kv_mem_set_down(kvname, false), 0);
	sim_pair_close(&pair);
}

/* The store answers: the failover's write still goes at once with the key
 * read ahead, not held for the store's answer (its failover-timing line
 * says held_us=0); the confirming read follows. */
static void test_read_ahead_key_used_at_once(void **state)
{
	unsigned long at_once = shift_stats.rkeys_at_once, waited = shift_stats.rkeys_waited;
	static char log[1 << 16];
	char tag[64];
	(void)state;

	open_pair();
	write_and_read_ahead();
	unsigned long read = shift_stats.rkeys_read;

	log_capture();
	write_survives(b.mr->rkey, 0x6c);
	uint64_t end = now_ms() + 5000;

	while (shift_stats.rkeys_read == read && now_ms() < end) {
		sim_world_step(pair.world);
		shift_rnic_pass_all();
	}
	log_captured(log, sizeof(log));
	assert_true(shift_stats.rkeys_read > read); /* (the confirming read) */
	assert_true(shift_stats.rkeys_at_once > at_once);
	assert_int_equal(shift_stats.rkeys_waited, waited);
	snprintf(tag, sizeof(tag), "QP %u: failover-timing ", a.qp->qp_num);
	const char *t = strstr(log, tag);

	assert_non_null(t);
	assert_non_null(strstr(t, " held_us=0 "));
	assert_null(strstr(log, "changed since it was read"));
	sim_pair_close(&pair);
}

static void test_read_ahead_key_used_store_down(void **state)
{
	(void)state;
	earlier_key_used(true);
}

static void test_read_ahead_key_used_store_emptied(void **state)
{
	(void)state;
	earlier_key_used(false);
}

/* Run the passes until the pair has read ahead n peer MR records through
 * the other's MR index since it was opened (at most 5 s). */
static void index_read_ahead(unsigned long n)
{
	struct shift_shadow_stats st;
	uint64_t end = now_ms() + 5000;
	unsigned long want = mrs_read0 + n;

	shift_shadow_stats_get(&st);

	while (st.peer_mrs_read < want && now_ms() < end) {
		sim_world_step(pair.world);
		shift_rnic_pass_all();
		shift_shadow_stats_get(&st);
	}
	assert_true(st.peer_mrs_read >= want);
}

/* A's status line (shiftctl's) tells the peer MR keys read ahead, and
 * that both ends of its connection have a key mailbox. */
static void assert_status_mrs(unsigned want)
{
	char dir[] = "/tmp/shift-rkeys-XXXXXX", path[512], line[2048], tag[48];
	FILE *f;

	assert_non_null(mkdtemp(dir));
	snprintf(shift_config.status_dir, sizeof(shift_config.status_dir), "%s", dir);
	shift_status_write(shift_rnic_of(a.ctx));
	snprintf(path, sizeof(path), "%s/shift-%d-sim0_0.status", dir, (int)getpid());
	assert_non_null(f = fopen(path, "r"));
	do /* (past the process's counters, "#stats ...") */
		assert_non_null(fgets(line, sizeof(line), f));
	while (line[0] == '#');
	fclose(f);
	snprintf(tag, sizeof(tag), " mrs=%u mbox=both dgram=both ", want);
	assert_non_null(strstr(line, tag));
	shift_status_remove(shift_rnic_of(a.ctx));
	shift_config.status_dir[0] = '\0';
	assert_int_equal(rmdir(dir), 0);
}

/* A never addressed B's second MR before its failure, and the store goes
 * (down: how) before A's NIC dies: the key B's MR index led A to read
 * ahead is used at once, the write completes with its data. */
static void index_key_used(bool down)
{
	unsigned long at_once = shift_stats.rkeys_at_once, waited = shift_stats.rkeys_waited;

	open_pair();
	struct ibv_mr *mr2 = b_mr2();

	/* (A: both of B's MRs, the first and the new one; B: A's) */
	index_read_ahead(3);
	assert_status_mrs(2);
	if (down)
		assert_int_equal(shift_kv_mem_set_down(kvname, true), 0);
	else
		assert_int_equal(shift_kv_mem_clear(kvname), 0);
	write_survives(mr2->rkey, 0x3c);
	assert_true(shift_stats.rkeys_at_once > at_once);
	assert_int_equal(shift_stats.rkeys_waited, waited);
	if (down)
		assert_int_equal(shift_kv_mem_set_down(kvname, false), 0);
	assert_int_equal(b.v->dereg_mr(mr2), 0);
	sim_pair_close(&pair);
}

/* The key A read ahead changed before A's failover (here: B's record for
 * its first MR now names the backup key of its second, over the same
 * memory, as after B registered it anew): the failover's write goes at
 * once with the key known before; the confirming read behind it finds the
 * new one, says so once, and A's next write uses it. */
static void test_key_changed_found_by_confirm(void **state)
{
	shift_kv *h;
	union ibv_gid gid;
	char k1[SHIFT_EXCHANGE_KEY_MAX], k2[SHIFT_EXCHANGE_KEY_MAX];
	void *v = NULL;
	size_t len;
	struct ibv_wc wc[4];
	unsigned long changed = shift_stats.rkeys_changed, waited = shift_stats.rkeys_waited;
	(void)state;

	open_pair();
	struct ibv_mr *mr2 = b_mr2();

	index_read_ahead(3);
	assert_int_equal(shift_kv_open_from_env(NULL, &h), 0);
	assert_int_equal(shift_lower->query_gid(b.ctx, 1, 1, &gid), 0);
	shift_exchange_mr_key(&gid, b.mr->rkey, k1, sizeof(k1));
	shift_exchange_mr_key(&gid, mr2->rkey, k2, sizeof(k2));
	assert_int_equal(shift_kv_get(h, k2, &v, &len), 0);
	assert_non_null(v);
	assert_int_equal(shift_kv_put(h, k1, v, len, 0), 0);
	free(v);
	shift_kv_close(h);
	write_survives(b.mr->rkey, 0x71); /* (with the key read before) */
	assert_int_equal(shift_stats.rkeys_waited, waited);
	uint64_t end = now_ms() + 10000;

	while (shift_stats.rkeys_changed == changed && now_ms() < end) {
		sim_world_step(pair.world);
		shift_rnic_pass_all();
	}
	assert_int_equal(shift_stats.rkeys_changed, changed + 1);
	/* A's next write: the new key (B's second MR's backup), same memory */
	struct ibv_send_wr *bad;
	struct ibv_sge sg = { .addr = (uintptr_t)a.buf + 4096, .length = 512, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 92, .sg_list = &sg, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = (uintptr_t)b.buf + 4096,
					       .rkey = b.mr->rkey } };

	memset(a.buf + 4096, 0x72, 512);
	assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
	assert_int_equal(drive(wc, 1, 1000000, 5000), 1);
	assert_int_equal(wc[0].wr_id, 92);
	assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
	assert_written(0x72);
	assert_int_equal(shift_stats.rkeys_changed, changed + 1);
	assert_int_equal(b.v->dereg_mr(mr2), 0);
	sim_pair_close(&pair);
}

static void test_index_key_used_store_down(void **state)
{
	(void)state;
	index_key_used(true);
}

static void test_index_key_used_store_emptied(void **state)
{
	(void)state;
	index_key_used(false);
}

/* B's MR index garbled after A read it (a forger, a torn write): A's next
 * read of it is refused with one log line and keeps what it had, so the
 * key of B's MR is still there when the store goes down. */
static void test_index_garbled_keeps_what_was_read(void **state)
{
	shift_kv *h;
	union ibv_gid gid;
	char key[SHIFT_EXCHANGE_KEY_MAX];
	struct shift_qp_info qi;
	struct shift_shadow_stats st;
	const char *bad = "shift1 mri ver=99 chunks=1 keys=1,,2";
	(void)state;

	open_pair();
	index_read_ahead(2); /* (each side the other's MR) */
	assert_int_equal(shift_kv_open_from_env(NULL, &h), 0);
	assert_int_equal(shift_lower->query_gid(b.ctx, 1, 1, &gid), 0);
	assert_int_equal(shift_shadow_qp_info(b.qp, &qi), 0);
	assert_true(qi.mri_id != 0);
	assert_true(shift_exchange_mri_key(&gid, qi.mri_id, 0, key, sizeof(key)) > 0);
	assert_int_equal(shift_kv_put(h, key, bad, strlen(bad), 0), 0);
	shift_kv_close(h);
	shift_shadow_stats_get(&st);
	unsigned long bad0 = st.peer_mri_bad;
	uint64_t end = now_ms() + 10000;

	while (st.peer_mri_bad == bad0 && now_ms() < end) {
		sim_world_step(pair.world);
		shift_rnic_pass_all();
		shift_shadow_stats_get(&st);
	}
	assert_true(st.peer_mri_bad > bad0);
	assert_int_equal(shift_kv_mem_set_down(kvname, true), 0);
	write_survives(b.mr->rkey, 0x2d);
	assert_int_equal(shift_kv_mem_set_down(kvname, false), 0);
	sim_pair_close(&pair);
}

/* The store restarts empty while both sides are idle (down, then back
 * with nothing): B's records (its QP's, its MR's, its MR index) are
 * written again as soon as it answers, not at the next refresh round
 * hours later, so a later failover of A's finds them. */
static void test_store_restarted_empty_records_back(void **state)
{
	shift_kv *h;
	union ibv_gid gid;
	char key[SHIFT_EXCHANGE_KEY_MAX];
	void *v = NULL;
	size_t len;
	(void)state;

	open_pair();
	assert_int_equal(shift_kv_open_from_env(NULL, &h), 0);
	assert_int_equal(shift_lower->query_gid(b.ctx, 1, 1, &gid), 0);
	shift_exchange_mr_key(&gid, b.mr->rkey, key, sizeof(key));
	assert_int_equal(shift_kv_get(h, key, &v, &len), 0);
	free(v);
	assert_int_equal(shift_kv_mem_set_down(kvname, true), 0);
	for (int i = 0; i < 200; i++) { /* (the threads' reads fail meanwhile) */
		sim_world_step(pair.world);
		shift_rnic_pass_all();
	}
	assert_int_equal(shift_kv_mem_clear(kvname), 0);
	assert_int_equal(shift_kv_mem_set_down(kvname, false), 0);
	assert_int_equal(shift_kv_get(h, key, &v, &len), -ENOENT);
	int rc = -ENOENT;
	/* (SHIFT's clock: a refresh round would come SHIFT_KV_TTL_S / 3,
	 * 200 s, after the last one) */
	uint64_t t0 = shift_clock_ms(), end = now_ms() + 5000;

	while (rc == -ENOENT && shift_clock_ms() - t0 < 2000 && now_ms() < end) {
		sim_world_step(pair.world);
		shift_rnic_pass_all();
		rc = shift_kv_get(h, key, &v, &len);
	}
	print_message("B's MR record back %llu ms after the store\n",
		      (unsigned long long)(shift_clock_ms() - t0));
	assert_int_equal(rc, 0);
	free(v);
	shift_kv_close(h);
	sim_pair_close(&pair);
}

/* B's record for its MR (the range told: the whole MR), rewritten to tell
 * only its first 4 KiB. */
static void narrow_record(void)
{
	shift_kv *h;
	union ibv_gid gid;
	char key[SHIFT_EXCHANGE_KEY_MAX], val[SHIFT_EXCHANGE_VALUE_MAX];
	struct shift_mr_value mv;
	void *v;
	size_t len;

	assert_int_equal(shift_kv_open_from_env(NULL, &h), 0);
	assert_int_equal(shift_lower->query_gid(b.ctx, 1, 1, &gid), 0);
	shift_exchange_mr_key(&gid, b.mr->rkey, key, sizeof(key));
	assert_int_equal(shift_kv_get(h, key, &v, &len), 0);
	assert_int_equal(shift_exchange_mr_decode(v, len, &mv), 0);
	free(v);
	assert_true(mv.has_range);
	assert_true(mv.addr == (uintptr_t)b.mr->addr && mv.len == b.mr->length);
	mv.len = 4096;
	int n = shift_exchange_mr_encode(&mv, val, sizeof(val));

	assert_true(n > 0);
	assert_int_equal(shift_kv_put(h, key, val, (size_t)n, 0), 0);
	shift_kv_close(h);
}

/* A failover's write to bytes outside the range the peer's MR record
 * tells is refused, as the peer's NIC refuses a write outside the MR on
 * the default path, though the backup key (registered over the whole
 * buffer here) would take it. (A read the record before it was narrowed:
 * the failover's confirming read finds it changed before the write goes.) */
static void test_write_outside_the_peer_mr_refused(void **state)
{
	struct ibv_wc wc[4];
	unsigned long outside = shift_stats.rkeys_outside, changed = shift_stats.rkeys_changed;
	(void)state;

	open_pair();
	narrow_record();
	write_after_failure(b.mr->rkey, 0x42); /* (at 4096: past the first 4 KiB) */
	sim_pair_expect_errors(1);
	assert_int_equal(drive(wc, 1, 1000000, 10000), 1);
	assert_int_equal(wc[0].wr_id, 91);
	assert_int_not_equal(wc[0].status, IBV_WC_SUCCESS);
	assert_int_equal(b.buf[4096], 0);
	assert_true(shift_stats.rkeys_outside > outside);
	assert_true(shift_stats.rkeys_changed > changed);
	sim_pair_close(&pair);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_write_waits_for_its_key),
		cmocka_unit_test(test_key_unreadable_fails_in_bounded_time),
		cmocka_unit_test(test_key_never_published_refused_at_once),
		cmocka_unit_test(test_key_absent_everywhere_refused),
		cmocka_unit_test(test_key_not_in_the_store_yet_asked_of_the_peer),
		cmocka_unit_test(test_key_from_the_peer_store_down),
		cmocka_unit_test(test_key_the_peer_lacks_refused),
		cmocka_unit_test(test_read_ahead_key_used_at_once),
		cmocka_unit_test(test_read_ahead_key_used_store_down),
		cmocka_unit_test(test_read_ahead_key_used_store_emptied),
		cmocka_unit_test(test_write_outside_the_peer_mr_refused),
		cmocka_unit_test(test_key_changed_found_by_confirm),
		cmocka_unit_test(test_index_key_used_store_down),
		cmocka_unit_test(test_index_key_used_store_emptied),
		cmocka_unit_test(test_index_garbled_keeps_what_was_read),
		cmocka_unit_test(test_store_restarted_empty_records_back),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
