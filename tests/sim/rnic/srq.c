/*
 * Shared receive queues of the simulated RNIC: create (plain and through
 * the context's create_srq_ex slot, basic SRQs only), modify (max_wr grows
 * the ring, srq_limit arms the limit event), query, destroy (EBUSY while a
 * QP is attached) and post_srq_recv. A QP created on an SRQ takes the
 * oldest WQE of its ring for each message that consumes a receive (wire.c
 * through sim_rq_peek/sim_rq_take); an empty ring gives the requester an
 * RNR NAK, as an empty receive queue does. When a WQE taken leaves fewer
 * than the armed limit, IBV_EVENT_SRQ_LIMIT_REACHED goes to the context's
 * async queue once (the limit is disarmed, as the spec says). A QP in
 * error flushes only the WQEs it took: the sim completes a message in one
 * step, so a QP never holds one.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sim_int.h"

static struct sim_ctx *ctx_of(struct ibv_context *c)
{
	return (struct sim_ctx *)verbs_get_ctx(c);
}

static struct ibv_srq *srq_new(struct ibv_context *c, struct ibv_pd *pd,
			       struct ibv_srq_attr *a, void *srq_context)
{
	struct sim_ctx *ctx = ctx_of(c);
	struct sim_srq *s;

	if (ctx->dev->fatal) {
		errno = EIO;
		return NULL;
	}
	if (!pd || pd->context != c || !a->max_wr || a->max_wr > SIM_MAX_WR ||
	    a->max_sge > SIM_MAX_SGE) {
		errno = EINVAL;
		return NULL;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->rq_cap = a->max_wr;
	s->max_sge = a->max_sge ? a->max_sge : 1;
	s->rq = calloc(s->rq_cap, sizeof(*s->rq));
	if (!s->rq) {
		free(s);
		errno = ENOMEM;
		return NULL;
	}
	s->ctx = ctx;
	s->srq.context = c;
	s->srq.srq_context = srq_context;
	s->srq.pd = pd;
	pthread_mutex_init(&s->srq.mutex, NULL);
	pthread_cond_init(&s->srq.cond, NULL);
	a->max_wr = s->rq_cap;
	a->max_sge = s->max_sge;
	s->next = ctx->srqs;
	ctx->srqs = s;
	return &s->srq;
}

struct ibv_srq *sim_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *ia)
{
	return srq_new(pd->context, pd, &ia->attr, ia->srq_context);
}

struct ibv_srq *sim_create_srq_ex(struct ibv_context *c,
				  struct ibv_srq_init_attr_ex *ia)
{
	const uint32_t known = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;

	if (!(ia->comp_mask & IBV_SRQ_INIT_ATTR_PD) || (ia->comp_mask & ~known) ||
	    ((ia->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && ia->srq_type != IBV_SRQT_BASIC)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return srq_new(c, ia->pd, &ia->attr, ia->srq_context);
}

static unsigned outstanding(const struct sim_srq *s)
{
	return s->rq_tail - s->rq_head;
}

int sim_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *a, int mask)
{
	struct sim_srq *s = (struct sim_srq *)srq;

	if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))
		return EINVAL;
	if ((mask & IBV_SRQ_MAX_WR) &&
	    (a->max_wr < outstanding(s) || !a->max_wr || a->max_wr > SIM_MAX_WR))
		return EINVAL;
	if ((mask & IBV_SRQ_LIMIT) &&
	    a->srq_limit > ((mask & IBV_SRQ_MAX_WR) ? a->max_wr : s->rq_cap))
		return EINVAL;
	if (mask & IBV_SRQ_MAX_WR) {
		struct sim_rwqe *n = calloc(a->max_wr, sizeof(*n));

		if (!n)
			return ENOMEM;
		for (uint32_t i = s->rq_head, k = 0; i != s->rq_tail; i++, k++)
			n[k] = s->rq[i % s->rq_cap];
		s->rq_tail -= s->rq_head;
		s->rq_head = 0;
		free(s->rq);
		s->rq = n;
		s->rq_cap = a->max_wr;
	}
	if (mask & IBV_SRQ_LIMIT)
		s->limit = a->srq_limit;
	return 0;
}

int sim_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *a)
{
	struct sim_srq *s = (struct sim_srq *)srq;

	a->max_wr = s->rq_cap;
	a->max_sge = s->max_sge;
	a->srq_limit = s->limit;
	return 0;
}

static void srq_free(struct sim_srq *s)
{
	pthread_mutex_destroy(&s->srq.mutex);
	pthread_cond_destroy(&s->srq.cond);
	free(s->rq);
	free(s);
}

int sim_destroy_srq(struct ibv_srq *srq)
{
	struct sim_srq *s = (struct sim_srq *)srq;

	if (s->nqps)
		return EBUSY;
	for (struct sim_srq **pp = &s->ctx->srqs; *pp; pp = &(*pp)->next) {
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	}
	srq_free(s);
	return 0;
}

void sim_srq_free_all(struct sim_ctx *ctx)
{
	while (ctx->srqs) {
		struct sim_srq *s = ctx->srqs;

		ctx->srqs = s->next;
		srq_free(s);
	}
}

int sim_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
		      struct ibv_recv_wr **bad)
{
	struct sim_srq *s = (struct sim_srq *)srq;
	int rc = 0;

	for (; wr; wr = wr->next) {
		struct sim_rwqe *r;

		if (outstanding(s) >= s->rq_cap) {
			rc = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || (unsigned)wr->num_sge > s->max_sge) {
			rc = EINVAL;
			break;
		}
		r = &s->rq[s->rq_tail % s->rq_cap];
		r->wr_id = wr->wr_id;
		r->num_sge = (unsigned)wr->num_sge;
		if (r->num_sge)
			memcpy(r->sge, wr->sg_list, r->num_sge * sizeof(*r->sge));
		s->rq_tail++;
	}
	if (rc && bad)
		*bad = wr;
	return rc;
}

struct sim_rwqe *sim_rq_peek(struct sim_qp *q)
{
	struct sim_srq *s = q->srq;

	if (!s)
		return q->rq_head == q->rq_tail ? NULL : &q->rq[q->rq_head % q->rq_cap];
	return s->rq_head == s->rq_tail ? NULL : &s->rq[s->rq_head % s->rq_cap];
}

void sim_rq_take(struct sim_qp *q)
{
	struct sim_srq *s = q->srq;

	if (!s) {
		q->rq_head++;
		return;
	}
	s->rq_head++;
	if (s->limit && outstanding(s) < s->limit) {
		s->limit = 0;
		sim_async(s->ctx, IBV_EVENT_SRQ_LIMIT_REACHED, &s->srq, 0);
	}
}
