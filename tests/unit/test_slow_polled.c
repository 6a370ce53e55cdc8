/*
 * dp/ctx.h's slow_polled: the threads seen leaving a context's slow poll
 * since its last switch of slow, which the background pass's grace need
 * not wait for (fo/background.c). A mark counts for the switch it was made
 * in only; at most SHIFT_SLOW_POLLERS threads are marked; a context with
 * an extended CQ of SHIFT's names none (its poll sessions span calls).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "shift/dp/ctx.h"
#include "shift/base/quiesce.h"

/* s's marked threads, as a sorted-free check: is tid among them? */
static bool named(struct shift_ctx *s, int tid, unsigned *count)
{
	int out[SHIFT_SLOW_POLLERS];
	unsigned n = shift_ctx_slow_pollers(s, out);
	bool found = false;

	for (unsigned i = 0; i < n; i++)
		found |= out[i] == tid;
	if (count)
		*count = n;
	return found;
}

static struct shift_ctx *new_ctx(void)
{
	/* (no provider context: set_slow swaps no ops, as for a detached one) */
	struct shift_ctx *s = calloc(1, sizeof(*s));

	assert_non_null(s);
	return s;
}

static void test_mark_counts_for_its_switch(void **state)
{
	struct shift_ctx *s = new_ctx();
	int me = shift_quiesce_tid();
	unsigned n;
	(void)state;

	assert_false(named(s, me, &n));
	assert_int_equal(n, 0);
	shift_ctx_set_slow(s, true);
	assert_false(named(s, me, NULL)); /* (not polled since) */
	shift_ctx_slow_polled(s);
	shift_ctx_slow_polled(s); /* (one slot however often) */
	assert_true(named(s, me, &n));
	assert_int_equal(n, 1);
	/* fast again: it may enter the fast path; slow once more: a new
	 * switch, the old mark says nothing about it */
	shift_ctx_set_slow(s, false);
	assert_false(named(s, me, NULL));
	shift_ctx_set_slow(s, true);
	assert_false(named(s, me, NULL));
	shift_ctx_slow_polled(s);
	assert_true(named(s, me, &n));
	assert_int_equal(n, 1); /* (its slot reused) */
	free(s);
}

struct marker {
	struct shift_ctx *s;
	int tid;
};

static void *mark_one(void *arg)
{
	struct marker *m = arg;

	m->tid = shift_quiesce_tid();
	shift_ctx_slow_polled(m->s);
	return NULL;
}

/* More threads than slots: SHIFT_SLOW_POLLERS of them named, each once;
 * after a switch the slots are free for the next ones. */
static void test_slots_bounded(void **state)
{
	struct shift_ctx *s = new_ctx();
	struct marker m[SHIFT_SLOW_POLLERS + 2];
	pthread_t t;
	unsigned n, found = 0;
	(void)state;

	shift_ctx_set_slow(s, true);
	for (unsigned i = 0; i < SHIFT_SLOW_POLLERS + 2; i++) {
		m[i].s = s;
		assert_int_equal(pthread_create(&t, NULL, mark_one, &m[i]), 0);
		pthread_join(t, NULL);
	}
	for (unsigned i = 0; i < SHIFT_SLOW_POLLERS + 2; i++)
		found += named(s, m[i].tid, &n);
	assert_int_equal(n, SHIFT_SLOW_POLLERS);
	assert_int_equal(found, SHIFT_SLOW_POLLERS);
	/* the first ones got the slots, the last ones none */
	assert_true(named(s, m[0].tid, NULL));
	assert_false(named(s, m[SHIFT_SLOW_POLLERS + 1].tid, NULL));
	shift_ctx_set_slow(s, false);
	shift_ctx_set_slow(s, true);
	shift_ctx_slow_polled(s);
	assert_true(named(s, shift_quiesce_tid(), &n));
	assert_int_equal(n, 1);
	free(s);
}

static void test_extended_cq_names_none(void **state)
{
	struct shift_ctx *s = new_ctx();
	unsigned n;
	(void)state;

	shift_ctx_set_slow(s, true);
	shift_ctx_slow_polled(s);
	assert_true(named(s, shift_quiesce_tid(), NULL));
	__atomic_store_n(&s->has_cqx, true, __ATOMIC_SEQ_CST);
	assert_false(named(s, shift_quiesce_tid(), &n));
	assert_int_equal(n, 0);
	free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mark_counts_for_its_switch),
		cmocka_unit_test(test_slots_bounded),
		cmocka_unit_test(test_extended_cq_names_none),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
