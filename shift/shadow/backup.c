/*
 * Choosing the backup NIC of a default NIC.
 *
 * SHIFT_BACKUP maps explicitly ("rxe0:rxe1,rxe1:rxe0"). Without it, the
 * backup is the next device, in name order and cyclically, whose port is
 * active and has the same link layer: with rails named in order on both
 * hosts, rail i backs up to rail i+1 on both ends (rail-aligned).
 */
#include "shift/shadow/backup.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int by_name(const void *a, const void *b)
{
	const struct shift_backup_cand *x = a, *y = b;

	return strcmp(x->name, y->name);
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
	if (self >= 0) {
		for (int k = 1; k < n; k++) {
			const struct shift_backup_cand *c = &sorted[(self + k) % n];

			if (c->active && c->link_layer == sorted[self].link_layer &&
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
