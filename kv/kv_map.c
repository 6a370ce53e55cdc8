/*
 * kv/kv_map.c - a small chained hash map from strings to byte values.
 *
 * Used by the in-memory backend as its store and by every handle to remember
 * the keys it put.  No locking here: the owner's mutex guards the map.
 * FNV-1a hashing, power-of-two bucket count, doubles when count > buckets.
 */
#include <stdlib.h>
#include <string.h>

#include "kv/kv_map.h"

static uint64_t kv_hash(const char *key, size_t klen)
{
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < klen; i++) {
		h ^= (unsigned char)key[i];
		h *= 1099511628211ull;
	}
	return h;
}

static struct kv_entry **kv_slot(struct kv_map *m, const char *key,
				 size_t klen)
{
	struct kv_entry **pp;

	if (m->nbuckets == 0)
		return NULL;
	pp = &m->buckets[kv_hash(key, klen) & (m->nbuckets - 1)];
	while (*pp && ((*pp)->klen != klen || memcmp((*pp)->key, key, klen)))
		pp = &(*pp)->next;
	return pp;
}

/* Double the bucket array (or create it); on ENOMEM keep the old one, the
 * map stays correct, only slower. */
static void kv_grow(struct kv_map *m)
{
	size_t n = m->nbuckets ? m->nbuckets * 2 : 16;
	struct kv_entry **b = calloc(n, sizeof(*b));

	if (!b)
		return;
	for (size_t i = 0; i < m->nbuckets; i++) {
		struct kv_entry *e = m->buckets[i], *next;

		for (; e; e = next) {
			size_t j = kv_hash(e->key, e->klen) & (n - 1);

			next = e->next;
			e->next = b[j];
			b[j] = e;
		}
	}
	free(m->buckets);
	m->buckets = b;
	m->nbuckets = n;
}

struct kv_entry *kv_map_find(struct kv_map *m, const char *key, size_t klen)
{
	struct kv_entry **pp = kv_slot(m, key, klen);

	return pp ? *pp : NULL;
}

struct kv_entry *kv_map_upsert(struct kv_map *m, const char *key, size_t klen)
{
	struct kv_entry **pp, *e;

	if (m->count >= m->nbuckets)
		kv_grow(m);
	if (m->nbuckets == 0)
		return NULL;
	pp = kv_slot(m, key, klen);
	if (*pp)
		return *pp;
	e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->key = malloc(klen + 1);
	if (!e->key) {
		free(e);
		return NULL;
	}
	memcpy(e->key, key, klen);
	e->key[klen] = '\0';
	e->klen = klen;
	e->seq = ++m->inserts;
	*pp = e;
	m->count++;
	return e;
}

static void kv_entry_free(struct kv_entry *e)
{
	free(e->key);
	free(e->val);
	free(e);
}

int kv_map_remove(struct kv_map *m, const char *key, size_t klen)
{
	struct kv_entry **pp = kv_slot(m, key, klen), *e;

	if (!pp || !*pp)
		return 0;
	e = *pp;
	*pp = e->next;
	kv_entry_free(e);
	m->count--;
	return 1;
}

int kv_map_each(struct kv_map *m, int (*fn)(void *arg, struct kv_entry *e),
		void *arg)
{
	for (size_t i = 0; i < m->nbuckets; i++) {
		struct kv_entry **pp = &m->buckets[i];

		while (*pp) {
			struct kv_entry *e = *pp;
			int r = fn(arg, e);

			if (r < 0)
				return r;
			if (r > 0) {
				*pp = e->next;
				kv_entry_free(e);
				m->count--;
			} else {
				pp = &e->next;
			}
		}
	}
	return 0;
}

void kv_map_clear(struct kv_map *m)
{
	for (size_t i = 0; i < m->nbuckets; i++) {
		struct kv_entry *e = m->buckets[i], *next;

		for (; e; e = next) {
			next = e->next;
			kv_entry_free(e);
		}
	}
	free(m->buckets);
	m->buckets = NULL;
	m->nbuckets = 0;
	m->count = 0;
}
