/*
 * Recording the application's objects (see shadow.h), on the application's
 * threads, after the lower verb succeeded: an allocation and a list insert
 * (or a mark) under rnic->lock, and a kick of the RNIC's thread, which does
 * the replay (replay.c). Nothing here waits for a verb or the KV store.
 * Also the lookups tests and tools use (shift_shadow_*_of, bk_lkey,
 * qp_info, mr_backup).
 */
#include "shift/shadow/shadow_int.h"
#include "shift/base/log.h"
#include "shift/dp/ctx.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

/* Something to replay (rnic->lock held). Only an idle thread is woken:
 * one that is already collecting a burst notices by itself, so a burst of
 * control verbs costs the application one wake-up, not one each. */
static void kick(struct shift_rnic *r)
{
	bool was = r->dirty;

	r->dirty = true;
	if (!was && r->idle)
		shift_rnic_signal(r);
}

#define PUSH(r, list, map, obj)                                         \
	do {                                                            \
		pthread_mutex_lock(&(r)->lock);                         \
		(obj)->next = (r)->list;                                \
		(r)->list = (obj);                                      \
		shift_pmap_put(&(r)->map, &(obj)->hn, (uintptr_t)(obj)->app); \
		kick(r);                                                \
		pthread_mutex_unlock(&(r)->lock);                       \
	} while (0)

/* The live shadow of application object key in map (type's node hn),
 * newest first, or NULL. rnic->lock held. */
#define FIND(r, map, type, key)                                                  \
	do {                                                                     \
		for (struct shift_pmap_node *x_ = shift_pmap_first(&(r)->map,     \
								   (uintptr_t)(key)); \
		     x_; x_ = shift_pmap_next(x_)) {                              \
			type *o_ = shift_pmap_entry(x_, type, hn);                \
			if (!o_->dead)                                            \
				return o_;                                        \
		}                                                                \
		return NULL;                                                     \
	} while (0)

/* The application destroyed o (may be NULL): the replay thread reaps its
 * backup. rnic->lock held. */
#define MARK_DEAD(r, o)                         \
	do {                                    \
		__typeof__(o) o_ = (o);         \
		if (o_) {                       \
			SHIFT_SHADOW_KILL(o_);  \
			kick(r);                \
		}                               \
	} while (0)

static struct shift_pd *find_pd(struct shift_rnic *r, struct ibv_pd *pd)
{
	FIND(r, pd_of, struct shift_pd, pd);
}

static struct shift_cq *find_cq(struct shift_rnic *r, struct ibv_cq *cq)
{
	FIND(r, cq_of, struct shift_cq, cq);
}

static struct shift_mr *find_mr(struct shift_rnic *r, struct ibv_mr *mr)
{
	FIND(r, mr_of, struct shift_mr, mr);
}

void shift_shadow_pd(struct shift_rnic *r, struct ibv_pd *pd)
{
	struct shift_pd *p = calloc(1, sizeof(*p));

	if (!p)
		return; /* the objects on it will run unprotected */
	p->app = pd;
	PUSH(r, pds, pd_of, p);
}

void shift_shadow_mr(struct shift_rnic *r, struct ibv_mr *mr,
		     enum shift_mr_kind kind, void *addr, size_t length,
		     uint64_t iova, uint64_t dmabuf_offset, int dmabuf_fd,
		     unsigned int access)
{
	struct shift_mr *m = calloc(1, sizeof(*m));

	if (!m)
		return;
	m->app = mr;
	m->kind = kind;
	m->addr = addr;
	m->length = length;
	m->iova = iova;
	m->dmabuf_offset = dmabuf_offset;
	m->access = access;
	m->app_lkey = mr->lkey;
	m->app_rkey = mr->rkey;
	m->dmabuf_fd = -1;
	if (kind == SHIFT_MR_DMABUF) {
		/* NCCL closes the fd right after registering: keep our own */
		m->dmabuf_fd = fcntl(dmabuf_fd, F_DUPFD_CLOEXEC, 0);
		if (m->dmabuf_fd < 0) {
			m->state = SHIFT_SHADOW_UNPROTECTED;
			shift_warn("%s: dmabuf MR: cannot keep the fd (%s): MR unprotected",
				   r->name, strerror(errno));
		}
	}
	pthread_mutex_lock(&r->lock);
	m->pd = find_pd(r, mr->pd);
	m->next = r->mrs;
	r->mrs = m;
	shift_pmap_put(&r->mr_of, &m->hn, (uintptr_t)mr);
	shift_pmap_put(&r->mr_by_lkey, &m->hl, m->app_lkey);
	kick(r);
	pthread_mutex_unlock(&r->lock);
}

void shift_shadow_mr_rereg(struct shift_rnic *r, struct ibv_mr *mr, int flags,
			   int access)
{
	unsigned int old_access = 0;
	enum shift_mr_kind kind = SHIFT_MR_PLAIN;
	uint64_t iova = 0;

	pthread_mutex_lock(&r->lock);
	struct shift_mr *m = find_mr(r, mr);

	if (m) {
		old_access = m->access;
		kind = m->kind == SHIFT_MR_DMABUF ? SHIFT_MR_PLAIN : m->kind;
		iova = m->iova;
		SHIFT_SHADOW_KILL(m);
	}
	pthread_mutex_unlock(&r->lock);
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION)
		kind = SHIFT_MR_PLAIN;
	shift_shadow_mr(r, mr, kind, mr->addr, mr->length, iova, 0, -1,
			(flags & IBV_REREG_MR_CHANGE_ACCESS) ? (unsigned int)access : old_access);
}

void shift_shadow_cq(struct shift_rnic *r, struct ibv_cq *cq, int cqe,
		     struct ibv_comp_channel *channel, int comp_vector)
{
	struct shift_cq *c = calloc(1, sizeof(*c));

	if (!c)
		return;
	c->app = cq;
	c->cqe = cqe;
	pthread_mutex_init(&c->dp_lock, NULL);
	c->app_has_channel = channel != NULL;
	c->app_channel = channel;
	c->comp_vector = comp_vector;
	PUSH(r, cqs, cq_of, c);
}

void shift_shadow_cq_resized(struct shift_rnic *r, struct ibv_cq *cq)
{
	pthread_mutex_lock(&r->lock);
	struct shift_cq *c = find_cq(r, cq);
	if (c)
		c->cqe = cq->cqe;
	pthread_mutex_unlock(&r->lock);
	/* (a backup not created yet is created at the new size; the thread
	 * reaps c only once the application destroyed cq, which it cannot
	 * do while it resizes it) */
	if (c)
		shift_cq_fit_backup(r, c);
}

static struct shift_qp *find_qp(struct shift_rnic *r, struct ibv_qp *qp)
{
	FIND(r, qp_of, struct shift_qp, qp);
}

void shift_qp_unprotected_locked(struct shift_qp *q, const char *why)
{
	if (q->state != SHIFT_SHADOW_UNPROTECTED) {
		/* (stored atomically: shift_shadow_state_of reads it unlocked) */
		__atomic_store_n(&q->state, SHIFT_SHADOW_UNPROTECTED, __ATOMIC_RELEASE);
		q->why = why;
		stat_add(&shift_shadow_counters.qps_unprotected, 1);
	}
}

struct shift_qp *shift_shadow_qp(struct shift_rnic *r, struct ibv_qp *qp,
				 enum ibv_qp_type type, struct ibv_cq *send_cq,
				 struct ibv_cq *recv_cq, const struct ibv_qp_cap *cap,
				 int sq_sig_all, bool has_srq)
{
	struct shift_qp *q = calloc(1, sizeof(*q));

	if (!q)
		return NULL;
	q->app = qp;
	q->app_qpn = qp->qp_num;
	q->cap = *cap;
	q->sq_sig_all = sq_sig_all;
	q->app_state = IBV_QPS_RESET;
	q->bk_state = IBV_QPS_RESET;
	pthread_mutex_lock(&r->lock);
	q->pd = find_pd(r, qp->pd);
	q->send_cq = find_cq(r, send_cq);
	q->recv_cq = find_cq(r, recv_cq);
	if (type != IBV_QPT_RC)
		shift_qp_unprotected_locked(q, "not an RC QP");
	else if (has_srq)
		shift_qp_unprotected_locked(q, "uses an SRQ SHIFT cannot protect (XRC, tag matching, or shared with a QP that cannot fail over)");
	else if (!q->pd || !q->send_cq || !q->recv_cq)
		shift_qp_unprotected_locked(q, "its PD or CQ is not shadowed");
	else if (r->unprotected)
		shift_qp_unprotected_locked(q, r->why);
	q->next = r->qps;
	r->qps = q;
	shift_pmap_put(&r->qp_of, &q->hn, (uintptr_t)qp);
	kick(r);
	pthread_mutex_unlock(&r->lock);
	if (q->state == SHIFT_SHADOW_UNPROTECTED)
		shift_info("%s: QP %u unprotected: %s", r->name, q->app_qpn, q->why);
	return q;
}

/*
 * Merge what the application set into the recorded attributes: the mask
 * bits say which fields are meaningful. A copy of a fixed-size struct and
 * an OR, under a lock nobody holds for long: no query_qp, no allocation.
 */
void shift_shadow_qp_modified(struct shift_rnic *r, struct ibv_qp *qp,
			      const struct ibv_qp_attr *attr, int mask)
{
	pthread_mutex_lock(&r->lock);
	struct shift_qp *q = find_qp(r, qp);
	if (q) {
		struct ibv_qp_attr *a = &q->attr;

		if (mask & IBV_QP_STATE) {
			q->app_state = attr->qp_state;
			a->qp_state = attr->qp_state;
		}
		if (mask & IBV_QP_PKEY_INDEX)
			a->pkey_index = attr->pkey_index;
		if (mask & IBV_QP_PORT)
			a->port_num = attr->port_num;
		if (mask & IBV_QP_ACCESS_FLAGS)
			a->qp_access_flags = attr->qp_access_flags;
		if (mask & IBV_QP_AV)
			a->ah_attr = attr->ah_attr;
		if (mask & IBV_QP_PATH_MTU)
			a->path_mtu = attr->path_mtu;
		if (mask & IBV_QP_DEST_QPN)
			a->dest_qp_num = attr->dest_qp_num;
		if (mask & IBV_QP_RQ_PSN)
			a->rq_psn = attr->rq_psn;
		if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
			a->max_dest_rd_atomic = attr->max_dest_rd_atomic;
		if (mask & IBV_QP_MIN_RNR_TIMER)
			a->min_rnr_timer = attr->min_rnr_timer;
		if (mask & IBV_QP_TIMEOUT)
			a->timeout = attr->timeout;
		if (mask & IBV_QP_RETRY_CNT)
			a->retry_cnt = attr->retry_cnt;
		if (mask & IBV_QP_RNR_RETRY)
			a->rnr_retry = attr->rnr_retry;
		if (mask & IBV_QP_SQ_PSN)
			a->sq_psn = attr->sq_psn;
		if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
			a->max_rd_atomic = attr->max_rd_atomic;
		q->attr_mask |= mask;
		kick(r);
	}
	pthread_mutex_unlock(&r->lock);
}

/* ---- destroyed by the application --------------------------------------- */

/* The record of an application object about to be destroyed, found while
 * its address is still the application's (once the provider freed it,
 * another thread may get the same address for a new object), and marked
 * dead once the provider's destroy succeeded (a failed destroy leaves the
 * object, and its record, alive). */
#define OF_AND_GONE(kind, type, app_type)                                          \
	struct type *shift_shadow_##kind##_of(struct shift_rnic *r, struct app_type *o) \
	{                                                                           \
		pthread_mutex_lock(&r->lock);                                       \
		struct type *rec = find_##kind(r, o);                               \
		pthread_mutex_unlock(&r->lock);                                     \
		return rec;                                                         \
	}                                                                           \
	void shift_shadow_##kind##_gone(struct shift_rnic *r, struct type *rec)     \
	{                                                                           \
		pthread_mutex_lock(&r->lock);                                       \
		MARK_DEAD(r, rec);                                                  \
		pthread_mutex_unlock(&r->lock);                                     \
	}
OF_AND_GONE(pd, shift_pd, ibv_pd)
OF_AND_GONE(mr, shift_mr, ibv_mr)
OF_AND_GONE(cq, shift_cq, ibv_cq)
OF_AND_GONE(qp, shift_qp, ibv_qp)
#undef OF_AND_GONE

/* ---- introspection ------------------------------------------------------ */

struct shift_rnic *shift_rnic_of(struct ibv_context *ctx)
{
	struct shift_ctx *s = ctx ? shift_ctx_of(ctx) : NULL;

	return s ? s->rnic : NULL;
}

int shift_shadow_qp_info(struct ibv_qp *qp, struct shift_qp_info *out)
{
	struct shift_rnic *r = shift_rnic_of(qp->context);
	int rc = -ENOENT;

	if (!r)
		return rc;
	pthread_mutex_lock(&r->lock);
	struct shift_qp *q = find_qp(r, qp);
	if (q) {
		out->state = q->state;
		out->why = q->why;
		out->bk = q->bk;
		out->bk_state = q->bk_state;
		out->peer_bk_qpn = q->peer_known ? q->peer_bk.qpn : 0;
		out->published = q->published;
		out->bk_dev = r->bk_name;
		out->mri_id = r->mri_id;
		rc = 0;
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}

int shift_shadow_qp_state(struct ibv_qp *qp)
{
	struct shift_rnic *r = shift_rnic_of(qp->context);
	int st = -ENOENT;

	if (!r)
		return st;
	pthread_mutex_lock(&r->lock);
	struct shift_qp *q = find_qp(r, qp);
	if (q)
		st = (int)q->state;
	pthread_mutex_unlock(&r->lock);
	return st;
}

int shift_shadow_state_of(const struct shift_qp *q)
{
	return (int)__atomic_load_n(&q->state, __ATOMIC_ACQUIRE);
}

int shift_shadow_bk_lkey(struct shift_rnic *r, uint32_t app_lkey, uint32_t *bk_lkey)
{
	int rc = -ENOENT;

	pthread_mutex_lock(&r->lock);
	for (struct shift_pmap_node *x = shift_pmap_first(&r->mr_by_lkey, app_lkey); x;
	     x = shift_pmap_next(x)) {
		struct shift_mr *m = shift_pmap_entry(x, struct shift_mr, hl);

		if (!m->dead && m->state == SHIFT_SHADOW_READY) {
			*bk_lkey = m->bk->lkey;
			rc = 0;
			break;
		}
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}

struct ibv_mr *shift_shadow_mr_backup(struct ibv_mr *mr)
{
	struct shift_rnic *r = shift_rnic_of(mr->context);
	struct ibv_mr *bk = NULL;

	if (!r)
		return NULL;
	pthread_mutex_lock(&r->lock);
	struct shift_mr *m = find_mr(r, mr);

	if (m && m->state == SHIFT_SHADOW_READY)
		bk = m->bk; /* (thread-owned: published by the state) */
	pthread_mutex_unlock(&r->lock);
	return bk;
}
