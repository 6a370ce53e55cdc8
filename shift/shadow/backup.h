/*
 * Choosing the backup NIC of a default NIC (see backup.c).
 */
#ifndef SHIFT_BACKUP_H
#define SHIFT_BACKUP_H

#include <stdbool.h>
#include <stddef.h>

struct shift_backup_cand {
	char name[64];
	int link_layer;  /* IBV_LINK_LAYER_* of port 1 */
	bool active;     /* port 1 is ACTIVE */
};

/* Look dev up in an explicit map "a:b,c:d". 0 and the backup's name in out;
 * -ENOENT if dev is not mapped; -EINVAL if the map is malformed. */
int shift_backup_parse_map(const char *map, const char *dev, char *out, size_t cap);

/* The backup of dev among cands: from map when map is non-empty, else the
 * next active device with the same link layer in name order (cyclic).
 * 0 and the name in out; -ENODEV if none; -EINVAL/-ENOENT from the map. */
int shift_backup_pick(const struct shift_backup_cand *cands, int n,
		      const char *dev, const char *map, char *out, size_t cap);

#endif /* SHIFT_BACKUP_H */
