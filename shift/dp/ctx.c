/*
 * The data path's registry (see ctx.h): the context table and the table of
 * the contexts past it, the QP lookup tables, the upcalls into the layers
 * above, statistics.
 */
#include "shift/dp/ctx.h"
#include "shift/dp/limbo.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>

struct shift_ctx *shift_ctx_tab[SHIFT_FAST_CTX];
struct shift_ctx_more *shift_ctx_more;
struct shift_stats shift_stats;

/* Guards writers of the context tables and the QP tables; readers are
 * lock-free. */
pthread_mutex_t shift_ctx_lock = PTHREAD_MUTEX_INITIALIZER;

struct shift_dqp shift_dqp_none = { .qpn = UINT32_MAX }; /* QPNs have 24 bits */
struct shift_dqp *shift_dqp_tab[SHIFT_DQP_TAB] = {
	[0 ... SHIFT_DQP_TAB - 1] = &shift_dqp_none,
};

struct shift_dp_upcalls shift_dp_up;

void shift_dp_set_upcalls(const struct shift_dp_upcalls *up)
{
	shift_dp_up = *up;
}

/* ---- the contexts past the fast slots --------------------------------- */

/* What a removed entry of shift_ctx_more holds (no context matches it). */
static struct shift_ctx ctx_gone;

static unsigned more_hash(const struct ibv_context *ibctx, unsigned mask)
{
	return (unsigned)(((uintptr_t)ibctx * 0x9e3779b97f4a7c15ull) >> 40) & mask;
}

struct shift_ctx *shift_ctx_of_more(const struct ibv_context *ibctx)
{
	const struct shift_ctx_more *m = __atomic_load_n(&shift_ctx_more, __ATOMIC_ACQUIRE);

	if (!m || !ibctx)
		return NULL;
	for (unsigned i = more_hash(ibctx, m->mask);; i = (i + 1) & m->mask) {
		struct shift_ctx *s = __atomic_load_n(&m->e[i], __ATOMIC_ACQUIRE);

		if (!s)
			return NULL;
		if (s->ibctx == ibctx)
			return s;
	}
}

/* Put s in m's first free or removed entry on its probe path. */
static void more_put(struct shift_ctx_more *m, struct shift_ctx *s)
{
	unsigned i = more_hash(s->ibctx, m->mask);

	while (m->e[i] && m->e[i] != &ctx_gone)
		i = (i + 1) & m->mask;
	if (!m->e[i])
		m->used++;
	__atomic_store_n(&m->e[i], s, __ATOMIC_RELEASE);
}

/* Add s (shift_ctx_lock held). A table more than half used is replaced
 * by one twice the size of its live entries (at least 16), built before it
 * is published. -1 if out of memory. */
int shift_ctx_more_add(struct shift_ctx *s)
{
	struct shift_ctx_more *m = shift_ctx_more;

	if (!m || 2 * (m->used + 1) > m->mask + 1) {
		unsigned live = 0, size = 16;

		for (unsigned i = 0; m && i <= m->mask; i++)
			live += m->e[i] && m->e[i] != &ctx_gone;
		while (size < 4 * (live + 1))
			size *= 2;
		struct shift_ctx_more *n = calloc(1, sizeof(*n) + size * sizeof(n->e[0]));

		if (!n)
			return -1;
		n->mask = size - 1;
		for (unsigned i = 0; m && i <= m->mask; i++)
			if (m->e[i] && m->e[i] != &ctx_gone)
				more_put(n, m->e[i]);
		__atomic_store_n(&shift_ctx_more, n, __ATOMIC_RELEASE);
		shift_limbo_put(m, free);
		m = n;
	}
	more_put(m, s);
	return 0;
}

/* Remove s (shift_ctx_lock held). */
void shift_ctx_more_remove(struct shift_ctx *s)
{
	struct shift_ctx_more *m = shift_ctx_more;

	for (unsigned i = more_hash(s->ibctx, m->mask); m->e[i]; i = (i + 1) & m->mask) {
		if (m->e[i] == s) {
			__atomic_store_n(&m->e[i], &ctx_gone, __ATOMIC_RELEASE);
			return;
		}
	}
}
