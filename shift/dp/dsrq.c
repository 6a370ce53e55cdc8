/*
 * The SRQ receive mirror (see dsrq.h): the registry of mirrored SRQs,
 * recording posts, retiring by completion, handing live entries to the
 * failover layer, the default SRQ's WQEs in order.
 */
#include "shift/dp/dsrq.h"
#include "shift/base/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DQ_STALE UINT64_MAX       /* a WQE whose entry was filled otherwise */
#define DQ_GONE (UINT64_MAX - 1)  /* consumed */

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shift_dsrq *reg;

static uint32_t pow2_at_least(uint64_t n)
{
	uint32_t p = 1;

	while (p < n && p < (1u << 30))
		p <<= 1;
	return p;
}

static struct shift_dsrq_dq *dq_at(struct shift_dsrq *q, uint64_t pos)
{
	return &q->dq[pos & (q->dq_size - 1)];
}

/* (Re)size both rings for max_wr, keeping every position (lock held or
 * not yet shared). 0 or -1. */
static int rings_alloc(struct shift_dsrq *q, uint32_t max_wr)
{
	uint32_t size = pow2_at_least(4ull * (max_wr ? max_wr : 1));
	uint8_t *ring;
	struct shift_dsrq_dq *dq;

	if ((uint64_t)size * q->stride > UINT32_MAX)
		return -1;
	ring = calloc(size, q->stride);
	dq = calloc(size, sizeof(*dq));
	if (!ring || !dq) {
		free(ring);
		free(dq);
		return -1;
	}
	for (uint64_t i = q->tail; q->ring && i < q->head; i++)
		memcpy(ring + ((i * q->stride) & (size * q->stride - 1)), shift_dsrq_entry(q, i),
		       q->stride);
	for (uint64_t i = q->dq_head; q->dq && i < q->dq_tail; i++)
		dq[i & (size - 1)] = *dq_at(q, i);
	free(q->ring);
	free(q->dq);
	q->ring = ring;
	q->dq = dq;
	q->size = q->dq_size = size;
	q->bmask = size * q->stride - 1;
	return 0;
}

struct shift_dsrq *shift_dsrq_create(struct ibv_srq *srq, uint32_t max_wr, uint32_t max_sge,
				     int (*prov_post)(struct ibv_srq *, struct ibv_recv_wr *,
						      struct ibv_recv_wr **))
{
	struct shift_dsrq *q = calloc(1, sizeof(*q));

	if (!q)
		return NULL;
	q->srq = srq;
	q->prov_post = prov_post;
	q->max_wr = max_wr;
	q->max_sge = max_sge ? max_sge : 1;
	q->stride = pow2_at_least(sizeof(struct shift_dsrq_entry) +
				  q->max_sge * sizeof(struct ibv_sge));
	snprintf(q->dev, sizeof(q->dev), "%.23s",
		 srq->context && srq->context->device ? srq->context->device->name : "?");
	if (rings_alloc(q, max_wr)) {
		free(q);
		return NULL;
	}
	shift_dsrq_add(q);
	return q;
}

struct shift_dsrq *shift_dsrq_of(const struct ibv_srq *srq)
{
	for (struct shift_dsrq *q = __atomic_load_n(&reg, __ATOMIC_ACQUIRE); q;
	     q = __atomic_load_n(&q->next, __ATOMIC_ACQUIRE))
		if (q->srq == srq)
			return q;
	return NULL;
}

void shift_dsrq_add(struct shift_dsrq *q)
{
	pthread_mutex_lock(&reg_lock);
	q->next = reg;
	__atomic_store_n(&reg, q, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&reg_lock);
}

struct shift_dsrq *shift_dsrq_remove(struct ibv_srq *srq)
{
	struct shift_dsrq *q;

	pthread_mutex_lock(&reg_lock);
	for (struct shift_dsrq **pp = &reg; (q = *pp); pp = &q->next) {
		if (q->srq == srq) {
			__atomic_store_n(pp, q->next, __ATOMIC_RELEASE);
			break;
		}
	}
	pthread_mutex_unlock(&reg_lock);
	return q;
}

void shift_dsrq_destroy(struct shift_dsrq *q)
{
	if (!q)
		return;
	free(q->ring);
	free(q->dq);
	free(q);
}

void shift_dsrq_unprotect(struct shift_dsrq *q, const char *why)
{
	shift_dsrq_lock(q);
	bool was = q->unprotected, moved = q->moved;

	/* (once moved the receives are SHIFT's until they are back) */
	if (!moved) {
		q->why = why;
		__atomic_store_n(&q->unprotected, true, __ATOMIC_RELEASE);
	}
	shift_dsrq_unlock(q);
	if (!was && !moved)
		shift_warn("%s: SRQ unprotected (%s): its QPs run as without SHIFT", q->dev, why);
}

int shift_dsrq_resize(struct shift_dsrq *q, uint32_t max_wr)
{
	int rc = 0;

	shift_dsrq_lock(q);
	q->max_wr = max_wr;
	if (4ull * max_wr > q->size)
		rc = rings_alloc(q, max_wr);
	shift_dsrq_unlock(q);
	if (rc)
		shift_dsrq_unprotect(q, "out of memory resizing its mirror");
	return rc;
}

static void advance(struct shift_dsrq *q)
{
	while (q->tail < q->head && !shift_dsrq_entry(q, q->tail)->live)
		q->tail++;
	while (q->dq_head < q->dq_tail && dq_at(q, q->dq_head)->idx == DQ_GONE)
		q->dq_head++;
}

/* Entry i goes to the default SRQ's order (lock held; room checked). */
static void dq_append(struct shift_dsrq *q, uint64_t i)
{
	struct shift_dsrq_entry *e = shift_dsrq_entry(q, i);
	struct shift_dsrq_dq *r = dq_at(q, q->dq_tail);

	r->wr_id = e->wr_id;
	r->idx = i;
	e->in_d = 1;
	e->dpos = q->dq_tail++;
	q->d_phys++;
}

static bool dq_full(const struct shift_dsrq *q, uint64_t n)
{
	return q->dq_tail + n - q->dq_head > q->dq_size;
}

/* Record wr at head (lock held): 0, or an errno (the provider's checks,
 * when moved; EOVERFLOW: the mirror is full). */
static int record_one(struct shift_dsrq *q, const struct ibv_recv_wr *wr)
{
	uint32_t n = (uint32_t)(wr->num_sge > 0 ? wr->num_sge : 0);
	struct shift_dsrq_entry *e;
	uint64_t len = 0;

	if (n > q->max_sge)
		return EINVAL;
	if (q->moved && q->live >= q->max_wr)
		return ENOMEM; /* (as the SRQ itself would refuse it) */
	if (q->head - q->tail >= q->size || (!q->moved && dq_full(q, 1)))
		return EOVERFLOW;
	e = shift_dsrq_entry(q, q->head);
	e->wr_id = wr->wr_id;
	e->num_sge = n;
	e->live = 1;
	e->in_d = 0;
	for (uint32_t i = 0; i < n; i++) {
		e->sge[i] = wr->sg_list[i];
		len += wr->sg_list[i].length;
	}
	if (len > q->max_len)
		q->max_len = len;
	if (!q->moved)
		dq_append(q, q->head);
	q->head++;
	q->live++;
	return 0;
}

/* Forget the entries recorded from `from` on (the provider refused them):
 * they are the newest in both rings. Lock held. */
static void unrecord_from(struct shift_dsrq *q, uint64_t from)
{
	while (q->head > from) {
		struct shift_dsrq_entry *e = shift_dsrq_entry(q, --q->head);

		q->live -= e->live;
		if (e->in_d) {
			q->d_phys--;
			q->dq_tail--;
		}
		e->live = e->in_d = 0;
	}
}

int shift_dsrq_post(struct shift_dsrq *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	int rc = 0;

	shift_dsrq_lock(q);
	if (q->unprotected) {
		shift_dsrq_unlock(q);
		return q->prov_post(q->srq, wr, bad_wr);
	}
	uint64_t head = q->head;
	struct ibv_recv_wr *w;

	for (w = wr; w && !rc; w = rc ? w : w->next)
		rc = record_one(q, w);
	if (rc == EOVERFLOW && q->moved)
		rc = ENOMEM; /* (the entries' ring: live ones pin it) */
	if (rc == EOVERFLOW) {
		/* the mirror cannot follow: the SRQ runs unprotected */
		unrecord_from(q, head);
		q->why = "its receive mirror overflowed";
		__atomic_store_n(&q->unprotected, true, __ATOMIC_RELEASE);
		shift_dsrq_unlock(q);
		shift_warn("%s: SRQ receive mirror overflow: the SRQ and its QPs run unprotected", q->dev);
		return q->prov_post(q->srq, wr, bad_wr);
	}
	if (q->moved) {
		/* recorded only: what arrives on the backup QPs fills them */
		if (rc)
			*bad_wr = w;
		shift_dsrq_unlock(q);
		return rc;
	}
	/* (a WR the mirror refused, the provider refuses too: the entries
	 * recorded before it are those it takes) */
	rc = q->prov_post(q->srq, wr, bad_wr);
	if (rc) {
		uint64_t keep = head;

		for (w = wr; w && w != *bad_wr; w = w->next)
			keep++;
		unrecord_from(q, keep);
	}
	shift_dsrq_unlock(q);
	return rc;
}

/* The first WQE of the default SRQ with this wr_id is consumed (lock
 * held): its entry is out of it; retired too if retire. */
static void out_of_d(struct shift_dsrq *q, uint64_t wr_id, bool retire)
{
	for (uint64_t p = q->dq_head; p < q->dq_tail; p++) {
		struct shift_dsrq_dq *r = dq_at(q, p);

		if (r->idx == DQ_GONE || r->wr_id != wr_id)
			continue;
		if (r->idx != DQ_STALE) {
			struct shift_dsrq_entry *e = shift_dsrq_entry(q, r->idx);

			e->in_d = 0;
			if (retire && e->live) {
				e->live = 0;
				q->live--;
			}
		}
		r->idx = DQ_GONE;
		q->d_phys--;
		break;
	}
	advance(q);
}

void shift_dsrq_retire(struct shift_dsrq *q, uint64_t wr_id)
{
	shift_dsrq_lock(q);
	out_of_d(q, wr_id, true);
	shift_dsrq_unlock(q);
}

void shift_dsrq_burned(struct shift_dsrq *q, uint64_t wr_id)
{
	shift_dsrq_lock(q);
	out_of_d(q, wr_id, false);
	shift_dsrq_unlock(q);
}

uint32_t shift_dsrq_held(const struct shift_dsrq *q)
{
	uint32_t live = __atomic_load_n(&q->live, __ATOMIC_RELAXED);
	uint32_t in_d = 0;

	/* (an estimate: d_phys counts stale WQEs too) */
	in_d = __atomic_load_n(&q->d_phys, __ATOMIC_RELAXED);
	return live > in_d ? live - in_d : 0;
}

int shift_dsrq_repost(struct shift_dsrq *q, bool unmove)
{
	int n = 0;

	shift_dsrq_lock(q);
	if ((unmove && q->d_phys) || (!unmove && q->moved)) {
		shift_dsrq_unlock(q);
		return -1;
	}
	for (uint64_t i = q->tail; i < q->head; i++) {
		struct shift_dsrq_entry *e = shift_dsrq_entry(q, i);
		struct ibv_recv_wr wr = { .wr_id = e->wr_id, .sg_list = e->sge,
					  .num_sge = (int)e->num_sge }, *bad;

		/* (posted after newer ones: the SRQ's order is lost for
		 * these, which verbs do not promise anyway) */
		if (!e->live || e->in_d)
			continue;
		if (dq_full(q, 1) || q->prov_post(q->srq, &wr, &bad)) {
			n = -1;
			break;
		}
		dq_append(q, i);
		n++;
	}
	if (unmove && n >= 0)
		__atomic_store_n(&q->moved, false, __ATOMIC_RELEASE);
	shift_dsrq_unlock(q);
	return n;
}

int shift_dsrq_take_oldest(struct shift_dsrq *q, struct shift_dsrq_entry *out)
{
	int rc = -1;

	shift_dsrq_lock(q);
	for (uint64_t i = q->tail; i < q->head; i++) {
		struct shift_dsrq_entry *e = shift_dsrq_entry(q, i);

		/* (moved, its WQE in the default SRQ, if any, is consumed by
		 * SHIFT before that SRQ is read again: stale till then) */
		if (!e->live || (e->in_d && !q->moved))
			continue;
		memcpy(out, e, sizeof(*e) + e->num_sge * sizeof(struct ibv_sge));
		if (e->in_d) {
			dq_at(q, e->dpos)->idx = DQ_STALE;
			e->in_d = 0;
		}
		e->live = 0;
		q->live--;
		advance(q);
		rc = 0;
		break;
	}
	shift_dsrq_unlock(q);
	return rc;
}
