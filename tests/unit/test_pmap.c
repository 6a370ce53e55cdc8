/*
 * shift/base/pmap: the intrusive pointer-keyed hash the shadow layer finds
 * its objects with. Thousands of keys through several doublings, each
 * found; nodes sharing a key come newest first (a destroyed object not yet
 * reaped, then a new one at the same address: the lookup must see the new
 * one first, as the list scan it replaced did), also across a doubling;
 * deleting any of them leaves the others.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "shift/base/pmap.h"

struct obj {
	int id;
	struct shift_pmap_node hn;
};

static void test_many(void **state)
{
	enum { N = 5000 };
	struct obj *o = calloc(N, sizeof(*o));
	struct shift_pmap m;
	(void)state;

	shift_pmap_init(&m);
	for (int i = 0; i < N; i++) {
		o[i].id = i;
		shift_pmap_put(&m, &o[i].hn, (uintptr_t)&o[i] ^ 0x5a5a); /* any key */
	}
	assert_true(m.mask + 1 >= N / 2); /* it doubled */
	for (int i = 0; i < N; i++) {
		struct shift_pmap_node *x = shift_pmap_first(&m, (uintptr_t)&o[i] ^ 0x5a5a);

		assert_non_null(x);
		assert_int_equal(shift_pmap_entry(x, struct obj, hn)->id, i);
		assert_null(shift_pmap_next(x));
	}
	for (int i = 0; i < N; i += 2)
		shift_pmap_del(&m, &o[i].hn);
	assert_int_equal(m.n, N / 2);
	for (int i = 0; i < N; i++)
		assert_true(!shift_pmap_first(&m, (uintptr_t)&o[i] ^ 0x5a5a) == !(i % 2));
	shift_pmap_fini(&m);
	free(o);
}

static void test_same_key_newest_first(void **state)
{
	struct obj dup[3] = { { .id = 0 }, { .id = 1 }, { .id = 2 } }, fill[100];
	struct shift_pmap m;
	(void)state;

	shift_pmap_init(&m);
	for (int i = 0; i < 3; i++)
		shift_pmap_put(&m, &dup[i].hn, 42);
	/* enough others to double the buckets with the three in them */
	for (int i = 0; i < 100; i++)
		shift_pmap_put(&m, &fill[i].hn, 1000 + (uintptr_t)i);
	struct shift_pmap_node *x = shift_pmap_first(&m, 42);
	int want = 2;

	for (; x; x = shift_pmap_next(x))
		assert_int_equal(shift_pmap_entry(x, struct obj, hn)->id, want--);
	assert_int_equal(want, -1);
	shift_pmap_del(&m, &dup[2].hn);
	assert_int_equal(shift_pmap_entry(shift_pmap_first(&m, 42), struct obj, hn)->id, 1);
	shift_pmap_del(&m, &dup[0].hn);
	x = shift_pmap_first(&m, 42);
	assert_int_equal(shift_pmap_entry(x, struct obj, hn)->id, 1);
	assert_null(shift_pmap_next(x));
	assert_null(shift_pmap_first(&m, 43));
	shift_pmap_fini(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_many),
		cmocka_unit_test(test_same_key_newest_first),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
