/*
 * shift/base/pmap.c - the intrusive pointer-keyed hash (pmap.h).
 */
#include "shift/base/pmap.h"

#include <stdlib.h>
#include <string.h>

void shift_pmap_init(struct shift_pmap *m)
{
	memset(m, 0, sizeof(*m));
	m->b = m->small;
	m->mask = SHIFT_PMAP_SMALL - 1;
}

void shift_pmap_fini(struct shift_pmap *m)
{
	if (m->b && m->b != m->small)
		free(m->b);
	shift_pmap_init(m);
}

/* Twice the buckets, if they can be had. */
static void grow(struct shift_pmap *m)
{
	size_t nb = 2 * (m->mask + 1);
	struct shift_pmap_node **b = calloc(nb, sizeof(*b)), **old = m->b;
	size_t oldn = m->mask + 1;

	if (!b)
		return;
	m->b = b;
	m->mask = nb - 1;
	/* (walked oldest first per chain would keep the order; newest first
	 * must stay first, so each chain is moved in reverse) */
	for (size_t i = 0; i < oldn; i++) {
		struct shift_pmap_node *rev = NULL;

		for (struct shift_pmap_node *x = old[i], *nx; x; x = nx) {
			nx = x->next;
			x->next = rev;
			rev = x;
		}
		for (struct shift_pmap_node *x = rev, *nx; x; x = nx) {
			size_t s = shift_pmap_slot(m, x->key);

			nx = x->next;
			x->next = b[s];
			b[s] = x;
		}
	}
	if (old != m->small)
		free(old);
}

void shift_pmap_put(struct shift_pmap *m, struct shift_pmap_node *x, uintptr_t key)
{
	if (m->n >= 2 * (m->mask + 1))
		grow(m);
	size_t s = shift_pmap_slot(m, key);

	x->key = key;
	x->next = m->b[s];
	m->b[s] = x;
	m->n++;
}

void shift_pmap_del(struct shift_pmap *m, struct shift_pmap_node *x)
{
	for (struct shift_pmap_node **pp = &m->b[shift_pmap_slot(m, x->key)]; *pp;
	     pp = &(*pp)->next) {
		if (*pp == x) {
			*pp = x->next;
			m->n--;
			return;
		}
	}
}
