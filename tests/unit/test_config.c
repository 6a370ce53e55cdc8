/*
 * Configuration and log lines as untrusted input (issue #20 items 3, 4, 6):
 * - a bad setting (too long URL, namespace too long or outside its charset,
 *   a control character in any value) disables SHIFT for the process with
 *   one error line naming the setting: never a silent fallback;
 * - the KV password never appears in a log line or in `shiftctl config`'s
 *   table (shift_config_print);
 * - a newline in an env value cannot forge a log line; lines are stamped
 *   with UTC time, host and pid.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "shift/base/config.h"
#include "shift/base/log.h"
#include "test_env.h"

#define SECRET "Zq9SecretMarker"

static char out[65536];

/* Run shift_config_load() (and, if print, shift_config_print) with stderr
 * and the print captured into out. Returns the number of rejected knobs. */
static int load_captured(bool print)
{
	FILE *f = tmpfile();
	int saved = dup(STDERR_FILENO), bad;
	size_t n;

	assert_non_null(f);
	assert_true(saved >= 0);
	fflush(stderr);
	assert_true(dup2(fileno(f), STDERR_FILENO) >= 0);
	bad = shift_config_load(NULL);
	if (print)
		shift_config_print(f);
	fflush(f);
	dup2(saved, STDERR_FILENO);
	close(saved);
	rewind(f);
	n = fread(out, 1, sizeof(out) - 1, f);
	out[n] = '\0';
	fclose(f);
	return bad;
}

static unsigned lines(const char *s)
{
	unsigned n = 0;

	for (; *s; s++)
		n += *s == '\n';
	return n;
}

static void test_good_defaults(void **state)
{
	(void)state;
	assert_int_equal(load_captured(false), 0);
	assert_true(shift_config.enable);
	assert_string_equal(shift_config.kv_namespace, "default");
}

static void test_long_url_disables_and_masks(void **state)
{
	char url[800];

	(void)state;
	snprintf(url, sizeof(url), "redis://job:" SECRET "@%0600d.example:6379", 7);
	test_setenv("SHIFT_KV_URL", url);
	assert_int_equal(load_captured(false), 1);
	assert_false(shift_config.enable);
	assert_int_equal(lines(out), 1);
	assert_non_null(strstr(out, "SHIFT_KV_URL"));
	assert_non_null(strstr(out, "too long"));
	assert_null(strstr(out, SECRET));
	test_env_restore();
}

static void test_namespace_rejected(void **state)
{
	char ns[200];

	(void)state;
	memset(ns, 'a', sizeof(ns) - 1);
	ns[sizeof(ns) - 1] = '\0';
	test_setenv("SHIFT_KV_NAMESPACE", ns);
	assert_int_equal(load_captured(false), 1);
	assert_false(shift_config.enable);
	assert_non_null(strstr(out, "SHIFT_KV_NAMESPACE"));
	test_setenv("SHIFT_KV_NAMESPACE", "job:x");
	assert_int_equal(load_captured(false), 1);
	assert_false(shift_config.enable);
	test_setenv("SHIFT_KV_NAMESPACE", "slurm-1234.0_a-b");
	assert_int_equal(load_captured(false), 0);
	assert_true(shift_config.enable);
	assert_string_equal(shift_config.kv_namespace, "slurm-1234.0_a-b");
	test_env_restore();
}

static void test_newline_cannot_forge_line(void **state)
{
	(void)state;
	test_setenv("SHIFT_BACKUP", "rxe0:rxe1\nshift: info: forged");
	assert_int_equal(load_captured(false), 1);
	assert_false(shift_config.enable);
	assert_int_equal(lines(out), 1);
	assert_null(strstr(out, "\nshift: info: forged"));
	assert_non_null(strstr(out, "\\x0ashift: info: forged"));
	assert_non_null(strstr(out, "SHIFT_BACKUP"));
	test_env_restore();
}

static void test_line_stamped(void **state)
{
	char pid[32];

	(void)state;
	test_setenv("SHIFT_PROBE_MS", "abc");
	assert_int_equal(load_captured(false), 1);
	snprintf(pid, sizeof(pid), "[%d] ", (int)getpid());
	assert_non_null(strstr(out, pid));
	/* shift: error: YYYY-MM-DDTHH:MM:SS.mmmZ host[pid] */
	const char *t = strstr(out, "shift: error: ");
	assert_non_null(t);
	t += strlen("shift: error: ");
	assert_true(strlen(t) > 24);
	assert_int_equal(t[4], '-');
	assert_int_equal(t[10], 'T');
	assert_int_equal(t[19], '.');
	assert_int_equal(t[23], 'Z');
	test_env_restore();
}

static void test_print_masks_password(void **state)
{
	(void)state;
	test_setenv("SHIFT_KV_URL", "redis://job:" SECRET "@kv.example:6379/2");
	assert_int_equal(load_captured(true), 0);
	assert_true(shift_config.enable);
	assert_null(strstr(out, SECRET));
	assert_non_null(strstr(out, "redis://job:***@kv.example:6379/2"));
	test_env_restore();
}

/* Unset: a per-user directory; '' : no status at all; relative: bad. */
static void test_status_dir(void **state)
{
	char want[300];

	(void)state;
	test_unsetenv("SHIFT_STATUS_DIR");
	test_setenv("XDG_RUNTIME_DIR", "/run/user/4242");
	assert_int_equal(load_captured(false), 0);
	assert_string_equal(shift_config.status_dir, "/run/user/4242/shift");
	test_unsetenv("XDG_RUNTIME_DIR");
	assert_int_equal(load_captured(false), 0);
	snprintf(want, sizeof(want), "-%u", (unsigned)geteuid());
	assert_non_null(strstr(shift_config.status_dir, want));
	test_setenv("SHIFT_STATUS_DIR", "");
	assert_int_equal(load_captured(true), 0);
	assert_true(shift_config.enable);
	assert_string_equal(shift_config.status_dir, "");
	test_setenv("SHIFT_STATUS_DIR", "relative/dir");
	assert_int_equal(load_captured(false), 1);
	assert_false(shift_config.enable);
	test_env_restore();
}

static char conf[] = "/tmp/shift-conf-XXXXXX";

/* A config file holding text, mode mode; its path in conf. */
static void conf_write(const char *text, mode_t mode)
{
	int fd = mkstemp(conf);
	FILE *f;

	assert_true(fd >= 0);
	f = fdopen(fd, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	assert_int_equal(chmod(conf, mode), 0);
}

static void conf_drop(void)
{
	unlink(conf);
	strcpy(conf, "/tmp/shift-conf-XXXXXX");
}

/* key = value lines, comments, blanks; env wins; origin file:line shown. */
static void test_conf_file(void **state)
{
	char origin[128];

	(void)state;
	conf_write("# SHIFT\n\n  kv_namespace = job-42\nprobe_ms=500\n"
		   "kv_url = redis://u:" SECRET "@kv:6379\n", 0600);
	test_setenv("SHIFT_CONFIG", conf);
	test_setenv("SHIFT_PROBE_MS", "700");
	assert_int_equal(load_captured(true), 0);
	assert_true(shift_config.enable);
	assert_string_equal(shift_config.kv_namespace, "job-42");
	assert_int_equal(shift_config.probe_ms, 700);
	snprintf(origin, sizeof(origin), "job-42  (%s:3)", conf);
	assert_non_null(strstr(out, origin));
	assert_non_null(strstr(out, "700  (env)"));
	assert_null(strstr(out, SECRET));
	conf_drop();
	test_env_restore();
}

/* Unknown key, bad value, a group-writable file, a link: disabled, named. */
static void test_conf_file_bad(void **state)
{
	char where[128], link[64];

	(void)state;
	conf_write("kv_namespace = ok\nno_such_knob = 1\n", 0600);
	test_setenv("SHIFT_CONFIG", conf);
	assert_int_equal(load_captured(false), 1);
	assert_false(shift_config.enable);
	snprintf(where, sizeof(where), "%s:2: unknown key 'no_such_knob'", conf);
	assert_non_null(strstr(out, where));
	conf_drop();
	conf_write("probe_ms = soon\n", 0600);
	test_setenv("SHIFT_CONFIG", conf);
	assert_int_equal(load_captured(false), 1);
	assert_false(shift_config.enable);
	conf_drop();
	conf_write("probe_ms = 5\n", 0620);
	test_setenv("SHIFT_CONFIG", conf);
	assert_int_equal(load_captured(false), 1);
	assert_non_null(strstr(out, "writable by group or others"));
	assert_int_equal(chmod(conf, 0600), 0);
	snprintf(link, sizeof(link), "%s.link", conf);
	assert_int_equal(symlink(conf, link), 0);
	test_setenv("SHIFT_CONFIG", link);
	assert_int_equal(load_captured(false), 1);
	assert_false(shift_config.enable);
	unlink(link);
	test_setenv("SHIFT_CONFIG", "");
	assert_int_equal(load_captured(false), 0);
	assert_true(shift_config.enable);
	conf_drop();
	test_env_restore();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_good_defaults),
		cmocka_unit_test(test_long_url_disables_and_masks),
		cmocka_unit_test(test_namespace_rejected),
		cmocka_unit_test(test_newline_cannot_forge_line),
		cmocka_unit_test(test_line_stamped),
		cmocka_unit_test(test_print_masks_password),
		cmocka_unit_test(test_status_dir),
		cmocka_unit_test(test_conf_file),
		cmocka_unit_test(test_conf_file_bad),
	};

	return test_env_run_group_tests(tests);
}
