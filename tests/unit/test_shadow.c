/*
 * Unit tests of shadow control verbs (shift/shadow.c) on the simulated
 * RNIC with the in-memory KV store: two hosts of two NICs each in one
 * process, the application on NIC 0 of each, SHIFT stacked in between
 * (app -> shift_verbs -> sim). Replay runs synchronously
 * (shift_inline_load(), tests/sim/fixture/shift_inline.h), so each test decides when each host's thread "runs".
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "kv/kv.h"
#include "shift/base/config.h"
#include "shift_inline.h"
#include "shift/shadow/exchange.h"
#include "shift/shadow/shadow.h"
#include "shift/shift.h"
#include "sim.h"
#include "ep.h"
#include "test_env.h"

/* verbs.h's inline fallbacks name these; the simulator never takes them. */
int (ibv_query_port)(struct ibv_context *c, uint8_t p, struct _compat_ibv_port_attr *a)
{
	(void)c; (void)p; (void)a;
	fail_msg("legacy ibv_query_port reached");
	return -1;
}

static struct sim_world *world;
static struct sim_host *host[2];
static struct shift_lower both; /* the sim, listing both hosts' devices */
static char kvname[32];

static struct ibv_device **both_get_device_list(int *n)
{
	int na = 0, nb = 0;
	struct ibv_device **a = sim_lower(host[0])->get_device_list(&na);
	struct ibv_device **b = sim_lower(host[1])->get_device_list(&nb);
	struct ibv_device **l = calloc((size_t)(na + nb + 1), sizeof(*l));

	memcpy(l, a, sizeof(*l) * (size_t)na);
	memcpy(l + na, b, sizeof(*l) * (size_t)nb);
	sim_lower(host[0])->free_device_list(a);
	sim_lower(host[1])->free_device_list(b);
	*n = na + nb;
	return l;
}

static void both_free_device_list(struct ibv_device **l)
{
	free(l);
}

static int setup(void **state)
{
	static int run;
	(void)state;

	world = sim_world_create(NULL);
	host[0] = sim_host_create(world, 2);
	host[1] = sim_host_create(world, 2);
	both = *sim_lower(host[0]);
	both.get_device_list = both_get_device_list;
	both.free_device_list = both_free_device_list;
	shift_lower_set(&both);
	snprintf(kvname, sizeof(kvname), "shadow%d", run++);
	char url[64];
	snprintf(url, sizeof(url), "mem://%s", kvname);
	test_setenv("SHIFT_KV_URL", url);
	test_setenv("SHIFT_KV_NAMESPACE", "job42");
	test_setenv("SHIFT_STATUS_DIR", "");
	shift_inline_load();
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	sim_world_destroy(world);
	test_env_restore();
	return 0;
}

static const struct ibv_qp_cap cap = {
	.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2,
};
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static void open_pair(struct sim_ep *a, struct sim_ep *b)
{
	char an[32], bn[32];

	snprintf(an, sizeof(an), "%s", sim_dev_name(sim_host_dev(host[0], 0)));
	snprintf(bn, sizeof(bn), "%s", sim_dev_name(sim_host_dev(host[1], 0)));
	assert_int_equal(sim_ep_open(a, &shift_verbs, an, 4096, ACCESS, &cap, 64, SIM_EP_CHANNEL), 0);
	assert_int_equal(sim_ep_open(b, &shift_verbs, bn, 4096, ACCESS, &cap, 64, 0), 0);
}

static void connect_pair(struct sim_ep *a, struct sim_ep *b)
{
	struct sim_ep_info ia, ib;

	sim_ep_info(a, 100, &ia);
	sim_ep_info(b, 200, &ib);
	assert_int_equal(sim_ep_connect(a, &ia, &ib, NULL), 0);
	assert_int_equal(sim_ep_connect(b, &ib, &ia, NULL), 0);
}

static void passes(struct ibv_context *a, struct ibv_context *b, int n)
{
	for (int i = 0; i < n; i++) {
		shift_rnic_pass(shift_rnic_of(a));
		shift_rnic_pass(shift_rnic_of(b));
	}
}

static void assert_paired(struct sim_ep *a, struct sim_ep *b)
{
	struct shift_qp_info qa, qb;
	struct ibv_qp_attr at;
	struct ibv_qp_init_attr it;

	assert_int_equal(shift_shadow_qp_info(a->qp, &qa), 0);
	assert_int_equal(shift_shadow_qp_info(b->qp, &qb), 0);
	assert_int_equal(qa.state, SHIFT_SHADOW_READY);
	assert_int_equal(qb.state, SHIFT_SHADOW_READY);
	assert_int_equal(qa.bk_state, IBV_QPS_RTS);
	/* each backup QP is connected to the peer's backup QP, on NIC 1 */
	assert_int_equal(qa.peer_bk_qpn, qb.bk->qp_num);
	assert_int_equal(qb.peer_bk_qpn, qa.bk->qp_num);
	assert_ptr_equal(qa.bk->context, shift_rnic_of(a->ctx) ? qa.bk->context : NULL);
	assert_string_equal(qa.bk_dev, sim_dev_name(sim_host_dev(host[0], 1)));
	assert_string_equal(qb.bk_dev, sim_dev_name(sim_host_dev(host[1], 1)));
	assert_int_equal(shift_lower->query_qp(qa.bk, &at, IBV_QP_STATE | IBV_QP_DEST_QPN, &it), 0);
	assert_int_equal(at.qp_state, IBV_QPS_RTS);
	assert_int_equal(at.dest_qp_num, qb.bk->qp_num);
}

/* The backup rkey of (gid, rkey) as the peer would find it in the store. */
static int kv_backup_rkey(struct ibv_context *ctx, uint32_t rkey, uint32_t *out)
{
	shift_kv *h;
	union ibv_gid gid;
	char key[SHIFT_EXCHANGE_KEY_MAX], url[64];
	void *v;
	size_t len;
	int rc;

	snprintf(url, sizeof(url), "mem://%s", kvname);
	assert_int_equal(shift_kv_open(url, "job42", NULL, &h), 0);
	assert_int_equal(shift_lower->query_gid(ctx, 1, 1, &gid), 0);
	shift_exchange_mr_key(&gid, rkey, key, sizeof(key));
	rc = shift_kv_get(h, key, &v, &len);
	if (!rc) {
		struct shift_mr_value mv;

		rc = shift_exchange_mr_decode(v, len, &mv);
		free(v);
		*out = mv.bk_rkey;
	}
	shift_kv_close(h);
	return rc;
}

static void test_pair_is_shadowed(void **state)
{
	struct sim_ep a, b;
	uint32_t bk_rkey;
	(void)state;

	open_pair(&a, &b);
	connect_pair(&a, &b);
	passes(a.ctx, b.ctx, 3);
	assert_paired(&a, &b);

	/* MRs: a backup on the backup NIC, its rkey in the store under the
	 * default (GID, rkey) */
	struct ibv_mr *bk = shift_shadow_mr_backup(a.mr);
	assert_non_null(bk);
	assert_ptr_not_equal(bk->context, a.ctx);
	assert_ptr_equal(bk->addr, a.mr->addr);
	assert_int_equal(kv_backup_rkey(a.ctx, a.mr->rkey, &bk_rkey), 0);
	assert_int_equal(bk_rkey, bk->rkey);

	/* more MR variants registered after the QP exists */
	static char extra[8192];
	struct ibv_mr *m2 = shift_verbs.reg_mr_iova2(a.pd, extra, sizeof(extra), 0x1000, ACCESS);
	assert_non_null(m2);
	passes(a.ctx, b.ctx, 1);
	struct ibv_mr *bk2 = shift_shadow_mr_backup(m2);
	assert_non_null(bk2);
	assert_int_equal(kv_backup_rkey(a.ctx, m2->rkey, &bk_rkey), 0);
	assert_int_equal(bk_rkey, bk2->rkey);

	/* destruction is mirrored: keys go away with the objects */
	uint32_t rkey2 = m2->rkey;
	assert_int_equal(shift_verbs.dereg_mr(m2), 0);
	passes(a.ctx, b.ctx, 1);
	assert_int_equal(kv_backup_rkey(a.ctx, rkey2, &bk_rkey), -ENOENT);

	sim_ep_close(&a);
	sim_ep_close(&b);
}

/* SHIFT paper B.1: each side's thread first meets the QP whose peer is not
 * published yet. Best-effort replay must still finish both. */
static void test_cross_dependency(void **state)
{
	struct sim_ep a1, b1, a2, b2;
	struct sim_ep_info i_a1, i_b1, i_a2, i_b2;
	(void)state;

	open_pair(&a1, &b1);
	open_pair(&a2, &b2);
	sim_ep_info(&a1, 1, &i_a1);
	sim_ep_info(&b1, 2, &i_b1);
	sim_ep_info(&a2, 3, &i_a2);
	sim_ep_info(&b2, 4, &i_b2);
	/* host A connects QP 1 and replays; host B connects QP 2 and replays */
	assert_int_equal(sim_ep_connect(&a1, &i_a1, &i_b1, NULL), 0);
	shift_rnic_pass(shift_rnic_of(a1.ctx));
	assert_int_equal(sim_ep_connect(&b2, &i_b2, &i_a2, NULL), 0);
	shift_rnic_pass(shift_rnic_of(b2.ctx));
	/* then the other QP on each side, in the opposite order */
	assert_int_equal(sim_ep_connect(&b1, &i_b1, &i_a1, NULL), 0);
	assert_int_equal(sim_ep_connect(&a2, &i_a2, &i_b2, NULL), 0);
	for (int i = 0; i < 4; i++) {
		shift_rnic_pass(shift_rnic_of(b1.ctx));
		shift_rnic_pass(shift_rnic_of(a1.ctx));
		shift_rnic_pass(shift_rnic_of(a2.ctx));
		shift_rnic_pass(shift_rnic_of(b2.ctx));
	}
	assert_paired(&a1, &b1);
	assert_paired(&a2, &b2);
	sim_ep_close(&a1);
	sim_ep_close(&b1);
	sim_ep_close(&a2);
	sim_ep_close(&b2);
}

/* KV down: the application sets up and moves data as if SHIFT were not
 * there; its QPs wait, unprotected, and are shadowed once the store is back. */
static void test_kv_outage(void **state)
{
	struct sim_ep a, b;
	struct shift_qp_info qi;
	struct shift_shadow_stats st0, st1;
	(void)state;

	shift_shadow_stats_get(&st0);
	assert_int_equal(shift_kv_mem_set_down(kvname, true), 0);
	open_pair(&a, &b);
	connect_pair(&a, &b);
	passes(a.ctx, b.ctx, 3);
	shift_shadow_stats_get(&st1);
	assert_true(st1.kv_errors > st0.kv_errors);
	assert_int_equal(shift_shadow_qp_info(a.qp, &qi), 0);
	assert_int_equal(qi.state, SHIFT_SHADOW_PENDING);
	assert_false(qi.published);

	/* the application's own traffic is unaffected */
	struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = 64, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 7, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)b.buf, .rkey = b.mr->rkey },
	}, *bad;
	struct ibv_wc wc;
	memset(a.buf, 0x5a, 64);
	assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
	sim_world_run_until_idle(world);
	assert_int_equal(ibv_poll_cq(a.cq, 1, &wc), 1);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.wr_id, 7);
	assert_int_equal(b.buf[63], 0x5a);

	/* store back: shadowing completes */
	assert_int_equal(shift_kv_mem_set_down(kvname, false), 0);
	passes(a.ctx, b.ctx, 3);
	assert_paired(&a, &b);
	sim_ep_close(&a);
	sim_ep_close(&b);
}

/* The backup QP record published under (ctx's GID, qpn), as the peer
 * would look it up in the store. */
static int kv_qp_record(struct ibv_context *ctx, uint32_t qpn, struct shift_qp_value *out)
{
	struct shift_qp_key k = { .qpn = qpn };
	shift_kv *h;
	char key[SHIFT_EXCHANGE_KEY_MAX], url[64];
	void *v;
	size_t len;
	int rc;

	snprintf(url, sizeof(url), "mem://%s", kvname);
	assert_int_equal(shift_kv_open(url, "job42", NULL, &h), 0);
	assert_int_equal(shift_lower->query_gid(ctx, 1, 1, &k.gid), 0);
	assert_true(shift_exchange_qp_key(&k, key, sizeof(key)) > 0);
	rc = shift_kv_get(h, key, &v, &len);
	if (!rc) {
		rc = shift_exchange_qp_decode(v, len, out);
		free(v);
	}
	shift_kv_close(h);
	return rc;
}

/* Still waiting for the peer: my record in the store, none under the
 * peer's name, the backup QP at INIT, connected to nothing. */
static void assert_waiting_for_peer(struct sim_ep *a, struct sim_ep *b)
{
	struct shift_qp_info qi;
	struct shift_qp_value mine, peers;

	assert_int_equal(shift_shadow_qp_info(a->qp, &qi), 0);
	assert_int_equal(qi.state, SHIFT_SHADOW_PENDING);
	assert_true(qi.published);
	assert_non_null(qi.bk);
	assert_int_equal(qi.bk_state, IBV_QPS_INIT);
	assert_int_equal(qi.peer_bk_qpn, 0);
	assert_int_equal(kv_qp_record(a->ctx, a->qp->qp_num, &mine), 0);
	assert_int_equal(mine.qpn, qi.bk->qp_num);
	assert_int_equal(kv_qp_record(b->ctx, b->qp->qp_num, &peers), -ENOENT);
}

/* A peer without SHIFT never publishes: the QP stays unprotected (its
 * shadow waits for the peer, however many passes run), and the
 * application is unaffected: its traffic in both directions, through more
 * WRs than its queues (and SHIFT's mirror of them) hold, works as without
 * SHIFT. */
static void test_peer_without_shift(void **state)
{
	struct sim_ep a, b;
	char bn[32];
	struct sim_ep_info ia, ib;
	struct ibv_wc wc;
	struct ibv_send_wr *bad_s;
	struct ibv_recv_wr *bad_r;
	(void)state;

	snprintf(bn, sizeof(bn), "%s", sim_dev_name(sim_host_dev(host[1], 0)));
	assert_int_equal(sim_ep_open(&a, &shift_verbs, sim_dev_name(sim_host_dev(host[0], 0)),
				     4096, ACCESS, &cap, 64, 0), 0);
	assert_int_equal(sim_ep_open(&b, &both, bn, 4096, ACCESS, &cap, 64, 0), 0); /* plain */
	sim_ep_info(&a, 1, &ia);
	sim_ep_info(&b, 2, &ib);
	assert_int_equal(sim_ep_connect(&a, &ia, &ib, NULL), 0);
	assert_int_equal(sim_ep_connect(&b, &ib, &ia, NULL), 0);
	for (int i = 0; i < 8; i++)
		shift_rnic_pass(shift_rnic_of(a.ctx));
	assert_waiting_for_peer(&a, &b);

	/* A writes to B, then B sends to A, each 3 * 16 times, one at a time */
	for (int i = 0; i < 48; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)a.buf + 64 * (i % 32), .length = 64,
				       .lkey = a.mr->lkey };
		struct ibv_send_wr wr = {
			.wr_id = 100 + i, .sg_list = &sge, .num_sge = 1,
			.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = (uintptr_t)b.buf + 64 * (i % 32),
				     .rkey = b.mr->rkey },
		};

		memset(a.buf + 64 * (i % 32), i, 64);
		assert_int_equal(ibv_post_send(a.qp, &wr, &bad_s), 0);
		sim_world_run_until_idle(world);
		shift_rnic_pass(shift_rnic_of(a.ctx));
		assert_int_equal(ibv_poll_cq(a.cq, 1, &wc), 1);
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		assert_int_equal(wc.wr_id, 100 + i);
		assert_int_equal(wc.qp_num, a.qp->qp_num);
		assert_int_equal(b.buf[64 * (i % 32) + 63], i);
	}
	for (int i = 0; i < 48; i++) {
		struct ibv_sge rs = { .addr = (uintptr_t)a.buf + 2048, .length = 64,
				      .lkey = a.mr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 200 + i, .sg_list = &rs, .num_sge = 1 };
		struct ibv_sge ss = { .addr = (uintptr_t)b.buf + 2048, .length = 64,
				      .lkey = b.mr->lkey };
		struct ibv_send_wr swr = { .wr_id = 300 + i, .sg_list = &ss, .num_sge = 1,
					   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };

		assert_int_equal(ibv_post_recv(a.qp, &rwr, &bad_r), 0);
		memset(b.buf + 2048, 0x80 + i, 64);
		assert_int_equal(ibv_post_send(b.qp, &swr, &bad_s), 0);
		sim_world_run_until_idle(world);
		shift_rnic_pass(shift_rnic_of(a.ctx));
		assert_int_equal(ibv_poll_cq(a.cq, 1, &wc), 1);
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		assert_int_equal(wc.wr_id, 200 + i);
		assert_int_equal(wc.opcode, IBV_WC_RECV);
		assert_int_equal(wc.qp_num, a.qp->qp_num);
		assert_int_equal(a.buf[2048 + 63], 0x80 + i);
		assert_int_equal(ibv_poll_cq(b.cq, 1, &wc), 1);
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		assert_int_equal(wc.wr_id, 300 + i);
	}
	assert_int_equal(ibv_poll_cq(a.cq, 1, &wc), 0);
	assert_waiting_for_peer(&a, &b);
	sim_ep_close(&a);
	sim_ep_close(&b);
}

/* Plant a record under (b's GID, b's QPN) for backup QPN bk_qpn, written
 * by an end connected to (a's GID, peer_qpn). */
static void plant_qp_record(struct sim_ep *a, struct sim_ep *b, uint32_t bk_qpn,
			    uint32_t peer_qpn)
{
	struct shift_qp_key k = { .qpn = b->qp->qp_num };
	struct shift_qp_value v = { .qpn = bk_qpn, .psn = 1, .mtu = IBV_MTU_1024,
				    .has_peer = true, .peer.qpn = peer_qpn };
	char key[SHIFT_EXCHANGE_KEY_MAX], val[SHIFT_EXCHANGE_VALUE_MAX], url[64];
	shift_kv *h;

	snprintf(url, sizeof(url), "mem://%s", kvname);
	assert_int_equal(shift_kv_open(url, "job42", NULL, &h), 0);
	assert_int_equal(shift_lower->query_gid(b->ctx, 1, 1, &k.gid), 0);
	assert_int_equal(shift_lower->query_gid(b->ctx, 1, 1, &v.gid), 0);
	assert_int_equal(shift_lower->query_gid(a->ctx, 1, 1, &v.peer.gid), 0);
	int kl = shift_exchange_qp_key(&k, key, sizeof(key));
	int vl = shift_exchange_qp_encode(&v, val, sizeof(val));

	assert_true(kl > 0 && vl > 0);
	assert_int_equal(shift_kv_put(h, key, val, (size_t)vl, 0), 0);
	shift_kv_close(h);
}

/* A record under the peer's name that another connection wrote (an
 * earlier job's QP with the same number, connected elsewhere) is not
 * taken: the QP keeps waiting, unprotected; a record written for this
 * very connection is taken. (B runs without SHIFT: only the planted
 * records are there.) */
static void test_other_connection_record_ignored(void **state)
{
	struct sim_ep a, b;
	struct sim_ep_info ia, ib;
	struct shift_qp_info qi;
	struct shift_shadow_stats st;
	(void)state;

	shift_shadow_stats_get(&st);
	unsigned long other = st.records_other;

	assert_int_equal(sim_ep_open(&a, &shift_verbs, sim_dev_name(sim_host_dev(host[0], 0)),
				     4096, ACCESS, &cap, 64, 0), 0);
	assert_int_equal(sim_ep_open(&b, &both, sim_dev_name(sim_host_dev(host[1], 0)), 4096,
				     ACCESS, &cap, 64, 0), 0); /* plain */
	sim_ep_info(&a, 1, &ia);
	sim_ep_info(&b, 2, &ib);
	plant_qp_record(&a, &b, 4242, a.qp->qp_num + 7);
	assert_int_equal(sim_ep_connect(&a, &ia, &ib, NULL), 0);
	assert_int_equal(sim_ep_connect(&b, &ib, &ia, NULL), 0);
	for (int i = 0; i < 8; i++)
		shift_rnic_pass(shift_rnic_of(a.ctx));
	assert_int_equal(shift_shadow_qp_info(a.qp, &qi), 0);
	assert_int_equal(qi.state, SHIFT_SHADOW_PENDING);
	assert_int_equal(qi.peer_bk_qpn, 0);
	shift_shadow_stats_get(&st);
	assert_true(st.records_other > other);

	plant_qp_record(&a, &b, 4243, a.qp->qp_num);
	for (int i = 0; i < 8; i++)
		shift_rnic_pass(shift_rnic_of(a.ctx));
	assert_int_equal(shift_shadow_qp_info(a.qp, &qi), 0);
	assert_int_equal(qi.peer_bk_qpn, 4243);
	sim_ep_close(&a);
	sim_ep_close(&b);
}

/* No backup NIC (one NIC per host): everything runs unprotected, the
 * application works. */
static void test_no_backup_nic(void **state)
{
	struct sim_ep a;
	struct shift_qp_info qi;
	(void)state;

	struct sim_host *lone = sim_host_create(world, 1);
	both = *sim_lower(lone);
	shift_lower_set(&both);
	assert_int_equal(sim_ep_open(&a, &shift_verbs, sim_dev_name(sim_host_dev(lone, 0)),
				     4096, ACCESS, &cap, 64, 0), 0);
	assert_int_equal(shift_shadow_qp_info(a.qp, &qi), 0);
	assert_int_equal(qi.state, SHIFT_SHADOW_UNPROTECTED);
	assert_non_null(qi.why);
	sim_ep_close(&a);
}

/* ---- the application's destroy verbs ---------------------------------------- */

static int (*real_destroy_qp)(struct ibv_qp *qp);

static int busy_destroy_qp(struct ibv_qp *qp)
{
	(void)qp;
	return EBUSY;
}

/*
 * The provider refuses to destroy a protected QP: the application still
 * has it, and SHIFT still protects it. Its shadow is not reaped (it used
 * to be marked dead before the provider's verb, so the data-path state put
 * back pointed at a freed record); a later destroy succeeds and reaps it.
 */
static void test_refused_destroy_qp_stays_protected(void **state)
{
	struct sim_ep a, b;
	struct ibv_qp_attr at;
	(void)state;

	open_pair(&a, &b);
	connect_pair(&a, &b);
	passes(a.ctx, b.ctx, 3);
	assert_paired(&a, &b);
	real_destroy_qp = both.destroy_qp;
	both.destroy_qp = busy_destroy_qp;
	shift_lower_set(&both);
	assert_int_equal(shift_verbs.destroy_qp(a.qp), EBUSY);
	both.destroy_qp = real_destroy_qp;
	shift_lower_set(&both);
	passes(a.ctx, b.ctx, 2);
	assert_int_equal(shift_shadow_qp_state(a.qp), SHIFT_SHADOW_READY);
	assert_paired(&a, &b);
	struct ibv_qp_init_attr init;

	assert_int_equal(shift_verbs.query_qp(a.qp, &at, IBV_QP_STATE, &init), 0);
	assert_int_equal(at.qp_state, IBV_QPS_RTS);
	struct shift_shadow_stats before, after;

	shift_shadow_stats_get(&before);
	assert_int_equal(shift_verbs.destroy_qp(a.qp), 0);
	a.qp = NULL;
	passes(a.ctx, b.ctx, 1);
	shift_shadow_stats_get(&after);
	assert_int_equal(after.qps_ready + 1, before.qps_ready);
	sim_ep_close(&a);
	sim_ep_close(&b);
}

/* dealloc_pd through a provider whose free is followed, before SHIFT
 * records the dealloc, by another thread's alloc_pd and reg_mr, which get
 * the freed PD's address (as malloc gives it back at once) */
static int (*real_dealloc_pd)(struct ibv_pd *pd);
static struct ibv_context *reuse_ctx;
static struct ibv_pd *reused_pd;
static struct ibv_mr *reused_mr;
static char reuse_buf[4096];

static int racing_dealloc_pd(struct ibv_pd *pd)
{
	struct ibv_context *c = reuse_ctx;
	void *fill[8];

	/* (glibc's calloc skips the thread's cache of freed chunks: fill it,
	 * so that the PD's chunk goes where calloc takes from) */
	for (int i = 0; i < 8; i++)
		fill[i] = c ? malloc(sizeof(struct ibv_pd) + sizeof(void *)) : NULL;
	for (int i = 0; i < 8; i++)
		free(fill[i]);
	int rc = real_dealloc_pd(pd);

	reuse_ctx = NULL;
	if (!rc && c) {
		struct ibv_pd *other[64];
		int n = 0;

		/* (until one gets pd's address, as malloc may give it) */
		while ((reused_pd = shift_verbs.alloc_pd(c)) != pd && n < 64)
			other[n++] = reused_pd;
		while (n--)
			assert_int_equal(shift_verbs.dealloc_pd(other[n]), 0);
		assert_non_null(reused_pd);
		reused_mr = shift_verbs.reg_mr(reused_pd, reuse_buf, sizeof(reuse_buf), ACCESS);
		assert_non_null(reused_mr);
	}
	return rc;
}

/*
 * What a destroy marks dead is the record of the object destroyed, not
 * whatever record has its address by then: the new PD at the old one's
 * address keeps its shadow, and its MR gets a backup (the record used to be
 * looked up after the provider's free: the new PD's was marked dead and
 * reaped under its live MR, the old one's never).
 */
static void test_destroy_kills_its_own_record(void **state)
{
	struct sim_ep a, b;
	(void)state;

	open_pair(&a, &b);
	connect_pair(&a, &b);
	passes(a.ctx, b.ctx, 3);
	struct ibv_pd *p = shift_verbs.alloc_pd(a.ctx);

	assert_non_null(p);
	passes(a.ctx, b.ctx, 1);
	real_dealloc_pd = both.dealloc_pd;
	both.dealloc_pd = racing_dealloc_pd;
	shift_lower_set(&both);
	reuse_ctx = a.ctx;
	assert_int_equal(shift_verbs.dealloc_pd(p), 0);
	both.dealloc_pd = real_dealloc_pd;
	shift_lower_set(&both);
	if (p != reused_pd)
		print_message("(the new PD got another address: no race this run) %p %p\n", (void *)p, (void *)reused_pd);
	passes(a.ctx, b.ctx, 2);
	assert_non_null(shift_shadow_mr_backup(reused_mr));
	assert_int_equal(shift_verbs.dereg_mr(reused_mr), 0);
	assert_int_equal(shift_verbs.dealloc_pd(reused_pd), 0);
	passes(a.ctx, b.ctx, 1);
	sim_ep_close(&a);
	sim_ep_close(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_pair_is_shadowed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cross_dependency, setup, teardown),
		cmocka_unit_test_setup_teardown(test_kv_outage, setup, teardown),
		cmocka_unit_test_setup_teardown(test_peer_without_shift, setup, teardown),
		cmocka_unit_test_setup_teardown(test_other_connection_record_ignored, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_no_backup_nic, setup, teardown),
		cmocka_unit_test_setup_teardown(test_refused_destroy_qp_stays_protected, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_destroy_kills_its_own_record, setup,
						teardown),
	};
	return test_env_run_group_tests(tests);
}
