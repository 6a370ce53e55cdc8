/*
 * tests/unit/test_kv_sentinel.c - the Redis backend behind Redis Sentinel
 * (redis-sentinel:// URLs), against real servers the test starts on free
 * loopback ports: a primary, a replica of it, and one sentinel (quorum 1,
 * down-after 300 ms) watching them.
 *
 *  - the primary is found through the sentinels, the first of which does
 *    not answer (a closed port): it is skipped within the deadline;
 *  - the primary is killed (SIGKILL): the sentinel promotes the replica
 *    and the same handle, with no reopen, writes to the new primary and
 *    reads what was written before the failure;
 *  - a master name no sentinel knows fails each command within its
 *    deadline with a message saying so, never a hang.
 *
 * Without redis-server every test FAILS (scripts/deps installs it).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kv/kv.h"
#include "redis_proc.h"

#define PW "shift-sentinel-pw"

static pid_t prim = -1, repl = -1, sent = -1;
static int prim_port, repl_port, sent_port, dead_port;
static char dir[64];

static int write_sentinel_conf(const char *path)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return -1;
	fprintf(f,
		"port %d\nbind 127.0.0.1\ndir %s\n"
		"sentinel monitor m 127.0.0.1 %d 1\n"
		"sentinel auth-pass m %s\n"
		"sentinel down-after-milliseconds m 300\n"
		"sentinel failover-timeout m 3000\n",
		sent_port, dir, prim_port, PW);
	return fclose(f);
}

/* Until the condition on the reply of cmd (on port) holds, up to ms. */
static int wait_reply(int port, const char *pw, int ms, const char *cmd,
		      const char *needle)
{
	uint64_t t0 = rp_now_ms();

	while (rp_now_ms() - t0 < (uint64_t)ms) {
		redisReply *r = rp_command(port, pw, cmd);
		int ok = 0;

		if (r && r->type == REDIS_REPLY_STRING)
			ok = strstr(r->str, needle) != NULL;
		if (r && r->type == REDIS_REPLY_ARRAY)
			ok = r->elements > 0;
		if (r)
			freeReplyObject(r);
		if (ok)
			return 0;
		rp_sleep_ms(50);
	}
	return -1;
}

static int group_setup(void **state)
{
	char p[16], pp[16], conf[128];
	(void)state;

	if (!rp_server_path()) {
		fprintf(stderr, "*** FAIL: redis-server not found (scripts/deps installs it) ***\n");
		return -1;
	}
	snprintf(dir, sizeof(dir), "/tmp/shift-sentinel-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	prim_port = rp_free_port();
	snprintf(p, sizeof(p), "%d", prim_port);
	const char *pa[] = { "--port", p, "--bind", "127.0.0.1", "--requirepass", PW,
			     "--masterauth", PW, "--save", "", "--appendonly", "no", NULL };
	prim = rp_start(prim_port, PW, pa);
	repl_port = rp_free_port();
	snprintf(pp, sizeof(pp), "%d", repl_port);
	const char *ra[] = { "--port", pp, "--bind", "127.0.0.1", "--requirepass", PW,
			     "--masterauth", PW, "--replicaof", "127.0.0.1", p,
			     "--save", "", "--appendonly", "no", NULL };
	repl = rp_start(repl_port, PW, ra);
	if (prim < 0 || repl < 0 ||
	    wait_reply(repl_port, PW, 10000, "INFO replication", "master_link_status:up"))
		return -1;
	sent_port = rp_free_port();
	snprintf(conf, sizeof(conf), "%s/sentinel.conf", dir);
	if (write_sentinel_conf(conf))
		return -1;
	const char *sa[] = { conf, "--sentinel", NULL };
	sent = rp_start(sent_port, NULL, sa);
	dead_port = rp_free_port();
	/* the sentinel must know the replica before the primary dies */
	return sent < 0 || wait_reply(sent_port, NULL, 15000, "SENTINEL replicas m", "") ? -1 : 0;
}

static int group_teardown(void **state)
{
	(void)state;
	rp_kill(&sent);
	rp_kill(&repl);
	rp_kill(&prim);
	rp_rmtree(dir);
	return 0;
}

static shift_kv *open_sentinel(const char *master)
{
	char url[256];
	struct shift_kv_options o = { .command_timeout_ms = 1000, .lazy_connect = true,
				      .retry_min_ms = 10, .retry_max_ms = 50 };
	shift_kv *h = NULL;

	snprintf(url, sizeof(url), "redis-sentinel://:%s@127.0.0.1:%d,127.0.0.1:%d/%s",
		 PW, dead_port, sent_port, master);
	assert_int_equal(shift_kv_open(url, "sent", &o, &h), 0);
	return h;
}

/* The primary, found past a dead sentinel; then it dies and the same
 * handle follows the promotion. */
static void test_sentinel_failover(void **state)
{
	shift_kv *h = open_sentinel("m");
	char buf[64];
	size_t len;
	uint64_t t0;
	int rc = -1;
	(void)state;

	assert_int_equal(shift_kv_put(h, "before", "v1", 2, 0), 0);
	assert_int_equal(shift_kv_get_buf(h, "before", buf, sizeof(buf), &len), 0);
	/* what was written reached the primary the sentinel names */
	redisReply *r = rp_command(prim_port, PW, "GET shift:sent:before");
	assert_non_null(r);
	assert_int_equal(r->type, REDIS_REPLY_STRING);
	freeReplyObject(r);
	assert_int_equal(wait_reply(repl_port, PW, 5000, "GET shift:sent:before", "v1"), 0);

	rp_kill(&prim);
	t0 = rp_now_ms();
	while (rp_now_ms() - t0 < 30000) {
		rc = shift_kv_put(h, "after", "v2", 2, 0);
		if (!rc)
			break;
		rp_sleep_ms(100);
	}
	printf("# writes went on %llu ms after the primary was killed\n",
	       (unsigned long long)(rp_now_ms() - t0));
	assert_int_equal(rc, 0);
	memset(buf, 0, sizeof(buf));
	assert_int_equal(shift_kv_get_buf(h, "before", buf, sizeof(buf), &len), 0);
	assert_string_equal(buf, "v1");
	/* the write landed on the promoted replica */
	r = rp_command(repl_port, PW, "GET shift:sent:after");
	assert_non_null(r);
	assert_int_equal(r->type, REDIS_REPLY_STRING);
	assert_string_equal(r->str, "v2");
	freeReplyObject(r);
	shift_kv_close(h);
}

/* No sentinel knows the master: each command fails within its deadline,
 * saying so. */
static void test_sentinel_unknown_master(void **state)
{
	shift_kv *h = open_sentinel("nosuch");
	uint64_t t0 = rp_now_ms();
	(void)state;

	assert_int_equal(shift_kv_put(h, "k", "v", 1, 0), -ENOTCONN);
	assert_true(rp_now_ms() - t0 < 1500);
	assert_non_null(strstr(shift_kv_last_error(), "does not know the master"));
	assert_null(strstr(shift_kv_last_error(), PW));
	shift_kv_close(h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sentinel_unknown_master),
		cmocka_unit_test(test_sentinel_failover),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
