/*
 * Contexts: taking over a provider context (saving its data-path ops and the
 * struct verbs_context slots SHIFT routes through itself, installing SHIFT's),
 * and the data-path replacements themselves.
 *
 * The replacements are what verbs.h's inline ibv_post_send(), ibv_poll_cq(),
 * ibv_create_qp_ex(), ibv_query_port()... reach once a context is SHIFT's.
 * In the Default state they add one table lookup and one indirect call.
 */
#include "shift/shift.h"
#include "shift/shadow/shadow.h"
#include "shift/fo/failover.h"
#include "shift/shadow/chan.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>

struct shift_ctx *shift_ctx_tab[SHIFT_MAX_CTX];
struct shift_stats shift_stats;

/* Guards writers of shift_ctx_tab; readers are lock-free. */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- data path ---------------------------------------------------------- */

/*
 * QPs SHIFT does not protect (not RC, on an SRQ, created before SHIFT had the
 * context...): straight to the provider's verb saved on the context.
 */
#define UNPROTECTED_POST(verb, wr_type)                                         \
	static __attribute__((noinline, cold)) int unprotected_##verb(           \
		struct ibv_qp *qp, struct wr_type *wr, struct wr_type **bad_wr)  \
	{                                                                        \
		struct shift_ctx *s = shift_ctx_of(qp->context);                 \
                                                                                 \
		if (!s) {                                                        \
			*bad_wr = wr;                                            \
			return EINVAL;                                           \
		}                                                                \
		return s->verb(qp, wr, bad_wr);                                  \
	}
UNPROTECTED_POST(post_send, ibv_send_wr)
UNPROTECTED_POST(post_recv, ibv_recv_wr)

/*
 * Default state: mirror the WRs, then the provider's post. The mirror and
 * the provider see the same WRs in the same order (post_lock), and WRs the
 * provider refuses are forgotten again. The common case takes the fast
 * paths below (shift_post_send_fast, shift_post_recv_fast) instead.
 */
static int shift_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
			   struct ibv_send_wr **bad_wr) __attribute__((noinline));
static int shift_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
			   struct ibv_recv_wr **bad_wr) __attribute__((noinline));

/*
 * The provider refused WRs the mirror holds (from *bad_wr on; post_lock
 * held): if the QP failed, SHIFT keeps them and the post succeeds
 * (shift_failover_post_refused), else they are forgotten and the refusal
 * is the application's.
 */
static __attribute__((noinline, cold)) int send_refused(struct shift_dqp *d, struct ibv_send_wr *wr,
							 struct ibv_send_wr *bad, uint64_t head, int rc)
{
	uint64_t from = head;

	for (struct ibv_send_wr *w = wr; w && w != bad; w = w->next)
		from++;
	if (shift_failover_post_refused(d, rc, from, d->rq_head))
		return 0;
	shift_dqp_unrecord_send(d, wr, bad, head);
	return rc;
}

static __attribute__((noinline, cold)) int recv_refused(struct shift_dqp *d, struct ibv_recv_wr *wr,
							 struct ibv_recv_wr *bad, uint64_t head, int rc)
{
	uint64_t from = head;

	for (struct ibv_recv_wr *w = wr; w && w != bad; w = w->next)
		from++;
	if (shift_failover_post_refused(d, rc, d->sq_head, from))
		return 0;
	shift_dqp_unrecord_recv(d, wr, bad, head);
	return rc;
}

static int shift_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
			   struct ibv_send_wr **bad_wr)
{
	struct shift_dqp *d = shift_dqp_of_qp(qp);
	uint64_t head;
	int rc;

	if (shift_unlikely(!d))
		return unprotected_post_send(qp, wr, bad_wr);
	shift_dqp_lock(d);
	head = d->sq_head;
	if (shift_likely(d->send_state == SHIFT_SEND_DEFAULT)) {
		shift_dqp_record_send(d, wr);
		rc = d->prov_post_send(qp, wr, bad_wr);
		if (shift_unlikely(rc))
			rc = send_refused(d, wr, *bad_wr, head, rc);
	} else if (d->send_state == SHIFT_SEND_UNPROTECTED) {
		rc = d->prov_post_send(qp, wr, bad_wr);
	} else {
		rc = shift_post_send_fallback(d, wr, bad_wr);
	}
	shift_dqp_unlock(d);
	return rc;
}

static int shift_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
			   struct ibv_recv_wr **bad_wr)
{
	struct shift_dqp *d = shift_dqp_of_qp(qp);
	uint64_t head;
	int rc;

	if (shift_unlikely(!d))
		return unprotected_post_recv(qp, wr, bad_wr);
	shift_dqp_lock(d);
	head = d->rq_head;
	if (shift_likely(d->recv_state == SHIFT_RECV_DEFAULT &&
			 d->send_state != SHIFT_SEND_UNPROTECTED)) {
		(void)shift_dqp_rq_room(d); /* (the fast path's bound again) */
		shift_dqp_record_recv(d, wr);
		rc = d->prov_post_recv(qp, wr, bad_wr);
		if (shift_unlikely(rc))
			rc = recv_refused(d, wr, *bad_wr, head, rc);
	} else if (d->send_state == SHIFT_SEND_UNPROTECTED) {
		rc = d->prov_post_recv(qp, wr, bad_wr);
	} else {
		rc = shift_post_recv_fallback(d, wr, bad_wr);
	}
	shift_dqp_unlock(d);
	return rc;
}

/* The provider refused the WR the fast path just mirrored: forget it,
 * unless the QP failed (send_refused). */
static __attribute__((noinline, cold)) int post_send_refused(struct shift_dqp *d, int rc)
{
	if (shift_failover_post_refused(d, rc, d->sq_head - 1, d->rq_head))
		rc = 0;
	else
		shift_dqp_unrecord_last_send(d);
	shift_dqp_unlock(d);
	return rc;
}

static __attribute__((noinline, cold)) int post_recv_refused(struct shift_dqp *d, int rc)
{
	if (shift_failover_post_refused(d, rc, d->sq_head, d->rq_head - 1))
		rc = 0;
	else
		d->rq_head--;
	shift_dqp_unlock(d);
	return rc;
}

/*
 * Default state, the common WR (shift_dqp_send_is_common): mirror it inline,
 * then the provider's post. Only d stays live across the provider's call;
 * anything else goes to shift_post_send().
 */
static __attribute__((hot)) int shift_post_send_fast(struct ibv_qp *qp, struct ibv_send_wr *wr,
						     struct ibv_send_wr **bad_wr)
{
	struct shift_dqp *d = __atomic_load_n(&shift_dqp_tab[shift_dqp_hash(qp)],
					      __ATOMIC_ACQUIRE);

	while (shift_unlikely(d->qp != qp)) {
		if (d == &shift_dqp_none)
			return unprotected_post_send(qp, wr, bad_wr);
		d = __atomic_load_n(&d->next_by_qp, __ATOMIC_ACQUIRE);
	}
	if (shift_likely(shift_dqp_send_is_common(wr))) {
		shift_dqp_lock(d);
		/* (the bound is 0 in any other state than Default; a mirror
		 * that looks full goes to shift_post_send(), which syncs) */
		if (shift_likely(d->sq_head < d->sq_limit)) {
			int rc;

			shift_dqp_record_one(d, wr);
			rc = d->prov_post_send(qp, wr, bad_wr);
			if (shift_unlikely(rc))
				return post_send_refused(d, rc);
			/* (rc is 0 here: returned as is, not made again) */
			__asm__("" : "+r"(rc));
			shift_dqp_unlock(d);
			return rc;
		}
		shift_dqp_unlock(d);
	}
	return shift_post_send(qp, wr, bad_wr);
}

static __attribute__((hot)) int shift_post_recv_fast(struct ibv_qp *qp, struct ibv_recv_wr *wr,
						     struct ibv_recv_wr **bad_wr)
{
	struct shift_dqp *d = __atomic_load_n(&shift_dqp_tab[shift_dqp_hash(qp)],
					      __ATOMIC_ACQUIRE);

	while (shift_unlikely(d->qp != qp)) {
		if (d == &shift_dqp_none)
			return unprotected_post_recv(qp, wr, bad_wr);
		d = __atomic_load_n(&d->next_by_qp, __ATOMIC_ACQUIRE);
	}
	if (shift_likely(!wr->next && wr->num_sge == 1)) {
		shift_dqp_lock(d);
		/* (rq_room fails unless both states are Default) */
		if (shift_likely(shift_dqp_rq_room(d))) {
			int rc;

			shift_dqp_record_recv_one(d, wr);
			rc = d->prov_post_recv(qp, wr, bad_wr);
			if (shift_unlikely(rc))
				return post_recv_refused(d, rc);
			/* (rc is 0 here: returned as is, not made again) */
			__asm__("" : "+r"(rc));
			shift_dqp_unlock(d);
			return rc;
		}
		shift_dqp_unlock(d);
	}
	return shift_post_recv(qp, wr, bad_wr);
}

static int shift_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
			       struct ibv_recv_wr **bad_wr)
{
	struct shift_ctx *s = shift_ctx_of(srq->context);

	if (shift_unlikely(!s)) {
		*bad_wr = wr;
		return EINVAL;
	}
	return s->post_srq_recv(srq, wr, bad_wr);
}

/*
 * Polling. Each context slot has its own poll_cq (installed in the
 * context's ops at attach), so the context is one load from the table, not
 * a scan; the slot also keeps the QP of the last completion polled.
 */
static struct shift_dqp *shift_poll_last[SHIFT_MAX_CTX] = {
	[0 ... SHIFT_MAX_CTX - 1] = &shift_dqp_none,
};

/*
 * The provider's poll_cq of each slot's context: the fast poll calls it
 * straight from here. A context with a failed-over QP (slow) has
 * shift_poll_cq_slow in its ops instead of its slot's fast poll
 * (shift_ctx_set_slow), so the fast path tests nothing for it.
 */
static int (*shift_prov_poll[SHIFT_MAX_CTX])(struct ibv_cq *, int, struct ibv_wc *);

static int shift_poll_cq_slow(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	struct shift_ctx *s = shift_ctx_of(cq->context);

	if (shift_unlikely(!s))
		return -1; /* the context is being closed */
	return shift_poll_slow(s, cq, num_entries, wc, 0, 0);
}

/*
 * The CQ a completion of protected QP d came from, for a lean poll (which
 * does not keep its cq across the provider's call): d's only CQ. A lean poll
 * runs only on contexts whose protected QPs each use one CQ for both queues
 * (shift_dqp_link() moves the context to the full poll otherwise), so two
 * CQs here mean a poll that started before such a QP was created and
 * returned one of its first completions: the error is then the oldest
 * outstanding WR of the queue it came from, told apart by its wr_id (if
 * both queues' oldest share it, the send CQ, the likelier). NULL if d has
 * no shadow CQs (it cannot fail over anyway).
 */
static struct ibv_cq *cq_of(struct shift_dqp *d, const struct ibv_wc *wc)
{
	if (!d->scq || !d->rcq)
		return NULL;
	if (shift_likely(d->scq == d->rcq))
		return d->scq->app;
	shift_dqp_sync(d);
	if (d->sq_tail < d->sq_head && shift_dqp_swqe(d, d->sq_tail)->wr_id == wc->wr_id)
		return d->scq->app;
	if (d->rq_tail < d->rq_head && shift_dqp_rwqe(d, d->rq_tail)->wr_id == wc->wr_id)
		return d->rcq->app;
	return d->scq->app;
}

/*
 * Retire the n completions the provider returned, or hand them to the slow
 * path from the first error of a protected QP on. The slow path then fills
 * at most those n entries (the application asked for at least as many):
 * so the fast path need not keep num_entries across the provider's call.
 * cq is NULL for a lean poll (cq_of()).
 */
static __attribute__((noinline)) int poll_retire(int slot, struct ibv_cq *cq, struct ibv_wc *wc,
						 int n)
{
	struct shift_ctx *s = __atomic_load_n(&shift_ctx_tab[slot], __ATOMIC_ACQUIRE);

	if (!s)
		return n;
	for (int i = 0; i < n; i++) {
		struct shift_dqp *d = __atomic_load_n(&shift_poll_last[slot], __ATOMIC_RELAXED);

		if (d->qpn != wc[i].qp_num) {
			d = shift_dqp_by_qpn(s, wc[i].qp_num);
			if (!d)
				continue; /* not protected: as it is */
			__atomic_store_n(&shift_poll_last[slot], d, __ATOMIC_RELAXED);
		}
		if (shift_likely(wc[i].status == IBV_WC_SUCCESS)) {
			shift_dqp_retire(d, &wc[i]);
		} else if (d->send_state != SHIFT_SEND_UNPROTECTED || d->failovers) {
			/* (an unprotected QP that failed over may still flush
			 * SHIFT's own WRs: the slow path drops those) */
			struct ibv_cq *c = cq ? cq : cq_of(d, &wc[i]);

			if (c)
				return shift_poll_slow(s, c, n, wc, i, n);
		}
	}
	return n;
}

/*
 * Default state: the provider's poll, then count what completed. A lean
 * poll keeps only wc across the provider's call (one saved register, no
 * stack adjustment); the full one keeps cq too, for contexts with a
 * protected QP whose send and receive CQs differ.
 */
static inline __attribute__((always_inline)) int poll_fast(int slot, bool lean, struct ibv_cq *cq,
							   int num_entries, struct ibv_wc *wc)
{
	int n = shift_prov_poll[slot](cq, num_entries, wc);

	if (shift_likely(n == 1)) {
		struct shift_dqp *d = __atomic_load_n(&shift_poll_last[slot], __ATOMIC_RELAXED);

		/* the cached QP's, and a success (IBV_WC_SUCCESS is 0): one test */
		if (shift_likely(((d->qpn ^ wc->qp_num) | (uint32_t)wc->status) == 0)) {
			shift_dqp_retire(d, wc);
			return 1;
		}
	} else if (n <= 0) {
		return n;
	}
	return poll_retire(slot, lean ? NULL : cq, wc, n);
}

#define POLL_SLOT(k)                                                            	static __attribute__((hot)) int shift_poll_cq_##k(struct ibv_cq *cq, int num_entries, 							  struct ibv_wc *wc)    	{                                                                       		return poll_fast(k, false, cq, num_entries, wc);                	}                                                                       	static __attribute__((hot)) int shift_poll_cq_lean_##k(struct ibv_cq *cq, int num_entries, 							       struct ibv_wc *wc) \
	{                                                                       		return poll_fast(k, true, cq, num_entries, wc);                 	}
#define POLL_SLOT8(b)                                                           	POLL_SLOT(0##b##0) POLL_SLOT(0##b##1) POLL_SLOT(0##b##2) POLL_SLOT(0##b##3) 	POLL_SLOT(0##b##4) POLL_SLOT(0##b##5) POLL_SLOT(0##b##6) POLL_SLOT(0##b##7)
POLL_SLOT8(0) POLL_SLOT8(1) POLL_SLOT8(2) POLL_SLOT8(3)
POLL_SLOT8(4) POLL_SLOT8(5) POLL_SLOT8(6) POLL_SLOT8(7)
#define POLL_FN8(p, b)                                                          	p##0##b##0, p##0##b##1, p##0##b##2, p##0##b##3,                         	p##0##b##4, p##0##b##5, p##0##b##6, p##0##b##7
_Static_assert(SHIFT_MAX_CTX == 64, "one poll_cq per context slot: 8 x POLL_SLOT8");
static int (*const shift_poll_cq_of_slot[SHIFT_MAX_CTX])(struct ibv_cq *, int, struct ibv_wc *) = {
	POLL_FN8(shift_poll_cq_, 0), POLL_FN8(shift_poll_cq_, 1), POLL_FN8(shift_poll_cq_, 2),
	POLL_FN8(shift_poll_cq_, 3), POLL_FN8(shift_poll_cq_, 4), POLL_FN8(shift_poll_cq_, 5),
	POLL_FN8(shift_poll_cq_, 6), POLL_FN8(shift_poll_cq_, 7),
};
static int (*const shift_poll_cq_lean_of_slot[SHIFT_MAX_CTX])(struct ibv_cq *, int,
							       struct ibv_wc *) = {
	POLL_FN8(shift_poll_cq_lean_, 0), POLL_FN8(shift_poll_cq_lean_, 1),
	POLL_FN8(shift_poll_cq_lean_, 2), POLL_FN8(shift_poll_cq_lean_, 3),
	POLL_FN8(shift_poll_cq_lean_, 4), POLL_FN8(shift_poll_cq_lean_, 5),
	POLL_FN8(shift_poll_cq_lean_, 6), POLL_FN8(shift_poll_cq_lean_, 7),
};

/* The fast poll a context gets when not slow. */
static int (*fast_poll_of(const struct shift_ctx *s))(struct ibv_cq *, int, struct ibv_wc *)
{
	return s->split_cqs ? shift_poll_cq_of_slot[s->slot] : shift_poll_cq_lean_of_slot[s->slot];
}

static int shift_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	struct shift_ctx *s = shift_ctx_of(cq->context);

	if (shift_unlikely(!s))
		return EINVAL;
	int rc = s->req_notify_cq(cq, solicited_only);

	if (shift_unlikely(cq->channel && s->rnic && !rc))
		shift_chan_arm_backup(s, cq, solicited_only); /* completions after a failover */
	return rc;
}

void shift_dqp_link(struct shift_ctx *s, struct ibv_qp *qp, struct ibv_cq *send_cq,
		    struct ibv_cq *recv_cq)
{
	struct shift_dqp *d = s ? shift_dqp_by_qpn(s, qp->qp_num) : NULL;

	if (!d || !s->rnic)
		return;
	d->shadow = shift_shadow_qp_of(s->rnic, qp);
	d->scq = shift_shadow_cq_of(s->rnic, send_cq);
	d->rcq = shift_shadow_cq_of(s->rnic, recv_cq);
	if (send_cq != recv_cq && !__atomic_load_n(&s->split_cqs, __ATOMIC_ACQUIRE)) {
		/* the lean poll cannot tell its CQs apart: the full one */
		pthread_mutex_lock(&ctx_lock);
		__atomic_store_n(&s->split_cqs, true, __ATOMIC_RELEASE);
		if (!s->detached && !s->slow && s->poll_cq)
			__atomic_store_n(&s->ibctx->ops.poll_cq, fast_poll_of(s), __ATOMIC_RELEASE);
		pthread_mutex_unlock(&ctx_lock);
	}
}

struct shift_dqp shift_dqp_none = { .qpn = UINT32_MAX }; /* QPNs have 24 bits */
struct shift_dqp *shift_dqp_tab[SHIFT_DQP_TAB] = {
	[0 ... SHIFT_DQP_TAB - 1] = &shift_dqp_none,
};

void shift_ctx_add_dqp(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_dqp **b = &s->dqp[d->qpn & (SHIFT_DQP_BUCKETS - 1)];
	struct shift_dqp **g = &shift_dqp_tab[shift_dqp_hash(d->qp)];

	d->prov_post_send = s->post_send;
	d->prov_post_recv = s->post_recv;
	pthread_mutex_lock(&ctx_lock);
	d->next_in_bucket = *b;
	__atomic_store_n(b, d, __ATOMIC_RELEASE);
	d->next_by_qp = *g;
	__atomic_store_n(g, d, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&ctx_lock);
}

struct shift_dqp *shift_ctx_remove_dqp(struct shift_ctx *s, struct ibv_qp *qp)
{
	struct shift_dqp **pp = &s->dqp[qp->qp_num & (SHIFT_DQP_BUCKETS - 1)], *d;

	pthread_mutex_lock(&ctx_lock);
	while ((d = *pp) && d->qp != qp)
		pp = &d->next_in_bucket;
	if (d) {
		struct shift_dqp **g = &shift_dqp_tab[shift_dqp_hash(d->qp)];

		__atomic_store_n(pp, d->next_in_bucket, __ATOMIC_RELEASE);
		while (*g != &shift_dqp_none && *g != d)
			g = &(*g)->next_by_qp;
		if (*g == d)
			__atomic_store_n(g, d->next_by_qp, __ATOMIC_RELEASE);
		if (__atomic_load_n(&shift_poll_last[s->slot], __ATOMIC_RELAXED) == d)
			__atomic_store_n(&shift_poll_last[s->slot], &shift_dqp_none, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&ctx_lock);
	return d;
}

void shift_ctx_set_slow(struct shift_ctx *s, bool slow)
{
	if (__atomic_load_n(&s->slow, __ATOMIC_ACQUIRE) == slow)
		return;
	pthread_mutex_lock(&ctx_lock);
	__atomic_store_n(&s->slow, slow, __ATOMIC_RELEASE);
	if (!s->detached && s->poll_cq)
		__atomic_store_n(&s->ibctx->ops.poll_cq,
				 slow ? shift_poll_cq_slow : fast_poll_of(s),
				 __ATOMIC_RELEASE);
	pthread_mutex_unlock(&ctx_lock);
}

/* ---- extended verbs (struct verbs_context slots) ------------------------- */

static int shift_vctx_query_port(struct ibv_context *context, uint8_t port_num,
				 struct ibv_port_attr *port_attr,
				 size_t port_attr_len)
{
	struct shift_ctx *s = shift_ctx_of(context);

	if (!s || !s->query_port)
		return EOPNOTSUPP;
	int rc = s->query_port(context, port_num, port_attr, port_attr_len);
	shift_debug("query_port(%p, %u, len %zu) = %d, state %d", (void *)context, port_num,
		    port_attr_len, rc, (int)port_attr->state);
	return rc;
}

static int shift_vctx_query_device_ex(struct ibv_context *context,
				      const struct ibv_query_device_ex_input *input,
				      struct ibv_device_attr_ex *attr,
				      size_t attr_size)
{
	struct shift_ctx *s = shift_ctx_of(context);

	if (!s || !s->query_device_ex)
		return EOPNOTSUPP;
	return s->query_device_ex(context, input, attr, attr_size);
}

static struct ibv_qp *shift_vctx_create_qp_ex(struct ibv_context *context,
					      struct ibv_qp_init_attr_ex *attr)
{
	struct shift_ctx *s = shift_ctx_of(context);

	if (!s || !s->create_qp_ex) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct ibv_qp *qp = s->create_qp_ex(context, attr);

	if (qp && s->rnic && attr->qp_type == IBV_QPT_RC && !attr->srq) {
		struct shift_dqp *d = shift_dqp_create(qp, &attr->cap, attr->sq_sig_all);

		if (d)
			shift_ctx_add_dqp(s, d);
	}
	if (qp && s->rnic) {
		shift_shadow_qp(s->rnic, qp, attr->qp_type, attr->send_cq, attr->recv_cq,
				&attr->cap, attr->sq_sig_all,
				attr->srq != NULL || (attr->comp_mask & IBV_QP_INIT_ATTR_XRCD));
		shift_dqp_link(s, qp, attr->send_cq, attr->recv_cq);
	}
	return qp;
}

static struct ibv_cq_ex *shift_vctx_create_cq_ex(struct ibv_context *context,
						 struct ibv_cq_init_attr_ex *attr)
{
	struct shift_ctx *s = shift_ctx_of(context);

	if (!s || !s->create_cq_ex) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct shift_chan *k = shift_chan_lower_begin(attr->channel);
	struct ibv_cq_ex *cq = s->create_cq_ex(context, attr);

	shift_chan_lower_end(k, attr->channel);
	if (cq && s->rnic)
		shift_shadow_cq(s->rnic, ibv_cq_ex_to_cq(cq), (int)attr->cqe,
				attr->channel, (int)attr->comp_vector);
	return cq;
}

/* ---- attach / detach ------------------------------------------------------ */

/*
 * The struct verbs_context of a context, or NULL for a legacy one. A slot
 * exists only if the provider's structure is large enough to hold it
 * (verbs.h grows the structure downwards: new slots sit at lower offsets).
 */
static struct verbs_context *vctx_of(struct ibv_context *ibctx)
{
	return verbs_get_ctx(ibctx);
}

#define VCTX_HAS(vctx, op)                                                  \
	((vctx) && (vctx)->sz >= sizeof(*(vctx)) - offsetof(struct verbs_context, op))

#define VCTX_TAKE(s, vctx, op)                                              \
	do {                                                                \
		if (VCTX_HAS(vctx, op) && (vctx)->op) {                     \
			(s)->op = (vctx)->op;                               \
			(vctx)->op = shift_vctx_##op;                       \
		}                                                           \
	} while (0)

#define VCTX_GIVE_BACK(s, vctx, op)                                         \
	do {                                                                \
		if ((s)->op)                                                \
			(vctx)->op = (s)->op;                               \
	} while (0)

struct shift_ctx *shift_ctx_attach(struct ibv_context *ibctx)
{
	struct shift_ctx *s = calloc(1, sizeof(*s));
	struct verbs_context *vctx = vctx_of(ibctx);
	int slot = -1;

	if (!s) {
		shift_warn("%s: out of memory: context left unprotected",
			   ibctx->device ? ibctx->device->name : "?");
		__atomic_fetch_add(&shift_stats.contexts_unprotected, 1, __ATOMIC_RELAXED);
		return NULL;
	}
	s->ibctx = ibctx;
	pthread_mutex_init(&s->slow_lock, NULL);

	pthread_mutex_lock(&ctx_lock);
	for (int i = 0; i < SHIFT_MAX_CTX; i++) {
		if (!shift_ctx_tab[i]) {
			slot = i;
			break;
		}
	}
	if (slot < 0) {
		pthread_mutex_unlock(&ctx_lock);
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
	__atomic_store_n(&shift_poll_last[slot], &shift_dqp_none, __ATOMIC_RELAXED);
	__atomic_store_n(&shift_ctx_tab[slot], s, __ATOMIC_RELEASE);
	__atomic_store_n(&shift_prov_poll[slot], s->poll_cq, __ATOMIC_RELEASE);

	if (s->post_send)
		ibctx->ops.post_send = shift_post_send_fast;
	if (s->post_recv)
		ibctx->ops.post_recv = shift_post_recv_fast;
	if (s->post_srq_recv)
		ibctx->ops.post_srq_recv = shift_post_srq_recv;
	if (s->poll_cq)
		ibctx->ops.poll_cq = fast_poll_of(s);
	if (s->req_notify_cq)
		ibctx->ops.req_notify_cq = shift_req_notify_cq;
	VCTX_TAKE(s, vctx, query_port);
	VCTX_TAKE(s, vctx, query_device_ex);
	VCTX_TAKE(s, vctx, create_qp_ex);
	VCTX_TAKE(s, vctx, create_cq_ex);
	pthread_mutex_unlock(&ctx_lock);

	__atomic_fetch_add(&shift_stats.contexts_attached, 1, __ATOMIC_RELAXED);
	shift_debug("%s: context %p attached (slot %d)",
		    ibctx->device ? ibctx->device->name : "?", (void *)ibctx, slot);
	return s;
}

void shift_ctx_detach(struct ibv_context *ibctx)
{
	struct verbs_context *vctx = vctx_of(ibctx);
	struct shift_ctx *s;

	pthread_mutex_lock(&ctx_lock);
	s = shift_ctx_of(ibctx);
	if (!s) {
		pthread_mutex_unlock(&ctx_lock);
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
	if (vctx) {
		VCTX_GIVE_BACK(s, vctx, query_port);
		VCTX_GIVE_BACK(s, vctx, query_device_ex);
		VCTX_GIVE_BACK(s, vctx, create_qp_ex);
		VCTX_GIVE_BACK(s, vctx, create_cq_ex);
	}
	__atomic_store_n(&shift_ctx_tab[s->slot], NULL, __ATOMIC_RELEASE);
	s->detached = true;
	pthread_mutex_unlock(&ctx_lock);
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		while (s->dqp[i]) {
			struct shift_dqp *d = s->dqp[i];

			s->dqp[i] = d->next_in_bucket;
			struct shift_dqp **g = &shift_dqp_tab[shift_dqp_hash(d->qp)];
			while (*g != &shift_dqp_none && *g != d)
				g = &(*g)->next_by_qp;
			if (*g == d)
				*g = d->next_by_qp;
			if (__atomic_load_n(&shift_poll_last[s->slot], __ATOMIC_RELAXED) == d)
				__atomic_store_n(&shift_poll_last[s->slot], &shift_dqp_none,
						 __ATOMIC_RELAXED);
			shift_dqp_destroy(d);
		}
	}
	pthread_mutex_destroy(&s->slow_lock);
	free(s);
}
