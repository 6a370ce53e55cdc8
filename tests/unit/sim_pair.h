/*
 * The fixture of the failover tests on the simulated RNIC: two hosts with
 * two NICs each, an application endpoint through SHIFT on NIC 0 of each
 * (A on host 0, B on host 1), SHIFT's background work run synchronously
 * and its KV store in memory. Include once per test binary, after cmocka.
 */
#ifndef SHIFT_TESTS_SIM_PAIR_H
#define SHIFT_TESTS_SIM_PAIR_H

#include <inttypes.h>

#include "shift/base/config.h"
#include "shift_inline.h"
#include "shift/shadow/shadow.h"
#include "shift/shift.h"
#include "shift/dp/state.h"
#include "sim.h"
#include "ep.h"
#include "test_env.h"

/* SHIFT never calls the legacy query_port entry (it reaches the provider's). */
int (ibv_query_port)(struct ibv_context *c, uint8_t p, struct _compat_ibv_port_attr *a)
{
	(void)c; (void)p; (void)a;
	fail_msg("legacy ibv_query_port reached");
	return -1;
}

#define SIM_PAIR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
			 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

struct sim_pair {
	struct sim_world *world;
	struct sim_host *host[2];
	struct sim_ep *a, *b;
	struct sim_ep_info ia, ib;
};

/* Error completions the running test expects its polls to see (reset by
 * sim_pair_open): see sim_pair_poll1(). */
static int sim_pair_errors_expected;

/* The test expects n error completions (in all), each checked by the test. */
static inline void sim_pair_expect_errors(int n)
{
	sim_pair_errors_expected = n;
}

/*
 * Poll one completion from the CQ of endpoint who ("A", "B") into wc, as
 * the tests' drive loops do: 1 or 0. A negative return fails the test, and
 * so does an error completion beyond those the test said it expects.
 */
static inline int sim_pair_poll1(const char *who, const struct sim_ep *e, struct ibv_wc *wc)
{
	int n = ibv_poll_cq(e->cq, 1, wc);
	unsigned qpn = e->qp ? e->qp->qp_num : 0;

	if (n < 0)
		fail_msg("%s: ibv_poll_cq on CQ %p (QP %u) returned %d", who, (void *)e->cq, qpn, n);
	if (n > 0 && wc->status != IBV_WC_SUCCESS && sim_pair_errors_expected-- <= 0)
		fail_msg("%s: unexpected error completion on CQ %p (QP %u): wr_id %" PRIu64
			 " status %d vendor_err %u (completion's QP %u)",
			 who, (void *)e->cq, qpn, wc->wr_id, wc->status, wc->vendor_err, wc->qp_num);
	return n;
}

/* A new world with both endpoints open (ep_flags: sim_ep_open's), not
 * connected. kv names the in-memory KV store (a fresh one per call). */
static inline void sim_pair_open(struct sim_pair *p, struct sim_ep *a, struct sim_ep *b,
				 const char *kv, unsigned ep_flags)
{
	static int run;
	char url[64];
	struct ibv_qp_cap cap = { .max_send_wr = 64, .max_recv_wr = 64,
				  .max_send_sge = 2, .max_recv_sge = 2, .max_inline_data = 64 };

	p->a = a;
	p->b = b;
	sim_pair_errors_expected = 0;
	p->world = sim_world_create(NULL);
	p->host[0] = sim_host_create(p->world, 2);
	p->host[1] = sim_host_create(p->world, 2);
	shift_lower_set(sim_lower_world(p->world));
	snprintf(url, sizeof(url), "mem://%s%d", kv, run++);
	test_setenv("SHIFT_KV_URL", url);
	test_setenv("SHIFT_STATUS_DIR", "");
	shift_inline_load();
	assert_int_equal(sim_ep_open(a, &shift_verbs, "sim0_0", 1 << 16, SIM_PAIR_ACCESS, &cap, 256,
				     ep_flags), 0);
	assert_int_equal(sim_ep_open(b, &shift_verbs, "sim1_0", 1 << 16, SIM_PAIR_ACCESS, &cap, 256,
				     ep_flags), 0);
	sim_ep_info(a, 1, &p->ia);
	sim_ep_info(b, 2, &p->ib);
}

/* Connect A and B and let SHIFT shadow A's QP (READY). */
static inline void sim_pair_connect(struct sim_pair *p)
{
	struct shift_qp_info qi;

	assert_int_equal(sim_ep_connect(p->a, &p->ia, &p->ib, NULL), 0);
	assert_int_equal(sim_ep_connect(p->b, &p->ib, &p->ia, NULL), 0);
	for (int i = 0; i < 4; i++)
		shift_rnic_pass_all();
	assert_int_equal(shift_shadow_qp_info(p->a->qp, &qi), 0);
	assert_int_equal(qi.state, SHIFT_SHADOW_READY);
}

/* Close both endpoints and the world; the environment the test changed
 * (test_setenv) goes back to what it was. */
static inline void sim_pair_close(struct sim_pair *p)
{
	/* every state change SHIFT made was one its state machine allows */
	assert_int_equal(shift_dqp_illegal_transitions(), 0);
	sim_ep_close(p->a);
	sim_ep_close(p->b);
	sim_world_destroy(p->world);
	test_env_restore();
}

#endif /* SHIFT_TESTS_SIM_PAIR_H */
