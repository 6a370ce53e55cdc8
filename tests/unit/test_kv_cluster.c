/*
 * tests/unit/test_kv_cluster.c - the Redis backend over Redis Cluster
 * (redis-cluster:// URLs), against a real cluster the test builds on free
 * loopback ports: three primaries with a password (slots split in three),
 * and a replica of the first, node timeout 500 ms.
 *
 *  - the slot of a key and of a {hash tag} is the server's (CLUSTER
 *    KEYSLOT) for keys with every kind of brace;
 *  - CLUSTER NODES parsing on hand-made replies: replicas, slots in
 *    migration, a node without its own IP; refused whole when a line does
 *    not parse, a slot is out of range or claimed twice, too many
 *    primaries;
 *  - put/get/mget/delete of 200 keys reach each key's owner (the owner
 *    answers GET without a redirect); an MGET of one host's records (one
 *    hash tag) is one MGET on one node, of untagged keys one per slot;
 *  - a slot moved behind the handle's back (MOVED) and one in migration
 *    (ASK, for a key already moved and for a new one) are followed;
 *  - the primary of a slot is killed: the replica is promoted and the same
 *    handle reads and writes that slot again, each failing call within its
 *    deadline;
 *  - a seed that is not a cluster, a redis:// URL at a cluster node, and
 *    a cluster all down fail within the deadline with a message.
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
#include "kv/kv_redis_cluster.h"
#include "redis_proc.h"

#define PW "shift-cluster-pw"
#define NPRIM 3

static pid_t node_pid[NPRIM + 1] = { -1, -1, -1, -1 };
static int port[NPRIM + 1], bus_port[NPRIM + 1];
static char id[NPRIM + 1][64];
static char dir[64];

static pid_t start_node(int i)
{
	char p[16], bus[16], conf[128];
	int bp = bus_port[i] = rp_free_port();

	port[i] = rp_free_port();
	snprintf(p, sizeof(p), "%d", port[i]);
	snprintf(bus, sizeof(bus), "%d", bp);
	snprintf(conf, sizeof(conf), "nodes-%d.conf", port[i]);
	const char *a[] = { "--port", p, "--bind", "127.0.0.1", "--requirepass", PW,
			    "--masterauth", PW, "--save", "", "--appendonly", "no",
			    "--dir", dir, "--cluster-enabled", "yes", "--cluster-port", bus,
			    "--cluster-config-file", conf, "--cluster-node-timeout", "500", NULL };
	return rp_start(port[i], PW, a);
}

/* Until every node says cluster_state:ok, up to ms. */
static int wait_ok(int n, int ms)
{
	uint64_t t0 = rp_now_ms();

	while (rp_now_ms() - t0 < (uint64_t)ms) {
		int ok = 0;

		for (int i = 0; i < n; i++) {
			redisReply *r = node_pid[i] > 0 ? rp_command(port[i], PW, "CLUSTER INFO") : NULL;

			ok += !node_pid[i] || (r && r->type == REDIS_REPLY_STRING &&
					       strstr(r->str, "cluster_state:ok"));
			if (r)
				freeReplyObject(r);
		}
		if (ok == n)
			return 0;
		rp_sleep_ms(50);
	}
	return -1;
}

static int str_cmd(int p, char *out, size_t cap, const char *fmt, const char *arg)
{
	redisReply *r = rp_command(p, PW, fmt, arg);
	int rc = r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) ? 0 : -1;

	if (!rc && out)
		snprintf(out, cap, "%s", r->str);
	if (r)
		freeReplyObject(r);
	return rc;
}

static int group_setup(void **state)
{
	char lo[8], hi[8], pp[16], bp[16];
	(void)state;

	if (!rp_server_path()) {
		fprintf(stderr, "*** FAIL: redis-server not found (scripts/deps installs it) ***\n");
		return -1;
	}
	snprintf(dir, sizeof(dir), "/tmp/shift-cluster-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	for (int i = 0; i <= NPRIM; i++)
		if ((node_pid[i] = start_node(i)) < 0 ||
		    str_cmd(port[i], id[i], sizeof(id[i]), "CLUSTER MYID", NULL))
			return -1;
	for (int i = 0; i < NPRIM; i++) {
		snprintf(lo, sizeof(lo), "%d", i * 5462);
		snprintf(hi, sizeof(hi), "%d", i == NPRIM - 1 ? 16383 : i * 5462 + 5461);
		redisReply *r = rp_command(port[i], PW, "CLUSTER ADDSLOTSRANGE %s %s", lo, hi);

		if (!r || r->type != REDIS_REPLY_STATUS)
			return -1;
		freeReplyObject(r);
	}
	for (int i = 1; i <= NPRIM; i++) {
		snprintf(pp, sizeof(pp), "%d", port[i]);
		snprintf(bp, sizeof(bp), "%d", bus_port[i]);
		redisReply *r = rp_command(port[0], PW, "CLUSTER MEET 127.0.0.1 %s %s", pp, bp);

		if (!r)
			return -1;
		freeReplyObject(r);
	}
	if (wait_ok(NPRIM, 20000))
		return -1;
	/* node 3 replicates node 0, once it knows it */
	for (uint64_t t0 = rp_now_ms(); rp_now_ms() - t0 < 10000; rp_sleep_ms(100))
		if (!str_cmd(port[NPRIM], NULL, 0, "CLUSTER REPLICATE %s", id[0]))
			return wait_ok(NPRIM + 1, 20000);
	return -1;
}

static int group_teardown(void **state)
{
	(void)state;
	for (int i = 0; i <= NPRIM; i++)
		rp_kill(&node_pid[i]);
	rp_rmtree(dir);
	return 0;
}

static shift_kv *open_cluster(int seed, bool lazy)
{
	char url[256];
	struct shift_kv_options o = { .command_timeout_ms = 1000, .lazy_connect = lazy,
				      .retry_min_ms = 10, .retry_max_ms = 50, .job_id = "" };
	shift_kv *h = NULL;

	snprintf(url, sizeof(url), "redis-cluster://:%s@127.0.0.1:%d", PW, port[seed]);
	assert_int_equal(shift_kv_open(url, "cl", &o, &h), 0);
	assert_string_equal(shift_kv_backend_name(h), "redis-cluster");
	return h;
}

/* The node (0..NPRIM-1 or the replica) that serves key's slot now. */
static int owner_of(const char *full)
{
	for (int i = 0; i <= NPRIM; i++) {
		redisReply *r = node_pid[i] > 0 ? rp_command(port[i], PW, "GET %s", full) : NULL;
		int mine = r && r->type != REDIS_REPLY_ERROR;

		if (r)
			freeReplyObject(r);
		if (mine)
			return i;
	}
	return -1;
}

static long long mget_calls(void)
{
	long long n = 0;

	for (int i = 0; i < NPRIM; i++) {
		redisReply *r = node_pid[i] > 0 ? rp_command(port[i], PW, "INFO commandstats") : NULL;
		const char *m = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, "cmdstat_mget:calls=")
								    : NULL;

		if (m)
			n += atoll(m + strlen("cmdstat_mget:calls="));
		if (r)
			freeReplyObject(r);
	}
	return n;
}

static void test_slot(void **state)
{
	const char *keys[] = { "123456789", "foo", "bar", "{user1000}.following",
			       "{user1000}.followers", "foo{}{bar}", "foo{{bar}}zap",
			       "foo{bar}{zap}", "{}x", "a{b", "a}b{c}", "shift:cl:qp:{00ff}:7",
			       "x{y", "{", "}{" };
	(void)state;

	assert_int_equal(kv_cluster_slot("123456789", 9), 0x31C3 & 16383);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		redisReply *r = rp_command(port[0], PW, "CLUSTER KEYSLOT %s", keys[i]);

		assert_non_null(r);
		assert_int_equal(r->type, REDIS_REPLY_INTEGER);
		assert_int_equal(kv_cluster_slot(keys[i], strlen(keys[i])), (unsigned)r->integer);
		freeReplyObject(r);
	}
	assert_int_equal(kv_cluster_slot("qp:{ab}:1", 9), kv_cluster_slot("mr:{ab}:77", 10));
}

static int parse(const char *txt, struct shift_kv_addr *a, int cap, uint16_t *owner, char *why)
{
	const struct shift_kv_addr asked = { "10.9.9.9", 7777 };

	return kv_cluster_parse_nodes(txt, strlen(txt), &asked, a, cap, owner, why, 200);
}

static void test_parse_nodes(void **state)
{
	static uint16_t owner[KV_CLUSTER_SLOTS];
	struct shift_kv_addr a[4];
	char why[200];
	(void)state;

	const char *good =
		"aaa 10.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-100 200 [300->-bbb]\n"
		"bbb :7001@17001 master - 0 0 2 connected 101-199 [5-<-aaa]\r\n"
		"ccc 10.0.0.3:7002@17002,host3 slave aaa 0 0 1 connected\n"
		"ddd 10.0.0.4:7003@17003 master,fail - 0 0 3 disconnected 201-300\n"
		"eee 10.0.0.5:7004@17004 master - 0 0 4 connected\n"
		"fff fe80::1:7005@17005 master - 0 0 5 connected 16383\n";
	assert_int_equal(parse(good, a, 4, owner, why), 3);
	assert_string_equal(a[0].host, "10.0.0.1");
	assert_int_equal(a[0].port, 7000);
	assert_string_equal(a[1].host, "10.9.9.9"); /* no IP of its own: who answered */
	assert_int_equal(a[1].port, 7001);
	assert_string_equal(a[2].host, "fe80::1");
	assert_int_equal(owner[0], 1);
	assert_int_equal(owner[100], 1);
	assert_int_equal(owner[150], 2);
	assert_int_equal(owner[200], 1);
	assert_int_equal(owner[250], 0); /* its primary failed */
	assert_int_equal(owner[300], 0); /* migrating, not counted */
	assert_int_equal(owner[16383], 3);

	const char *bad[] = {
		"aaa 10.0.0.1:7000@17000 master - 0 0 1 connected 0-16384\n",
		"aaa 10.0.0.1:7000@17000 master - 0 0 1 connected 5-3\n",
		"aaa 10.0.0.1:7000@17000 master - 0 0 1 connected 0-10\n"
		"bbb 10.0.0.2:7001@17001 master - 0 0 2 connected 10\n",
		"aaa 10.0.0.1:7000@17000 master - 0 0 1 connected 1x\n",
		"aaa 10.0.0.1:99999@17000 master - 0 0 1 connected 1\n",
		"aaa 10.0.0.1 master - 0 0 1 connected 1\n",
		"aaa evil;host:7000@17000 master - 0 0 1 connected 1\n",
		"garbage\n",
		"ccc 10.0.0.3:7002@17002 slave aaa 0 0 1 connected\n",
		"",
		"a 1.1.1.1:1@2 master - 0 0 1 connected 1\nb 1.1.1.2:1@2 master - 0 0 1 connected 2\n"
		"c 1.1.1.3:1@2 master - 0 0 1 connected 3\nd 1.1.1.4:1@2 master - 0 0 1 connected 4\n"
		"e 1.1.1.5:1@2 master - 0 0 1 connected 5\n",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		why[0] = '\0';
		assert_int_equal(parse(bad[i], a, 4, owner, why), -1);
		assert_true(why[0] != '\0');
	}
}

/* 200 keys: each on its owner; MGET with absent keys; delete. */
static void test_spread(void **state)
{
	shift_kv *h = open_cluster(1, false);
	char k[32], full[64], buf[32];
	const char *keys[201];
	char kk[201][32];
	void *v[201];
	size_t len[201], n;
	int per[NPRIM + 1] = { 0 };
	(void)state;

	for (int i = 0; i < 200; i++) {
		snprintf(k, sizeof(k), "spread:%d", i);
		assert_int_equal(shift_kv_put(h, k, k, strlen(k), 60000), 0);
		snprintf(full, sizeof(full), "shift:cl:%s", k);
		int o = owner_of(full);

		assert_true(o >= 0 && o < NPRIM);
		per[o]++;
	}
	for (int i = 0; i < NPRIM; i++)
		assert_true(per[i] > 20); /* the keys really are spread */
	for (int i = 0; i < 201; i++) {
		snprintf(kk[i], sizeof(kk[i]), "spread:%d", i); /* 200: absent */
		keys[i] = kk[i];
	}
	assert_int_equal(shift_kv_mget(h, keys, 201, v, len), 0);
	for (int i = 0; i < 200; i++) {
		assert_non_null(v[i]);
		assert_int_equal(len[i], strlen(kk[i]));
		assert_memory_equal(v[i], kk[i], len[i]);
		free(v[i]);
	}
	assert_null(v[200]);
	assert_int_equal(shift_kv_get_buf(h, "spread:7", buf, sizeof(buf), &n), 0);
	assert_int_equal(shift_kv_delete(h, "spread:7"), 0);
	assert_int_equal(shift_kv_get_buf(h, "spread:7", buf, sizeof(buf), &n), -ENOENT);
	assert_int_equal(shift_kv_delete_own(h) >= 199, 1);
	shift_kv_close(h);
}

/* One hash tag: one MGET on one node; untagged keys: one per slot. */
static void test_tag_one_mget(void **state)
{
	shift_kv *h = open_cluster(0, false);
	char kk[40][48];
	const char *keys[40];
	void *v[40];
	size_t len[40];
	long long before;
	(void)state;

	for (int i = 0; i < 40; i++) {
		snprintf(kk[i], sizeof(kk[i]), "mr:{00000000000000000000ffffc6120001}:%d", i);
		keys[i] = kk[i];
		assert_int_equal(shift_kv_put(h, kk[i], "r", 1, 60000), 0);
	}
	before = mget_calls();
	assert_int_equal(shift_kv_mget(h, keys, 40, v, len), 0);
	assert_int_equal(mget_calls() - before, 1);
	for (int i = 0; i < 40; i++) {
		assert_non_null(v[i]);
		free(v[i]);
		snprintf(kk[i], sizeof(kk[i]), "untagged:%d", i);
	}
	before = mget_calls();
	assert_int_equal(shift_kv_mget(h, keys, 40, v, len), 0);
	assert_true(mget_calls() - before > 10);
	shift_kv_close(h);
}

/* The first key (from "mv:0" on) whose slot node src serves. */
static void key_on(int src, char *k, size_t cap, char *full, size_t fcap)
{
	for (int i = 0;; i++) {
		snprintf(k, cap, "mv:%d", i);
		snprintf(full, fcap, "shift:cl:%s", k);
		if (owner_of(full) == src)
			return;
	}
}

static void setslot(int on, unsigned slot, const char *how, const char *nid)
{
	char s[8];

	snprintf(s, sizeof(s), "%u", slot);
	redisReply *r = nid ? rp_command(port[on], PW, "CLUSTER SETSLOT %s %s %s", s, how, nid)
			    : rp_command(port[on], PW, "CLUSTER SETSLOT %s %s", s, how);
	assert_non_null(r);
	assert_int_equal(r->type, REDIS_REPLY_STATUS);
	freeReplyObject(r);
}

static void migrate(int from, int to, const char *full)
{
	char p[16];

	snprintf(p, sizeof(p), "%d", port[to]);
	redisReply *r = rp_command(port[from], PW, "MIGRATE 127.0.0.1 %s %s 0 2000 AUTH " PW, p,
				   full);
	assert_non_null(r);
	assert_int_equal(r->type, REDIS_REPLY_STATUS);
	freeReplyObject(r);
}

/* A slot moved from node 1 to node 2 behind the handle: MOVED; then one
 * in migration from node 2 to node 1: ASK, for a moved key and a new one. */
static void test_moved_and_ask(void **state)
{
	shift_kv *h = open_cluster(0, false);
	char k[32], full[64], k2[32], full2[64], buf[32];
	size_t n;
	(void)state;

	key_on(1, k, sizeof(k), full, sizeof(full));
	unsigned slot = kv_cluster_slot(full, strlen(full));

	assert_int_equal(shift_kv_put(h, k, "moved", 5, 60000), 0);
	setslot(2, slot, "IMPORTING", id[1]);
	setslot(1, slot, "MIGRATING", id[2]);
	migrate(1, 2, full);
	for (int i = 0; i < NPRIM; i++) /* a replica takes no SETSLOT */
		setslot(i, slot, "NODE", id[2]);
	assert_int_equal(owner_of(full), 2);
	memset(buf, 0, sizeof(buf));
	assert_int_equal(shift_kv_get_buf(h, k, buf, sizeof(buf), &n), 0);
	assert_string_equal(buf, "moved");

	/* back from 2 to 1, stopped half-way: the key moved, the slot not */
	setslot(1, slot, "IMPORTING", id[2]);
	setslot(2, slot, "MIGRATING", id[1]);
	migrate(2, 1, full);
	memset(buf, 0, sizeof(buf));
	assert_int_equal(shift_kv_get_buf(h, k, buf, sizeof(buf), &n), 0);
	assert_string_equal(buf, "moved");
	/* a new key of that slot goes to the importing node too */
	snprintf(k2, sizeof(k2), "%s", k);
	snprintf(full2, sizeof(full2), "%s", full);
	for (int i = 0;; i++) {
		snprintf(k2, sizeof(k2), "mv2:%d", i);
		snprintf(full2, sizeof(full2), "shift:cl:%s", k2);
		if (kv_cluster_slot(full2, strlen(full2)) == slot)
			break;
	}
	assert_int_equal(shift_kv_put(h, k2, "asked", 5, 60000), 0);
	redisReply *r = rp_command(port[1], PW, "ASKING");
	freeReplyObject(r);
	for (int i = 0; i < NPRIM; i++)
		setslot(i, slot, "NODE", id[1]);
	assert_int_equal(owner_of(full2), 1);
	memset(buf, 0, sizeof(buf));
	assert_int_equal(shift_kv_get_buf(h, k2, buf, sizeof(buf), &n), 0);
	assert_string_equal(buf, "asked");
	shift_kv_close(h);
}

/* Not a cluster, a redis:// URL at a cluster node, a cluster all down. */
static void test_refusals(void **state)
{
	char url[256];
	struct shift_kv_options o = { .command_timeout_ms = 300, .retry_min_ms = 10,
				      .retry_max_ms = 50, .job_id = "" };
	shift_kv *h = NULL;
	int plain = rp_free_port(), dead = rp_free_port();
	char p[16], buf[8];
	size_t n;
	(void)state;

	snprintf(p, sizeof(p), "%d", plain);
	const char *a[] = { "--port", p, "--bind", "127.0.0.1", "--save", "", NULL };
	pid_t pl = rp_start(plain, NULL, a);

	assert_true(pl > 0);
	snprintf(url, sizeof(url), "redis-cluster://127.0.0.1:%d,127.0.0.1:%d", dead, plain);
	assert_int_equal(shift_kv_open(url, "cl", &o, &h), -ENOTCONN);
	printf("# %s\n", shift_kv_last_error());
	assert_non_null(strstr(shift_kv_last_error(), "no slot map"));
	assert_non_null(strstr(shift_kv_last_error(), "cluster support disabled"));
	rp_kill(&pl);

	snprintf(url, sizeof(url), "redis://:%s@127.0.0.1:%d", PW, port[0]);
	assert_int_equal(shift_kv_open(url, "cl", &o, &h), 0);
	int rc = 0;

	for (int i = 0; i < 20 && !rc; i++) { /* some key lives elsewhere */
		char k[16];

		snprintf(k, sizeof(k), "r%d", i);
		rc = shift_kv_put(h, k, "v", 1, 1000);
	}
	assert_int_equal(rc, -EPROTO);
	assert_non_null(strstr(shift_kv_last_error(), "redis-cluster://"));
	shift_kv_close(h);

	o.lazy_connect = true;
	snprintf(url, sizeof(url), "redis-cluster://127.0.0.1:%d,127.0.0.1:%d", dead,
		 rp_free_port());
	assert_int_equal(shift_kv_open(url, "cl", &o, &h), 0);
	uint64_t t0 = rp_now_ms();

	assert_int_equal(shift_kv_get_buf(h, "k", buf, sizeof(buf), &n), -ENOTCONN);
	assert_true(rp_now_ms() - t0 < 600);
	shift_kv_close(h);
}

/* The primary of a slot dies: its replica is promoted and the same handle
 * goes on; every failing call ends within its deadline.  Last: it kills
 * node 0. */
static void test_primary_killed(void **state)
{
	shift_kv *h = open_cluster(1, false);
	char k[32], full[64], buf[32];
	size_t n;
	int rc = -1, calls = 0;
	(void)state;

	key_on(0, k, sizeof(k), full, sizeof(full));
	assert_int_equal(shift_kv_put(h, k, "kept", 4, 0), 0);
	long long acked = 0;

	for (uint64_t t0 = rp_now_ms(); !acked && rp_now_ms() - t0 < 10000;) {
		redisReply *w = rp_command(port[0], PW, "WAIT 1 200");

		acked = w && w->type == REDIS_REPLY_INTEGER ? w->integer : 0;
		if (w)
			freeReplyObject(w);
	}
	assert_int_equal(acked, 1); /* the replica has the key */
	rp_kill(&node_pid[0]);
	uint64_t t0 = rp_now_ms();

	while (rp_now_ms() - t0 < 30000) {
		uint64_t c0 = rp_now_ms();

		memset(buf, 0, sizeof(buf));
		rc = shift_kv_get_buf(h, k, buf, sizeof(buf), &n);
		calls++;
		assert_true(rp_now_ms() - c0 < 1500); /* 1000 ms deadline */
		if (!rc)
			break;
		rp_sleep_ms(50);
	}
	printf("# the slot was served again %llu ms after its primary was killed (%d calls)\n",
	       (unsigned long long)(rp_now_ms() - t0), calls);
	assert_int_equal(rc, 0);
	assert_string_equal(buf, "kept");
	assert_int_equal(owner_of(full), NPRIM);
	assert_int_equal(shift_kv_put(h, k, "after", 5, 0), 0);
	shift_kv_close(h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_slot),
		cmocka_unit_test(test_parse_nodes),
		cmocka_unit_test(test_spread),
		cmocka_unit_test(test_tag_one_mget),
		cmocka_unit_test(test_moved_and_ask),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_primary_killed),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
