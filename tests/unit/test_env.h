/*
 * Environment variables in the unit tests. A test sets one with
 * test_setenv() (or unsets it with test_unsetenv()), which saves the value
 * it had the first time; test_env_restore(), from the test's teardown,
 * puts every saved one back, so a failed assertion in between leaks
 * nothing into the next test. test_env_run_group_tests() runs the group
 * with fixtures that catch a test that changes one some other way: the
 * program fails if the group ends with a SHIFT_* variable set, changed or
 * unset against its start (cmocka reports a failed group teardown but does
 * not count it). Include once per test binary, after cmocka.
 */
#ifndef SHIFT_TESTS_TEST_ENV_H
#define SHIFT_TESTS_TEST_ENV_H

#include <stdlib.h>
#include <string.h>

extern char **environ;

#define TEST_ENV_MAX 16

static struct {
	char *name;
	char *old; /* NULL: it was unset */
} test_env_saved[TEST_ENV_MAX];
static int test_env_nsaved;

/* Save name's value, the first time the test changes it. */
static inline void test_env_save(const char *name)
{
	const char *old = getenv(name);

	for (int i = 0; i < test_env_nsaved; i++)
		if (!strcmp(test_env_saved[i].name, name))
			return;
	assert_true(test_env_nsaved < TEST_ENV_MAX);
	test_env_saved[test_env_nsaved].name = strdup(name);
	test_env_saved[test_env_nsaved].old = old ? strdup(old) : NULL;
	test_env_nsaved++;
}

static inline void test_setenv(const char *name, const char *value)
{
	test_env_save(name);
	assert_int_equal(setenv(name, value, 1), 0);
}

static inline void test_unsetenv(const char *name)
{
	test_env_save(name);
	assert_int_equal(unsetenv(name), 0);
}

static inline void test_env_put_back(int i)
{
	if (test_env_saved[i].old)
		setenv(test_env_saved[i].name, test_env_saved[i].old, 1);
	else
		unsetenv(test_env_saved[i].name);
}

/* name back to its value before the test (mid-test; teardown does all) */
static inline void test_env_restore_var(const char *name)
{
	for (int i = 0; i < test_env_nsaved; i++)
		if (!strcmp(test_env_saved[i].name, name))
			test_env_put_back(i);
}

static inline void test_env_restore(void)
{
	while (test_env_nsaved > 0) {
		int i = --test_env_nsaved;

		test_env_put_back(i);
		free(test_env_saved[i].name);
		free(test_env_saved[i].old);
	}
}

/* A test's teardown when it has nothing else to undo. */
static inline int test_env_teardown(void **state)
{
	(void)state;
	test_env_restore();
	return 0;
}

static inline int test_env_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The "SHIFT_*=value" entries of the environment, sorted, one a line. */
static inline char *test_env_shift_vars(void)
{
	size_t n = 0, len = 1;
	char **v, *s;

	for (char **e = environ; *e; e++)
		if (!strncmp(*e, "SHIFT_", 6)) {
			n++;
			len += strlen(*e) + 1;
		}
	v = calloc(n + 1, sizeof(*v));
	s = calloc(1, len);
	assert_true(v && s);
	n = 0;
	for (char **e = environ; *e; e++)
		if (!strncmp(*e, "SHIFT_", 6))
			v[n++] = *e;
	qsort(v, n, sizeof(*v), test_env_cmp);
	for (size_t i = 0; i < n; i++) {
		strcat(s, v[i]);
		strcat(s, "\n");
	}
	free(v);
	return s;
}

static char *test_env_at_start;
static int test_env_leaked;

static inline int test_env_group_setup(void **state)
{
	(void)state;
	test_env_at_start = test_env_shift_vars();
	return 0;
}

static inline int test_env_group_teardown(void **state)
{
	char *now = test_env_shift_vars();
	int same = !strcmp(now, test_env_at_start);

	(void)state;
	if (!same)
		print_error("SHIFT_* environment leaked by a test:\n"
			    "at the start of the group:\n%sat its end:\n%s",
			    test_env_at_start, now);
	free(now);
	free(test_env_at_start);
	test_env_leaked = !same;
	return same ? 0 : -1;
}

static inline int test_env_result(int failed)
{
	return failed ? failed : test_env_leaked;
}

#define test_env_run_group_tests(tests) \
	test_env_result(cmocka_run_group_tests(tests, test_env_group_setup, \
					       test_env_group_teardown))

#endif /* SHIFT_TESTS_TEST_ENV_H */
