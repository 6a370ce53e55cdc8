/*
 * shift/base/pmap.h - an intrusive hash of nodes keyed by a pointer-sized
 * key (an application object's address, an lkey), for the lookups the
 * control path makes per verb: O(1) where a list scan made N QPs' setup
 * cost N^2.
 *
 * The node lives in the object (struct shift_pmap_node); the map only
 * holds bucket heads. Several nodes may share a key (an object the
 * application destroyed, not yet reaped, and a new one at the same
 * address): first/next walk the nodes of one key, newest first, and the
 * caller skips what it does not want, as a list scan would. The map starts
 * with buckets of its own and doubles them when it holds twice as many
 * nodes; a doubling that cannot allocate keeps the old buckets (longer
 * chains), so put never fails. Not thread-safe: the owner's lock guards it.
 */
#ifndef SHIFT_BASE_PMAP_H
#define SHIFT_BASE_PMAP_H

#include <stddef.h>
#include <stdint.h>

#define SHIFT_PMAP_SMALL 16

struct shift_pmap_node {
	struct shift_pmap_node *next;
	uintptr_t key;
};

struct shift_pmap {
	struct shift_pmap_node **b; /* mask + 1 heads: small, or malloc'd */
	size_t mask, n;
	struct shift_pmap_node *small[SHIFT_PMAP_SMALL];
};

/* The object holding node x as its member m. */
#define shift_pmap_entry(x, type, m) ((type *)(void *)((char *)(x) - offsetof(type, m)))

void shift_pmap_init(struct shift_pmap *m);
/* Frees the buckets (the nodes are the owner's). */
void shift_pmap_fini(struct shift_pmap *m);
void shift_pmap_put(struct shift_pmap *m, struct shift_pmap_node *x, uintptr_t key);
/* x must be in m. */
void shift_pmap_del(struct shift_pmap *m, struct shift_pmap_node *x);

static inline size_t shift_pmap_slot(const struct shift_pmap *m, uintptr_t key)
{
	return (size_t)(((uint64_t)key * 0x9e3779b97f4a7c15ull) >> 32) & m->mask;
}

/* The newest node with key, or NULL; then the next older one. */
static inline struct shift_pmap_node *shift_pmap_first(const struct shift_pmap *m, uintptr_t key)
{
	struct shift_pmap_node *x = m->b[shift_pmap_slot(m, key)];

	while (x && x->key != key)
		x = x->next;
	return x;
}

static inline struct shift_pmap_node *shift_pmap_next(const struct shift_pmap_node *x)
{
	uintptr_t key = x->key;

	for (x = x->next; x && x->key != key; x = x->next)
		;
	return (struct shift_pmap_node *)x;
}

#endif /* SHIFT_BASE_PMAP_H */
