/*
 * tests/unit/test_kv_auth.c - authenticated KV records (kv/kv_auth.c) on
 * the in-memory backend: a job's handles share a secret file; a handle
 * without it (the "forger": anyone who can write the namespace) plants
 * records. Every forged, altered, moved or other-job record reads as
 * absent and is counted; the secret file itself is checked like any
 * untrusted file.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kv/kv.h"

static char dir[64], secret1[128], secret2[128];

static void write_file(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
}

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/shift-kvauth-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(secret1, sizeof(secret1), "%s/job1", dir);
	snprintf(secret2, sizeof(secret2), "%s/job2", dir);
	write_file(secret1, "9f86d081884c7d659a2feaa0c55ad015\n", 0600);
	write_file(secret2, "a5b9c3d7e1f20304a5b9c3d7e1f20304\n", 0400);
	return 0;
}

static int teardown(void **state)
{
	char p[160];
	const char *names[] = { "job1", "job2", "open", "short", "link" };
	(void)state;

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
		unlink(p);
	}
	rmdir(dir);
	return 0;
}

static shift_kv *open_h(const char *secret)
{
	struct shift_kv_options o = { .secret_file = secret };
	shift_kv *h = NULL;

	assert_int_equal(shift_kv_open("mem://auth", "job", &o, &h), 0);
	return h;
}

static void expect_absent(shift_kv *h, const char *key, uint64_t failures)
{
	void *v = NULL;
	size_t n = 0;

	assert_int_equal(shift_kv_get(h, key, &v, &n), -ENOENT);
	assert_null(v);
	assert_int_equal(shift_kv_auth_failures(h), failures);
}

/* The job's own records open; what is stored is sealed. */
static void test_roundtrip(void **state)
{
	shift_kv *a = open_h(secret1), *b = open_h(secret1), *raw = open_h("");
	char buf[256];
	size_t n;
	(void)state;

	assert_int_equal(shift_kv_mem_clear("auth"), 0);
	assert_true(shift_kv_authenticated(a));
	assert_false(shift_kv_authenticated(raw));
	assert_int_equal(shift_kv_put(a, "qp:g:1", "v1 qp gid=x qpn=7", 17, 0), 0);
	assert_int_equal(shift_kv_get_buf(b, "qp:g:1", buf, sizeof(buf), &n), 0);
	assert_int_equal(n, 17);
	assert_memory_equal(buf, "v1 qp gid=x qpn=7", 17);
	assert_int_equal(shift_kv_get_buf(raw, "qp:g:1", buf, sizeof(buf), &n), 0);
	assert_true(n == 17 + 68 && !memcmp(buf, "m1:", 3));
	assert_int_equal(shift_kv_auth_failures(b), 0);
	shift_kv_close(a);
	shift_kv_close(b);
	shift_kv_close(raw);
}

/* Forged (no MAC), altered (a byte of the payload or of the MAC), moved
 * under another key, and another job's record: none is ever returned. */
static void test_forged_ignored(void **state)
{
	shift_kv *a = open_h(secret1), *b = open_h(secret1), *raw = open_h(""),
		 *other = open_h(secret2);
	char buf[256];
	size_t n;
	(void)state;

	assert_int_equal(shift_kv_mem_clear("auth"), 0);
	assert_int_equal(shift_kv_put(raw, "qp:g:2", "v1 qp gid=evil qpn=66", 21, 0), 0);
	expect_absent(b, "qp:g:2", 1);

	assert_int_equal(shift_kv_put(a, "mr:g:5", "v1 mr rkey=5", 12, 0), 0);
	assert_int_equal(shift_kv_get_buf(raw, "mr:g:5", buf, sizeof(buf), &n), 0);
	buf[n - 1] ^= 1; /* the payload altered */
	assert_int_equal(shift_kv_put(raw, "mr:g:5", buf, n, 0), 0);
	expect_absent(b, "mr:g:5", 2);
	buf[n - 1] ^= 1;
	buf[10] = buf[10] == 'a' ? 'b' : 'a'; /* the MAC altered */
	assert_int_equal(shift_kv_put(raw, "mr:g:5", buf, n, 0), 0);
	expect_absent(b, "mr:g:5", 3);

	/* a valid record replayed under another QP's key */
	assert_int_equal(shift_kv_put(a, "qp:g:3", "v1 qp gid=x qpn=3", 17, 0), 0);
	assert_int_equal(shift_kv_get_buf(raw, "qp:g:3", buf, sizeof(buf), &n), 0);
	assert_int_equal(shift_kv_put(raw, "qp:g:4", buf, n, 0), 0);
	expect_absent(b, "qp:g:4", 4);

	/* an earlier job's record (its own secret) in the same namespace */
	assert_int_equal(shift_kv_put(other, "qp:g:9", "v1 qp gid=old qpn=9", 19, 0), 0);
	expect_absent(b, "qp:g:9", 5);
	shift_kv_close(a);
	shift_kv_close(b);
	shift_kv_close(raw);
	shift_kv_close(other);
}

/* mget hands out the records that open, the others as absent; wait does
 * not return a forged value. */
static void test_mget_and_wait(void **state)
{
	shift_kv *a = open_h(secret1), *raw = open_h("");
	const char *keys[] = { "ep:1", "ep:2", "ep:3" };
	void *v[3];
	size_t n[3];
	(void)state;

	assert_int_equal(shift_kv_mem_clear("auth"), 0);
	assert_int_equal(shift_kv_put(a, "ep:1", "one", 3, 0), 0);
	assert_int_equal(shift_kv_put(raw, "ep:2", "forged", 6, 0), 0);
	assert_int_equal(shift_kv_mget(a, keys, 3, v, n), 0);
	assert_non_null(v[0]);
	assert_memory_equal(v[0], "one", 3);
	assert_null(v[1]);
	assert_null(v[2]);
	assert_int_equal(shift_kv_auth_failures(a), 1);
	free(v[0]);
	assert_int_equal(shift_kv_wait(a, "ep:2", 30, &v[0], &n[0]), -ETIMEDOUT);
	assert_null(v[0]);
	shift_kv_close(a);
	shift_kv_close(raw);
}

/* The secret file is untrusted: others may read it, a link, too short, a
 * relative path, a missing file: the handle does not open. */
static void test_secret_file_checked(void **state)
{
	struct shift_kv_options o = { 0 };
	shift_kv *h = NULL;
	char p[160], l[160];
	(void)state;

	snprintf(p, sizeof(p), "%s/open", dir);
	write_file(p, "0123456789abcdef0123", 0644);
	o.secret_file = p;
	assert_int_equal(shift_kv_open("mem://auth", "job", &o, &h), -EACCES);
	snprintf(p, sizeof(p), "%s/short", dir);
	write_file(p, "0123456789\n", 0600);
	assert_int_equal(shift_kv_open("mem://auth", "job", &o, &h), -EINVAL);
	snprintf(l, sizeof(l), "%s/link", dir);
	assert_int_equal(symlink(secret1, l), 0);
	o.secret_file = l;
	assert_int_equal(shift_kv_open("mem://auth", "job", &o, &h), -ELOOP);
	o.secret_file = "job1";
	assert_int_equal(shift_kv_open("mem://auth", "job", &o, &h), -EINVAL);
	o.secret_file = "/nonexistent/secret";
	assert_int_equal(shift_kv_open("mem://auth", "job", &o, &h), -ENOENT);
	assert_null(h);
	assert_null(strstr(shift_kv_last_error(), "9f86d081"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_forged_ignored),
		cmocka_unit_test(test_mget_and_wait),
		cmocka_unit_test(test_secret_file_checked),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
