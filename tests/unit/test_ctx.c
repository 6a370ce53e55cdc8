/*
 * Unit tests of the context takeover (shift/ctx.c): SHIFT installs its own
 * data-path ops and extended-verb slots on the contexts it opens, routes the
 * verbs.h inline functions through them to the provider's, and gives the
 * provider's back on close. A fake provider counts what reaches it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "shift/shift.h"
#include "shift/base/config.h"
#include "test_env.h"

/* verbs.h's inline fallbacks name these; this test never takes them. */
int (ibv_query_port)(struct ibv_context *c, uint8_t p, struct _compat_ibv_port_attr *a)
{
	(void)c; (void)p; (void)a;
	fail_msg("legacy ibv_query_port reached");
	return -1;
}

struct fake {
	struct verbs_context vctx; /* its context is the app's */
	int post_send, post_recv, srq_recv, poll_cq, notify, query_port, create_qp_ex;
	struct ibv_qp qp;
	struct ibv_cq cq;
	struct ibv_srq srq;
};

static struct fake *fake_of(struct ibv_context *c)
{
	return (struct fake *)((char *)c - offsetof(struct verbs_context, context));
}

static int f_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	(void)wr; (void)bad;
	fake_of(qp->context)->post_send++;
	return 0;
}
static int f_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	(void)wr; (void)bad;
	fake_of(qp->context)->post_recv++;
	return 0;
}
static int f_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	(void)wr; (void)bad;
	fake_of(srq->context)->srq_recv++;
	return 0;
}
static int f_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	(void)wc;
	fake_of(cq->context)->poll_cq++;
	return n > 0 ? 0 : -1;
}
static int f_notify(struct ibv_cq *cq, int solicited)
{
	(void)solicited;
	fake_of(cq->context)->notify++;
	return 0;
}
static int f_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a, size_t len)
{
	(void)len;
	fake_of(c)->query_port++;
	memset(a, 0, sizeof(*a));
	a->state = IBV_PORT_ACTIVE;
	return port == 1 ? 0 : EINVAL;
}
static struct ibv_qp *f_create_qp_ex(struct ibv_context *c, struct ibv_qp_init_attr_ex *a)
{
	(void)a;
	fake_of(c)->create_qp_ex++;
	return &fake_of(c)->qp;
}

static struct fake *fake_new(int extended)
{
	struct fake *f = calloc(1, sizeof(*f));
	struct ibv_context *c = &f->vctx.context;

	c->ops.post_send = f_post_send;
	c->ops.post_recv = f_post_recv;
	c->ops.post_srq_recv = f_srq_recv;
	c->ops.poll_cq = f_poll_cq;
	c->ops.req_notify_cq = f_notify;
	if (extended) {
		c->abi_compat = __VERBS_ABI_IS_EXTENDED;
		f->vctx.sz = sizeof(f->vctx);
		f->vctx.query_port = f_query_port;
		f->vctx.create_qp_ex = f_create_qp_ex;
	}
	f->qp.context = c;
	f->cq.context = c;
	f->srq.context = c;
	return f;
}

static struct fake *next_fake;
static struct ibv_context *l_open(struct ibv_device *d)
{
	(void)d;
	return &next_fake->vctx.context;
}
static int closed;
static int l_close(struct ibv_context *c)
{
	(void)c;
	closed++;
	return 0;
}
static const struct shift_lower fake_lower = {
	.name = "fake", .open_device = l_open, .close_device = l_close,
};

static int setup(void **state)
{
	(void)state;
	shift_lower_set(&fake_lower);
	closed = 0;
	return 0;
}

static void test_takeover_routes_data_path(void **state)
{
	struct fake *f = fake_new(1);
	struct ibv_send_wr swr = { 0 }, *sbad;
	struct ibv_recv_wr rwr = { 0 }, *rbad;
	struct ibv_wc wc;
	(void)state;

	next_fake = f;
	struct ibv_context *c = shift_verbs.open_device(NULL);
	assert_ptr_equal(c, &f->vctx.context); /* the provider's own object */
	assert_ptr_not_equal(c->ops.post_send, f_post_send);
	assert_ptr_not_equal(f->vctx.create_qp_ex, f_create_qp_ex);

	assert_int_equal(ibv_post_send(&f->qp, &swr, &sbad), 0);
	assert_int_equal(ibv_post_recv(&f->qp, &rwr, &rbad), 0);
	assert_int_equal(ibv_post_srq_recv(&f->srq, &rwr, &rbad), 0);
	assert_int_equal(ibv_poll_cq(&f->cq, 1, &wc), 0);
	assert_int_equal(ibv_req_notify_cq(&f->cq, 0), 0);
	assert_int_equal(f->post_send, 1);
	assert_int_equal(f->post_recv, 1);
	assert_int_equal(f->srq_recv, 1);
	assert_int_equal(f->poll_cq, 1);
	assert_int_equal(f->notify, 1);

	/* extended verbs through struct verbs_context reach SHIFT, then the provider */
	struct ibv_port_attr pa;
	assert_int_equal(ibv_query_port(c, 1, &pa), 0);
	assert_int_equal(pa.state, IBV_PORT_ACTIVE);
	assert_int_equal(ibv_query_port(c, 2, &pa), EINVAL); /* errors pass through */
	assert_int_equal(f->query_port, 2);
	struct ibv_qp_init_attr_ex qa = { 0 };
	assert_ptr_equal(ibv_create_qp_ex(c, &qa), &f->qp);
	assert_int_equal(f->create_qp_ex, 1);

	/* close gives the provider its ops back */
	assert_int_equal(shift_verbs.close_device(c), 0);
	assert_int_equal(closed, 1);
	assert_ptr_equal(c->ops.post_send, f_post_send);
	assert_ptr_equal(c->ops.poll_cq, f_poll_cq);
	assert_ptr_equal(f->vctx.create_qp_ex, f_create_qp_ex);
	assert_ptr_equal(f->vctx.query_port, f_query_port);
	assert_null(shift_ctx_of(c));
	free(f);
}

static void test_legacy_context(void **state)
{
	struct fake *f = fake_new(0);
	struct ibv_send_wr swr = { 0 }, *sbad;
	(void)state;

	next_fake = f;
	struct ibv_context *c = shift_verbs.open_device(NULL);
	assert_non_null(shift_ctx_of(c));
	assert_null(verbs_get_ctx(c)); /* no extended slots to take */
	assert_int_equal(ibv_post_send(&f->qp, &swr, &sbad), 0);
	assert_int_equal(f->post_send, 1);
	shift_verbs.close_device(c);
	assert_ptr_equal(c->ops.post_send, f_post_send);
	free(f);
}

/* One context through SHIFT: found, its data path routed to the provider. */
static void assert_routed(struct fake *f)
{
	struct ibv_context *c = &f->vctx.context;
	struct ibv_send_wr swr = { 0 }, *sbad;
	struct ibv_wc wc;
	int sent = f->post_send, polled = f->poll_cq;

	assert_non_null(shift_ctx_of(c));
	assert_ptr_equal(shift_ctx_of(c)->ibctx, c);
	assert_ptr_not_equal(c->ops.post_send, f_post_send);
	assert_ptr_not_equal(c->ops.poll_cq, f_poll_cq);
	assert_int_equal(ibv_post_send(&f->qp, &swr, &sbad), 0);
	assert_int_equal(ibv_poll_cq(&f->cq, 1, &wc), 0);
	assert_int_equal(f->post_send, sent + 1);
	assert_int_equal(f->poll_cq, polled + 1);
}

/* No limit the plain library lacks: past the contexts with a poll of their
 * own (SHIFT_FAST_CTX), every further one is taken over too, through the
 * table that grows; closing some in the middle and opening more reuses
 * slots and removed entries, and every close gives the provider its ops. */
static void test_any_number_of_contexts(void **state)
{
	enum { N = 3 * SHIFT_FAST_CTX + 41 };
	static struct fake *f[N + 64];
	(void)state;

	for (int i = 0; i < N; i++) {
		f[i] = fake_new(1);
		next_fake = f[i];
		assert_ptr_equal(shift_verbs.open_device(NULL), &f[i]->vctx.context);
	}
	for (int i = 0; i < N; i++)
		assert_routed(f[i]);
	/* close every third one, fast slots and the others alike */
	for (int i = 0; i < N; i += 3) {
		assert_int_equal(shift_verbs.close_device(&f[i]->vctx.context), 0);
		assert_ptr_equal(f[i]->vctx.context.ops.post_send, f_post_send);
		assert_ptr_equal(f[i]->vctx.context.ops.poll_cq, f_poll_cq);
		assert_null(shift_ctx_of(&f[i]->vctx.context));
	}
	for (int i = N; i < N + 64; i++) {
		f[i] = fake_new(1);
		next_fake = f[i];
		assert_ptr_equal(shift_verbs.open_device(NULL), &f[i]->vctx.context);
	}
	for (int i = 0; i < N + 64; i++)
		if (i >= N || i % 3)
			assert_routed(f[i]);
	for (int i = 0; i < N + 64; i++) {
		if (i < N && i % 3 == 0)
			continue;
		assert_int_equal(shift_verbs.close_device(&f[i]->vctx.context), 0);
		assert_ptr_equal(f[i]->vctx.context.ops.post_send, f_post_send);
		assert_null(shift_ctx_of(&f[i]->vctx.context));
	}
	assert_int_equal(closed, N + 64);
	for (int i = 0; i < N + 64; i++)
		free(f[i]);
}

static void test_dummy_lower_slots(void **state)
{
	(void)state;
	/* the fake lower has no alloc_pd: SHIFT fills a dummy, never a NULL */
	errno = 0;
	assert_null(shift_verbs.alloc_pd(NULL));
	assert_int_equal(errno, EOPNOTSUPP);
	assert_int_equal(shift_verbs.dealloc_pd(NULL), EOPNOTSUPP);
	assert_int_equal(shift_verbs.modify_qp(NULL, NULL, 0), EOPNOTSUPP);
}

static void test_config(void **state)
{
	(void)state;
	test_setenv("SHIFT_ENABLE", "0");
	test_setenv("SHIFT_LOG_LEVEL", "debug");
	test_setenv("SHIFT_PROBE_MS", "not-a-number");
	assert_int_equal(shift_config_load("/x/libibverbs.so.1"), 1);
	assert_false(shift_config.enable);
	assert_int_equal(shift_config.log_level, SHIFT_LOG_DEBUG);
	assert_int_equal(shift_config.probe_ms, 250); /* bad value: default kept */
	assert_int_equal(shift_config.port_down_ms, 300);
	assert_string_equal(shift_config.real_lib, "/x/libibverbs.so.1");
	assert_string_equal(shift_config.kv_url, "redis://127.0.0.1:6379");
	test_unsetenv("SHIFT_ENABLE");
	test_unsetenv("SHIFT_LOG_LEVEL");
	test_unsetenv("SHIFT_PROBE_MS");
	assert_int_equal(shift_config_load(NULL), 0);
	assert_true(shift_config.enable);
	assert_int_equal(shift_config.log_level, SHIFT_LOG_WARN);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_takeover_routes_data_path, setup),
		cmocka_unit_test_setup(test_legacy_context, setup),
		cmocka_unit_test_setup(test_any_number_of_contexts, setup),
		cmocka_unit_test_setup(test_dummy_lower_slots, setup),
		cmocka_unit_test_teardown(test_config, test_env_teardown),
	};
	return test_env_run_group_tests(tests);
}
