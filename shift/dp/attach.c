/*
 * Taking over a provider context: saving its data-path ops, installing
 * SHIFT's (dp/post.c, dp/poll.c) and giving them back; registering the
 * data-path state of its protected QPs; switching its polls between the
 * fast path and the failover layer's slow one.
 */
#include "shift/dp/ctx.h"
#include "shift/dp/poll.h"
#include "shift/dp/post.h"

#include <pthread.h>
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
		shift_dp_poll_forget(s->slot, d);
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


struct shift_ctx *shift_ctx_attach(struct ibv_context *ibctx)
{
	struct shift_ctx *s = calloc(1, sizeof(*s));
	int slot = -1;

	if (!s) {
		shift_warn("%s: out of memory: context left unprotected",
			   ibctx->device ? ibctx->device->name : "?");
		__atomic_fetch_add(&shift_stats.contexts_unprotected, 1, __ATOMIC_RELAXED);
		return NULL;
	}
	s->ibctx = ibctx;
	pthread_mutex_init(&s->slow_lock, NULL);

	pthread_mutex_lock(&shift_ctx_lock);
	for (int i = 0; i < SHIFT_MAX_CTX; i++) {
		if (!shift_ctx_tab[i]) {
			slot = i;
			break;
		}
	}
	if (slot < 0) {
		pthread_mutex_unlock(&shift_ctx_lock);
		pthread_mutex_destroy(&s->slow_lock);
		free(s);
		shift_warn("more than %d contexts open: %s left unprotected",
			   SHIFT_MAX_CTX, ibctx->device ? ibctx->device->name : "?");
		__atomic_fetch_add(&shift_stats.contexts_unprotected, 1, __ATOMIC_RELAXED);
		return NULL;
	}
	s->slot = slot;

	/* Save first, publish, then swap: a data-path call that arrives
	 * through a swapped op must find the shift_ctx. */
	s->post_send = ibctx->ops.post_send;
	s->post_recv = ibctx->ops.post_recv;
	s->post_srq_recv = ibctx->ops.post_srq_recv;
	s->poll_cq = ibctx->ops.poll_cq;
	s->req_notify_cq = ibctx->ops.req_notify_cq;
	shift_dp_poll_slot_init(slot, s->poll_cq);
	__atomic_store_n(&shift_ctx_tab[slot], s, __ATOMIC_RELEASE);

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
		    ibctx->device ? ibctx->device->name : "?", (void *)ibctx, slot);
	return s;
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
	__atomic_store_n(&shift_ctx_tab[s->slot], NULL, __ATOMIC_RELEASE);
	s->detached = true;
	pthread_mutex_unlock(&shift_ctx_lock);
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		while (s->dqp[i]) {
			struct shift_dqp *d = s->dqp[i];

			s->dqp[i] = d->next_in_bucket;
			struct shift_dqp **g = &shift_dqp_tab[shift_dqp_hash(d->qp)];
			while (*g != &shift_dqp_none && *g != d)
				g = &(*g)->next_by_qp;
			if (*g == d)
				*g = d->next_by_qp;
			shift_dp_poll_forget(s->slot, d);
			shift_dqp_destroy(d);
		}
	}
	pthread_mutex_destroy(&s->slow_lock);
	free(s);
}
