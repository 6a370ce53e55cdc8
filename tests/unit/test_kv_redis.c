/*
 * tests/unit/test_kv_redis.c - the kv Redis backend against a real
 * redis-server.  The group setup starts `redis-server --port P --bind
 * 127.0.0.1 --requirepass ...` on a free loopback port (binary from
 * $SHIFT_REDIS_SERVER, else redis-server on PATH) and the teardown kills it
 * by pid.  Without redis-server every test FAILS (scripts/test installs it):
 * this tier never skips silently.
 *
 * Covered: put/get/delete/wait/TTL and the stored key layout (checked with a
 * raw hiredis client), password and ACL-user AUTH, SELECT db, auth failures,
 * server killed mid-test (fast failures, no hang, reconnect after restart),
 * unreachable port, a connect that cannot complete (bounded by the connect
 * timeout) and a server that never answers (bounded by the command timeout).
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "kv/kv.h"
#include "redis_proc.h"

#define PASSWORD "shift-test-pw"

static pid_t srv_pid = -1;
static int srv_port;
static char srv_path[512];

/* The server process helpers are tests/unit/redis_proc.c's. */
static uint64_t now_ms(void)
{
	return rp_now_ms();
}

static void sleep_ms(int ms)
{
	rp_sleep_ms(ms);
}

/* Find the redis-server binary; 0 on success. */
static int find_redis_server(void)
{
	const char *p = rp_server_path();

	if (!p)
		return -1;
	snprintf(srv_path, sizeof(srv_path), "%s", p);
	return 0;
}

static int free_port(void)
{
	return rp_free_port();
}

/* A raw hiredis connection to the test server, authenticated; NULL if it
 * does not answer PING. */
static redisContext *raw_connect(void)
{
	return rp_connect(srv_port, PASSWORD);
}

/* Start redis-server on srv_port and wait (up to 10 s) until it answers. */
static int start_server(void)
{
	char port[16];

	snprintf(port, sizeof(port), "%d", srv_port);
	const char *args[] = { "--port", port, "--bind", "127.0.0.1", "--requirepass", PASSWORD,
			       "--save", "", "--appendonly", "no", "--daemonize", "no", NULL };
	srv_pid = rp_start(srv_port, PASSWORD, args);
	return srv_pid < 0 ? -1 : 0;
}

static void kill_server(void)
{
	rp_kill(&srv_pid);
}

static int group_setup(void **state)
{
	(void)state;
	signal(SIGPIPE, SIG_DFL); /* prove the library guards SIGPIPE itself */
	if (find_redis_server()) {
		fprintf(stderr,
			"\n*** FAIL: redis-server not found (set SHIFT_REDIS_SERVER or "
			"install redis-server; scripts/test does). The Redis kv tests "
			"cannot run and are counted as failed. ***\n\n");
		return -1;
	}
	srv_port = free_port();
	if (srv_port < 0 || start_server()) {
		fprintf(stderr, "*** FAIL: could not start %s ***\n", srv_path);
		kill_server();
		return -1;
	}
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	kill_server();
	return 0;
}

static shift_kv *open_ok(const char *fmt_url, const char *ns,
			 const struct shift_kv_options *o)
{
	char url[256];
	shift_kv *h = NULL;
	int rc;

	snprintf(url, sizeof(url), fmt_url, srv_port);
	rc = shift_kv_open(url, ns, o, &h);
	if (rc)
		fail_msg("open %s: %d %s", url, rc, shift_kv_last_error());
	return h;
}

/* ---- basic operations and key layout ---- */

static void test_redis_basic(void **state)
{
	const unsigned char bin[] = { 'a', 0, 'b', 0xff, '\r', '\n' };
	shift_kv *h = open_ok("redis://:" PASSWORD "@127.0.0.1:%d", "job1", NULL);
	redisContext *raw = raw_connect();
	redisReply *r;
	void *v;
	size_t n;

	(void)state;
	assert_non_null(raw);
	assert_string_equal(shift_kv_backend_name(h), "redis");
	assert_int_equal(shift_kv_put(h, "qp/fe80::1/7", bin, sizeof(bin), 0), 0);
	assert_int_equal(shift_kv_get(h, "qp/fe80::1/7", &v, &n), 0);
	assert_int_equal(n, sizeof(bin));
	assert_memory_equal(v, bin, sizeof(bin));
	free(v);

	/* stored under shift:<ns>:<key>, byte for byte */
	r = redisCommand(raw, "GET %s", "shift:job1:qp/fe80::1/7");
	assert_non_null(r);
	assert_int_equal(r->type, REDIS_REPLY_STRING);
	assert_int_equal(r->len, sizeof(bin));
	assert_memory_equal(r->str, bin, sizeof(bin));
	freeReplyObject(r);

	/* TTL is a Redis PX expiry */
	assert_int_equal(shift_kv_put(h, "ttl", "x", 1, 30000), 0);
	r = redisCommand(raw, "PTTL %s", "shift:job1:ttl");
	assert_true(r && r->type == REDIS_REPLY_INTEGER && r->integer > 25000 &&
		    r->integer <= 30000);
	freeReplyObject(r);
	assert_int_equal(shift_kv_put(h, "gone", "x", 1, 50), 0);
	sleep_ms(120);
	assert_int_equal(shift_kv_get(h, "gone", &v, &n), -ENOENT);

	assert_int_equal(shift_kv_put(h, "empty", "", 0, 0), 0);
	assert_int_equal(shift_kv_get(h, "empty", &v, &n), 0);
	assert_int_equal(n, 0);
	free(v);
	assert_int_equal(shift_kv_delete(h, "empty"), 0);
	assert_int_equal(shift_kv_delete(h, "empty"), -ENOENT);
	assert_int_equal(shift_kv_get(h, "empty", &v, &n), -ENOENT);

	/* delete_own removes exactly what this handle put */
	shift_kv *other = open_ok("redis://:" PASSWORD "@127.0.0.1:%d", "job1", NULL);
	assert_int_equal(shift_kv_put(other, "theirs", "t", 1, 0), 0);
	/* qp/..., ttl, and the expired "gone" (already absent: not counted) */
	assert_int_equal(shift_kv_own_count(h), 3);
	assert_int_equal(shift_kv_delete_own(h), 2);
	assert_int_equal(shift_kv_own_count(h), 0);
	r = redisCommand(raw, "EXISTS %s %s %s", "shift:job1:qp/fe80::1/7",
			 "shift:job1:ttl", "shift:job1:theirs");
	assert_true(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
	freeReplyObject(r);
	assert_int_equal(shift_kv_delete_own(other), 1);

	redisFree(raw);
	shift_kv_close(other);
	shift_kv_close(h);
}

struct putter {
	int delay_ms;
};

static void *putter_main(void *arg)
{
	struct putter *p = arg;
	shift_kv *h = NULL;
	char url[128];

	snprintf(url, sizeof(url), "redis://:" PASSWORD "@127.0.0.1:%d", srv_port);
	sleep_ms(p->delay_ms);
	if (shift_kv_open(url, "job1", NULL, &h) == 0) {
		shift_kv_put(h, "peer", "attrs", 5, 10000);
		shift_kv_close(h);
	}
	return NULL;
}

/* mget: one MGET for several keys, NULL for absent ones, binary-safe */
static void test_redis_mget(void **state)
{
	const unsigned char bin[] = { 'a', 0, 'b', 0xff, '\r', '\n' };
	const char *keys[3] = { "m/1", "m/absent", "m/2" };
	shift_kv *h = open_ok("redis://:" PASSWORD "@127.0.0.1:%d", "job1", NULL);
	void *v[3];
	size_t n[3];

	(void)state;
	assert_int_equal(shift_kv_put(h, "m/1", bin, sizeof(bin), 0), 0);
	assert_int_equal(shift_kv_put(h, "m/2", "x", 1, 0), 0);
	uint64_t before = shift_kv_commands(h);

	assert_int_equal(shift_kv_mget(h, keys, 3, v, n), 0);
	assert_int_equal(shift_kv_commands(h), before + 1);
	assert_int_equal(n[0], sizeof(bin));
	assert_memory_equal(v[0], bin, sizeof(bin));
	assert_null(v[1]);
	assert_int_equal(n[2], 1);
	assert_memory_equal(v[2], "x", 1);
	free(v[0]);
	free(v[2]);
	shift_kv_close(h);
}

static void test_redis_wait(void **state)
{
	shift_kv *h = open_ok("redis://:" PASSWORD "@127.0.0.1:%d", "job1", NULL);
	struct putter p = { 150 };
	pthread_t t;
	uint64_t t0, dt;
	void *v;
	size_t n;

	(void)state;
	t0 = now_ms();
	assert_int_equal(pthread_create(&t, NULL, putter_main, &p), 0);
	assert_int_equal(shift_kv_wait(h, "peer", 5000, &v, &n), 0);
	dt = now_ms() - t0;
	pthread_join(t, NULL);
	assert_int_equal(n, 5);
	assert_memory_equal(v, "attrs", 5);
	free(v);
	assert_true(dt >= 140 && dt < 1000);

	static const int tmo[] = { 0, 30, 250 };
	for (size_t i = 0; i < 3; i++) {
		t0 = now_ms();
		assert_int_equal(shift_kv_wait(h, "never", tmo[i], &v, &n), -ETIMEDOUT);
		dt = now_ms() - t0;
		if (dt + 1 < (uint64_t)tmo[i] || dt > (uint64_t)tmo[i] + 100)
			fail_msg("redis wait(%d ms) took %llu ms", tmo[i],
				 (unsigned long long)dt);
	}
	assert_int_equal(shift_kv_delete(h, "peer"), 0);
	shift_kv_close(h);
}

/* ---- one handle shared by threads (hiredis context behind the lock) ---- */

struct worker {
	shift_kv *h;
	int id;
	int errors;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	char key[32], val[32];

	for (int i = 0; i < 100; i++) {
		int len = snprintf(val, sizeof(val), "%d-%d", w->id, i);
		void *v = NULL;
		size_t n;

		snprintf(key, sizeof(key), "w%d/%d", w->id, i % 7);
		if (shift_kv_put(w->h, key, val, (size_t)len, 60000) ||
		    shift_kv_get(w->h, key, &v, &n) || n != (size_t)len ||
		    memcmp(v, val, n))
			w->errors++;
		free(v);
	}
	if (w->id == 0) {
		if (shift_kv_put(w->h, "go", "1", 1, 60000))
			w->errors++;
	} else {
		void *v = NULL;
		size_t n;

		if (shift_kv_wait(w->h, "go", 5000, &v, &n))
			w->errors++;
		free(v);
	}
	return NULL;
}

static void test_redis_threads(void **state)
{
	shift_kv *h = open_ok("redis://:" PASSWORD "@127.0.0.1:%d", "thr", NULL);
	struct worker w[4];
	pthread_t t[4];

	(void)state;
	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){ h, i, 0 };
		assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		assert_int_equal(w[i].errors, 0);
	}
	assert_int_equal(shift_kv_own_count(h), 4 * 7 + 1);
	assert_int_equal(shift_kv_delete_own(h), 4 * 7 + 1);
	shift_kv_close(h);
}

/* ---- authentication and databases ---- */

static void test_redis_auth(void **state)
{
	char url[256];
	shift_kv *h = NULL;
	redisContext *raw = raw_connect();
	redisReply *r;
	uint64_t t0;
	void *v;
	size_t n;

	(void)state;
	assert_non_null(raw);

	/* wrong password: open fails, clearly, without leaking the password */
	snprintf(url, sizeof(url), "redis://:wrong-pw-xyz@127.0.0.1:%d", srv_port);
	t0 = now_ms();
	assert_int_equal(shift_kv_open(url, "ns", NULL, &h), -EACCES);
	assert_null(h);
	assert_true(now_ms() - t0 < 1000);
	assert_non_null(strstr(shift_kv_last_error(), "authentication failed"));
	assert_null(strstr(shift_kv_last_error(), "wrong-pw-xyz"));

	/* no password at all: connects, then every command is refused */
	h = open_ok("redis://127.0.0.1:%d", "ns", NULL);
	assert_int_equal(shift_kv_put(h, "k", "v", 1, 0), -EACCES);
	assert_non_null(strstr(shift_kv_last_error(), "NOAUTH"));
	assert_int_equal(shift_kv_get(h, "k", &v, &n), -EACCES);
	assert_int_equal(shift_kv_wait(h, "k", 1000, &v, &n), -EACCES);
	shift_kv_close(h);

	/* ACL user (Redis 6+): AUTH user pass */
	r = redisCommand(raw, "ACL SETUSER shiftuser on >userpw ~shift:* +@all");
	assert_true(r && r->type == REDIS_REPLY_STATUS);
	freeReplyObject(r);
	h = open_ok("redis://shiftuser:userpw@127.0.0.1:%d", "acl", NULL);
	assert_int_equal(shift_kv_put(h, "k", "v", 1, 0), 0);
	assert_int_equal(shift_kv_get(h, "k", &v, &n), 0);
	free(v);
	assert_int_equal(shift_kv_delete_own(h), 1);
	shift_kv_close(h);
	h = NULL;
	snprintf(url, sizeof(url), "redis://shiftuser:nope@127.0.0.1:%d", srv_port);
	assert_int_equal(shift_kv_open(url, "acl", NULL, &h), -EACCES);
	assert_null(h);
	snprintf(url, sizeof(url), "redis://nobody:userpw@127.0.0.1:%d", srv_port);
	assert_int_equal(shift_kv_open(url, "acl", NULL, &h), -EACCES);

	/* SELECT db */
	h = open_ok("redis://:" PASSWORD "@127.0.0.1:%d/5", "dbtest", NULL);
	assert_int_equal(shift_kv_put(h, "k", "five", 4, 0), 0);
	r = redisCommand(raw, "GET %s", "shift:dbtest:k");
	assert_true(r && r->type == REDIS_REPLY_NIL); /* not in db 0 */
	freeReplyObject(r);
	r = redisCommand(raw, "SELECT 5");
	freeReplyObject(r);
	r = redisCommand(raw, "GET %s", "shift:dbtest:k");
	assert_true(r && r->type == REDIS_REPLY_STRING && r->len == 4);
	freeReplyObject(r);
	assert_int_equal(shift_kv_delete_own(h), 1);
	shift_kv_close(h);
	h = NULL;
	snprintf(url, sizeof(url), "redis://:" PASSWORD "@127.0.0.1:%d/60000", srv_port);
	assert_int_equal(shift_kv_open(url, "ns", NULL, &h), -EPROTO);
	assert_non_null(strstr(shift_kv_last_error(), "SELECT"));
	assert_null(h);
	redisFree(raw);
}

/* ---- server killed mid-test, then restarted ---- */

static void test_redis_restart(void **state)
{
	struct shift_kv_options o = { .connect_timeout_ms = 300,
				      .command_timeout_ms = 300,
				      .retry_min_ms = 20,
				      .retry_max_ms = 200 };
	shift_kv *h = open_ok("redis://:" PASSWORD "@127.0.0.1:%d", "rs", &o);
	uint64_t t0, dt, worst = 0;
	int rc, fails = 0;
	void *v;
	size_t n;

	(void)state;
	assert_int_equal(shift_kv_put(h, "before", "1", 1, 0), 0);
	kill_server();

	/* every call fails fast: no hang, no tight reconnect loop */
	t0 = now_ms();
	for (int i = 0; i < 50; i++) {
		uint64_t t1 = now_ms();

		rc = shift_kv_put(h, "during", "2", 1, 0);
		if (rc != -ENOTCONN)
			fail_msg("put during outage: %d (%s)", rc, shift_kv_last_error());
		dt = now_ms() - t1;
		worst = dt > worst ? dt : worst;
		fails++;
	}
	print_message("server killed: 50 puts failed in %llu ms (worst %llu ms): %s\n",
		      (unsigned long long)(now_ms() - t0), (unsigned long long)worst,
		      shift_kv_last_error());
	assert_true(worst < 300 + 100);
	assert_true(now_ms() - t0 < 2000);
	assert_non_null(strstr(shift_kv_last_error(), "127.0.0.1"));
	t0 = now_ms();
	assert_int_equal(shift_kv_get(h, "before", &v, &n), -ENOTCONN);
	assert_int_equal(shift_kv_delete(h, "before"), -ENOTCONN);
	assert_int_equal(shift_kv_wait(h, "before", 3000, &v, &n), -ENOTCONN);
	assert_true(now_ms() - t0 < 1000);
	assert_int_equal(shift_kv_delete_own(h), -ENOTCONN);
	assert_int_equal(shift_kv_own_count(h), 1);

	/* restart on the same port: the handle reconnects by itself */
	assert_int_equal(start_server(), 0);
	t0 = now_ms();
	do {
		rc = shift_kv_put(h, "after", "3", 1, 0);
		if (rc)
			sleep_ms(10);
	} while (rc && now_ms() - t0 < 5000);
	if (rc)
		fail_msg("no reconnect after restart: %s", shift_kv_last_error());
	print_message("restarted: reconnected %llu ms after the server answered\n",
		      (unsigned long long)(now_ms() - t0));
	assert_true(now_ms() - t0 < 1000); /* back-off is capped at 200 ms */
	assert_int_equal(shift_kv_get(h, "after", &v, &n), 0);
	free(v);
	/* "before" died with the server (no persistence): ENOENT is fine */
	assert_int_equal(shift_kv_delete_own(h), 1);
	assert_int_equal(shift_kv_own_count(h), 0);
	shift_kv_close(h);
	(void)fails;
}

/* ---- unreachable and unresponsive servers ---- */

static void test_redis_unreachable(void **state)
{
	struct shift_kv_options o = { .connect_timeout_ms = 300,
				      .command_timeout_ms = 300 };
	struct shift_kv_options lazy = o;
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t alen = sizeof(a);
	char url[128];
	shift_kv *h = NULL;
	uint64_t t0, dt;
	int lfd, cfd[4], port;
	void *v;
	size_t n;

	(void)state;
	/* nobody listening: refused at once */
	port = free_port();
	snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
	t0 = now_ms();
	assert_int_equal(shift_kv_open(url, "ns", &o, &h), -ENOTCONN);
	assert_true(now_ms() - t0 < 300);
	assert_null(h);
	assert_non_null(strstr(shift_kv_last_error(), "connect"));

	/* lazy handle on a dead port: ops fail fast, then back off */
	lazy.lazy_connect = true;
	assert_int_equal(shift_kv_open(url, "ns", &lazy, &h), 0);
	t0 = now_ms();
	for (int i = 0; i < 20; i++)
		assert_int_equal(shift_kv_get(h, "k", &v, &n), -ENOTCONN);
	assert_true(now_ms() - t0 < 300);
	assert_non_null(strstr(shift_kv_last_error(), "next reconnect attempt"));
	shift_kv_close(h);
	h = NULL;

	/* a listener that never accept()s: the kernel completes the first
	 * connection, so AUTH is sent and never answered -> command timeout */
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(lfd, 0), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &alen), 0);
	snprintf(url, sizeof(url), "redis://:pw@127.0.0.1:%d", ntohs(a.sin_port));
	t0 = now_ms();
	assert_int_equal(shift_kv_open(url, "ns", &o, &h), -ENOTCONN);
	dt = now_ms() - t0;
	print_message("silent server: open failed after %llu ms: %s\n",
		      (unsigned long long)dt, shift_kv_last_error());
	if (dt < 250 || dt > 300 + 150)
		fail_msg("silent server: open took %llu ms", (unsigned long long)dt);
	assert_non_null(strstr(shift_kv_last_error(), "no reply within"));

	/* fill the accept queue so further SYNs are dropped: connect can
	 * never complete and must give up after connect_timeout_ms */
	for (int i = 0; i < 4; i++) {
		cfd[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		connect(cfd[i], (struct sockaddr *)&a, sizeof(a));
	}
	sleep_ms(50);
	t0 = now_ms();
	assert_int_equal(shift_kv_open(url, "ns", &o, &h), -ENOTCONN);
	dt = now_ms() - t0;
	print_message("blocked connect: open failed after %llu ms: %s\n",
		      (unsigned long long)dt, shift_kv_last_error());
	if (dt < 250 || dt > 300 + 150)
		fail_msg("blocked connect: open took %llu ms (%s)",
			 (unsigned long long)dt, shift_kv_last_error());
	assert_null(h);
	for (int i = 0; i < 4; i++)
		close(cfd[i]);
	close(lfd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_redis_basic),
		cmocka_unit_test(test_redis_mget),
		cmocka_unit_test(test_redis_wait),
		cmocka_unit_test(test_redis_threads),
		cmocka_unit_test(test_redis_auth),
		cmocka_unit_test(test_redis_restart),
		cmocka_unit_test(test_redis_unreachable),
	};
	int rc = cmocka_run_group_tests(tests, group_setup, group_teardown);

	kill_server(); /* also when a test failed half-way */
	return rc;
}
