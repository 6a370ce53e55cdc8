/*
 * tests/unit/test_kv_deadline.c - the Redis backend's total per-command
 * deadline and reply size limit, against a fake server: a thread in this
 * program that listens on a free 127.0.0.1 port and answers each
 * connection with the script set in fk_mode when it was accepted (plain
 * sockets, no redis-server).
 *
 *   silent     accepts, reads, never answers
 *   auth_slow  answers AUTH after 200 ms, then never again
 *   drip       answers with a valid reply, one byte per 100 ms
 *   big        answers GET with a 400 MiB bulk string (sent from one 64 KiB
 *              buffer, so the server itself adds nothing to the RSS)
 *   big_mget   answers MGET with a small value and a 400 MiB one
 *   good       answers every request with "$1\r\nv\r\n"
 *
 * Each failing command must return within its deadline plus slack; a
 * refused reply must leave the RSS peak where it was, name its key in one
 * log line, count, and the next command must get a fresh connection.
 * Also: SHIFT_KV_TIMEOUT_MS and SHIFT_KV_MAX_REPLY are parsed, bounded and
 * reach a handle opened without options.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kv/kv.h"
#include "shift/base/config.h"

#define BIG_LEN (400u << 20) /* (issue #20: a 400 MiB value) */
#define RSS_BOUND_KIB (10 * 1024) /* ... costs less than 10 MiB of RSS */
#define SLACK_MS 200

enum fk_mode { FK_SILENT, FK_AUTH_SLOW, FK_DRIP, FK_BIG, FK_BIG_MGET, FK_GOOD };

static atomic_int fk_mode;
static atomic_int fk_stop;
static atomic_int fk_live;  /* connection threads running */
static atomic_int fk_conns; /* connections accepted */
static int fk_lfd = -1, fk_port;
static pthread_t fk_thr;
static char fk_chunk[64 << 10];

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* ---- the fake server ---- */

/* Read what the client sent: bytes read, 0 when it closed, -1 on stop. */
static ssize_t fk_read(int fd)
{
	char buf[4096];

	while (!atomic_load(&fk_stop)) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (poll(&p, 1, 20) > 0)
			return read(fd, buf, sizeof(buf));
	}
	return -1;
}

/* Keep the connection open until the client closes it. */
static void fk_hold(int fd)
{
	while (fk_read(fd) > 0)
		;
}

static int fk_send(int fd, const char *b, size_t n)
{
	while (n) {
		ssize_t k = send(fd, b, n, MSG_NOSIGNAL);

		if (k <= 0)
			return -1;
		b += k;
		n -= (size_t)k;
	}
	return 0;
}

/* A 400 MiB bulk string after prefix; stops when the client hangs up. */
static void fk_send_big(int fd, const char *prefix)
{
	char hdr[64];

	snprintf(hdr, sizeof(hdr), "%s$%u\r\n", prefix, BIG_LEN);
	if (fk_send(fd, hdr, strlen(hdr)))
		return;
	for (unsigned off = 0; off < BIG_LEN; off += sizeof(fk_chunk))
		if (fk_send(fd, fk_chunk, sizeof(fk_chunk)))
			return;
	fk_send(fd, "\r\n", 2);
}

static void fk_script(int fd, int mode)
{
	static const char drip[] = "$5\r\nhello\r\n";

	if (mode == FK_SILENT || fk_read(fd) <= 0)
		return;
	switch (mode) {
	case FK_AUTH_SLOW:
		sleep_ms(200);
		fk_send(fd, "+OK\r\n", 5);
		return;
	case FK_DRIP:
		for (size_t i = 0; i < sizeof(drip) - 1 && !atomic_load(&fk_stop); i++) {
			if (fk_send(fd, drip + i, 1))
				return;
			sleep_ms(100);
		}
		return;
	case FK_BIG:
		fk_send_big(fd, "");
		return;
	case FK_BIG_MGET:
		fk_send_big(fd, "*2\r\n$1\r\na\r\n");
		return;
	default: /* FK_GOOD */
		do {
			if (fk_send(fd, "$1\r\nv\r\n", 7))
				return;
		} while (fk_read(fd) > 0);
	}
}

struct fk_conn {
	int fd, mode;
};

static void *fk_conn_main(void *arg)
{
	struct fk_conn c = *(struct fk_conn *)arg;

	free(arg);
	fk_script(c.fd, c.mode);
	fk_hold(c.fd);
	close(c.fd);
	atomic_fetch_sub(&fk_live, 1);
	return NULL;
}

static void *fk_accept_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&fk_stop)) {
		struct pollfd p = { .fd = fk_lfd, .events = POLLIN };
		struct fk_conn *c;
		pthread_t t;
		int fd;

		if (poll(&p, 1, 20) <= 0 || (fd = accept(fk_lfd, NULL, NULL)) < 0)
			continue;
		c = malloc(sizeof(*c));
		c->fd = fd;
		c->mode = atomic_load(&fk_mode);
		atomic_fetch_add(&fk_conns, 1);
		atomic_fetch_add(&fk_live, 1);
		if (pthread_create(&t, NULL, fk_conn_main, c)) {
			close(fd);
			free(c);
			atomic_fetch_sub(&fk_live, 1);
			continue;
		}
		pthread_detach(t);
	}
	return NULL;
}

static int group_setup(void **state)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);

	(void)state;
	memset(fk_chunk, 'x', sizeof(fk_chunk));
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fk_lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (fk_lfd < 0 || bind(fk_lfd, (struct sockaddr *)&a, sizeof(a)) ||
	    listen(fk_lfd, 16) || getsockname(fk_lfd, (struct sockaddr *)&a, &len))
		return -1;
	fk_port = ntohs(a.sin_port);
	return pthread_create(&fk_thr, NULL, fk_accept_main, NULL) ? -1 : 0;
}

static int group_teardown(void **state)
{
	uint64_t t0 = now_ms();

	(void)state;
	atomic_store(&fk_stop, 1);
	pthread_join(fk_thr, NULL);
	while (atomic_load(&fk_live) && now_ms() - t0 < 2000)
		sleep_ms(10);
	close(fk_lfd);
	return 0;
}

static shift_kv *fk_open(const char *userinfo, const struct shift_kv_options *o)
{
	char url[128];
	shift_kv *h = NULL;
	int rc;

	snprintf(url, sizeof(url), "redis://%s127.0.0.1:%d", userinfo, fk_port);
	rc = shift_kv_open(url, "dl", o, &h);
	if (rc)
		fail_msg("open %s: %d %s", url, rc, shift_kv_last_error());
	return h;
}

/* One GET in mode; returns its rc, *ms its duration. */
static int fk_get(shift_kv *h, int mode, const char *key, uint64_t *ms)
{
	uint64_t t0;
	void *v = NULL;
	size_t n = 0;
	int rc;

	atomic_store(&fk_mode, mode);
	t0 = now_ms();
	rc = shift_kv_get(h, key, &v, &n);
	*ms = now_ms() - t0;
	print_message("mode %d: get -> %d after %llu ms: %s\n", mode, rc,
		      (unsigned long long)*ms, rc ? shift_kv_last_error() : "ok");
	free(v);
	return rc;
}

/* After a failure the handle must use a fresh connection that works. */
static void fk_expect_recovery(shift_kv *h)
{
	int before = atomic_load(&fk_conns);
	uint64_t ms;

	assert_int_equal(fk_get(h, FK_GOOD, "k", &ms), 0);
	assert_int_equal(atomic_load(&fk_conns), before + 1);
}

/* ---- (a) no answer: bounded by the default deadline, well under 1 s ---- */

static void test_silent_default_deadline(void **state)
{
	shift_kv *h;
	uint64_t ms;

	(void)state;
	atomic_store(&fk_mode, FK_SILENT);
	h = fk_open("", NULL);
	assert_int_equal(fk_get(h, FK_SILENT, "k", &ms), -ENOTCONN);
	/* the default is 300 ms (main: a 500 ms per-read timeout) */
	assert_true(ms >= 300 - 20);
	assert_true(ms <= 300 + SLACK_MS / 2);
	assert_non_null(strstr(shift_kv_last_error(), "no reply within 300 ms"));
	fk_expect_recovery(h);
	shift_kv_close(h);
}

/* AUTH answered slowly, then the GET never: connect + AUTH + GET share one
 * deadline (main: 200 ms AUTH + a fresh 300 ms read timeout = 500 ms). */
static void test_auth_then_silent_total(void **state)
{
	struct shift_kv_options o = { .command_timeout_ms = 300,
				      .lazy_connect = true };
	shift_kv *h = fk_open(":pw@", &o);
	uint64_t ms;

	(void)state;
	assert_int_equal(fk_get(h, FK_AUTH_SLOW, "k", &ms), -ENOTCONN);
	assert_true(ms >= 280);
	assert_true(ms <= 300 + SLACK_MS);
	shift_kv_close(h);
}

/* ---- (b) a valid reply dripped one byte per 100 ms ---- */

static void test_drip(void **state)
{
	struct shift_kv_options o = { .command_timeout_ms = 300,
				      .lazy_connect = true };
	shift_kv *h = fk_open("", &o);
	uint64_t ms;

	(void)state;
	/* main: each byte resets the read timeout: rc 0 after ~1.1 s */
	assert_int_equal(fk_get(h, FK_DRIP, "k", &ms), -ENOTCONN);
	assert_true(ms >= 280);
	assert_true(ms <= 300 + SLACK_MS);
	assert_non_null(strstr(shift_kv_last_error(), "reply incomplete within 300 ms"));
	/* the half-read connection is not reused: a fresh one answers */
	fk_expect_recovery(h);
	shift_kv_close(h);
}

/* ---- (c) a 400 MiB value: refused from its header ---- */

static long maxrss_kib(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss;
}

/* Run f with stderr going to a temporary file; returns the file. */
static FILE *with_stderr_captured(void (*f)(shift_kv *), shift_kv *h)
{
	FILE *tmp = tmpfile();
	int saved = dup(2);

	assert_non_null(tmp);
	fflush(stderr);
	dup2(fileno(tmp), 2);
	f(h);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(tmp);
	return tmp;
}

static int big_rc[2];
static uint64_t big_ms[2];

/* (no assertion while stderr is captured) */
static void two_big_gets(shift_kv *h)
{
	for (int i = 0; i < 2; i++)
		big_rc[i] = fk_get(h, FK_BIG, "bigkey", &big_ms[i]);
}

static void test_big_value(void **state)
{
	struct shift_kv_options o = { .command_timeout_ms = 300,
				      .lazy_connect = true };
	shift_kv *h = fk_open("", &o);
	long rss0 = maxrss_kib(), lines = 0;
	char line[1024];
	FILE *log;

	(void)state;
	/* Before the limit the whole value was read (rc 0) and the RSS peak
	 * grew by two to three times that (+31 MiB for 10 MiB). Refused from
	 * its header, the value costs nothing; the bound, 10 MiB, leaves
	 * room for what the sanitizers add per connection thread (ASan's fake
	 * stacks: +2.5 MiB seen in CI) and fails whenever a 40th of the value
	 * is read. */
	log = with_stderr_captured(two_big_gets, h);
	print_message("RSS peak %ld KiB -> %ld KiB\n", rss0, maxrss_kib());
	assert_true(maxrss_kib() - rss0 < RSS_BOUND_KIB);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(big_rc[i], -EMSGSIZE);
		assert_true(big_ms[i] <= SLACK_MS);
	}
	assert_int_equal(shift_kv_oversize_replies(h), 2);
	assert_non_null(strstr(shift_kv_last_error(), "shift:dl:bigkey"));
	assert_non_null(strstr(shift_kv_last_error(), "419430400"));
	/* one line per dropped connection, at most one a second: 1 here */
	while (fgets(line, sizeof(line), log))
		if (strstr(line, "refused")) {
			lines++;
			assert_non_null(strstr(line, "shift:dl:bigkey"));
			fputs(line, stderr);
		}
	fclose(log);
	assert_int_equal(lines, 1);
	fk_expect_recovery(h);
	shift_kv_close(h);
}

static void test_big_mget_element(void **state)
{
	struct shift_kv_options o = { .command_timeout_ms = 300,
				      .max_reply = 1024,
				      .lazy_connect = true };
	const char *keys[2] = { "small", "huge" };
	shift_kv *h = fk_open("", &o);
	void *v[2];
	size_t n[2];
	uint64_t t0;

	(void)state;
	atomic_store(&fk_mode, FK_BIG_MGET);
	t0 = now_ms();
	assert_int_equal(shift_kv_mget(h, keys, 2, v, n), -EMSGSIZE);
	assert_true(now_ms() - t0 <= SLACK_MS);
	assert_null(v[0]);
	assert_null(v[1]);
	/* the second value is the one refused, and named */
	assert_non_null(strstr(shift_kv_last_error(), "shift:dl:huge"));
	assert_int_equal(shift_kv_oversize_replies(h), 1);
	fk_expect_recovery(h);
	shift_kv_close(h);
}

/* ---- the knobs ---- */

static void test_config_knobs(void **state)
{
	shift_kv *h;
	uint64_t ms;

	(void)state;
	assert_int_equal(shift_config_load(NULL), 0);
	assert_int_equal(shift_config.kv_timeout_ms, 300);
	assert_int_equal(shift_config.kv_max_reply, 65536);
	const char *bad_t[] = { "5", "10001", "-1", "abc", "300ms" };
	for (size_t i = 0; i < sizeof(bad_t) / sizeof(bad_t[0]); i++) {
		setenv("SHIFT_KV_TIMEOUT_MS", bad_t[i], 1);
		assert_int_equal(shift_config_load(NULL), 1);
		assert_int_equal(shift_config.kv_timeout_ms, 300);
	}
	const char *bad_r[] = { "1023", "1048577", "-5", "64k" };
	for (size_t i = 0; i < sizeof(bad_r) / sizeof(bad_r[0]); i++) {
		setenv("SHIFT_KV_MAX_REPLY", bad_r[i], 1);
		setenv("SHIFT_KV_TIMEOUT_MS", "150", 1);
		assert_int_equal(shift_config_load(NULL), 1);
		assert_int_equal(shift_config.kv_max_reply, 65536);
		assert_int_equal(shift_config.kv_timeout_ms, 150);
	}
	setenv("SHIFT_KV_MAX_REPLY", "2048", 1);
	assert_int_equal(shift_config_load(NULL), 0);
	assert_int_equal(shift_config.kv_max_reply, 2048);

	/* a handle opened without options takes both */
	atomic_store(&fk_mode, FK_SILENT);
	h = fk_open("", NULL);
	assert_int_equal(fk_get(h, FK_SILENT, "k", &ms), -ENOTCONN);
	assert_true(ms >= 130 && ms <= 150 + SLACK_MS);
	assert_int_equal(fk_get(h, FK_BIG, "k", &ms), -EMSGSIZE);
	assert_non_null(strstr(shift_kv_last_error(), "SHIFT_KV_MAX_REPLY 2048"));
	shift_kv_close(h);
	unsetenv("SHIFT_KV_TIMEOUT_MS");
	unsetenv("SHIFT_KV_MAX_REPLY");
	shift_config_load(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		/* first, while the RSS peak is still the program's own */
		cmocka_unit_test(test_big_value),
		cmocka_unit_test(test_big_mget_element),
		cmocka_unit_test(test_silent_default_deadline),
		cmocka_unit_test(test_auth_then_silent_total),
		cmocka_unit_test(test_drip),
		cmocka_unit_test(test_config_knobs),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
