/*
 * Taking over a provider context: saving its data-path ops, installing
 * SHIFT's (dp/post.c, dp/poll.c) and giving them back; registering the
 * data-path state of its protected QPs; switching its polls between the
 * fast path and the failover layer's slow one.
 */
#include "shift/dp/ctx.h"
#include "shift/dp/cqex.h"
#include "shift/dp/qpex.h"
#include "shift/dp/limbo.h"
#include "shift/dp/poll.h"
#include "shift/dp/post.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

void shift_ctx_add_dqp(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_dqp **b = &s->dqp[d->qpn & (SHIFT_DQP_BUCKETS - 1)];
	struct shift_dqp **g = &shift_dqp_tab[shift_dqp_hash(d->qp)];

	d->prov_post_send = s->post_send;
	d->prov_post_recv = s->post_recv;
	pthread_mutex_lock(&shift_ctx_lock);
	d->next_in_bucket = *b;
	__atomic_store_n(b, d, __ATOMIC_RELEASE);
	d->next_by_qp = *g;
	__atomic_store_n(g, d, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&shift_ctx_lock);
}

struct shift_dqp *shift_ctx_remove_dqp(struct shift_ctx *s, struct ibv_qp *qp)
{
	struct shift_dqp **pp = &s->dqp[qp->qp_num & (SHIFT_DQP_BUCKETS - 1)], *d;

	pthread_mutex_lock(&shift_ctx_lock);
	while ((d = *pp) && d->qp != qp)
		pp = &d->next_in_bucket;
	if (d) {
		struct shift_dqp **g = &shift_dqp_tab[shift_dqp_hash(d->qp)];

		__atomic_store_n(pp, d->next_in_bucket, __ATOMIC_RELEASE);
		while (*g != &shift_dqp_none && *g != d)
			g = &(*g)->next_by_qp;
		if (*g == d)
			__atomic_store_n(g, d->next_by_qp, __ATOMIC_RELEASE);
		shift_dp_poll_forget(s, d);
	}
	pthread_mutex_unlock(&shift_ctx_lock);
	return d;
}

void shift_ctx_set_slow(struct shift_ctx *s, bool slow)
{
	if (__atomic_load_n(&s->slow, __ATOMIC_ACQUIRE) == slow)
		return;
	pthread_mutex_lock(&shift_ctx_lock);
	__atomic_store_n(&s->slow, slow, __ATOMIC_RELEASE);
	shift_dp_poll_mark_slow(s, slow);
	if (!s->detached && s->poll_cq)
		__atomic_store_n(&s->ibctx->ops.poll_cq,
				 slow ? shift_dp_poll_slow : shift_dp_fast_poll(s),
				 __ATOMIC_RELEASE);
	pthread_mutex_unlock(&shift_ctx_lock);
}

void shift_ctx_set_split_cqs(struct shift_ctx *s)
{
	if (__atomic_load_n(&s->split_cqs, __ATOMIC_ACQUIRE))
		return;
	/* the lean poll cannot tell its CQs apart: the full one */
	pthread_mutex_lock(&shift_ctx_lock);
	__atomic_store_n(&s->split_cqs, true, __ATOMIC_RELEASE);
	if (!s->detached && !s->slow && s->poll_cq)
		__atomic_store_n(&s->ibctx->ops.poll_cq, shift_dp_fast_poll(s), __ATOMIC_RELEASE);
	pthread_mutex_unlock(&shift_ctx_lock);
}


/* A slot for s (shift_ctx_lock held): the first free fast one, else -1
 * and the table of the others. false if out of memory. */
static bool take_slot(struct shift_ctx *s)
{
	for (int i = 0; i < SHIFT_FAST_CTX; i++) {
		if (!shift_ctx_tab[i]) {
			s->slot = i;
			return true;
		}
	}
	s->slot = -1;
	return shift_ctx_more_add(s) == 0;
}

struct shift_ctx *shift_ctx_attach(struct ibv_context *ibctx)
{
	struct shift_ctx *s = calloc(1, sizeof(*s));

	if (!s) {
		shift_warn("%s: out of memory: context left unprotected",
			   ibctx->device ? ibctx->device->name : "?");
		__atomic_fetch_add(&shift_stats.contexts_unprotected, 1, __ATOMIC_RELAXED);
		return NULL;
	}
	s->ibctx = ibctx;
	s->poll_last = &shift_dqp_none;
	pthread_mutex_init(&s->slow_lock, NULL);
	pthread_spin_init(&s->early_lock, PTHREAD_PROCESS_PRIVATE);

	/* Save first, publish, then swap: a data-path call that arrives
	 * through a swapped op must find the shift_ctx. */
	s->post_send = ibctx->ops.post_send;
	s->post_recv = ibctx->ops.post_recv;
	s->post_srq_recv = ibctx->ops.post_srq_recv;
	s->poll_cq = ibctx->ops.poll_cq;
	s->req_notify_cq = ibctx->ops.req_notify_cq;
	pthread_mutex_lock(&shift_ctx_lock);
	if (!take_slot(s)) {
		pthread_mutex_unlock(&shift_ctx_lock);
		pthread_mutex_destroy(&s->slow_lock);
		pthread_spin_destroy(&s->early_lock);
		free(s);
		shift_warn("%s: out of memory: context left unprotected",
			   ibctx->device ? ibctx->device->name : "?");
		__atomic_fetch_add(&shift_stats.contexts_unprotected, 1, __ATOMIC_RELAXED);
		return NULL;
	}
	shift_dp_poll_slot_init(s);
	if (s->slot >= 0)
		__atomic_store_n(&shift_ctx_tab[s->slot], s, __ATOMIC_RELEASE);

	if (s->post_send)
		ibctx->ops.post_send = shift_dp_post_send;
	if (s->post_recv)
		ibctx->ops.post_recv = shift_dp_post_recv;
	if (s->post_srq_recv)
		ibctx->ops.post_srq_recv = shift_dp_post_srq_recv;
	if (s->poll_cq)
		ibctx->ops.poll_cq = shift_dp_fast_poll(s);
	if (s->req_notify_cq)
		ibctx->ops.req_notify_cq = shift_dp_req_notify_cq;
	pthread_mutex_unlock(&shift_ctx_lock);

	__atomic_fetch_add(&shift_stats.contexts_attached, 1, __ATOMIC_RELAXED);
	shift_debug("%s: context %p attached (slot %d)",
		    ibctx->device ? ibctx->device->name : "?", (void *)ibctx, s->slot);
	return s;
}

void shift_ctx_set_native(struct shift_ctx *s)
{
	struct ibv_context *ibctx = s->ibctx;

	pthread_mutex_lock(&shift_ctx_lock);
	if (ibctx->ops.post_send == shift_dp_post_send)
		ibctx->ops.post_send = shift_dp_post_send_native;
	if (ibctx->ops.post_recv == shift_dp_post_recv)
		ibctx->ops.post_recv = shift_dp_post_recv_native;
	pthread_mutex_unlock(&shift_ctx_lock);
}

/* The provider's ops back on s's context, s out of the context tables
 * (shift_ctx_lock held). */
static void give_back_locked(struct shift_ctx *s)
{
	struct ibv_context *ibctx = s->ibctx;

	if (s->post_send)
		ibctx->ops.post_send = s->post_send;
	if (s->post_recv)
		ibctx->ops.post_recv = s->post_recv;
	if (s->post_srq_recv)
		ibctx->ops.post_srq_recv = s->post_srq_recv;
	if (s->poll_cq)
		ibctx->ops.poll_cq = s->poll_cq;
	if (s->req_notify_cq)
		ibctx->ops.req_notify_cq = s->req_notify_cq;
	if (s->slot >= 0)
		__atomic_store_n(&shift_ctx_tab[s->slot], NULL, __ATOMIC_RELEASE);
	else
		shift_ctx_more_remove(s);
	s->detached = true;
}

/* Free a detached context and its QPs' data-path state (from limbo). */
static void ctx_free(void *p)
{
	struct shift_ctx *s = p;

	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		while (s->dqp[i]) {
			struct shift_dqp *d = s->dqp[i];

			s->dqp[i] = d->next_in_bucket;
			shift_dqp_destroy(d);
		}
	}
	free(s->fo);
	pthread_mutex_destroy(&s->slow_lock);
	pthread_spin_destroy(&s->early_lock);
	free(s);
}

void shift_ctx_detach(struct ibv_context *ibctx)
{
	struct shift_ctx *s;

	pthread_mutex_lock(&shift_ctx_lock);
	s = shift_ctx_of(ibctx);
	if (!s) {
		pthread_mutex_unlock(&shift_ctx_lock);
		return;
	}
	give_back_locked(s);
	/* its QPs leave the post path's table now, their memory later */
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *d = s->dqp[i]; d; d = d->next_in_bucket) {
			struct shift_dqp **g = &shift_dqp_tab[shift_dqp_hash(d->qp)];

			while (*g != &shift_dqp_none && *g != d)
				g = &(*g)->next_by_qp;
			if (*g == d)
				__atomic_store_n(g, d->next_by_qp, __ATOMIC_RELEASE);
		}
	}
	pthread_mutex_unlock(&shift_ctx_lock);
	shift_limbo_put(s, ctx_free);
}

/* ---- fork() (see ctx.h) ------------------------------------------------ */

/* The contexts a forked child inherited, kept reachable (never freed: the
 * child may still hold pointers into them, e.g. a slow poll's). */
static struct inherited {
	struct inherited *next;
	struct shift_ctx *s;
} *inherited;

void shift_dp_fork_prepare(void)
{
	pthread_mutex_lock(&shift_ctx_lock);
	shift_limbo_fork_prepare();
	shift_cqx_fork_prepare();
	shift_qpx_fork_prepare();
}

/* (the registries' own locks: leaves, taken last, given back first) */
static void fork_done_leaves(void)
{
	shift_qpx_fork_done();
	shift_cqx_fork_done();
	shift_limbo_fork_done();
}

void shift_dp_fork_parent(void)
{
	fork_done_leaves();
	pthread_mutex_unlock(&shift_ctx_lock);
}

static void inherit(struct shift_ctx *s, void (*before)(struct shift_ctx *s))
{
	struct inherited *i = malloc(sizeof(*i));

	if (before)
		before(s);
	give_back_locked(s);
	if (i) {
		i->s = s;
		i->next = inherited;
		inherited = i;
	}
}

void shift_dp_fork_child(void (*before)(struct shift_ctx *s))
{
	fork_done_leaves(); /* (before() may take them: this is the only thread) */
	for (int i = 0; i < SHIFT_FAST_CTX; i++)
		if (shift_ctx_tab[i])
			inherit(shift_ctx_tab[i], before);
	for (unsigned i = 0; shift_ctx_more && i <= shift_ctx_more->mask; i++) {
		struct shift_ctx *s = shift_ctx_more->e[i];

		if (s && s->ibctx)
			inherit(s, before);
	}
	for (int i = 0; i < SHIFT_DQP_TAB; i++)
		shift_dqp_tab[i] = &shift_dqp_none;
	shift_dp_poll_fork_child();
	pthread_mutex_unlock(&shift_ctx_lock);
}
