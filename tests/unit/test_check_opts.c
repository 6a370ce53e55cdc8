/* test_check_opts.c - unit tests of shift-nccl-check's command line
 * (tests/tools/nccl_check/opts.c): defaults, a full client line, size
 * suffixes, the self-test injection point, and rejected lines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tests/tools/nccl_check/opts.h"

#define PARSE(o, err, ...)                                                    \
	({                                                                    \
		char *argv_[] = {"shift-nccl-check", __VA_ARGS__, NULL};      \
		nc_opts_parse(&(o), (int)(sizeof(argv_) / sizeof(argv_[0])) - 1, \
		              argv_, (err), sizeof(err));                     \
	})

static void defaults(void **state)
{
	(void)state;
	struct nc_opts o;
	char err[256];
	char *argv[] = {"shift-nccl-check", NULL};
	assert_int_equal(nc_opts_parse(&o, 1, argv, err, sizeof(err)), 0);
	assert_null(o.server);
	assert_null(o.dev);
	assert_int_equal(o.mode, NC_WRITE);
	assert_int_equal(o.qps, 1);
	assert_int_equal(o.iters, 1000);
	assert_int_equal(o.msg_size, 65536);
	assert_int_equal(o.chunk_size, 8192);
	assert_int_equal(o.slots, 8);
	assert_int_equal(o.tcp_port, NC_DEFAULT_TCP_PORT);
	assert_int_equal(o.ib_port, 1);
	assert_int_equal(o.mtu, 1024);
	assert_int_equal(o.timeout, 14);
	assert_int_equal(o.inject, NC_INJ_NONE);
	assert_int_equal(o.inject_at, 10);
	assert_false(o.bidir);
	assert_true(o.mr2_at == 0);
}

static void full_client_line(void **state)
{
	(void)state;
	struct nc_opts o;
	char err[256];
	int rc = PARSE(o, err, "-d", "rxe0", "-g", "1", "-p", "9999", "--mode", "read",
	               "-q", "4", "-s", "1M", "-c", "64K", "-S", "16", "-D", "2.5",
	               "--bidir", "--json", "/tmp/x.json", "--watchdog", "20",
	               "--inject", "corrupt-byte", "--mtu", "4096", "--quiet",
	               "--mr2-at", "7.5", "10.0.0.1");
	assert_int_equal(rc, 0);
	assert_string_equal(o.dev, "rxe0");
	assert_int_equal(o.gid_idx, 1);
	assert_int_equal(o.tcp_port, 9999);
	assert_int_equal(o.mode, NC_READ);
	assert_int_equal(o.qps, 4);
	assert_int_equal(o.msg_size, 1u << 20);
	assert_int_equal(o.chunk_size, 65536);
	assert_int_equal(o.slots, 16);
	assert_int_equal(o.iters, 0);
	assert_true(o.duration > 2.49 && o.duration < 2.51);
	assert_true(o.bidir);
	assert_string_equal(o.json_path, "/tmp/x.json");
	assert_int_equal(o.inject, NC_INJ_CORRUPT);
	assert_int_equal(o.mtu, 4096);
	assert_true(o.quiet);
	assert_true(o.mr2_at > 7.49 && o.mr2_at < 7.51);
	assert_string_equal(o.server, "10.0.0.1");
}

static void inject_point(void **state)
{
	(void)state;
	struct nc_opts o;
	char err[256];
	assert_int_equal(PARSE(o, err, "-n", "6", "--inject", "dup-notify"), 0);
	assert_int_equal(o.inject, NC_INJ_DUP);
	assert_int_equal(o.inject_at, 3); /* inside a short run */
	assert_int_equal(PARSE(o, err, "-n", "100", "--inject-at", "77"), 0);
	assert_int_equal(o.inject_at, 77);
}

static void sizes(void **state)
{
	(void)state;
	uint64_t v;
	assert_int_equal(nc_parse_size("4096", &v), 0);
	assert_int_equal(v, 4096);
	assert_int_equal(nc_parse_size("8k", &v), 0);
	assert_int_equal(v, 8192);
	assert_int_equal(nc_parse_size("2G", &v), 0);
	assert_int_equal(v, 2ull << 30);
	assert_int_equal(nc_parse_size("12x", &v), -1);
	assert_int_equal(nc_parse_size("-1", &v), -1);
	assert_int_equal(nc_parse_size("", &v), -1);
	assert_int_equal(nc_parse_size("99999999999999999999", &v), -1);
	assert_int_equal(nc_parse_size("17179869184G", &v), -1);
}

static void rejected_lines(void **state)
{
	(void)state;
	struct nc_opts o;
	char err[256];
	assert_int_equal(PARSE(o, err, "--mode", "foo"), -1);
	assert_non_null(strstr(err, "--mode"));
	assert_int_equal(PARSE(o, err, "-n", "5", "-D", "3"), -1);
	assert_int_equal(PARSE(o, err, "-s", "0"), -1);
	assert_int_equal(PARSE(o, err, "--mtu", "1000"), -1);
	assert_int_equal(PARSE(o, err, "-q", "0"), -1);
	assert_int_equal(PARSE(o, err, "-S", "0"), -1);
	assert_int_equal(PARSE(o, err, "-s", "1M", "-c", "16"), -1); /* > 4096 chunks */
	assert_int_equal(PARSE(o, err, "--inject", "everything"), -1);
	assert_int_equal(PARSE(o, err, "--bogus"), -1);
	assert_int_equal(PARSE(o, err, "--mr2-at", "0"), -1);
	assert_int_equal(PARSE(o, err, "--mr2-at", "-3"), -1);
	assert_int_equal(PARSE(o, err, "--mr2-reg-at", "3"), -1); /* (no --mr2-at) */
	assert_int_equal(PARSE(o, err, "--mr2-reg-at", "3", "--mr2-at", "3"), -1);
	assert_non_null(strstr(err, "later --mr2-at"));
	assert_int_equal(PARSE(o, err, "--mr2-reg-at", "0", "--mr2-at", "3"), -1);
	assert_int_equal(PARSE(o, err, "--mr2-reg-at", "2.5", "--mr2-at", "3"), 0);
	assert_true(o.mr2_reg_at > 2.49 && o.mr2_reg_at < 2.51);
	assert_int_equal(PARSE(o, err, "host1", "host2"), -1);
	assert_int_equal(PARSE(o, err, "-s"), -1);
	assert_non_null(strstr(err, "needs a value"));
	assert_int_equal(PARSE(o, err, "--help"), 1);
	assert_non_null(strstr(err, "usage"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(defaults),
		cmocka_unit_test(full_client_line),
		cmocka_unit_test(inject_point),
		cmocka_unit_test(sizes),
		cmocka_unit_test(rejected_lines),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
