/*
 * Choosing the backup NIC of a default NIC, and its ports (see backup.c).
 */
#ifndef SHIFT_BACKUP_H
#define SHIFT_BACKUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHIFT_BACKUP_MAX_PORTS 8

struct shift_backup_port {
	int link_layer;  /* IBV_LINK_LAYER_* */
	bool active;     /* IBV_PORT_ACTIVE */
};

struct shift_backup_cand {
	char name[64];
	int numa;        /* NUMA node, -1 if unknown */
	int nports;      /* ports described in port[] (0 if it could not be opened) */
	struct shift_backup_port port[SHIFT_BACKUP_MAX_PORTS]; /* port[0] = port 1 */
};

/* Look dev up in an explicit map "a:b,c:d". 0 and the backup's name in out;
 * -ENOENT if dev is not mapped; -EINVAL if the map is malformed. */
int shift_backup_parse_map(const char *map, const char *dev, char *out, size_t cap);

/* The backup of dev among cands: from map when map is non-empty, else
 * automatically (backup.c: natural name order after dev, cyclic, the same
 * NUMA node first, an active port with dev's port-1 link layer).
 * 0 and the name in out; -ENODEV if none; -EINVAL/-ENOENT from the map. */
int shift_backup_pick(const struct shift_backup_cand *cands, int n,
		      const char *dev, const char *map, char *out, size_t cap);

/* The backup port for port p (1-based) of dflt on bk: port p if it is active
 * with the same link layer, else the next such port of bk (cyclic), else p
 * itself if bk has it, else 1. */
uint8_t shift_backup_port(const struct shift_backup_cand *dflt,
			  const struct shift_backup_cand *bk, uint8_t p);

/* The NUMA node of the device whose sysfs directory is ibdev_path
 * (struct ibv_device's, e.g. /sys/class/infiniband/mlx5_0): its
 * device/numa_node, or -1 if unknown. */
int shift_backup_numa(const char *ibdev_path);

#endif /* SHIFT_BACKUP_H */
