/*
 * Backup auto-pick (shift/shadow/backup.c) on fake device lists: natural
 * name order, the same NUMA node first, multi-port devices and the
 * port-to-port map, and the NUMA node read from a device's sysfs directory.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>
#include <infiniband/verbs.h>

#include "shift/shadow/backup.h"

#define ETH IBV_LINK_LAYER_ETHERNET
#define IB IBV_LINK_LAYER_INFINIBAND

/* one-port device */
#define DEV(n, node, ll, up) \
	{ .name = n, .numa = node, .nports = 1, .port = { { ll, up } } }

static const char *pick(const struct shift_backup_cand *c, int n, const char *dev)
{
	static char out[64];

	return shift_backup_pick(c, n, dev, "", out, sizeof(out)) ? "(none)" : out;
}

/* mlx5_2 comes before mlx5_10 (strcmp put mlx5_10 first). */
static void test_natural_order(void **state)
{
	struct shift_backup_cand c[] = {
		DEV("mlx5_10", -1, ETH, true), DEV("mlx5_1", -1, ETH, true),
		DEV("mlx5_2", -1, ETH, true), DEV("mlx5_9", -1, ETH, true),
	};
	(void)state;

	assert_string_equal(pick(c, 4, "mlx5_1"), "mlx5_2");
	assert_string_equal(pick(c, 4, "mlx5_2"), "mlx5_9");
	assert_string_equal(pick(c, 4, "mlx5_9"), "mlx5_10");
	assert_string_equal(pick(c, 4, "mlx5_10"), "mlx5_1");
}

/* Two NUMA nodes of two rails each: each rail backs up within its node,
 * symmetric (0<->1, 2<->3); a node with no other usable device falls back
 * to the next device anywhere. */
static void test_numa_first(void **state)
{
	struct shift_backup_cand c[] = {
		DEV("mlx5_0", 0, ETH, true), DEV("mlx5_1", 0, ETH, true),
		DEV("mlx5_2", 1, ETH, true), DEV("mlx5_3", 1, ETH, true),
	};
	(void)state;

	assert_string_equal(pick(c, 4, "mlx5_0"), "mlx5_1");
	assert_string_equal(pick(c, 4, "mlx5_1"), "mlx5_0");
	assert_string_equal(pick(c, 4, "mlx5_2"), "mlx5_3");
	assert_string_equal(pick(c, 4, "mlx5_3"), "mlx5_2");
	c[3].port[0].active = false; /* mlx5_3 down: mlx5_2 leaves its node */
	assert_string_equal(pick(c, 4, "mlx5_2"), "mlx5_0");
	c[0].numa = -1; /* unknown node: plain name order */
	assert_string_equal(pick(c, 4, "mlx5_0"), "mlx5_1");
}

/* A dual-port backup whose port 1 is down but port 2 is up is usable;
 * ports map p -> p, else the next active port with the link layer. */
static void test_multiport(void **state)
{
	struct shift_backup_cand c[] = {
		{ .name = "mlx5_0", .numa = -1, .nports = 2,
		  .port = { { ETH, true }, { ETH, true } } },
		{ .name = "mlx5_1", .numa = -1, .nports = 2,
		  .port = { { ETH, false }, { ETH, true } } },
		{ .name = "mlx5_2", .numa = -1, .nports = 4,
		  .port = { { ETH, true }, { IB, true }, { ETH, false }, { ETH, true } } },
	};
	(void)state;

	assert_string_equal(pick(c, 3, "mlx5_0"), "mlx5_1");
	assert_int_equal(shift_backup_port(&c[0], &c[1], 1), 2);
	assert_int_equal(shift_backup_port(&c[0], &c[1], 2), 2);
	c[1].port[0].active = true;
	assert_int_equal(shift_backup_port(&c[0], &c[1], 1), 1);
	/* port 2 of mlx5_2 is IB, 3 is down: ETH port 2 goes to 4 */
	assert_int_equal(shift_backup_port(&c[0], &c[2], 2), 4);
	assert_int_equal(shift_backup_port(&c[0], &c[2], 1), 1);
	/* nothing fits: the same port if the backup has it, else 1 */
	c[1].port[0].active = c[1].port[1].active = false;
	assert_int_equal(shift_backup_port(&c[0], &c[1], 2), 2);
	assert_int_equal(shift_backup_port(&c[2], &c[1], 4), 1);
	assert_string_equal(pick(c, 3, "mlx5_0"), "mlx5_2");
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* device/numa_node under a device's sysfs directory: a number, or -1 for
 * absent, "-1" (no NUMA) and garbage. */
static void test_numa_sysfs(void **state)
{
	char root[] = "/tmp/shift-numa-XXXXXX", dev[128], f[160];
	(void)state;

	assert_non_null(mkdtemp(root));
	snprintf(dev, sizeof(dev), "%s/device", root);
	snprintf(f, sizeof(f), "%s/numa_node", dev);
	assert_int_equal(shift_backup_numa(root), -1);
	assert_int_equal(mkdir(dev, 0700), 0);
	write_file(f, "1\n");
	assert_int_equal(shift_backup_numa(root), 1);
	write_file(f, "-1\n");
	assert_int_equal(shift_backup_numa(root), -1);
	write_file(f, "x7\n");
	assert_int_equal(shift_backup_numa(root), -1);
	write_file(f, "99999999999999999999\n");
	assert_int_equal(shift_backup_numa(root), -1);
	assert_int_equal(shift_backup_numa(NULL), -1);
	unlink(f);
	rmdir(dev);
	rmdir(root);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_natural_order),
		cmocka_unit_test(test_numa_first),
		cmocka_unit_test(test_multiport),
		cmocka_unit_test(test_numa_sysfs),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
