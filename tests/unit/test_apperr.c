/*
 * The application's errors through SHIFT (shift/dp/errclass.h,
 * shift/fo/apperr.c): the classification of every ibv_wc_status, and
 * errors the application causes on the simulated RNIC reaching it exactly
 * as without SHIFT. Each scenario runs twice, once on the simulator's own
 * verbs (plain) and once through SHIFT, and the two must agree completion
 * for completion (wr_id, status, the opcode of successes, order, per
 * endpoint) and in the QP states the application reads afterwards.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "sim_pair.h"
#include "shift/dp/ctx.h"
#include "shift/dp/errclass.h"

/* ---- the classification ---------------------------------------------- */

static void test_every_status_has_its_class(void **state)
{
	static const struct { enum ibv_wc_status st; enum shift_wc_class k; } table[] = {
		{ IBV_WC_SUCCESS, SHIFT_WC_OK },
		{ IBV_WC_LOC_LEN_ERR, SHIFT_WC_APP },
		{ IBV_WC_LOC_QP_OP_ERR, SHIFT_WC_APP },
		{ IBV_WC_LOC_EEC_OP_ERR, SHIFT_WC_APP },
		{ IBV_WC_LOC_PROT_ERR, SHIFT_WC_APP },
		{ IBV_WC_WR_FLUSH_ERR, SHIFT_WC_FLUSH },
		{ IBV_WC_MW_BIND_ERR, SHIFT_WC_APP },
		{ IBV_WC_BAD_RESP_ERR, SHIFT_WC_APP },
		{ IBV_WC_LOC_ACCESS_ERR, SHIFT_WC_APP },
		{ IBV_WC_REM_INV_REQ_ERR, SHIFT_WC_APP },
		{ IBV_WC_REM_ACCESS_ERR, SHIFT_WC_APP },
		{ IBV_WC_REM_OP_ERR, SHIFT_WC_APP },
		{ IBV_WC_RETRY_EXC_ERR, SHIFT_WC_PATH },
		{ IBV_WC_RNR_RETRY_EXC_ERR, SHIFT_WC_APP },
		{ IBV_WC_LOC_RDD_VIOL_ERR, SHIFT_WC_APP },
		{ IBV_WC_REM_INV_RD_REQ_ERR, SHIFT_WC_APP },
		{ IBV_WC_REM_ABORT_ERR, SHIFT_WC_APP },
		{ IBV_WC_INV_EECN_ERR, SHIFT_WC_APP },
		{ IBV_WC_INV_EEC_STATE_ERR, SHIFT_WC_APP },
		{ IBV_WC_FATAL_ERR, SHIFT_WC_PATH },
		{ IBV_WC_RESP_TIMEOUT_ERR, SHIFT_WC_PATH },
		{ IBV_WC_GENERAL_ERR, SHIFT_WC_APP },
		{ IBV_WC_TM_ERR, SHIFT_WC_APP },
		{ IBV_WC_TM_RNDV_INCOMPLETE, SHIFT_WC_APP },
	};
	(void)state;
	/* every value of the enum, in order: a new one fails here until the
	 * table (and docs/failover.md's) says what it is */
	assert_int_equal(sizeof(table) / sizeof(table[0]), IBV_WC_TM_RNDV_INCOMPLETE + 1);
	for (unsigned i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		assert_int_equal(table[i].st, i);
		if (shift_wc_class(table[i].st) != table[i].k)
			fail_msg("status %u: class %s, expected %s", i,
				 shift_wc_class_name(shift_wc_class(table[i].st)),
				 shift_wc_class_name(table[i].k));
	}
	/* a status newer than the table is passed on, never hidden */
	assert_int_equal(shift_wc_class((enum ibv_wc_status)(IBV_WC_TM_RNDV_INCOMPLETE + 7)),
			 SHIFT_WC_APP);
}

/* ---- plain against SHIFT ---------------------------------------------- */

struct seen {
	int n;
	struct { uint64_t wr_id; int status, opcode; } e[96];
};

struct outcome {
	struct seen a, b;
	int qa, qb; /* QP states, as the application's query_qp reads them */
	/* posts the provider refused: errno * 100 + the refused WR's place */
	int nref, ref[8];
};

struct env {
	bool shift;
	struct sim_world *w;
	struct sim_host *h[2];
	const struct shift_lower *v;
	struct sim_ep a, b;
	int nref, ref[8]; /* (struct outcome) */
};

/* the simulator's mlx5 mode: SHIFT reads its WQEs back (the native path) */
static bool mlx5_mode;

static const struct sim_ep_conn conn_default = { 14, 7, 7, 12, 16, 0 };

static void env_open(struct env *e, bool shift, const struct sim_ep_conn *ca,
		     const struct sim_ep_conn *cb)
{
	static int run;
	char url[64];
	struct ibv_qp_cap cap = { .max_send_wr = 64, .max_recv_wr = 64,
				  .max_send_sge = 2, .max_recv_sge = 2, .max_inline_data = 64 };
	struct sim_ep_info ia, ib;

	memset(e, 0, sizeof(*e));
	e->shift = shift;
	struct sim_world_opts wo = { .mlx5 = mlx5_mode };

	e->w = sim_world_create(&wo);
	e->h[0] = sim_host_create(e->w, 2);
	e->h[1] = sim_host_create(e->w, 2);
	shift_lower_set(sim_lower_world(e->w));
	snprintf(url, sizeof(url), "mem://apperr%d", run++);
	test_setenv("SHIFT_KV_URL", url);
	test_setenv("SHIFT_STATUS_DIR", "");
	shift_inline_load();
	e->v = shift ? &shift_verbs : sim_lower_world(e->w);
	assert_int_equal(sim_ep_open(&e->a, e->v, "sim0_0", 1 << 16, SIM_PAIR_ACCESS, &cap, 256, 0), 0);
	assert_int_equal(sim_ep_open(&e->b, e->v, "sim1_0", 1 << 16, SIM_PAIR_ACCESS, &cap, 256, 0), 0);
	sim_ep_info(&e->a, 1, &ia);
	sim_ep_info(&e->b, 2, &ib);
	assert_int_equal(sim_ep_connect(&e->a, &ia, &ib, ca ? ca : &conn_default), 0);
	assert_int_equal(sim_ep_connect(&e->b, &ib, &ia, cb ? cb : &conn_default), 0);
	for (int i = 0; shift && i < 4; i++)
		shift_rnic_pass_all();
}

static void env_close(struct env *e)
{
	if (e->shift)
		assert_int_equal(shift_dqp_illegal_transitions(), 0);
	sim_ep_close(&e->a);
	sim_ep_close(&e->b);
	sim_world_destroy(e->w);
	test_env_restore();
}

static int poll_one(struct sim_ep *ep, struct seen *s)
{
	struct ibv_wc wc;
	int n = ibv_poll_cq(ep->cq, 1, &wc);

	assert_true(n >= 0);
	if (n) {
		assert_true(s->n < 96);
		assert_int_equal(wc.qp_num, ep->qp->qp_num);
		s->e[s->n].wr_id = wc.wr_id;
		s->e[s->n].status = wc.status;
		/* (an error completion's opcode is undefined in verbs) */
		s->e[s->n].opcode = wc.status == IBV_WC_SUCCESS ? (int)wc.opcode : -1;
		s->n++;
	}
	return n;
}

/* Network, SHIFT's passes and both applications' polls until nothing moves
 * for `quiet` rounds (who: 1 A only, 2 B only, 3 both). */
static void drive(struct env *e, struct outcome *o, int quiet, int who)
{
	for (int idle = 0; idle < quiet;) {
		int moved = sim_world_step(e->w) != 0;

		if (e->shift)
			shift_rnic_pass_all();
		if (who & 1)
			moved += poll_one(&e->a, &o->a);
		if (who & 2)
			moved += poll_one(&e->b, &o->b);
		idle = moved ? 0 : idle + 1;
	}
}

static int qp_state(struct env *e, struct sim_ep *ep)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;

	memset(&attr, 0, sizeof(attr));
	assert_int_equal(e->v->query_qp(ep->qp, &attr, IBV_QP_STATE, &init), 0);
	return attr.qp_state;
}

/* ---- work requests ---------------------------------------------------- */

static void wr_write(struct sim_ep *a, struct sim_ep *b, uint64_t id, uint32_t off, bool sig,
		     uint32_t rkey_bad, uint32_t lkey_bad)
{
	struct ibv_sge sge = { (uintptr_t)a->buf + off, 64, a->mr->lkey + lkey_bad };
	struct ibv_send_wr *bad, wr = {
		.wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = sig ? IBV_SEND_SIGNALED : 0,
		.wr.rdma = { .remote_addr = (uintptr_t)b->buf + off, .rkey = b->mr->rkey + rkey_bad },
	};

	memset(a->buf + off, (int)(id & 0x7f), 64);
	assert_int_equal(ibv_post_send(a->qp, &wr, &bad), 0);
}

static void wr_send(struct sim_ep *a, uint64_t id, uint32_t off, uint32_t len, bool sig)
{
	struct ibv_sge sge = { (uintptr_t)a->buf + off, len, a->mr->lkey };
	struct ibv_send_wr *bad, wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1,
					.opcode = IBV_WR_SEND,
					.send_flags = sig ? IBV_SEND_SIGNALED : 0 };

	assert_int_equal(ibv_post_send(a->qp, &wr, &bad), 0);
}

static void wr_recv(struct sim_ep *b, uint64_t id, uint32_t off, uint32_t len, uint32_t lkey_bad)
{
	struct ibv_sge sge = { (uintptr_t)b->buf + off, len, b->mr->lkey + lkey_bad };
	struct ibv_recv_wr *bad, wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 };

	assert_int_equal(ibv_post_recv(b->qp, &wr, &bad), 0);
}

static void wr_fetch_add(struct sim_ep *a, struct sim_ep *b, uint64_t id, uint32_t roff)
{
	struct ibv_sge sge = { (uintptr_t)a->buf + 8192, 8, a->mr->lkey };
	struct ibv_send_wr *bad, wr = {
		.wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.atomic = { .remote_addr = (uintptr_t)b->buf + roff, .compare_add = 1,
			       .rkey = b->mr->rkey },
	};

	assert_int_equal(ibv_post_send(a->qp, &wr, &bad), 0);
}

/* ---- the scenarios ---------------------------------------------------- */

struct scenario {
	const char *name;
	void (*post)(struct env *e);
	const struct sim_ep_conn *ca, *cb;
	/* what plain shows, checked so a scenario cannot pass vacuously: A's
	 * first error status and B's (0: none) */
	int a_err, b_err;
	/* posts refused (by the provider, plain): so many, and SHIFT keeps
	 * both QPs protected */
	int refused;
};

/* a write with a bad rkey among good ones: the requester gets the remote
 * access error, its later WRs flush; the responder's QP goes to ERR and
 * its receives flush with no error of its own */
static void post_rem_access(struct env *e)
{
	for (int i = 0; i < 4; i++)
		wr_recv(&e->b, 500 + i, 1024 + 64 * i, 64, 0);
	wr_write(&e->a, &e->b, 100, 0, true, 0, 0);
	wr_write(&e->a, &e->b, 101, 64, false, 0, 0);
	wr_write(&e->a, &e->b, 102, 128, true, 1000, 0);
	wr_write(&e->a, &e->b, 103, 192, false, 0, 0);
	wr_send(&e->a, 104, 256, 32, true);
}

static void post_loc_prot(struct env *e)
{
	wr_recv(&e->b, 500, 1024, 64, 0);
	wr_write(&e->a, &e->b, 100, 0, true, 0, 0);
	wr_write(&e->a, &e->b, 101, 64, true, 0, 77);
	wr_write(&e->a, &e->b, 102, 128, true, 0, 0);
}

/* a send bigger than the receive: the responder's local length error, the
 * requester's remote invalid request */
static void post_loc_len(struct env *e)
{
	wr_recv(&e->b, 500, 1024, 16, 0);
	wr_recv(&e->b, 501, 2048, 64, 0);
	wr_send(&e->a, 100, 0, 48, true);
	wr_send(&e->a, 101, 64, 8, true);
}

/* a receive with a bad lkey: the responder's local protection error, the
 * requester's remote operation error */
static void post_rem_op(struct env *e)
{
	wr_recv(&e->b, 500, 1024, 64, 55);
	wr_recv(&e->b, 501, 2048, 64, 0);
	wr_send(&e->a, 100, 0, 32, true);
	wr_send(&e->a, 101, 64, 32, true);
}

/* no receive posted and one RNR retry: receiver-not-ready retries exceeded */
static void post_rnr(struct env *e)
{
	wr_send(&e->a, 100, 0, 32, true);
	wr_write(&e->a, &e->b, 101, 64, true, 0, 0);
}

static const struct sim_ep_conn conn_rnr1 = { 14, 7, 1, 12, 16, 0 };
static const struct sim_ep_conn conn_rnr_fast = { 14, 7, 7, 1, 16, 0 };

/* a misaligned atomic: the remote invalid request */
static void post_misaligned_atomic(struct env *e)
{
	wr_recv(&e->b, 500, 1024, 64, 0);
	wr_write(&e->a, &e->b, 100, 0, true, 0, 0);
	wr_fetch_add(&e->a, &e->b, 101, 4096 + 3);
	wr_write(&e->a, &e->b, 102, 64, true, 0, 0);
}

/* ---- WRs beyond the QP's capacities (max_send_sge, max_recv_sge and
 * max_inline_data 2, 2, 64): refused by the provider, as plain ---------- */

static void refused(struct env *e, int rc, int place)
{
	assert_true(e->nref < 8);
	e->ref[e->nref++] = rc * 100 + place;
}

static void post_send_chain(struct env *e, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(e->a.qp, wr, &bad), place = 0;

	for (struct ibv_send_wr *w = wr; rc && w != bad; w = w->next)
		place++;
	refused(e, rc, rc ? place : -1);
}

static void post_recv_chain(struct env *e, struct ibv_recv_wr *wr)
{
	struct ibv_recv_wr *bad = NULL;
	int rc = ibv_post_recv(e->b.qp, wr, &bad), place = 0;

	for (struct ibv_recv_wr *w = wr; rc && w != bad; w = w->next)
		place++;
	refused(e, rc, rc ? place : -1);
}

static void post_beyond_caps(struct env *e)
{
	struct sim_ep *a = &e->a, *b = &e->b;
	struct ibv_sge rs[3] = { { (uintptr_t)b->buf + 1024, 32, b->mr->lkey },
				 { (uintptr_t)b->buf + 1056, 32, b->mr->lkey },
				 { (uintptr_t)b->buf + 1088, 32, b->mr->lkey } };
	struct ibv_recv_wr r2 = { .wr_id = 502, .sg_list = &rs[0], .num_sge = 1 };
	struct ibv_recv_wr r1 = { .wr_id = 501, .next = &r2, .sg_list = rs, .num_sge = 3 };
	struct ibv_recv_wr r0 = { .wr_id = 500, .next = &r1, .sg_list = &rs[0], .num_sge = 1 };
	struct ibv_sge big = { (uintptr_t)a->buf, 65, a->mr->lkey };
	struct ibv_sge ss[3] = { { (uintptr_t)a->buf + 256, 16, a->mr->lkey },
				 { (uintptr_t)a->buf + 272, 16, a->mr->lkey },
				 { (uintptr_t)a->buf + 288, 16, a->mr->lkey } };
	struct ibv_send_wr w2 = { .wr_id = 102, .sg_list = &ss[0], .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { (uintptr_t)b->buf + 512, b->mr->rkey } };
	struct ibv_send_wr w1 = w2, w0 = w2;

	w1.wr_id = 101;
	w1.next = &w2;
	w1.sg_list = &big;
	w1.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	w0.wr_id = 100;
	w0.next = &w1;
	memset(a->buf, 0x5a, 512);
	/* chains refused in the middle: the WRs before go out */
	post_recv_chain(e, &r0);
	post_send_chain(e, &w0);
	/* alone: 65 inline bytes, three SGEs (the fast paths' shapes) */
	w1.next = NULL;
	post_send_chain(e, &w1);
	w1.sg_list = ss;
	w1.num_sge = 3;
	w1.send_flags = IBV_SEND_SIGNALED;
	post_send_chain(e, &w1);
	r1.next = NULL;
	post_recv_chain(e, &r1);
	/* at the limits: taken */
	big.length = 64;
	w1.sg_list = &big;
	w1.num_sge = 1;
	w1.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	post_send_chain(e, &w1);
	r1.num_sge = 2;
	post_recv_chain(e, &r1);
	wr_send(a, 103, 0, 32, true);
	wr_write(a, b, 104, 128, true, 0, 0);
}

/* the wr_ids SHIFT once kept for itself, used by the application */
static void post_shift_wrids(struct env *e)
{
	for (uint64_t k = 1; k <= 5; k++)
		wr_recv(&e->b, 0x7ff0000000000000ull | k, 1024 + 64 * (uint32_t)k, 64, 0);
	for (uint64_t k = 1; k <= 5; k++) {
		wr_write(&e->a, &e->b, 0x7ff0000000000000ull | k, 64 * (uint32_t)k, true, 0, 0);
		wr_send(&e->a, 0x7ff0000000000000ull | k, 512 + 64 * (uint32_t)k, 16, true);
	}
}

static void run(const struct scenario *sc, bool shift, struct outcome *o)
{
	struct env e;

	memset(o, 0, sizeof(*o));
	env_open(&e, shift, sc->ca, sc->cb);
	sc->post(&e);
	drive(&e, o, 8, 3);
	o->qa = qp_state(&e, &e.a);
	o->qb = qp_state(&e, &e.b);
	o->nref = e.nref;
	memcpy(o->ref, e.ref, sizeof(o->ref));
	if (shift) {
		/* SHIFT left no QP half-protected: an errored QP is the
		 * application's, and nothing of SHIFT's moved afterwards */
		struct shift_dqp *da = shift_dqp_of_qp(e.a.qp), *db = shift_dqp_of_qp(e.b.qp);

		assert_non_null(da);
		assert_non_null(db);
		assert_int_equal(da->failovers, 0);
		assert_int_equal(db->failovers, 0);
		if (o->qa == IBV_QPS_ERR)
			assert_int_equal(da->send_state, SHIFT_SEND_UNPROTECTED);
		if (o->qb == IBV_QPS_ERR)
			assert_int_equal(db->send_state, SHIFT_SEND_UNPROTECTED);
		if (sc->refused) {
			assert_int_equal(da->send_state, SHIFT_SEND_DEFAULT);
			assert_int_equal(db->send_state, SHIFT_SEND_DEFAULT);
			assert_int_equal(da->recv_state, SHIFT_RECV_DEFAULT);
			assert_int_equal(db->recv_state, SHIFT_RECV_DEFAULT);
			/* (the native path read nothing back: no failover) */
			assert_int_equal(!!da->sq_dbrec, mlx5_mode);
		}
	}
	env_close(&e);
}

static void same(const char *what, const char *who, const struct seen *p, const struct seen *s)
{
	for (int i = 0; i < p->n || i < s->n; i++) {
		if (i < p->n && i < s->n && p->e[i].wr_id == s->e[i].wr_id &&
		    p->e[i].status == s->e[i].status && p->e[i].opcode == s->e[i].opcode)
			continue;
		fail_msg("%s, %s's completion %d: plain %s wr %#llx status %d opcode %d, SHIFT %s "
			 "wr %#llx status %d opcode %d", what, who, i, i < p->n ? "" : "(none)",
			 i < p->n ? (unsigned long long)p->e[i].wr_id : 0ull,
			 i < p->n ? p->e[i].status : -1, i < p->n ? p->e[i].opcode : -1,
			 i < s->n ? "" : "(none)", i < s->n ? (unsigned long long)s->e[i].wr_id : 0ull,
			 i < s->n ? s->e[i].status : -1, i < s->n ? s->e[i].opcode : -1);
	}
}

static int first_error(const struct seen *s)
{
	for (int i = 0; i < s->n; i++)
		if (s->e[i].status != IBV_WC_SUCCESS)
			return s->e[i].status;
	return 0;
}

static void check_scenario(const struct scenario *sc)
{
	struct outcome plain, through;

	run(sc, false, &plain);
	run(sc, true, &through);
	print_message("%s: A %d completions (first error %d), B %d (%d); QPs %d %d\n", sc->name,
		      plain.a.n, first_error(&plain.a), plain.b.n, first_error(&plain.b), plain.qa,
		      plain.qb);
	assert_int_equal(first_error(&plain.a), sc->a_err);
	assert_int_equal(first_error(&plain.b), sc->b_err);
	same(sc->name, "A", &plain.a, &through.a);
	same(sc->name, "B", &plain.b, &through.b);
	assert_int_equal(plain.qa, through.qa);
	assert_int_equal(plain.qb, through.qb);
	assert_int_equal(plain.nref, through.nref);
	for (int i = 0; i < plain.nref; i++)
		if (plain.ref[i] != through.ref[i])
			fail_msg("%s, post %d: plain returned %d (WR %d), SHIFT %d (WR %d)", sc->name,
				 i, plain.ref[i] / 100, plain.ref[i] % 100, through.ref[i] / 100,
				 through.ref[i] % 100);
	if (sc->refused) {
		int n = 0;

		for (int i = 0; i < plain.nref; i++)
			n += plain.ref[i] / 100 != 0;
		assert_int_equal(n, sc->refused);
	}
}

static void test_rem_access_as_plain(void **state)
{
	static const struct scenario sc = { "remote access", post_rem_access, NULL, NULL,
					    IBV_WC_REM_ACCESS_ERR, IBV_WC_WR_FLUSH_ERR, 0 };
	(void)state;
	check_scenario(&sc);
}

static void test_loc_prot_as_plain(void **state)
{
	static const struct scenario sc = { "local protection", post_loc_prot, NULL, NULL,
					    IBV_WC_LOC_PROT_ERR, 0, 0 };
	(void)state;
	check_scenario(&sc);
}

static void test_loc_len_as_plain(void **state)
{
	static const struct scenario sc = { "local length", post_loc_len, NULL, NULL,
					    IBV_WC_REM_INV_REQ_ERR, IBV_WC_LOC_LEN_ERR, 0 };
	(void)state;
	check_scenario(&sc);
}

static void test_rem_op_as_plain(void **state)
{
	static const struct scenario sc = { "remote operation", post_rem_op, NULL, NULL,
					    IBV_WC_REM_OP_ERR, IBV_WC_LOC_PROT_ERR, 0 };
	(void)state;
	check_scenario(&sc);
}

static void test_rnr_retry_exc_as_plain(void **state)
{
	static const struct scenario sc = { "RNR retry exceeded", post_rnr, &conn_rnr1,
					    &conn_rnr_fast, IBV_WC_RNR_RETRY_EXC_ERR, 0, 0 };
	(void)state;
	check_scenario(&sc);
}

static void test_misaligned_atomic_as_plain(void **state)
{
	static const struct scenario sc = { "misaligned atomic", post_misaligned_atomic, NULL,
					    NULL, IBV_WC_REM_INV_REQ_ERR, IBV_WC_WR_FLUSH_ERR, 0 };
	(void)state;
	check_scenario(&sc);
}

static void test_shift_wrids_are_the_apps(void **state)
{
	static const struct scenario sc = { "SHIFT's old wr_ids", post_shift_wrids, NULL, NULL,
					    0, 0, 0 };
	(void)state;
	check_scenario(&sc);
}

static void test_beyond_caps_as_plain(void **state)
{
	static const struct scenario sc = { "WRs beyond the QP's capacities", post_beyond_caps,
					    NULL, NULL, 0, 0, 5 };
	(void)state;
	check_scenario(&sc);
	mlx5_mode = true;
	check_scenario(&sc);
	mlx5_mode = false;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_status_has_its_class),
		cmocka_unit_test(test_rem_access_as_plain),
		cmocka_unit_test(test_loc_prot_as_plain),
		cmocka_unit_test(test_loc_len_as_plain),
		cmocka_unit_test(test_rem_op_as_plain),
		cmocka_unit_test(test_rnr_retry_exc_as_plain),
		cmocka_unit_test(test_misaligned_atomic_as_plain),
		cmocka_unit_test(test_shift_wrids_are_the_apps),
		cmocka_unit_test(test_beyond_caps_as_plain),
	};

	test_setenv("SHIFT_LOG_LEVEL", "warn");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
