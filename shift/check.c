/*
 * shiftctl check: is this host set up for SHIFT?  Run by shift-run before a
 * job starts.  Checks, from the same configuration the library reads:
 *   - the KV store at SHIFT_KV_URL answers (one GET, bounded by the KV
 *     connect and command deadlines);
 *   - every device named in SHIFT_BACKUP exists under
 *     /sys/class/infiniband (automatic pick: nothing to check).
 * Prints one line per check and returns 0 when all pass, 1 otherwise.
 */
#include "shift/check.h"
#include "shift/base/config.h"
#include "kv/kv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int check_kv(void)
{
	shift_kv *h = NULL;
	void *val = NULL;
	size_t len = 0;
	int rc = shift_kv_open(shift_config.kv_url, shift_config.kv_namespace, NULL, &h);

	if (rc == 0)
		rc = shift_kv_get(h, "shiftctl-check", &val, &len);
	/* (why, from the library: never the password) */
	char why[300];

	snprintf(why, sizeof(why), "%s", rc && rc != -ENOENT ? shift_kv_last_error() : "");
	free(val);
	shift_kv_close(h);
	char url[1200];

	/* the password never reaches the report */
	shift_config_mask("SHIFT_KV_URL", shift_config.kv_url, url, sizeof(url));
	/* an absent key is a store that answered */
	if (rc == 0 || rc == -ENOENT) {
		printf("ok    KV store %s reachable (namespace %s)\n", url[0] ? url : "(default)",
		       shift_config.kv_namespace[0] ? shift_config.kv_namespace : "(default)");
		return 0;
	}
	printf("FAIL  KV store %s: %s%s%s%s\n", url[0] ? url : "(default)", shift_kv_strerror(rc),
	       why[0] ? " (" : "", why, why[0] ? ")" : "");
	return 1;
}

/* One device name of a "dev:dev,dev:dev" map: ok if present. */
static int check_dev(const char *name, size_t n)
{
	char path[512];
	struct stat st;

	snprintf(path, sizeof(path), "/sys/class/infiniband/%.*s", (int)n, name);
	if (n && n < 64 && stat(path, &st) == 0)
		return 0;
	printf("FAIL  backup map: no RDMA device '%.*s' on this host\n", (int)(n < 64 ? n : 64), name);
	return 1;
}

static int check_backup(void)
{
	const char *p = shift_config.backup;
	int bad = 0;

	if (!p[0] || !strcmp(p, "auto")) {
		printf("ok    backup NICs: automatic pick\n");
		return 0;
	}
	while (*p) {
		size_t n = strcspn(p, ":,");

		bad |= check_dev(p, n);
		p += n;
		if (*p)
			p++;
	}
	if (!bad)
		printf("ok    backup map %s: every device present\n", shift_config.backup);
	return bad;
}

int shiftctl_check(void)
{
	int bad = check_kv();

	bad |= check_backup();
	return bad ? 1 : 0;
}
