/*
 * The data path of one application SRQ: a mirror of its receive WQEs
 * (shift/dp/dsrq.c), the SRQ-side counterpart of dqp.h's receive mirror.
 *
 * Receives on an SRQ are not the QPs': any QP attached to it may consume
 * any of them, and completions of different QPs (different CQs) are polled
 * in any order. So the mirror keeps each posted receive as an entry in a
 * ring, indexed like dqp.h's, marked live while the application has not had
 * it back; and the default SRQ's WQEs in the order posted, in a second ring
 * (dq: wr_id and entry, or DQ_STALE for a WQE whose entry was filled from
 * the backup path). A receive completion of a QP on the SRQ takes the first
 * WQE of dq with its wr_id (the SRQ hands out its WQEs in the order posted,
 * so of several with one wr_id the first went first): its entry is no
 * longer in the default SRQ, nor live. tail moves past entries no longer
 * live, head is the next to post; both rings hold four times the SRQ's
 * max_wr, so the holes of out-of-order completion rarely fill them (if they
 * do the SRQ runs unprotected, as a full QP mirror does).
 *
 * Failover (shift/fo/srq.c) takes an SRQ's receives over once every QP on
 * it has left its default QP ("moved"): from then on the application's
 * posts are only recorded here, and the failover layer fills the oldest
 * live entries with what arrives on the backup QPs
 * (shift_dsrq_take_oldest()); their WQEs stay in the default SRQ (verbs
 * cannot take one back) until SHIFT consumes them with empty messages of
 * its own (shift_dsrq_burned()). Once none is left there (d_phys = 0) the
 * live entries go back to the default SRQ (shift_dsrq_unmove()) and the
 * QPs may fail back; a QP still on its backup then takes receives out of
 * the default SRQ the same way, one at a time.
 *
 * Posters, pollers and the failover layer share the mirror under one spin
 * lock (post_srq_recv is not the hot path SHIFT budgets: no SRQ there).
 */
#ifndef SHIFT_DP_DSRQ_H
#define SHIFT_DP_DSRQ_H

#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#include "shift/base/cpu.h"

/* Receives SHIFT keeps on each backup QP of a QP on an SRQ, for what
 * arrives there once failed over (fo/srq.c) */
#define SHIFT_SRQ_BOUNCE 16
/* SGEs per receive the mirror takes (an SRQ with more is not protected) */
#define SHIFT_DSRQ_MAX_SGE 64

struct shift_dsrq_entry {
	uint64_t wr_id;
	uint32_t num_sge;
	uint16_t live; /* the application has not had it back */
	uint16_t in_d; /* its WQE is in the default SRQ, at dq position dpos */
	uint64_t dpos;
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
	uint32_t live;            /* live entries */
	/* the default SRQ's WQEs, in order: [dq_head, dq_tail) of dq_size */
	struct shift_dsrq_dq {
		uint64_t wr_id;
		uint64_t idx;     /* the entry, DQ_STALE, or DQ_GONE (consumed) */
	} *dq;
	uint32_t dq_size;
	uint64_t dq_head, dq_tail;
	uint32_t d_phys;          /* WQEs in the default SRQ */
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
	void *fo_burner;          /* its loopback pair on the default NIC (fo/srq_burn.c) */
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
			shift_cpu_relax();
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
/* A receive completed on a QP of the SRQ, to the application (a success,
 * or an error that is the application's): its entry left the default SRQ
 * and is no longer live. */
void shift_dsrq_retire(struct shift_dsrq *q, uint64_t wr_id);
/* A WQE of the default SRQ was consumed by a message of SHIFT's (empty: it
 * wrote nothing): its entry left the default SRQ, and stays live. */
void shift_dsrq_burned(struct shift_dsrq *q, uint64_t wr_id);
/* Take (retire) the oldest live entry, copied to e (room for max_sge
 * SGEs): moved, any; else only one out of the default SRQ. 0, or -1. */
int shift_dsrq_take_oldest(struct shift_dsrq *q, struct shift_dsrq_entry *e);
/* Post the live entries that are not in the default SRQ to it: all of them
 * to end "moved" (only once d_phys is 0), or those SHIFT took out and did
 * not need. The number posted, or -1 (the provider refused: they stay). */
int shift_dsrq_repost(struct shift_dsrq *q, bool unmove);
/* Live entries not in the default SRQ (lock-free estimate). */
uint32_t shift_dsrq_held(const struct shift_dsrq *q);

#endif /* SHIFT_DP_DSRQ_H */
