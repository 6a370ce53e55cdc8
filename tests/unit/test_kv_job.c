/*
 * tests/unit/test_kv_job.c - the job run in every KV key (issue #19 item 6):
 * SHIFT_JOB_ID, else the scheduler's job id (SLURM_JOB_ID.SLURM_STEP_ID,
 * TORCHELASTIC_RUN_ID), goes after the namespace ("shift:NS:JOB:key"), so
 * a run never reads the records an earlier run of the same job left in the
 * same namespace. Values from the environment are untrusted: checked like
 * a namespace; SHIFT_JOB_ID invalid disables SHIFT, a scheduler's invalid
 * id counts as none.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv/kv.h"
#include "shift/base/config.h"
#include "test_env.h"

static shift_kv *open_job(const char *job)
{
	struct shift_kv_options o = { .job_id = job };
	shift_kv *h = NULL;

	assert_int_equal(shift_kv_open("mem://jobs", "ns", &o, &h), 0);
	return h;
}

/* Two runs in one namespace see nothing of each other; a run's handles
 * share everything. */
static void test_runs_apart(void **state)
{
	shift_kv *r1 = open_job("1234.0"), *r1b = open_job("1234.0"), *r2 = open_job("1235.0");
	shift_kv *none = open_job("");
	char buf[128];
	void *v;
	size_t n;
	(void)state;

	assert_int_equal(shift_kv_full_key(r1, "qp:x:1", buf, sizeof(buf)),
			 (int)strlen("shift:ns:1234.0:qp:x:1"));
	assert_string_equal(buf, "shift:ns:1234.0:qp:x:1");
	assert_int_equal(shift_kv_full_key(none, "qp:x:1", buf, sizeof(buf)),
			 (int)strlen("shift:ns:qp:x:1"));
	assert_int_equal(shift_kv_put(r1, "qp:x:1", "run1", 4, 0), 0);
	assert_int_equal(shift_kv_get(r1b, "qp:x:1", &v, &n), 0);
	assert_true(n == 4 && !memcmp(v, "run1", 4));
	free(v);
	assert_int_equal(shift_kv_get(r2, "qp:x:1", &v, &n), -ENOENT);
	assert_int_equal(shift_kv_get(none, "qp:x:1", &v, &n), -ENOENT);
	shift_kv_close(r1);
	shift_kv_close(r1b);
	shift_kv_close(r2);
	shift_kv_close(none);
}

/* A job id is checked like a namespace: none of ':' (another prefix), '*'
 * (a pattern), spaces, nor more than 64 bytes. */
static void test_bad_job_id_refused(void **state)
{
	static const char *const bad[] = { "a:b", "a*", "a b", "x\n",
		"12345678901234567890123456789012345678901234567890123456789012345" };
	(void)state;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct shift_kv_options o = { .job_id = bad[i] };
		shift_kv *h = (shift_kv *)1;

		assert_int_equal(shift_kv_open("mem://jobs", "ns", &o, &h), -EINVAL);
		assert_null(h);
	}
}

static void clear_job_env(void)
{
	test_unsetenv("SHIFT_JOB_ID");
	test_unsetenv("SLURM_JOB_ID");
	test_unsetenv("SLURM_STEP_ID");
	test_unsetenv("TORCHELASTIC_RUN_ID");
}

/* Where the job id comes from, in order; a handle opened without options
 * takes the configuration's. */
static void test_job_id_from_env(void **state)
{
	(void)state;

	clear_job_env();
	assert_int_equal(shift_config_load(NULL), 0);
	assert_string_equal(shift_config.job_id, "");
	test_setenv("TORCHELASTIC_RUN_ID", "te-run_7");
	assert_int_equal(shift_config_load(NULL), 0);
	assert_string_equal(shift_config.job_id, "te-run_7");
	assert_string_equal(shift_config.job_id_from, "TORCHELASTIC_RUN_ID");
	test_setenv("SLURM_JOB_ID", "1234");
	assert_int_equal(shift_config_load(NULL), 0);
	assert_string_equal(shift_config.job_id, "1234");
	test_setenv("SLURM_STEP_ID", "0");
	assert_int_equal(shift_config_load(NULL), 0);
	assert_string_equal(shift_config.job_id, "1234.0");
	assert_string_equal(shift_config.job_id_from, "SLURM_JOB_ID.SLURM_STEP_ID");

	shift_kv *h = NULL;
	char buf[128];

	assert_int_equal(shift_kv_open("mem://jobs", "ns", NULL, &h), 0);
	assert_int_equal(shift_kv_full_key(h, "k", buf, sizeof(buf)), (int)strlen("shift:ns:1234.0:k"));
	shift_kv_close(h);

	test_setenv("SHIFT_JOB_ID", "mine");
	assert_int_equal(shift_config_load(NULL), 0);
	assert_string_equal(shift_config.job_id, "mine");
	assert_string_equal(shift_config.job_id_from, "SHIFT_JOB_ID");
	test_env_restore();
}

/* Untrusted values: a scheduler's bad id counts as none (SHIFT runs, and
 * says so at its start); a bad SHIFT_JOB_ID disables SHIFT, as any bad
 * setting. */
static void test_bad_env_job_id(void **state)
{
	(void)state;

	clear_job_env();
	test_setenv("SLURM_JOB_ID", "12:34");
	assert_int_equal(shift_config_load(NULL), 0);
	assert_true(shift_config.enable);
	assert_string_equal(shift_config.job_id, "");
	test_setenv("SLURM_JOB_ID", "1234");
	test_setenv("SLURM_STEP_ID", "0 *");
	assert_int_equal(shift_config_load(NULL), 0);
	assert_string_equal(shift_config.job_id, "");
	test_setenv("SHIFT_JOB_ID", "a:b");
	assert_int_equal(shift_config_load(NULL), 1);
	assert_false(shift_config.enable);
	test_env_restore();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_runs_apart),
		cmocka_unit_test(test_bad_job_id_refused),
		cmocka_unit_test(test_job_id_from_env),
		cmocka_unit_test(test_bad_env_job_id),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
