/*
 * kv/kv_redis_cluster.h - Redis Cluster routing for redis-cluster:// URLs
 * (kv_redis_cluster.c): the hash slot of a key and the slot map read from
 * CLUSTER NODES.  Internal to the kv layer (and its unit tests).
 */
#ifndef SHIFT_KV_REDIS_CLUSTER_H
#define SHIFT_KV_REDIS_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kv_types.h"

#define KV_CLUSTER_SLOTS 16384
#define KV_CLUSTER_NODES_MAX 1024        /* most primaries a map may name */
#define KV_CLUSTER_NODES_REPLY (1u << 20) /* largest CLUSTER NODES reply read */

/* The slot of a key as Redis Cluster computes it: CRC16 (XMODEM) of the
 * key, or of its hash tag (the bytes between the first '{' and the next
 * '}' after it, when there are any), modulo 16384. */
unsigned kv_cluster_slot(const char *k, size_t len);

/*
 * Parse a CLUSTER NODES reply (text, untrusted) into the primaries that
 * serve slots: addr[0..n) and owner[slot] = index + 1 (0: no primary
 * serves it).  A primary without an address of its own (`:0@0`, a node
 * that does not know its IP yet) is taken to be `asked`, the server that
 * answered.  Failed, handshaking and address-less nodes, replicas and
 * slots in migration (`[s->-id]`) are skipped.  Returns n (>= 1), or -1
 * with why: a line that does not parse, a slot out of range or claimed
 * twice, more than cap primaries, or none at all.
 */
int kv_cluster_parse_nodes(const char *txt, size_t len, const struct shift_kv_addr *asked,
			   struct shift_kv_addr *addr, int cap, uint16_t *owner, char *why,
			   size_t whycap);

#endif /* SHIFT_KV_REDIS_CLUSTER_H */
