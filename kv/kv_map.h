/*
 * kv/kv_map.h - a small string-keyed hash map (kv_map.c).  Internal to kv/:
 * the in-memory backend's store, and the keys each handle owns.  Not
 * thread-safe by itself; the owner's mutex guards it.
 */
#ifndef SHIFT_KV_MAP_H
#define SHIFT_KV_MAP_H

#include <stddef.h>
#include <stdint.h>

struct kv_entry {
	struct kv_entry *next; /* bucket chain */
	char *key;             /* NUL-terminated, owned */
	size_t klen;
	void *val;             /* owned (malloc), may be NULL */
	size_t vlen;
	uint64_t expire_ns;    /* CLOCK_MONOTONIC deadline, 0 = never */
	uint64_t ttl_ms;       /* (a handle's own key: the TTL it refreshes) */
	uint64_t seq;          /* the map's count of inserts when it was made */
};

struct kv_map {
	struct kv_entry **buckets;
	size_t nbuckets; /* power of two, or 0 before the first insert */
	size_t count;
	uint64_t inserts; /* entries ever created: each one's seq */
};

/* Find key; NULL if absent. */
struct kv_entry *kv_map_find(struct kv_map *m, const char *key, size_t klen);
/* Find key or insert an empty entry for it (val NULL).  NULL on ENOMEM. */
struct kv_entry *kv_map_upsert(struct kv_map *m, const char *key, size_t klen);
/* Remove key; returns 1 if removed, 0 if absent. */
int kv_map_remove(struct kv_map *m, const char *key, size_t klen);
/* Call fn on every entry.  fn returns 1 to remove the entry, 0 to keep it,
 * negative to stop (that value is returned).  Returns 0 after a full pass. */
int kv_map_each(struct kv_map *m, int (*fn)(void *arg, struct kv_entry *e),
		void *arg);
/* Drop every entry and the bucket array. */
void kv_map_clear(struct kv_map *m);

#endif /* SHIFT_KV_MAP_H */
