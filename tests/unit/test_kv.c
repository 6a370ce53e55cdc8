/*
 * tests/unit/test_kv.c - unit tests of the kv layer without a server: URL
 * and namespace validation, key prefixing, and the in-memory backend
 * (put/get/delete/wait/TTL, wait timeout accuracy, injected outages,
 * delete_own, concurrent use).  The Redis backend is tested against a real
 * redis-server in test_kv_redis.c.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kv/kv.h"
#include "test_env.h"

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

/* Open a mem handle on a fresh (cleared) store. */
static shift_kv *open_mem(const char *store, const char *ns)
{
	char url[128];
	shift_kv *h = NULL;

	snprintf(url, sizeof(url), "mem://%s", store);
	assert_int_equal(shift_kv_mem_set_down(store, false), 0);
	assert_int_equal(shift_kv_open(url, ns, NULL, &h), 0);
	assert_non_null(h);
	return h;
}

/* ---- URL parsing ---- */

static void test_url_good(void **state)
{
	struct shift_kv_url u;

	(void)state;
	assert_int_equal(shift_kv_url_parse(NULL, &u), 0);
	assert_int_equal(u.scheme, SHIFT_KV_SCHEME_REDIS);
	assert_string_equal(u.host, "127.0.0.1");
	assert_int_equal(u.port, 6379);
	assert_int_equal(u.db, 0);
	assert_string_equal(u.user, "");
	assert_string_equal(u.password, "");

	assert_int_equal(shift_kv_url_parse("", &u), 0);
	assert_string_equal(u.host, "127.0.0.1");

	assert_int_equal(shift_kv_url_parse("redis://kvhost", &u), 0);
	assert_string_equal(u.host, "kvhost");
	assert_int_equal(u.port, 6379);
	assert_false(u.tls);

	assert_int_equal(shift_kv_url_parse("rediss://:pw@kvhost:6380/2", &u), 0);
	assert_int_equal(u.scheme, SHIFT_KV_SCHEME_REDIS);
	assert_true(u.tls);
	assert_string_equal(u.host, "kvhost");
	assert_string_equal(u.password, "pw");
	assert_int_equal(u.port, 6380);
	assert_int_equal(u.db, 2);
	assert_int_not_equal(shift_kv_url_parse("redisss://kvhost", &u), 0);

	assert_int_equal(shift_kv_url_parse("redis://:s3cret@10.0.0.2:7000/3", &u), 0);
	assert_string_equal(u.user, "");
	assert_string_equal(u.password, "s3cret");
	assert_string_equal(u.host, "10.0.0.2");
	assert_int_equal(u.port, 7000);
	assert_int_equal(u.db, 3);

	assert_int_equal(shift_kv_url_parse("redis://alice:pw@redis-1.mgmt:6380/15", &u), 0);
	assert_string_equal(u.user, "alice");
	assert_string_equal(u.password, "pw");
	assert_string_equal(u.host, "redis-1.mgmt");
	assert_int_equal(u.port, 6380);
	assert_int_equal(u.db, 15);

	/* %-escapes, and an unescaped '@' or '/' inside the password */
	assert_int_equal(shift_kv_url_parse("redis://b%3Ab:p%40ss%25@h:1", &u), 0);
	assert_string_equal(u.user, "b:b");
	assert_string_equal(u.password, "p@ss%");
	assert_int_equal(shift_kv_url_parse("redis://:a@b/c@h:2/4", &u), 0);
	assert_string_equal(u.password, "a@b/c");
	assert_string_equal(u.host, "h");
	assert_int_equal(u.port, 2);
	assert_int_equal(u.db, 4);

	assert_int_equal(shift_kv_url_parse("redis://[::1]:6380/1", &u), 0);
	assert_string_equal(u.host, "::1");
	assert_int_equal(u.port, 6380);
	assert_int_equal(u.db, 1);

	assert_int_equal(shift_kv_url_parse("redis://h:65535/", &u), 0);
	assert_int_equal(u.port, 65535);
	assert_int_equal(u.db, 0);

	assert_int_equal(shift_kv_url_parse("mem://unit_test-1.a", &u), 0);
	assert_int_equal(u.scheme, SHIFT_KV_SCHEME_MEM);
	assert_string_equal(u.name, "unit_test-1.a");
}

/* redis-sentinel://: sentinels in order with default port 26379, the
 * master name, db and the primary's credentials. */
static void test_url_sentinel(void **state)
{
	static const char *bad[] = {
		"redis-sentinel://h", "redis-sentinel://h/", "redis-sentinel:///m",
		"redis-sentinel://h,/m", "redis-sentinel://,h/m", "redis-sentinel://h:0/m",
		"redis-sentinel://h/m!", "redis-sentinel://h/m/x", "redis-sentinel://h/m/1/2",
		"redis-sentinel://a,b,c,d,e,f,g,h,i/m", "redis-sentinel://h h/m",
		"redis-sentinel://[::1/m",
	};
	struct shift_kv_url u;

	(void)state;
	assert_int_equal(shift_kv_url_parse("redis-sentinel://u:p%40w@s1,10.0.0.2:5000,"
					    "[fe80::1]:7/mymaster/3", &u), 0);
	assert_int_equal(u.scheme, SHIFT_KV_SCHEME_SENTINEL);
	assert_int_equal(u.naddrs, 3);
	assert_string_equal(u.addr[0].host, "s1");
	assert_int_equal(u.addr[0].port, 26379);
	assert_string_equal(u.addr[1].host, "10.0.0.2");
	assert_int_equal(u.addr[1].port, 5000);
	assert_string_equal(u.addr[2].host, "fe80::1");
	assert_int_equal(u.addr[2].port, 7);
	assert_string_equal(u.master, "mymaster");
	assert_int_equal(u.db, 3);
	assert_string_equal(u.user, "u");
	assert_string_equal(u.password, "p@w");
	assert_int_equal(shift_kv_url_parse("redis-sentinel://a,b,c,d,e,f,g,h/m", &u), 0);
	assert_int_equal(u.naddrs, SHIFT_KV_ADDRS_MAX);
	assert_int_equal(u.db, 0);
	/* redis-cluster://: seed nodes, port 6379 by default, db 0 only */
	assert_int_equal(shift_kv_url_parse("redis-cluster://:pw@n1,10.0.0.2:7001,[::1]:7002/", &u),
			 0);
	assert_int_equal(u.scheme, SHIFT_KV_SCHEME_CLUSTER);
	assert_int_equal(u.naddrs, 3);
	assert_string_equal(u.addr[0].host, "n1");
	assert_int_equal(u.addr[0].port, 6379);
	assert_int_equal(u.addr[1].port, 7001);
	assert_string_equal(u.addr[2].host, "::1");
	assert_string_equal(u.password, "pw");
	assert_int_equal(u.db, 0);
	assert_false(u.tls);
	/* the same over TLS, parsed the same way */
	assert_int_equal(shift_kv_url_parse("rediss-cluster://:pw@n1,10.0.0.2:7001", &u), 0);
	assert_int_equal(u.scheme, SHIFT_KV_SCHEME_CLUSTER);
	assert_true(u.tls);
	assert_int_equal(u.naddrs, 2);
	assert_int_equal(u.addr[1].port, 7001);
	assert_int_equal(shift_kv_url_parse("rediss-sentinel://s1,s2:5000/m/2", &u), 0);
	assert_int_equal(u.scheme, SHIFT_KV_SCHEME_SENTINEL);
	assert_true(u.tls);
	assert_int_equal(u.naddrs, 2);
	assert_int_equal(u.addr[0].port, 26379);
	assert_string_equal(u.master, "m");
	assert_int_equal(u.db, 2);
	assert_int_equal(shift_kv_url_parse("redis-sentinel://s1/m", &u), 0);
	assert_false(u.tls);
	static const char *cbad[] = {
		"rediss-cluster://", "rediss-cluster://h/1", "rediss-sentinel://h",
		"rediss-sentinel:///m", "redisss-cluster://h", "rediss-cluster:/h",
		"redis-cluster://", "redis-cluster://h/0", "redis-cluster://h/1",
		"redis-cluster://h,/", "redis-cluster://,h", "redis-cluster://h:0",
		"redis-cluster://a,b,c,d,e,f,g,h,i", "redis-cluster://h?x=1",
	};
	for (size_t i = 0; i < sizeof(cbad) / sizeof(cbad[0]); i++)
		if (shift_kv_url_parse(cbad[i], &u) != -EINVAL)
			fail_msg("URL '%s' accepted", cbad[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = shift_kv_url_parse(bad[i], &u);

		if (rc != -EINVAL)
			fail_msg("URL '%s' accepted (rc %d)", bad[i], rc);
		assert_true(strlen(shift_kv_last_error()) > 5);
	}
}

static void test_url_bad(void **state)
{
	static const char *bad[] = {
		"http://127.0.0.1:6379", "REDIS://h:1", "redis:/h:1", "redis://",
		"redis://:6379", "redis://h:", "redis://h:0", "redis://h:65536",
		"redis://h:abc", "redis://h:-1", "redis://h:+1", "redis://h:1x",
		"redis://h:1/x", "redis://h:1/1?timeout=1", "redis://h:1/1/2",
		"redis://h:1/99999999", "redis://h:1/70000", "redis://h ost:1",
		"redis://h:1 ", " redis://h:1", "redis://user@h:1",
		"redis://u:@h:1", "redis://:@h:1", "redis://%zz:p@h:1",
		"redis://u:p%0@h:1", "redis://u:p%00@h:1", "redis://u:p w@h:1",
		"redis://[::1", "redis://[zz]:1", "redis://[::1]x", "redis://[]:1",
		"redis://h_!:1", "redis://h,1:1", "mem://", "mem://a/b",
		"mem://a b", "mem://a:b", "mem:/a", "redis",
	};
	struct shift_kv_url u;
	char longurl[SHIFT_KV_URL_MAX + 32];

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = shift_kv_url_parse(bad[i], &u);

		if (rc != -EINVAL)
			fail_msg("URL '%s' accepted (rc %d)", bad[i], rc);
		assert_true(strlen(shift_kv_last_error()) > 5);
	}
	memset(longurl, 'a', sizeof(longurl) - 1);
	longurl[sizeof(longurl) - 1] = '\0';
	memcpy(longurl, "redis://", 8);
	assert_int_equal(shift_kv_url_parse(longurl, &u), -EINVAL);
	assert_int_equal(shift_kv_url_parse("redis://h:1", NULL), -EINVAL);

	/* the password never shows up in an error message */
	assert_int_equal(shift_kv_url_parse("redis://u:topsecret@h:99999", &u), -EINVAL);
	assert_null(strstr(shift_kv_last_error(), "topsecret"));

	/* open() reports the same error and leaves *out NULL */
	shift_kv *h = (shift_kv *)&u;
	assert_int_equal(shift_kv_open("redis://h:0", "ns", NULL, &h), -EINVAL);
	assert_null(h);
	assert_non_null(strstr(shift_kv_last_error(), "port"));
}

/* ---- namespace and key layout ---- */

static void test_namespace(void **state)
{
	char ns65[66], key[SHIFT_KV_KEY_MAX + 2], buf[600];
	shift_kv *a, *b, *h = NULL;
	void *v;
	size_t n;

	(void)state;
	assert_int_equal(shift_kv_validate_namespace("job-42_a.b"), 0);
	assert_int_equal(shift_kv_validate_namespace(""), -EINVAL);
	assert_int_equal(shift_kv_validate_namespace(NULL), -EINVAL);
	assert_int_equal(shift_kv_validate_namespace("a:b"), -EINVAL);
	assert_int_equal(shift_kv_validate_namespace("a b"), -EINVAL);
	assert_int_equal(shift_kv_validate_namespace("a*"), -EINVAL);
	memset(ns65, 'n', 65);
	ns65[65] = '\0';
	assert_int_equal(shift_kv_validate_namespace(ns65), -EINVAL);
	ns65[64] = '\0';
	assert_int_equal(shift_kv_validate_namespace(ns65), 0);
	assert_int_equal(shift_kv_open("mem://ns", "bad:ns", NULL, &h), -EINVAL);
	assert_null(h);

	assert_int_equal(shift_kv_mem_clear("ns"), 0);
	a = open_mem("ns", "job42");
	b = open_mem("ns", "job43");
	assert_string_equal(shift_kv_namespace(a), "job42");
	assert_string_equal(shift_kv_backend_name(a), "mem");
	assert_int_equal(shift_kv_full_key(a, "qp/fe80::1/17", buf, sizeof(buf)),
			 (int)strlen("shift:job42:qp/fe80::1/17"));
	assert_string_equal(buf, "shift:job42:qp/fe80::1/17");
	assert_int_equal(shift_kv_full_key(a, "k", buf, 5), -EMSGSIZE);
	assert_int_equal(shift_kv_full_key(a, "", buf, sizeof(buf)), -EINVAL);

	/* same key, different namespaces: independent */
	assert_int_equal(shift_kv_put(a, "k", "A", 1, 0), 0);
	assert_int_equal(shift_kv_get(b, "k", &v, &n), -ENOENT);
	assert_int_equal(shift_kv_put(b, "k", "B", 1, 0), 0);
	assert_int_equal(shift_kv_get(a, "k", &v, &n), 0);
	assert_memory_equal(v, "A", 1);
	free(v);

	/* key length limit */
	memset(key, 'k', sizeof(key) - 1);
	key[sizeof(key) - 1] = '\0';
	assert_int_equal(shift_kv_put(a, key, "x", 1, 0), -ENAMETOOLONG);
	key[SHIFT_KV_KEY_MAX] = '\0';
	assert_int_equal(shift_kv_put(a, key, "x", 1, 0), 0);
	assert_int_equal(shift_kv_get(a, key, &v, &n), 0);
	free(v);
	shift_kv_close(a);
	shift_kv_close(b);

	/* default namespace */
	assert_int_equal(shift_kv_open("mem://ns", NULL, NULL, &h), 0);
	assert_string_equal(shift_kv_namespace(h), SHIFT_KV_DEFAULT_NAMESPACE);
	shift_kv_close(h);
}

/* ---- basic operations on mem ---- */

static void test_mem_basic(void **state)
{
	const unsigned char bin[] = { 0, 1, 2, 0xff, 0, 'x' };
	unsigned char buf[16];
	shift_kv *a, *b;
	void *v = NULL;
	size_t n = 99;

	(void)state;
	assert_int_equal(shift_kv_mem_clear("basic"), 0);
	a = open_mem("basic", "ns");
	b = open_mem("basic", "ns"); /* a second "host" in this process */

	assert_int_equal(shift_kv_get(a, "missing", &v, &n), -ENOENT);
	assert_null(v);
	assert_int_equal(n, 0);
	assert_int_equal(shift_kv_put(a, "bin", bin, sizeof(bin), 0), 0);
	assert_int_equal(shift_kv_get(b, "bin", &v, &n), 0);
	assert_int_equal(n, sizeof(bin));
	assert_memory_equal(v, bin, sizeof(bin));
	assert_int_equal(((unsigned char *)v)[n], 0); /* trailing NUL */
	free(v);

	/* overwrite, empty value */
	assert_int_equal(shift_kv_put(b, "bin", "new", 3, 0), 0);
	assert_int_equal(shift_kv_get_buf(a, "bin", buf, sizeof(buf), &n), 0);
	assert_int_equal(n, 3);
	assert_memory_equal(buf, "new", 3);
	assert_int_equal(shift_kv_get_buf(a, "bin", buf, 2, &n), -EMSGSIZE);
	assert_int_equal(n, 3);
	assert_int_equal(shift_kv_put(a, "empty", NULL, 0, 0), 0);
	assert_int_equal(shift_kv_get(b, "empty", &v, &n), 0);
	assert_int_equal(n, 0);
	free(v);

	/* delete */
	assert_int_equal(shift_kv_delete(b, "bin"), 0);
	assert_int_equal(shift_kv_delete(b, "bin"), -ENOENT);
	assert_int_equal(shift_kv_get(a, "bin", &v, &n), -ENOENT);

	/* bad arguments never crash */
	assert_int_equal(shift_kv_put(NULL, "k", "v", 1, 0), -EINVAL);
	assert_int_equal(shift_kv_put(a, NULL, "v", 1, 0), -EINVAL);
	assert_int_equal(shift_kv_put(a, "k", NULL, 1, 0), -EINVAL);
	assert_int_equal(shift_kv_put(a, "k", "v", SHIFT_KV_VALUE_MAX + 1, 0), -EMSGSIZE);
	assert_int_equal(shift_kv_get(a, "k", NULL, &n), -EINVAL);
	assert_int_equal(shift_kv_get(a, "k", &v, NULL), -EINVAL);
	assert_int_equal(shift_kv_get_buf(a, "k", NULL, 4, &n), -EINVAL);
	assert_int_equal(shift_kv_delete(a, ""), -EINVAL);
	assert_int_equal(shift_kv_wait(a, "k", -1, &v, &n), -EINVAL);
	assert_int_equal(shift_kv_wait(a, "k", 10, NULL, &n), -EINVAL);
	assert_int_equal(shift_kv_delete_own(NULL), -EINVAL);
	assert_int_equal(shift_kv_own_count(NULL), 0);
	assert_int_equal(shift_kv_open("mem://x", "ns", NULL, NULL), -EINVAL);
	struct shift_kv_options bad = { .connect_timeout_ms = -1 };
	shift_kv *h = NULL;
	assert_int_equal(shift_kv_open("mem://x", "ns", &bad, &h), -EINVAL);
	bad = (struct shift_kv_options){ .retry_min_ms = 100, .retry_max_ms = 10 };
	assert_int_equal(shift_kv_open("mem://x", "ns", &bad, &h), -EINVAL);
	assert_null(h);
	shift_kv_close(NULL);

	assert_string_equal(shift_kv_strerror(-ENOTCONN), "kv store unreachable");
	assert_string_equal(shift_kv_strerror(0), "success");
	assert_string_equal(shift_kv_strerror(-12345), "unknown kv error");

	shift_kv_close(a);
	shift_kv_close(b);
}

/* mget: values of several keys in one command, NULL for absent ones */
static void test_mem_mget(void **state)
{
	const char *keys[3] = { "k0", "absent", "k2" };
	void *v[3];
	size_t n[3];
	shift_kv *a;

	(void)state;
	assert_int_equal(shift_kv_mem_clear("mget"), 0);
	a = open_mem("mget", "ns");
	assert_int_equal(shift_kv_put(a, "k0", "zero", 4, 0), 0);
	assert_int_equal(shift_kv_put(a, "k2", "two!!", 5, 0), 0);
	uint64_t before = shift_kv_commands(a);

	assert_int_equal(shift_kv_mget(a, keys, 3, v, n), 0);
	assert_int_equal(shift_kv_commands(a), before + 1); /* one round trip */
	assert_int_equal(n[0], 4);
	assert_memory_equal(v[0], "zero", 4);
	assert_null(v[1]);
	assert_int_equal(n[1], 0);
	assert_int_equal(n[2], 5);
	assert_memory_equal(v[2], "two!!", 5);
	free(v[0]);
	free(v[2]);
	assert_int_equal(shift_kv_mget(a, keys, 0, v, n), 0);
	assert_int_equal(shift_kv_mget(a, keys, SHIFT_KV_MGET_MAX + 1, v, n), -EINVAL);
	/* store down: the whole call fails, nothing returned */
	assert_int_equal(shift_kv_mem_set_down("mget", true), 0);
	assert_int_equal(shift_kv_mget(a, keys, 3, v, n), -ENOTCONN);
	assert_null(v[0]);
	assert_null(v[2]);
	assert_int_equal(shift_kv_mem_set_down("mget", false), 0);
	shift_kv_close(a);
}

static void test_mem_ttl(void **state)
{
	shift_kv *h;
	void *v;
	size_t n;

	(void)state;
	assert_int_equal(shift_kv_mem_clear("ttl"), 0);
	h = open_mem("ttl", "ns");
	assert_int_equal(shift_kv_put(h, "short", "s", 1, 60), 0);
	assert_int_equal(shift_kv_put(h, "long", "l", 1, 60000), 0);
	assert_int_equal(shift_kv_get(h, "short", &v, &n), 0);
	free(v);
	sleep_ms(100);
	assert_int_equal(shift_kv_get(h, "short", &v, &n), -ENOENT);
	assert_int_equal(shift_kv_wait(h, "short", 20, &v, &n), -ETIMEDOUT);
	assert_int_equal(shift_kv_delete(h, "short"), -ENOENT);
	assert_int_equal(shift_kv_get(h, "long", &v, &n), 0);
	free(v);
	/* a put without TTL clears an earlier TTL */
	assert_int_equal(shift_kv_put(h, "short", "s", 1, 30), 0);
	assert_int_equal(shift_kv_put(h, "short", "s", 1, 0), 0);
	sleep_ms(60);
	assert_int_equal(shift_kv_get(h, "short", &v, &n), 0);
	free(v);
	shift_kv_close(h);
}

/* A handle's keys with a TTL live on while it refreshes them, come back
 * after the store lost them, and expire once it stops; a key put without
 * a TTL is never written again. */
static void test_mem_refresh_own(void **state)
{
	shift_kv *h;
	void *v;
	size_t n;

	(void)state;
	assert_int_equal(shift_kv_mem_clear("refresh"), 0);
	h = open_mem("refresh", "ns");
	assert_int_equal(shift_kv_put(h, "a", "va", 2, 80), 0);
	assert_int_equal(shift_kv_put(h, "b", "vb", 2, 80), 0);
	assert_int_equal(shift_kv_put(h, "c", "vc", 2, 0), 0);
	/* round robin: one key per call, then the next */
	assert_int_equal(shift_kv_refresh_own(h, 1), 1);
	assert_int_equal(shift_kv_refresh_own(h, 5), 2); /* (the other two; c has no TTL) */
	for (int i = 0; i < 4; i++) { /* 200 ms: longer than the TTL */
		sleep_ms(50);
		assert_true(shift_kv_refresh_own(h, 5) >= 0);
	}
	assert_int_equal(shift_kv_get(h, "a", &v, &n), 0);
	assert_memory_equal(v, "va", 2);
	free(v);
	/* the store restarted empty: the refresh writes them back */
	assert_int_equal(shift_kv_mem_clear("refresh"), 0);
	assert_int_equal(shift_kv_get(h, "b", &v, &n), -ENOENT);
	assert_true(shift_kv_refresh_own(h, 5) >= 2);
	assert_int_equal(shift_kv_get(h, "b", &v, &n), 0);
	assert_memory_equal(v, "vb", 2);
	free(v);
	assert_int_equal(shift_kv_get(h, "c", &v, &n), -ENOENT);
	/* store down: the error, nothing lost; then no refresh: they expire.
	 * An absent key is an answer; the first answer after the outage is
	 * the handle's recovery (the caller writes its records again) */
	assert_int_equal(shift_kv_recoveries(h), 0);
	assert_int_equal(shift_kv_mem_set_down("refresh", true), 0);
	assert_int_equal(shift_kv_refresh_own(h, 5), -ENOTCONN);
	assert_int_equal(shift_kv_get(h, "b", &v, &n), -ENOTCONN);
	assert_int_equal(shift_kv_recoveries(h), 0);
	assert_int_equal(shift_kv_mem_set_down("refresh", false), 0);
	assert_int_equal(shift_kv_get(h, "c", &v, &n), -ENOENT);
	assert_int_equal(shift_kv_recoveries(h), 1);
	assert_int_equal(shift_kv_get(h, "c", &v, &n), -ENOENT);
	assert_int_equal(shift_kv_recoveries(h), 1);
	sleep_ms(120);
	assert_int_equal(shift_kv_get(h, "a", &v, &n), -ENOENT);
	shift_kv_close(h);
}

/* ---- wait ---- */

struct putter {
	shift_kv *h;
	const char *key;
	int delay_ms;
};

static void *putter_main(void *arg)
{
	struct putter *p = arg;

	sleep_ms(p->delay_ms);
	shift_kv_put(p->h, p->key, "peer-attrs", 10, 0);
	return NULL;
}

static void test_mem_wait(void **state)
{
	struct putter p;
	pthread_t t;
	shift_kv *a, *b;
	uint64_t t0, dt;
	void *v;
	size_t n;

	(void)state;
	assert_int_equal(shift_kv_mem_clear("wait"), 0);
	a = open_mem("wait", "ns");
	b = open_mem("wait", "ns");

	/* the peer publishes after 100 ms; wait returns right after */
	p = (struct putter){ b, "qp/1", 100 };
	t0 = now_ms();
	assert_int_equal(pthread_create(&t, NULL, putter_main, &p), 0);
	assert_int_equal(shift_kv_wait(a, "qp/1", 5000, &v, &n), 0);
	dt = now_ms() - t0;
	pthread_join(t, NULL);
	assert_int_equal(n, 10);
	assert_memory_equal(v, "peer-attrs", 10);
	free(v);
	assert_true(dt >= 95 && dt < 1000);

	/* present already: immediate, also with timeout 0 */
	t0 = now_ms();
	assert_int_equal(shift_kv_wait(a, "qp/1", 0, &v, &n), 0);
	free(v);
	assert_true(now_ms() - t0 < 50);

	/* timeout accuracy */
	static const int tmo[] = { 0, 1, 50, 200 };
	for (size_t i = 0; i < 4; i++) {
		t0 = now_ms();
		assert_int_equal(shift_kv_wait(a, "never", tmo[i], &v, &n), -ETIMEDOUT);
		dt = now_ms() - t0;
		if (dt + 1 < (uint64_t)tmo[i] || dt > (uint64_t)tmo[i] + 100)
			fail_msg("wait(%d ms) took %llu ms", tmo[i],
				 (unsigned long long)dt);
		assert_non_null(strstr(shift_kv_last_error(), "did not appear"));
	}
	shift_kv_close(a);
	shift_kv_close(b);
}

/* ---- outage ---- */

struct waiter {
	shift_kv *h;
	int rc;
	uint64_t ms;
};

static void *waiter_main(void *arg)
{
	struct waiter *w = arg;
	uint64_t t0 = now_ms();
	void *v = NULL;
	size_t n;

	w->rc = shift_kv_wait(w->h, "never", 10000, &v, &n);
	w->ms = now_ms() - t0;
	free(v);
	return NULL;
}

static void test_mem_outage(void **state)
{
	struct shift_kv_options lazy = { .lazy_connect = true };
	struct waiter w;
	pthread_t t;
	shift_kv *h, *h2 = NULL;
	uint64_t t0;
	void *v;
	size_t n;

	(void)state;
	assert_int_equal(shift_kv_mem_clear("down"), 0);
	h = open_mem("down", "ns");
	assert_int_equal(shift_kv_put(h, "k", "v", 1, 0), 0);

	/* a waiter blocked in wait() is woken by the outage and fails fast */
	w = (struct waiter){ h, 0, 0 };
	assert_int_equal(pthread_create(&t, NULL, waiter_main, &w), 0);
	sleep_ms(50);
	assert_int_equal(shift_kv_mem_set_down("down", true), 0);
	pthread_join(t, NULL);
	assert_int_equal(w.rc, -ENOTCONN);
	assert_true(w.ms < 500);

	t0 = now_ms();
	assert_int_equal(shift_kv_put(h, "k2", "v", 1, 0), -ENOTCONN);
	assert_non_null(strstr(shift_kv_last_error(), "down"));
	assert_int_equal(shift_kv_get(h, "k", &v, &n), -ENOTCONN);
	assert_int_equal(shift_kv_delete(h, "k"), -ENOTCONN);
	assert_int_equal(shift_kv_wait(h, "k", 5000, &v, &n), -ENOTCONN);
	assert_int_equal(shift_kv_delete_own(h), -ENOTCONN);
	assert_int_equal(shift_kv_own_count(h), 1); /* kept for a retry */
	assert_true(now_ms() - t0 < 200);

	/* opening while down: refused, unless lazy */
	assert_int_equal(shift_kv_open("mem://down", "ns", NULL, &h2), -ENOTCONN);
	assert_null(h2);
	assert_int_equal(shift_kv_open("mem://down", "ns", &lazy, &h2), 0);
	assert_int_equal(shift_kv_get(h2, "k", &v, &n), -ENOTCONN);

	/* back up: data survived, everything works again */
	assert_int_equal(shift_kv_mem_set_down("down", false), 0);
	assert_int_equal(shift_kv_get(h2, "k", &v, &n), 0);
	free(v);
	assert_int_equal(shift_kv_delete_own(h), 1);
	assert_int_equal(shift_kv_get(h2, "k", &v, &n), -ENOENT);
	shift_kv_close(h);
	shift_kv_close(h2);

	assert_int_equal(shift_kv_mem_set_down("bad name", true), -EINVAL);
	assert_int_equal(shift_kv_mem_clear(NULL), -EINVAL);
}

/* Records lost or damaged (the campaign's --kv-faults): spoil() deletes
 * the picked entry, or flips one byte of its value, and leaves the others
 * alone; an empty store has nothing to spoil. */
static void test_mem_spoil(void **state)
{
	shift_kv *h;
	void *v;
	size_t n;
	int kept = 0;

	(void)state;
	assert_int_equal(shift_kv_mem_clear("spoil"), 0);
	assert_int_equal(shift_kv_mem_spoil("spoil", 3, false), -ENOENT);
	h = open_mem("spoil", "ns");
	assert_int_equal(shift_kv_put(h, "a", "abcdef", 6, 0), 0);
	assert_int_equal(shift_kv_mem_spoil("spoil", 7, true), 0);
	assert_int_equal(shift_kv_get(h, "a", &v, &n), 0);
	assert_int_equal(n, 6);
	assert_memory_not_equal(v, "abcdef", 6);
	assert_memory_equal(v, "abc", 3); /* (the middle byte: 6 / 2) */
	free(v);
	assert_int_equal(shift_kv_put(h, "b", "x", 1, 0), 0);
	assert_int_equal(shift_kv_put(h, "c", "y", 1, 0), 0);
	/* picked in the order of creation (a, b, c), whatever the keys'
	 * buckets: pick 1 is b, then pick 5 of the two left is c */
	assert_int_equal(shift_kv_mem_spoil("spoil", 1, false), 0);
	assert_int_equal(shift_kv_mem_spoil("spoil", 5, false), 0);
	for (const char *k = "abc"; *k; k++) {
		char key[2] = { *k, 0 };

		if (shift_kv_get(h, key, &v, &n) == 0) {
			kept++;
			assert_int_equal(*k, 'a');
			free(v);
		}
	}
	assert_int_equal(kept, 1);
	shift_kv_close(h);
	assert_int_equal(shift_kv_mem_spoil(NULL, 0, false), -EINVAL);
}

/* ---- delete_own ---- */

static void test_mem_delete_own(void **state)
{
	shift_kv *a, *b;
	void *v;
	size_t n;

	(void)state;
	assert_int_equal(shift_kv_mem_clear("own"), 0);
	a = open_mem("own", "ns");
	b = open_mem("own", "ns");
	assert_int_equal(shift_kv_put(a, "a1", "1", 1, 0), 0);
	assert_int_equal(shift_kv_put(a, "a2", "2", 1, 0), 0);
	assert_int_equal(shift_kv_put(a, "a2", "2", 1, 0), 0); /* counted once */
	assert_int_equal(shift_kv_put(a, "a3", "3", 1, 0), 0);
	assert_int_equal(shift_kv_put(b, "b1", "1", 1, 0), 0);
	assert_int_equal(shift_kv_own_count(a), 3);
	assert_int_equal(shift_kv_delete(a, "a3"), 0);
	assert_int_equal(shift_kv_own_count(a), 2);
	assert_int_equal(shift_kv_delete(b, "a2"), 0); /* gone behind a's back */
	assert_int_equal(shift_kv_delete_own(a), 1);
	assert_int_equal(shift_kv_own_count(a), 0);
	assert_int_equal(shift_kv_get(b, "a1", &v, &n), -ENOENT);
	assert_int_equal(shift_kv_get(a, "b1", &v, &n), 0); /* b's key stays */
	free(v);
	assert_int_equal(shift_kv_delete_own(a), 0);
	shift_kv_close(a);
	shift_kv_close(b);
}

/* ---- environment ---- */

static void test_open_from_env(void **state)
{
	shift_kv *h = NULL;
	void *v;
	size_t n;

	(void)state;
	test_setenv(SHIFT_KV_ENV_URL, "mem://envstore");
	test_setenv(SHIFT_KV_ENV_NAMESPACE, "job-7");
	assert_int_equal(shift_kv_mem_clear("envstore"), 0);
	assert_int_equal(shift_kv_open_from_env(NULL, &h), 0);
	assert_string_equal(shift_kv_namespace(h), "job-7");
	assert_string_equal(shift_kv_backend_name(h), "mem");
	assert_int_equal(shift_kv_put(h, "x", "1", 1, 0), 0);
	shift_kv_close(h);
	h = open_mem("envstore", "job-7");
	assert_int_equal(shift_kv_get(h, "x", &v, &n), 0);
	free(v);
	shift_kv_close(h);

	test_setenv(SHIFT_KV_ENV_NAMESPACE, "job 7");
	assert_int_equal(shift_kv_open_from_env(NULL, &h), -EINVAL);
	assert_null(h);
	assert_non_null(strstr(shift_kv_last_error(), "namespace"));
	test_setenv(SHIFT_KV_ENV_NAMESPACE, "job7");
	test_setenv(SHIFT_KV_ENV_URL, "redis://h:notaport");
	assert_int_equal(shift_kv_open_from_env(NULL, &h), -EINVAL);
	assert_null(h);
}

/* ---- concurrency: shared handle and per-thread handles ---- */

#define NTHREADS 4
#define NOPS 300

struct worker {
	shift_kv *shared;
	int id;
	int errors;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	shift_kv *own = NULL;
	char key[32], val[32];

	if (shift_kv_open("mem://conc", "ns", NULL, &own))
		w->errors++;
	for (int i = 0; i < NOPS && own; i++) {
		shift_kv *h = (i & 1) ? own : w->shared;
		void *v = NULL;
		size_t n;
		int len = snprintf(val, sizeof(val), "%d:%d", w->id, i);

		snprintf(key, sizeof(key), "t%d/%d", w->id, i % 17);
		if (shift_kv_put(h, key, val, (size_t)len, 0))
			w->errors++;
		if (shift_kv_get(h, key, &v, &n) || n != (size_t)len ||
		    memcmp(v, val, n))
			w->errors++;
		free(v);
		/* everybody waits on one shared key published by thread 0 */
		if (i == NOPS / 2 && w->id == 0)
			shift_kv_put(h, "go", "1", 1, 0);
		if (i == NOPS / 2 + 1) {
			if (shift_kv_wait(h, "go", 5000, &v, &n))
				w->errors++;
			free(v);
		}
		if (i % 5 == 0)
			shift_kv_delete(h, key);
	}
	shift_kv_delete_own(own);
	shift_kv_close(own);
	return NULL;
}

static void test_mem_threads(void **state)
{
	struct worker w[NTHREADS];
	pthread_t t[NTHREADS];
	shift_kv *shared;

	(void)state;
	assert_int_equal(shift_kv_mem_clear("conc"), 0);
	shared = open_mem("conc", "ns");
	for (int i = 0; i < NTHREADS; i++) {
		w[i] = (struct worker){ shared, i, 0 };
		assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
	}
	for (int i = 0; i < NTHREADS; i++) {
		pthread_join(t[i], NULL);
		assert_int_equal(w[i].errors, 0);
	}
	assert_true(shift_kv_delete_own(shared) >= 0);
	assert_int_equal(shift_kv_own_count(shared), 0);
	shift_kv_close(shared);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_url_good),
		cmocka_unit_test(test_url_bad),
		cmocka_unit_test(test_url_sentinel),
		cmocka_unit_test(test_namespace),
		cmocka_unit_test(test_mem_basic),
		cmocka_unit_test(test_mem_mget),
		cmocka_unit_test(test_mem_ttl),
		cmocka_unit_test(test_mem_wait),
		cmocka_unit_test(test_mem_outage),
		cmocka_unit_test(test_mem_spoil),
		cmocka_unit_test(test_mem_delete_own),
		cmocka_unit_test(test_mem_refresh_own),
		cmocka_unit_test_teardown(test_open_from_env, test_env_teardown),
		cmocka_unit_test(test_mem_threads),
	};

	return test_env_run_group_tests(tests);
}
