/*
 * Choosing the backup NIC of a default NIC.
 *
 * SHIFT_BACKUP maps explicitly ("rxe0:rxe1,rxe1:rxe0"). Without it, the
 * backup is the first device after the default, in natural (version) name
 * order (mlx5_2 before mlx5_10) and cyclically, that has an ACTIVE port with
 * the default's port-1 link layer; devices on the default's NUMA node are
 * tried first, then the others. With rails named in order on both hosts, rail
 * i backs up to the next rail of its NUMA node on both ends (rail-aligned).
 *
 * Ports: port p of the default maps to port p of the backup when that port
 * is ACTIVE with the same link layer, else to the backup's next such port
 * (cyclic), decided once when the backup is opened.
 */
#include "shift/shadow/backup.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int by_name(const void *a, const void *b)
{
	const struct shift_backup_cand *x = a, *y = b;

	return strverscmp(x->name, y->name);
}

/* An ACTIVE port with link layer ll. */
static bool has_port(const struct shift_backup_cand *c, int ll)
{
	for (int i = 0; i < c->nports && i < SHIFT_BACKUP_MAX_PORTS; i++)
		if (c->port[i].active && c->port[i].link_layer == ll)
			return true;
	return false;
}

int shift_backup_parse_map(const char *map, const char *dev, char *out, size_t cap)
{
	size_t dl = strlen(dev);
	const char *p = map;

	while (p && *p) {
		const char *comma = strchr(p, ',');
		const char *end = comma ? comma : p + strlen(p);
		const char *colon = memchr(p, ':', (size_t)(end - p));

		if (!colon || colon == p || colon + 1 == end)
			return -EINVAL;
		if ((size_t)(colon - p) == dl && !memcmp(p, dev, dl)) {
			size_t n = (size_t)(end - colon - 1);

			if (n >= cap)
				return -EINVAL;
			memcpy(out, colon + 1, n);
			out[n] = '\0';
			return 0;
		}
		p = comma ? comma + 1 : NULL;
	}
	return -ENOENT;
}

int shift_backup_pick(const struct shift_backup_cand *cands, int n,
		      const char *dev, const char *map, char *out, size_t cap)
{
	struct shift_backup_cand *sorted;
	int self = -1, rc = -ENODEV;

	if (map && *map) {
		char want[64];
		int r = shift_backup_parse_map(map, dev, want, sizeof(want));

		if (r)
			return r; /* -EINVAL: bad map; -ENOENT: dev not mapped */
		if (!strcmp(want, dev))
			return -EINVAL;
		for (int i = 0; i < n; i++) {
			if (!strcmp(cands[i].name, want)) {
				if (strlen(want) >= cap)
					return -EINVAL;
				strcpy(out, want);
				return 0;
			}
		}
		return -ENODEV;
	}

	if (n <= 0)
		return -ENODEV;
	sorted = malloc(sizeof(*sorted) * (size_t)n);
	if (!sorted)
		return -ENOMEM;
	memcpy(sorted, cands, sizeof(*sorted) * (size_t)n);
	qsort(sorted, (size_t)n, sizeof(*sorted), by_name);
	for (int i = 0; i < n; i++)
		if (!strcmp(sorted[i].name, dev))
			self = i;
	/* pass 0: the same NUMA node (when known); pass 1: any */
	for (int pass = 0; self >= 0 && rc && pass < 2; pass++) {
		const struct shift_backup_cand *me = &sorted[self];

		if (pass == 0 && me->numa < 0)
			continue;
		for (int k = 1; k < n; k++) {
			const struct shift_backup_cand *c = &sorted[(self + k) % n];

			if (pass == 0 && c->numa != me->numa)
				continue;
			if (me->nports > 0 && has_port(c, me->port[0].link_layer) &&
			    strlen(c->name) < cap) {
				strcpy(out, c->name);
				rc = 0;
				break;
			}
		}
	}
	free(sorted);
	return rc;
}

uint8_t shift_backup_port(const struct shift_backup_cand *dflt,
			  const struct shift_backup_cand *bk, uint8_t p)
{
	int n = bk->nports < SHIFT_BACKUP_MAX_PORTS ? bk->nports : SHIFT_BACKUP_MAX_PORTS;
	int ll;

	if (p < 1 || n < 1)
		return 1;
	ll = p <= dflt->nports && p <= SHIFT_BACKUP_MAX_PORTS ? dflt->port[p - 1].link_layer :
								dflt->port[0].link_layer;
	for (int k = 0; k < n; k++) {
		int i = (p - 1 + k) % n;

		if (bk->port[i].active && bk->port[i].link_layer == ll)
			return (uint8_t)(i + 1);
	}
	return p <= n ? p : 1;
}

int shift_backup_numa(const char *ibdev_path)
{
	char path[512], buf[16];
	long v;
	char *end;
	ssize_t r;
	int fd;

	if (!ibdev_path || snprintf(path, sizeof(path), "%s/device/numa_node", ibdev_path) >=
				   (int)sizeof(path))
		return -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	r = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (r <= 0)
		return -1;
	buf[r] = '\0';
	errno = 0;
	v = strtol(buf, &end, 10);
	if (errno || end == buf || (*end && *end != '\n') || v < 0 || v > 65535)
		return -1;
	return (int)v;
}
