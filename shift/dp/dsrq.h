/*
 * The data path of one application SRQ: a mirror of its receive WQEs
 * (shift/dp/dsrq.c), the SRQ-side counterpart of dqp.h's receive mirror.
 *
 * Receives on an SRQ are not the QPs': any QP attached to it may consume
 * any of them, and completions of different QPs (different CQs) are polled
 * in any order. So the mirror keeps each posted receive as an entry in a
 * ring, indexed like dqp.h's, but retires entries by identity: a successful
 * receive completion of a QP on the SRQ retires the oldest live entry with
 * its wr_id (an SRQ hands out its WQEs in the order posted, so of several
 * with one wr_id the oldest went first). tail moves past retired entries,
 * head is the next to post; the ring holds twice the SRQ's max_wr, so the
 * holes of out-of-order retirement rarely fill it (if they do the SRQ runs
 * unprotected, as a full QP mirror does).
 *
 * Failover (shift/fo/srq.c) takes an SRQ's receives over once every QP on
 * it has left its default QP ("moved"): from then on the application's
 * posts are only recorded here (the default SRQ is never posted to again,
 * see fo/srq.c), and the failover layer fills the oldest live entries with
 * what arrives on the backup QPs (shift_dsrq_take_oldest()).
 *
 * Posters, pollers and the failover layer share the mirror under one spin
 * lock (post_srq_recv is not the hot path SHIFT budgets: no SRQ there).
 */
#ifndef SHIFT_DP_DSRQ_H
#define SHIFT_DP_DSRQ_H

#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

/* Receives SHIFT keeps on each backup QP of a QP on an SRQ, for what
 * arrives there once failed over (fo/srq.c) */
#define SHIFT_SRQ_BOUNCE 16
/* SGEs per receive the mirror takes (an SRQ with more is not protected) */
#define SHIFT_DSRQ_MAX_SGE 64

struct shift_dsrq_entry {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t live; /* posted (or recorded while moved), not consumed */
	struct ibv_sge sge[];
};

struct shift_dsrq {
	int lock;                 /* spin lock: shift_dsrq_lock() */
	struct ibv_srq *srq;      /* the application's */
	struct shift_dsrq *next;  /* the registry (shift_dsrq_of) */
	/* the provider's post_srq_recv of its context */
	int (*prov_post)(struct ibv_srq *srq, struct ibv_recv_wr *wr,
			 struct ibv_recv_wr **bad_wr);
	char dev[24];             /* device name, for logs */
	uint8_t *ring;
	uint32_t size, stride, bmask; /* powers of two; bmask = size * stride - 1 */
	uint64_t head, tail;      /* recorded / first not yet retired */
	uint32_t max_wr, max_sge; /* the SRQ's, as created (or modified) */
	uint32_t live;            /* entries not consumed */
	uint64_t max_len;         /* the largest receive recorded (bytes) */
	/* every QP on it has left its default QP: posts are recorded only */
	bool moved;
	/* a QP on it cannot fail over with the others (not protected, or its
	 * mirror overflowed): posts go straight to the provider, and no QP on
	 * it fails over */
	bool unprotected;
	const char *why;
	/* the failover layer's (fo/srq.c): what arrived on the backup QPs and
	 * waits for an entry, oldest first; the data path only carries it */
	void *fo_pending_head, *fo_pending_tail;
};

static inline struct shift_dsrq_entry *shift_dsrq_entry(struct shift_dsrq *q, uint64_t i)
{
	return (struct shift_dsrq_entry *)(q->ring + ((i * q->stride) & q->bmask));
}

/* moved and unprotected are written under the lock and read without it
 * (a QP's creation, the failover layer): atomically */
static inline bool shift_dsrq_moved(const struct shift_dsrq *q)
{
	return __atomic_load_n(&q->moved, __ATOMIC_ACQUIRE);
}

static inline bool shift_dsrq_unprotected(const struct shift_dsrq *q)
{
	return __atomic_load_n(&q->unprotected, __ATOMIC_ACQUIRE);
}

static inline void shift_dsrq_lock(struct shift_dsrq *q)
{
	while (__atomic_exchange_n(&q->lock, 1, __ATOMIC_ACQUIRE))
		while (__atomic_load_n(&q->lock, __ATOMIC_RELAXED))
			__builtin_ia32_pause();
}

static inline void shift_dsrq_unlock(struct shift_dsrq *q)
{
	__atomic_store_n(&q->lock, 0, __ATOMIC_RELEASE);
}

/* Start mirroring an SRQ created with these capabilities (as returned);
 * NULL on allocation failure (the SRQ and its QPs run unprotected). */
struct shift_dsrq *shift_dsrq_create(struct ibv_srq *srq, uint32_t max_wr, uint32_t max_sge,
				     int (*prov_post)(struct ibv_srq *, struct ibv_recv_wr *,
						      struct ibv_recv_wr **));
/* Its mirror, or NULL: lock-free (the registry only grows at its head,
 * under a mutex; an entry leaves it before the SRQ is destroyed). */
struct shift_dsrq *shift_dsrq_of(const struct ibv_srq *srq);
/* Unlink it (before the provider destroys the SRQ); the caller frees it
 * with shift_dsrq_destroy() once that succeeded, or links it back. */
struct shift_dsrq *shift_dsrq_remove(struct ibv_srq *srq);
void shift_dsrq_add(struct shift_dsrq *q);
void shift_dsrq_destroy(struct shift_dsrq *q);
/* The SRQ's max_wr changed (modify_srq): 0, or -1 (it runs unprotected). */
int shift_dsrq_resize(struct shift_dsrq *q, uint32_t max_wr);
/* The SRQ cannot fail over any more: posts go straight to the provider. */
void shift_dsrq_unprotect(struct shift_dsrq *q, const char *why);

/* ibv_post_srq_recv of a context SHIFT took over (dp/post.c). */
int shift_dsrq_post(struct shift_dsrq *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
/* A receive completed successfully on a QP of the SRQ: retire its entry. */
void shift_dsrq_retire(struct shift_dsrq *q, uint64_t wr_id);
/* Take (retire) the oldest live entry, copied to e (room for max_sge
 * SGEs): 0, or -1 if none. The failover layer's, once moved. */
int shift_dsrq_take_oldest(struct shift_dsrq *q, struct shift_dsrq_entry *e);

#endif /* SHIFT_DP_DSRQ_H */
