/*
 * kv/kv_redis_sentinel.h - the primary of a redis-sentinel:// URL, asked
 * of its sentinels (kv_redis_sentinel.c).  Internal to kv_redis_conn.c.
 */
#ifndef SHIFT_KV_REDIS_SENTINEL_H
#define SHIFT_KV_REDIS_SENTINEL_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "kv/kv_backend.h"
#include "kv/kv_tls.h"

/* Ask h's sentinels, from index *next on, for the primary's address, all
 * before deadline (each sentinel gets a share of it, and at most the
 * connect timeout); over TLS with tls (rediss-sentinel://, else NULL).
 * 0 with *out and *next the sentinel that answered; -1 with why naming
 * every sentinel's failure. */
int kv_sentinel_primary(const shift_kv *h, SSL_CTX *tls, int *next, uint64_t deadline,
			struct shift_kv_addr *out, char *why, size_t whycap);

/* Is c (connected, authenticated; ssl its TLS session or NULL) a
 * primary?  0 yes (or it will not say: INFO refused), -1 it is a replica
 * (why), -2 the round trip failed (why; drop the connection). */
int kv_sentinel_check_role(redisContext *c, SSL *ssl, uint64_t deadline, char *why,
			   size_t whycap);

#endif /* SHIFT_KV_REDIS_SENTINEL_H */
