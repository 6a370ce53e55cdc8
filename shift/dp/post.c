/*
 * Posting on a protected QP: what the context's ops.post_send, post_recv
 * and post_srq_recv are once SHIFT took the context over (dp/attach.c).
 *
 * In the Default state a post mirrors its WRs (shift/dp/dqp.h) and calls
 * the provider's post, under the QP's post_lock; the common single WR takes
 * a fast path that adds one table lookup, the lock and the copy. In any
 * other state the post goes to the failover layer (shift_dp_up), and on an
 * unprotected QP straight to the provider.
 */
#include "shift/dp/post.h"
#include "shift/dp/ctx.h"
#include "shift/dp/dsrq.h"
#include "shift/dp/nwq.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

/* rc is 0 when this is reached: keep it in the return register rather
 * than make a 0 again (one instruction on the hottest path) */
#if defined(__x86_64__)
#define SHIFT_KEEP_RC(rc) __asm__("" : "+a"(rc))
#else
#define SHIFT_KEEP_RC(rc) __asm__("" : "+r"(rc))
#endif

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
 * The fast paths' lock: post_lock taken at once, else (another poster, or a
 * failover, holds it) the general path, which waits for it, backing off to
 * sleeps (shift_dqp_lock). A tail call: nothing of the fast path stays live
 * across the wait, which a call inside it would make it keep (dqp.h).
 */
#define FAST_LOCK_OR(d, general)                              \
	do {                                                  \
		if (shift_unlikely(!shift_dqp_trylock(d)))    \
			return general;                       \
	} while (0)

/*
 * Default state: mirror the WRs, then the provider's post. The mirror and
 * the provider see the same WRs in the same order (post_lock), and WRs the
 * provider refuses are forgotten again. The common case takes the fast
 * paths below (shift_dp_post_send, shift_dp_post_recv) instead.
 */
static int shift_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
			   struct ibv_send_wr **bad_wr) __attribute__((noinline));
static int shift_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
			   struct ibv_recv_wr **bad_wr) __attribute__((noinline));

/*
 * The provider refused WRs the mirror holds (from *bad_wr on; post_lock
 * held): if the QP failed, SHIFT keeps them and the post succeeds
 * (shift_dp_up.post_refused), else they are forgotten and the refusal
 * is the application's.
 */
static __attribute__((noinline, cold)) int send_refused(struct shift_dqp *d, struct ibv_send_wr *wr,
							 struct ibv_send_wr *bad, uint64_t head, int rc)
{
	uint64_t from = head;

	for (struct ibv_send_wr *w = wr; w && w != bad; w = w->next)
		from++;
	if (shift_dp_up.post_refused(d, rc, from, d->rq_head))
		return 0;
	shift_dqp_unrecord_send(d, wr, bad, head);
	return rc;
}

static __attribute__((noinline, cold)) int recv_refused(struct shift_dqp *d, struct ibv_recv_wr *wr,
							 struct ibv_recv_wr *bad, uint64_t head, int rc)
{
	uint64_t from = head;

	if (d->dsrq) {
		/* (a QP on an SRQ has no receive queue: the refusal is the
		 * application's, whatever the QP's state) */
		shift_dqp_unrecord_recv(d, wr, bad, head);
		return rc;
	}

	for (struct ibv_recv_wr *w = wr; w && w != bad; w = w->next)
		from++;
	if (shift_dp_up.post_refused(d, rc, d->sq_head, from))
		return 0;
	shift_dqp_unrecord_recv(d, wr, bad, head);
	return rc;
}

/*
 * The chain held stop, a WR beyond the QP's capacities, and the WRs before
 * it are mirrored (shift_dqp_record_send). The provider refusing at or
 * before stop is the application's error, as without SHIFT, even on a QP
 * that failed meanwhile (plain refuses the same WRs): the WRs from bad on
 * are forgotten and the QP stays protected. The provider taking stop all
 * the same holds a WR the mirror does not: the QP is unprotected, said.
 */
#define BEYOND_CAPS(fn, wr_t, unrecord)                                                  \
	static __attribute__((noinline, cold)) int fn(struct shift_dqp *d, wr_t *wr, wr_t *bad, \
						      const wr_t *stop, uint64_t head, int rc) \
	{                                                                                \
		for (const wr_t *w = wr; rc && w; w = w->next) {                         \
			if (w == bad) {                                                  \
				unrecord(d, wr, bad, head);                              \
				return rc;                                               \
			}                                                                \
			if (w == stop)                                                   \
				break;                                                   \
		}                                                                        \
		shift_dqp_unprotect(d, "the provider took a work request beyond the QP's " \
				       "capacities (SGEs or inline data)");              \
		return rc;                                                               \
	}
BEYOND_CAPS(send_beyond_caps, struct ibv_send_wr, shift_dqp_unrecord_send)
BEYOND_CAPS(recv_beyond_caps, struct ibv_recv_wr, shift_dqp_unrecord_recv)

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
	if (shift_likely(shift_dqp_send_state(d) == SHIFT_SEND_DEFAULT)) {
		const struct ibv_send_wr *stop = NULL;

		shift_dqp_record_send(d, wr, &stop);
		rc = d->prov_post_send(qp, wr, bad_wr);
		if (shift_unlikely(stop))
			rc = send_beyond_caps(d, wr, *bad_wr, stop, head, rc);
		else if (shift_unlikely(rc))
			rc = send_refused(d, wr, *bad_wr, head, rc);
	} else if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED) {
		rc = d->prov_post_send(qp, wr, bad_wr);
	} else {
		rc = shift_dp_up.post_send_fallback(d, wr, bad_wr);
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
	if (shift_likely(shift_dqp_recv_state(d) == SHIFT_RECV_DEFAULT &&
			 shift_dqp_send_state(d) != SHIFT_SEND_UNPROTECTED)) {
		const struct ibv_recv_wr *stop = NULL;

		(void)shift_dqp_rq_room(d); /* (the fast path's bound again) */
		shift_dqp_record_recv(d, wr, &stop);
		rc = d->prov_post_recv(qp, wr, bad_wr);
		if (shift_unlikely(stop))
			rc = recv_beyond_caps(d, wr, *bad_wr, stop, head, rc);
		else if (shift_unlikely(rc))
			rc = recv_refused(d, wr, *bad_wr, head, rc);
	} else if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED) {
		rc = d->prov_post_recv(qp, wr, bad_wr);
	} else {
		rc = shift_dp_up.post_recv_fallback(d, wr, bad_wr);
	}
	shift_dqp_unlock(d);
	return rc;
}

/* The provider refused the WR the fast path just mirrored: forget it,
 * unless the QP failed (send_refused). */
static __attribute__((noinline, cold)) int post_send_refused(struct shift_dqp *d, int rc)
{
	if (shift_dp_up.post_refused(d, rc, d->sq_head - 1, d->rq_head))
		rc = 0;
	else
		shift_dqp_unrecord_last_send(d);
	shift_dqp_unlock(d);
	return rc;
}

static __attribute__((noinline, cold)) int post_recv_refused(struct shift_dqp *d, int rc)
{
	if (!d->dsrq && shift_dp_up.post_refused(d, rc, d->sq_head, d->rq_head - 1))
		rc = 0;
	else
		d->rq_head--;
	shift_dqp_unlock(d);
	return rc;
}

/* The inline WR just mirrored (one SGE): its bytes after the SGEs, as the
 * general path copies them (the application may reuse the buffer once the
 * post returns). False if they do not fit (the general path says why). */
static __attribute__((noinline)) bool record_inline(struct shift_dqp *d, const struct ibv_send_wr *wr)
{
	struct shift_swqe *e = shift_dqp_swqe(d, d->sq_head - 1);
	uint32_t len = wr->sg_list[0].length;

	if (shift_unlikely(len > d->max_inline))
		return false;
	memcpy(&e->sge[d->max_send_sge], (const void *)(uintptr_t)wr->sg_list[0].addr, len);
	e->inline_len = len;
	return true;
}

/*
 * Default state, a chain of WRs each WRITE, SEND or READ (with or without
 * immediate) of one SGE, inline or not (NCCL posts such chains, and 32-byte
 * inline sends): mirrored one by one as the single common WR is, under one
 * post_lock, then one provider post. Anything else met on the way (an
 * atomic, another SGE count, a mirror that looks full, another state)
 * forgets what this mirrored and takes the general path.
 */
static __attribute__((noinline)) int post_send_chain(struct shift_dqp *d, struct ibv_qp *qp,
						     struct ibv_send_wr *wr,
						     struct ibv_send_wr **bad_wr)
{
	uint64_t head;
	int rc;

	FAST_LOCK_OR(d, shift_post_send(qp, wr, bad_wr));
	head = d->sq_head;
	for (const struct ibv_send_wr *w = wr; w; w = w->next) {
		if (shift_unlikely(w->num_sge != 1 || (unsigned)w->opcode > IBV_WR_RDMA_READ ||
				   d->sq_head >= d->sq_limit))
			goto general;
		shift_dqp_record_one(d, w);
		if (shift_unlikely(w->send_flags & IBV_SEND_INLINE) && !record_inline(d, w))
			goto general;
	}
	rc = d->prov_post_send(qp, wr, bad_wr);
	if (shift_unlikely(rc))
		rc = send_refused(d, wr, *bad_wr, head, rc);
	shift_dqp_unlock(d);
	return rc;
general:
	while (d->sq_head > head)
		shift_dqp_unrecord_last_send(d);
	shift_dqp_unlock(d);
	return shift_post_send(qp, wr, bad_wr);
}

/*
 * Default state, one WRITE, SEND or READ WR alone in its chain, mirrored
 * under post_lock, then the provider's post; anything else goes to
 * shift_post_send(). kind, a constant at each call:
 * - ONE_COMMON: one SGE, not inline (shift_dqp_send_is_common), the copy
 *   inline in the caller;
 * - ONE_INLINE: one SGE with IBV_SEND_INLINE and at most 64 bytes (NCCL's
 *   small control writes): its bytes copied after the entry's SGEs (the
 *   application may reuse its buffer once the post returns);
 * - ONE_SGES: 2..max_send_sge SGEs, not inline: the further SGEs after the
 *   first.
 * Only d stays live across the provider's call.
 */
enum { ONE_COMMON, ONE_INLINE, ONE_SGES };

static inline __attribute__((always_inline)) int
post_send_one(struct shift_dqp *d, struct ibv_qp *qp, struct ibv_send_wr *wr,
	      struct ibv_send_wr **bad_wr, int kind)
{
	uint32_t n = kind == ONE_INLINE ? wr->sg_list[0].length : (uint32_t)wr->num_sge;

	FAST_LOCK_OR(d, shift_post_send(qp, wr, bad_wr));
	/* (the bound is 0 in any other state than Default; a mirror that
	 * looks full goes to shift_post_send(), which syncs) */
	if (shift_likely(d->sq_head < d->sq_limit &&
			 (kind != ONE_INLINE || n <= d->inl_max) &&
			 (kind != ONE_SGES || (n <= d->max_send_sge &&
					       (unsigned)wr->opcode <= IBV_WR_RDMA_READ &&
					       !(wr->send_flags & IBV_SEND_INLINE))))) {
		struct shift_swqe *e = shift_dqp_swqe(d, d->sq_head);
		int rc;

		shift_dqp_record_one(d, wr);
		if (kind == ONE_INLINE) {
			shift_copy64((uint8_t *)e + d->inl_off,
				     (const void *)(uintptr_t)wr->sg_list[0].addr, n);
			e->inline_len = n;
		} else if (kind == ONE_SGES) {
			for (uint32_t i = 1; i < n; i++)
				e->sge[i] = wr->sg_list[i];
		}
		rc = d->prov_post_send(qp, wr, bad_wr);
		if (shift_unlikely(rc))
			return post_send_refused(d, rc);
		/* (rc is 0 here: returned as is, not made again) */
		SHIFT_KEEP_RC(rc);
		shift_dqp_unlock(d);
		return rc;
	}
	shift_dqp_unlock(d);
	return shift_post_send(qp, wr, bad_wr);
}

static __attribute__((noinline)) int post_send_inline(struct shift_dqp *d, struct ibv_qp *qp,
						      struct ibv_send_wr *wr,
						      struct ibv_send_wr **bad_wr)
{
	return post_send_one(d, qp, wr, bad_wr, ONE_INLINE);
}

static __attribute__((noinline)) int post_send_sges(struct shift_dqp *d, struct ibv_qp *qp,
						    struct ibv_send_wr *wr,
						    struct ibv_send_wr **bad_wr)
{
	return post_send_one(d, qp, wr, bad_wr, ONE_SGES);
}

/* The data-path state of qp, found from the QP alone (a hash and, rarely,
 * a chain), or NULL. */
#define LOOKUP_OR(qp, unprotected)                                                   \
	struct shift_dqp *d = __atomic_load_n(&shift_dqp_tab[shift_dqp_hash(qp)],    \
					      __ATOMIC_ACQUIRE);                     \
	while (shift_unlikely(d->qp != qp)) {                                        \
		if (d == &shift_dqp_none)                                            \
			return unprotected;                                          \
		d = __atomic_load_n(&d->next_by_qp, __ATOMIC_ACQUIRE);               \
	}

__attribute__((hot)) int shift_dp_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
						     struct ibv_send_wr **bad_wr)
{
	LOOKUP_OR(qp, unprotected_post_send(qp, wr, bad_wr));
	if (shift_likely(shift_dqp_send_is_one(wr))) {
		if (shift_likely(!(wr->send_flags & IBV_SEND_INLINE)))
			return post_send_one(d, qp, wr, bad_wr, ONE_COMMON);
		return post_send_inline(d, qp, wr, bad_wr);
	}
	if (!wr->next && wr->num_sge > 1)
		return post_send_sges(d, qp, wr, bad_wr);
	return post_send_chain(d, qp, wr, bad_wr);
}

/* One receive WR of n SGEs, Default state: mirrored under post_lock,
 * else the general path. n is a constant at the call: 0 or 1 (the copy
 * inline in the caller), or RECV_SGES for 2..max_recv_sge (its count
 * read from the WR). */
#define RECV_SGES 2u
static inline __attribute__((always_inline)) int
post_recv_fast(struct shift_dqp *d, struct ibv_qp *qp, struct ibv_recv_wr *wr,
	       struct ibv_recv_wr **bad_wr, unsigned n)
{
	uint32_t ns = n == RECV_SGES ? (uint32_t)wr->num_sge : n;

	FAST_LOCK_OR(d, shift_post_recv(qp, wr, bad_wr));
	/* (rq_room fails unless both states are Default) */
	if (shift_likely((n != RECV_SGES || ns <= d->max_recv_sge) && shift_dqp_rq_room(d))) {
		int rc;

		if (n == RECV_SGES) {
			struct shift_rwqe *e = shift_dqp_rwqe(d, d->rq_head);

			e->wr_id = wr->wr_id;
			e->num_sge = ns;
			for (uint32_t i = 0; i < ns; i++)
				e->sge[i] = wr->sg_list[i];
			d->rq_head++;
		} else {
			shift_dqp_record_recv_one(d, wr, n);
		}
		rc = d->prov_post_recv(qp, wr, bad_wr);
		if (shift_unlikely(rc))
			return post_recv_refused(d, rc);
		/* (rc is 0 here: returned as is, not made again) */
		SHIFT_KEEP_RC(rc);
		shift_dqp_unlock(d);
		return rc;
	}
	shift_dqp_unlock(d);
	return shift_post_recv(qp, wr, bad_wr);
}

static __attribute__((noinline)) int post_recv_sges(struct shift_dqp *d, struct ibv_qp *qp,
						    struct ibv_recv_wr *wr,
						    struct ibv_recv_wr **bad_wr)
{
	return post_recv_fast(d, qp, wr, bad_wr, RECV_SGES);
}

/* A single receive of at most one SGE takes the fast path (true, *rc its
 * result); NCCL posts 0-SGE receives (for RDMA write with immediate). */
static inline __attribute__((always_inline)) bool
recv_fast(struct shift_dqp *d, struct ibv_qp *qp, struct ibv_recv_wr *wr,
	  struct ibv_recv_wr **bad_wr, int *rc)
{
	if (shift_likely(!wr->next)) {
		if (shift_likely(wr->num_sge == 1)) {
			*rc = post_recv_fast(d, qp, wr, bad_wr, 1);
			return true;
		}
		if (wr->num_sge == 0) {
			*rc = post_recv_fast(d, qp, wr, bad_wr, 0);
			return true;
		}
	}
	return false;
}

__attribute__((hot)) int shift_dp_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
						     struct ibv_recv_wr **bad_wr)
{
	int rc;

	LOOKUP_OR(qp, unprotected_post_recv(qp, wr, bad_wr));
	if (recv_fast(d, qp, wr, bad_wr, &rc))
		return rc;
	if (!wr->next && wr->num_sge > 1)
		return post_recv_sges(d, qp, wr, bad_wr);
	return shift_post_recv(qp, wr, bad_wr);
}

/*
 * Native work-queue access (dp/nwq.h). The common shapes keep the mirror's
 * fast paths above: a one-SGE WR costs fewer instructions copied (a 32-byte
 * block and its SGE) than its WQE index costs read (callgrind.sh). A WR
 * whose copy costs more (inline data, several SGEs, an atomic) is recorded
 * as its wr_id, opcode, flags and WQE index only, and read back from the
 * provider's queue at failover. A QP without native access takes the
 * mirror's paths for everything.
 */

/* The provider refused WRs a native post recorded: its queue does not hold
 * them, so they are mirrored in full (post_lock held), then as above. */
static __attribute__((noinline, cold)) int native_send_refused(struct shift_dqp *d,
							       struct ibv_send_wr *wr,
							       struct ibv_send_wr *bad,
							       uint64_t head, int rc)
{
	const struct ibv_send_wr *stop = NULL;

	while (d->sq_head > head)
		shift_dqp_unrecord_last_send(d);
	switch (shift_dqp_record_send(d, wr, &stop)) {
	case 0:
		return send_refused(d, wr, bad, head, rc);
	case 1:
		return send_beyond_caps(d, wr, bad, stop, head, rc);
	default:
		return rc; /* (the mirror cannot hold them: unprotected, said) */
	}
}

static __attribute__((noinline, cold)) int native_recv_refused(struct shift_dqp *d,
							       struct ibv_recv_wr *wr,
							       struct ibv_recv_wr *bad,
							       uint64_t head, int rc)
{
	const struct ibv_recv_wr *stop = NULL;

	d->rq_head = head;
	switch (shift_dqp_record_recv(d, wr, &stop)) {
	case 0:
		return recv_refused(d, wr, bad, head, rc);
	case 1:
		return recv_beyond_caps(d, wr, bad, stop, head, rc);
	default:
		return rc;
	}
}

/* One send WR of a native QP, not the common one: its wr_id, opcode, flags
 * and WQE index only, when the QP is in Default with room; else the
 * general path. */
static __attribute__((noinline)) int native_post_send(struct shift_dqp *d, struct ibv_qp *qp,
						      struct ibv_send_wr *wr,
						      struct ibv_send_wr **bad_wr)
{
	struct shift_swqe *e;
	int rc;

	FAST_LOCK_OR(d, shift_post_send(qp, wr, bad_wr));
	if (shift_unlikely(d->sq_head >= d->sq_limit)) {
		shift_dqp_unlock(d);
		return shift_post_send(qp, wr, bad_wr);
	}
	e = shift_dqp_swqe(d, d->sq_head);
	e->wr_id = wr->wr_id;
	e->num_sge = SHIFT_WQE_NATIVE;
	e->opcode = (uint32_t)wr->opcode;
	e->send_flags = wr->send_flags;
	e->imm = shift_nwq_index(d->sq_dbrec);
	if ((wr->send_flags & IBV_SEND_SIGNALED) || d->sq_sig_all)
		d->sig_head++;
	d->posted_by_op[wr->opcode]++; /* (shift_nwq_send_op: < 12) */
	d->sq_head++;
	rc = d->prov_post_send(qp, wr, bad_wr);
	if (shift_unlikely(rc))
		rc = native_send_refused(d, wr, *bad_wr, d->sq_head - 1, rc);
	shift_dqp_unlock(d);
	return rc;
}

__attribute__((hot)) int shift_dp_post_send_native(struct ibv_qp *qp, struct ibv_send_wr *wr,
						   struct ibv_send_wr **bad_wr)
{
	LOOKUP_OR(qp, unprotected_post_send(qp, wr, bad_wr));
	if (shift_likely(shift_dqp_send_is_common(wr)))
		return post_send_one(d, qp, wr, bad_wr, ONE_COMMON);
	if (d->sq_dbrec && !wr->next && shift_nwq_send_op((unsigned)wr->opcode))
		return native_post_send(d, qp, wr, bad_wr);
	return post_send_chain(d, qp, wr, bad_wr);
}

/* Receives of a native QP other than one of at most one SGE: recorded as
 * their wr_ids and WQE indices, in Default with room; else the general
 * path. */
static __attribute__((noinline)) int native_post_recv(struct shift_dqp *d, struct ibv_qp *qp,
						      struct ibv_recv_wr *wr,
						      struct ibv_recv_wr **bad_wr)
{
	uint64_t head;
	uint32_t idx;
	int rc;

	FAST_LOCK_OR(d, shift_post_recv(qp, wr, bad_wr));
	head = d->rq_head;
	idx = shift_nwq_index(d->rq_dbrec);
	for (const struct ibv_recv_wr *w = wr; w; w = w->next) {
		/* (room fails unless both states are Default) */
		if (shift_unlikely(!shift_dqp_rq_room(d))) {
			d->rq_head = head;
			shift_dqp_unlock(d);
			return shift_post_recv(qp, wr, bad_wr);
		}
		struct shift_rwqe *e = shift_dqp_rwqe(d, d->rq_head);

		e->wr_id = w->wr_id;
		e->num_sge = SHIFT_WQE_NATIVE;
		e->pad = idx++ & 0xffff;
		d->rq_head++;
	}
	rc = d->prov_post_recv(qp, wr, bad_wr);
	if (shift_unlikely(rc))
		rc = native_recv_refused(d, wr, *bad_wr, head, rc);
	shift_dqp_unlock(d);
	return rc;
}

__attribute__((hot)) int shift_dp_post_recv_native(struct ibv_qp *qp, struct ibv_recv_wr *wr,
						   struct ibv_recv_wr **bad_wr)
{
	int rc;

	LOOKUP_OR(qp, unprotected_post_recv(qp, wr, bad_wr));
	if (recv_fast(d, qp, wr, bad_wr, &rc))
		return rc;
	if (d->rq_dbrec)
		return native_post_recv(d, qp, wr, bad_wr);
	return shift_post_recv(qp, wr, bad_wr);
}

/* An SRQ SHIFT mirrors (dp/dsrq.c), or straight to the provider. */
int shift_dp_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
			       struct ibv_recv_wr **bad_wr)
{
	struct shift_dsrq *q = shift_dsrq_of(srq);

	if (q)
		return shift_dsrq_post(q, wr, bad_wr);
	struct shift_ctx *s = shift_ctx_of(srq->context);

	if (shift_unlikely(!s)) {
		*bad_wr = wr;
		return EINVAL;
	}
	return s->post_srq_recv(srq, wr, bad_wr);
}
