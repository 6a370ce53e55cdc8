/*
 * Unit tests of the KV spelling (shift/exchange.c) and of the backup NIC
 * choice (shift/backup.c): pure functions, no devices.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "shift/shadow/backup.h"
#include "shift/shadow/exchange.h"
#include "test_env.h"

static void test_qp_roundtrip(void **state)
{
	struct shift_qp_value v = { .qpn = 0x123456, .psn = 77, .mtu = IBV_MTU_1024 }, w;
	struct shift_qp_key k = { .qpn = 17 };
	char buf[SHIFT_EXCHANGE_VALUE_MAX], key[SHIFT_EXCHANGE_KEY_MAX];
	(void)state;

	for (int i = 0; i < 16; i++)
		v.gid.raw[i] = (uint8_t)(i * 17);
	k.gid = v.gid;
	int n = shift_exchange_qp_encode(&v, buf, sizeof(buf));
	assert_true(n > 0);
	assert_int_equal(shift_exchange_qp_decode(buf, (size_t)n, &w), 0);
	assert_memory_equal(&v.gid, &w.gid, 16);
	assert_int_equal(w.qpn, v.qpn);
	assert_int_equal(w.psn, 77);
	assert_int_equal(w.mtu, IBV_MTU_1024);
	assert_true(shift_exchange_qp_key(&k, key, sizeof(key)) > 0);
	assert_string_equal(key, "qp:{00112233445566778899aabbccddeeff}:17");
	/* too small a buffer is an error, not a truncation */
	assert_int_equal(shift_exchange_qp_key(&k, key, 10), -EMSGSIZE);
}

static void test_qp_decode_rejects(void **state)
{
	struct shift_qp_value w;
	static const char *const bad[] = {
		"",
		"shift0 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3",
		"shift1 qp gid=00112233445566778899aabbccddeefX qpn=1 psn=2 mtu=3",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=16777216 psn=2 mtu=3",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=9",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=0 psn=2 mtu=3",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3 extra=1",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=-1 psn=2 mtu=3",
		"shift1 mr rkey=5",
		/* the connection the writer's QP belongs to: both fields, valid */
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3 pgid=00",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3 "
		"pgid=00112233445566778899aabbccddeeff",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3 "
		"pgid=00112233445566778899aabbccddeeff pqpn=0",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3 "
		"pqpn=5 pgid=00112233445566778899aabbccddeeff",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3 "
		"pgid=00112233445566778899aabbccddeeff pqpn=5 x=1",
	};
	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(shift_exchange_qp_decode(bad[i], strlen(bad[i]), &w), -EINVAL);
	/* a truncated value (length shorter than the text) is rejected too */
	const char *ok = "shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3";
	assert_int_equal(shift_exchange_qp_decode(ok, strlen(ok), &w), 0);
	assert_int_equal(shift_exchange_qp_decode(ok, strlen(ok) - 7, &w), -EINVAL);
	assert_false(w.has_peer);
	/* with the writer's connection */
	struct shift_qp_value v = w;
	char buf[SHIFT_EXCHANGE_VALUE_MAX];

	v.has_peer = true;
	memset(&v.peer.gid, 0x5c, sizeof(v.peer.gid));
	v.peer.qpn = 0xffffff;
	int n = shift_exchange_qp_encode(&v, buf, sizeof(buf));

	assert_true(n > 0);
	assert_int_equal(shift_exchange_qp_decode(buf, (size_t)n, &w), 0);
	assert_true(w.has_peer && w.peer.qpn == 0xffffff && w.qpn == 1 &&
		    !memcmp(&w.peer.gid, &v.peer.gid, sizeof(w.peer.gid)));
}

/* A QP record with every field at its longest; encoded and decoded again
 * into *w (it fits). */
static struct shift_qp_value longest_qp(struct shift_qp_value *w)
{
	struct shift_qp_value v = { .qpn = 0xffffff, .psn = 0xffffff, .mtu = IBV_MTU_4096,
				    .has_peer = true, .has_mri = true,
				    .mri = 0xfedcba9876543210ull, .has_mb = true,
				    .mb_addr = UINT64_MAX, .mb_rkey = UINT32_MAX };
	char buf[SHIFT_EXCHANGE_VALUE_MAX];

	memset(&v.gid, 0xff, sizeof(v.gid));
	memset(&v.peer.gid, 0xee, sizeof(v.peer.gid));
	v.peer.qpn = 0xffffff;
	int n = shift_exchange_qp_encode(&v, buf, sizeof(buf));
	assert_true(n > 0);
	assert_int_equal(shift_exchange_qp_decode(buf, (size_t)n, w), 0);
	return v;
}

/* The writer's MR index id in its QP record: with or without the
 * connection, 16 hex digits, never 0, nothing after it. */
static void test_qp_mri(void **state)
{
	struct shift_qp_value w, v = longest_qp(&w);
	char buf[SHIFT_EXCHANGE_VALUE_MAX];
	int n;
	(void)state;

	v.has_mb = false; /* (the index alone below) */
	assert_true(w.has_peer && w.has_mri && w.mri == v.mri && w.peer.qpn == 0xffffff);
	v.has_peer = false;
	v.mri = 1;
	n = shift_exchange_qp_encode(&v, buf, sizeof(buf));
	assert_int_equal(shift_exchange_qp_decode(buf, (size_t)n, &w), 0);
	assert_true(!w.has_peer && w.has_mri && w.mri == 1);
	static const char *const bad[] = {
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3 mri=0000000000000000",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3 mri=00000000000001",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3 mri=000000000000000g",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3 mri=00000000000000001",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3 mri=0000000000000001 x",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3 mri=0000000000000001 "
		"pgid=00112233445566778899aabbccddeeff pqpn=5",
		"shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3 mri=",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(shift_exchange_qp_decode(bad[i], strlen(bad[i]), &w), -EINVAL);
}

/* The writer's key mailbox in its QP record (shadow/mbox.h): after the
 * MR index, address in 16 hex digits (never 0) and rkey; the longest
 * record with it fits; anything else after the index is refused. */
static void test_qp_mailbox(void **state)
{
	struct shift_qp_value w, v = longest_qp(&w);
	char buf[SHIFT_EXCHANGE_VALUE_MAX];
	int n;
	(void)state;

	assert_true(w.has_mb && w.mb_addr == UINT64_MAX && w.mb_rkey == UINT32_MAX && w.has_mri);
	v.has_mri = v.has_peer = false; /* (a mailbox alone) */
	v.mb_addr = 0x1000;
	v.mb_rkey = 0;
	n = shift_exchange_qp_encode(&v, buf, sizeof(buf));
	assert_int_equal(shift_exchange_qp_decode(buf, (size_t)n, &w), 0);
	assert_true(w.has_mb && !w.has_mri && !w.has_peer && w.mb_addr == 0x1000 && !w.mb_rkey);
	v.has_mb = false; /* (none: an older writer's record) */
	n = shift_exchange_qp_encode(&v, buf, sizeof(buf));
	assert_int_equal(shift_exchange_qp_decode(buf, (size_t)n, &w), 0);
	assert_false(w.has_mb);
#define QP_MRI "shift1 qp gid=00112233445566778899aabbccddeeff qpn=1 psn=2 mtu=3 mri=0000000000000001"
	static const char *const bad[] = {
		QP_MRI " mba=0000000000000000 mbk=5",
		QP_MRI " mba=0000000000001000",
		QP_MRI " mba=0000000000001000 mbk=",
		QP_MRI " mba=0000000000001000 mbk=4294967296",
		QP_MRI " mba=000000000000100 mbk=5",
		QP_MRI " mba=0000000000001000 mbk=5 x",
		QP_MRI " mbk=5 mba=0000000000001000",
	};
#undef QP_MRI
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(shift_exchange_qp_decode(bad[i], strlen(bad[i]), &w), -EINVAL);
}

/* MR index chunks: the spelling, the bounds, and what is refused. */
static void test_mri(void **state)
{
	static struct shift_mri_chunk c = { .ver = UINT64_MAX, .chunks = SHIFT_MRI_CHUNKS }, r;
	char buf[SHIFT_MRI_VALUE_MAX], key[SHIFT_EXCHANGE_KEY_MAX];
	union ibv_gid g;
	(void)state;

	memset(&g, 0xab, sizeof(g));
	assert_true(shift_exchange_mri_key(&g, 0x1234, 7, key, sizeof(key)) > 0);
	assert_string_equal(key, "mri:{abababababababababababababababab}:0000000000001234:7");
	/* a full chunk of the largest keys fits its buffer */
	c.n = SHIFT_MRI_CHUNK_KEYS;
	for (unsigned i = 0; i < c.n; i++)
		c.keys[i] = UINT32_MAX - i;
	int n = shift_exchange_mri_encode(&c, buf, sizeof(buf));
	assert_true(n > 0);
	assert_int_equal(shift_exchange_mri_decode(buf, (size_t)n, &r), 0);
	assert_true(r.ver == UINT64_MAX && r.chunks == SHIFT_MRI_CHUNKS && r.n == c.n);
	assert_memory_equal(r.keys, c.keys, c.n * sizeof(c.keys[0]));
	/* an empty index: one chunk, no keys */
	c = (struct shift_mri_chunk){ .ver = 3, .chunks = 1 };
	n = shift_exchange_mri_encode(&c, buf, sizeof(buf));
	assert_string_equal(buf, "shift1 mri ver=3 chunks=1 keys=");
	assert_int_equal(shift_exchange_mri_decode(buf, (size_t)n, &r), 0);
	assert_true(r.n == 0 && r.chunks == 1);
	/* too many keys, or chunks out of range: not encoded */
	c.n = SHIFT_MRI_CHUNK_KEYS + 1;
	assert_int_equal(shift_exchange_mri_encode(&c, buf, sizeof(buf)), -EINVAL);
	c.n = 0;
	c.chunks = 0;
	assert_int_equal(shift_exchange_mri_encode(&c, buf, sizeof(buf)), -EINVAL);
	static const char *const bad[] = {
		"shift1 mri ver=1 chunks=0 keys=",
		"shift1 mri ver=1 chunks=257 keys=",
		"shift1 mri ver=1 chunks=1 keys=1,",
		"shift1 mri ver=1 chunks=1 keys=,1",
		"shift1 mri ver=1 chunks=1 keys=1,,2",
		"shift1 mri ver=1 chunks=1 keys=4294967296",
		"shift1 mri ver=1 chunks=1 keys=12345678901",
		"shift1 mri ver=1 chunks=1 keys=1 2",
		"shift1 mri ver=1 chunks=1 keys=-1",
		"shift1 mri ver=1 chunks=1",
		"shift1 mri ver=18446744073709551616 chunks=1 keys=",
		"shift1 mr rkey=1",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(shift_exchange_mri_decode(bad[i], strlen(bad[i]), &r), -EINVAL);
	/* one key more than a chunk holds */
	char many[SHIFT_MRI_VALUE_MAX + 32];
	int m = snprintf(many, sizeof(many), "shift1 mri ver=1 chunks=1 keys=0");

	for (unsigned i = 1; i <= SHIFT_MRI_CHUNK_KEYS; i++)
		m += snprintf(many + m, sizeof(many) - (size_t)m, ",%u", i);
	assert_int_equal(shift_exchange_mri_decode(many, (size_t)m, &r), -EINVAL);
}

static void test_mr(void **state)
{
	char buf[SHIFT_EXCHANGE_VALUE_MAX], key[SHIFT_EXCHANGE_KEY_MAX];
	struct shift_mr_value r, v = { .bk_rkey = 4000000000u };
	union ibv_gid g;
	(void)state;

	memset(&g, 0xab, sizeof(g));
	/* without a range (an older writer's record) */
	int n = shift_exchange_mr_encode(&v, buf, sizeof(buf));
	assert_int_equal(shift_exchange_mr_decode(buf, (size_t)n, &r), 0);
	assert_true(r.bk_rkey == 4000000000u && !r.has_range);
	/* with one, up to the largest values */
	v = (struct shift_mr_value){ .bk_rkey = 7, .has_range = true,
				     .addr = 0x7f0000001000ull, .len = 1ull << 40 };
	n = shift_exchange_mr_encode(&v, buf, sizeof(buf));
	assert_string_equal(buf, "shift1 mr rkey=7 addr=139637976731648 len=1099511627776");
	assert_int_equal(shift_exchange_mr_decode(buf, (size_t)n, &r), 0);
	assert_true(r.has_range && r.addr == v.addr && r.len == v.len && r.bk_rkey == 7);
	const char *max = "shift1 mr rkey=1 addr=0 len=18446744073709551615";
	assert_int_equal(shift_exchange_mr_decode(max, strlen(max), &r), 0);
	assert_true(r.len == UINT64_MAX);
	const char *bad[] = {
		"shift1 mr rkey=",
		"shift1 mr rkey=4294967296",
		"shift1 mr rkey=1 addr=0 len=18446744073709551616", /* (2^64) */
		"shift1 mr rkey=1 addr=1 len=18446744073709551615", /* (wraps) */
		"shift1 mr rkey=1 addr=5",
		"shift1 mr rkey=1 len=5 addr=0",
		"shift1 mr rkey=1 addr=5 len=5 x=1",
		"shift1 mr rkey=1 addr=-5 len=5",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(shift_exchange_mr_decode(bad[i], strlen(bad[i]), &r), -EINVAL);

	assert_true(shift_exchange_mr_key(&g, 9, key, sizeof(key)) > 0);
	assert_string_equal(key, "mr:{abababababababababababababababab}:9");
}

static void test_backup_pick(void **state)
{
	struct shift_backup_cand c[] = {
		{ .name = "rxe1", .numa = -1, .nports = 1,
		  .port = { { IBV_LINK_LAYER_ETHERNET, true } } },
		{ .name = "rxe0", .numa = -1, .nports = 1,
		  .port = { { IBV_LINK_LAYER_ETHERNET, true } } },
		{ .name = "mlx5_0", .numa = -1, .nports = 1,
		  .port = { { IBV_LINK_LAYER_INFINIBAND, true } } },
		{ .name = "rxe2", .numa = -1, .nports = 1,
		  .port = { { IBV_LINK_LAYER_ETHERNET, false } } },
	};
	char out[64];
	(void)state;

	/* automatic: next active, same link layer, name order, cyclic */
	assert_int_equal(shift_backup_pick(c, 4, "rxe0", "", out, sizeof(out)), 0);
	assert_string_equal(out, "rxe1");
	assert_int_equal(shift_backup_pick(c, 4, "rxe1", "", out, sizeof(out)), 0);
	assert_string_equal(out, "rxe0"); /* rxe2 is down: wraps around */
	assert_int_equal(shift_backup_pick(c, 4, "mlx5_0", "", out, sizeof(out)), -ENODEV);
	assert_int_equal(shift_backup_pick(c, 1, "rxe1", "", out, sizeof(out)), -ENODEV);
	/* explicit map */
	assert_int_equal(shift_backup_pick(c, 4, "rxe0", "rxe0:rxe2,rxe1:rxe0", out, sizeof(out)), 0);
	assert_string_equal(out, "rxe2");
	assert_int_equal(shift_backup_pick(c, 4, "rxe1", "rxe0:rxe2,rxe1:rxe0", out, sizeof(out)), 0);
	assert_string_equal(out, "rxe0");
	assert_int_equal(shift_backup_pick(c, 4, "mlx5_0", "rxe0:rxe1", out, sizeof(out)), -ENOENT);
	assert_int_equal(shift_backup_pick(c, 4, "rxe0", "rxe0:nope", out, sizeof(out)), -ENODEV);
	assert_int_equal(shift_backup_pick(c, 4, "rxe0", "rxe0rxe1", out, sizeof(out)), -EINVAL);
	assert_int_equal(shift_backup_pick(c, 4, "rxe0", "rxe0:", out, sizeof(out)), -EINVAL);
	assert_int_equal(shift_backup_pick(c, 4, "rxe0", "rxe0:rxe0", out, sizeof(out)), -EINVAL);
}

/* A connection end's failover episode record: round trip, key, and the
 * malformed values a peer of another version or a corrupt store gives. */
static void test_ep(void **state)
{
	struct shift_qp_key k = { .qpn = 31 };
	char key[SHIFT_EXCHANGE_KEY_MAX], val[64];
	unsigned g = 99, st = 99;
	(void)state;

	k.gid.raw[10] = 0xff;
	k.gid.raw[11] = 0xff;
	k.gid.raw[12] = 198;
	k.gid.raw[13] = 18;
	k.gid.raw[15] = 1;
	assert_true(shift_exchange_ep_key(&k, key, sizeof(key)) > 0);
	assert_string_equal(key, "ep:{00000000000000000000ffffc6120001}:31");
	int n = shift_exchange_ep_encode(3, 4, val, sizeof(val));
	assert_true(n > 0);
	assert_int_equal(shift_exchange_ep_decode(val, (size_t)n, &g, &st), 0);
	assert_int_equal(g, 3);
	assert_int_equal(st, 4);
	assert_true(shift_exchange_ep_encode(3, 4, val, 8) < 0); /* too small: an error, not a cut */
	/* a return episode's record carries the receive counter */
	n = shift_exchange_ep_encode(3, 4, val, sizeof(val));
	struct shift_ep_value ev = { .ret = true, .count = 1, .bkfail = true };
	assert_int_equal(shift_exchange_ep_decode_ex(val, (size_t)n, &ev), 0);
	assert_false(ev.ret);
	assert_false(ev.bkfail);
	ev = (struct shift_ep_value){ .gen = 5, .started = 6, .ret = true, .count = 4000000000u };
	n = shift_exchange_ep_encode_ex(&ev, val, sizeof(val));
	assert_true(n > 0);
	memset(&ev, 0, sizeof(ev));
	assert_int_equal(shift_exchange_ep_decode_ex(val, (size_t)n, &ev), 0);
	assert_true(ev.ret);
	assert_int_equal(ev.gen, 5);
	assert_int_equal(ev.started, 6);
	assert_int_equal(ev.count, 4000000000u);
	assert_false(ev.bkfail);
	assert_int_equal(shift_exchange_ep_decode(val, (size_t)n, &g, &st), 0);
	/* ... and whether the end's backup failed */
	ev = (struct shift_ep_value){ .gen = 1, .started = 2, .bkfail = true };
	n = shift_exchange_ep_encode_ex(&ev, val, sizeof(val));
	memset(&ev, 0, sizeof(ev));
	assert_int_equal(shift_exchange_ep_decode_ex(val, (size_t)n, &ev), 0);
	assert_true(ev.bkfail);
	assert_false(ev.ret);
	assert_false(ev.nosend);
	/* ... and whether its application never sends, with or without the rest */
	for (int k = 0; k < 4; k++) {
		ev = (struct shift_ep_value){ .gen = 1, .started = 2, .ret = k & 1, .count = 9,
					      .bkfail = k & 2, .nosend = true };
		n = shift_exchange_ep_encode_ex(&ev, val, sizeof(val));
		memset(&ev, 0, sizeof(ev));
		assert_int_equal(shift_exchange_ep_decode_ex(val, (size_t)n, &ev), 0);
		assert_true(ev.nosend);
		assert_int_equal(ev.ret, k & 1);
		assert_int_equal(ev.bkfail, !!(k & 2));
	}
	const char *bad[] = { "", "shift1 ep gen=1", "shift1 ep gen=1 started=", "shift1 ep gen=x started=2",
			      "shift1 ep gen=99999 started=2", "shift1 ep gen=1 started=2 more",
			      "shift1 qp gen=1 started=2", "shift0 ep gen=1 started=2",
			      "shift1 ep gen=1 started=2 nosend=1 bkfail=1",
			      "shift1 ep gen=1 started=2 nosend=2", "shift1 ep gen=1 started=2 nosend=1 nosend=1" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		g = st = 7;
		assert_int_equal(shift_exchange_ep_decode(bad[i], strlen(bad[i]), &g, &st), -EINVAL);
		assert_int_equal(g, 7);
		assert_int_equal(st, 7);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_qp_roundtrip),
		cmocka_unit_test(test_qp_decode_rejects),
		cmocka_unit_test(test_mr),
		cmocka_unit_test(test_qp_mri),
		cmocka_unit_test(test_qp_mailbox),
		cmocka_unit_test(test_mri),
		cmocka_unit_test(test_backup_pick),
		cmocka_unit_test(test_ep),
	};
	return test_env_run_group_tests(tests);
}
