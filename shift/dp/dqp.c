/*
 * Work-queue mirror of an application QP (see dqp.h): allocation, and the
 * per-WR copy done on every post in the Default state. The copy is the only
 * work SHIFT adds to a post; it touches preallocated memory only.
 */
#include "shift/dp/dqp.h"
#include "shift/base/backoff.h"
#include "shift/dp/dsrq.h"
#include "shift/dp/limbo.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* shift_dqp_record_one() copies num_sge .. rdma.rkey of a send WR as one
 * 32-byte block */
#define SAME_DISTANCE(f, wf) \
	(offsetof(struct shift_swqe, f) - offsetof(struct shift_swqe, num_sge) == \
	 offsetof(struct ibv_send_wr, wf) - offsetof(struct ibv_send_wr, num_sge))
_Static_assert(SAME_DISTANCE(opcode, opcode) && SAME_DISTANCE(send_flags, send_flags) &&
	       SAME_DISTANCE(imm, imm_data) && SAME_DISTANCE(remote_addr, wr.rdma.remote_addr) &&
	       SAME_DISTANCE(rkey, wr.rdma.rkey),
	       "struct shift_swqe must follow struct ibv_send_wr's layout");
_Static_assert(offsetof(struct shift_swqe, num_sge) + 32 == offsetof(struct shift_swqe, compare_add) &&
	       offsetof(struct ibv_send_wr, num_sge) + 32 <= sizeof(struct ibv_send_wr),
	       "the 32-byte block stays inside both structures");
/* dqp.h's hot/cold layout: four hot lines, the cold part after them */
_Static_assert(offsetof(struct shift_dqp, post_lock) == 0 && offsetof(struct shift_dqp, sig_head) < 64 &&
	       offsetof(struct shift_dqp, posted_by_op) == 64 &&
	       offsetof(struct shift_dqp, states) == 128 && offsetof(struct shift_dqp, inl_max) < 192 &&
	       offsetof(struct shift_dqp, sig_tail) == 192 &&
	       offsetof(struct shift_dqp, next_in_bucket) < 256 && offsetof(struct shift_dqp, dev) == 256,
	       "struct shift_dqp: the hot fields in their four lines");
_Static_assert(sizeof(enum shift_send_state) == 4 && sizeof(enum shift_recv_state) == 4 &&
	       SHIFT_SEND_DEFAULT == 0 && SHIFT_RECV_DEFAULT == 0,
	       "states: both Default reads as states == 0");

static uint32_t pow2_at_least(uint32_t n)
{
	if (n <= 1)
		return 1;
	if (n > (1u << 30))
		return 1u << 30;
	return 1u << (32 - __builtin_clz(n - 1));
}

/* The tag of SHIFT's own WRs on a QP (dqp.h): a hash of its device name and
 * QP number, the same in every run (the simulator replays a schedule from
 * its seed), the kind's 4 bits clear. */
static uint64_t own_tag(const struct shift_dqp *d)
{
	uint64_t h = 0xcbf29ce484222325ull ^ d->qpn;

	for (const char *p = d->dev; *p; p++)
		h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
	h ^= h >> 31;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 29;
	return h & ~0xfull;
}

struct shift_dqp *shift_dqp_create(struct ibv_qp *qp, const struct ibv_qp_cap *cap,
				   int sq_sig_all)
{
	struct shift_dqp *d = calloc(1, sizeof(*d));

	if (!d)
		return NULL;
	static uint64_t serials;

	d->qp = qp;
	d->qpn = qp->qp_num;
	d->serial = __atomic_add_fetch(&serials, 1, __ATOMIC_RELAXED);
	/* (the name cut to fit, as "%.23s" would, without printf's cost at
	 * every create) */
	const char *dev = qp->context && qp->context->device ? qp->context->device->name : "?";
	size_t len = strnlen(dev, sizeof(d->dev) - 1);

	memcpy(d->dev, dev, len);
	d->dev[len] = '\0';
	d->own_tag = own_tag(d);
	d->sq_sig_all = sq_sig_all;
	d->max_send_sge = cap->max_send_sge ? cap->max_send_sge : 1;
	d->max_recv_sge = cap->max_recv_sge ? cap->max_recv_sge : 1;
	d->max_inline = cap->max_inline_data;
	/* twice the capacity: see dqp.h on syncs */
	d->sq_size = pow2_at_least(2 * (cap->max_send_wr ? cap->max_send_wr : 1));
	d->rq_size = pow2_at_least(cap->max_recv_wr ? cap->max_recv_wr : 1);
	/* strides of what an entry holds, 8-byte aligned, not rounded to a
	 * power of two (a one-SGE send entry is 72 bytes, not 128): an
	 * entry's offset is a mask and a multiply either way */
	uint64_t sst = sizeof(struct shift_swqe) + (uint64_t)d->max_send_sge * sizeof(struct ibv_sge) +
		       ((uint64_t)d->max_inline + 7) / 8 * 8;
	uint64_t rst = sizeof(struct shift_rwqe) + (uint64_t)d->max_recv_sge * sizeof(struct ibv_sge);

	/* (rings of at most 4 GB: a QP asking for more runs unprotected) */
	if (d->sq_size * sst > UINT32_MAX || d->rq_size * rst > UINT32_MAX) {
		free(d);
		return NULL;
	}
	d->sq_stride = (uint32_t)sst;
	d->rq_stride = (uint32_t)rst;
	d->sq_mask = d->sq_size - 1;
	if (offsetof(struct shift_swqe, sge[d->max_send_sge]) <= UINT16_MAX) {
		d->inl_off = (uint16_t)offsetof(struct shift_swqe, sge[d->max_send_sge]);
		d->inl_max = (uint16_t)(d->max_inline < 64 ? d->max_inline : 64);
	}
	d->rq_mask = d->rq_size - 1;
	d->sq_limit = d->sq_size;
	d->rq_limit = d->rq_size;
	/* not zeroed: an entry is written by the post that mirrors it before
	 * anything reads it, so a ring costs memory only as far as the QP's
	 * posts reach (no memset of 2 x max_send_wr entries at create) */
	/* one block, the receive ring after the send ring (strides of 8-byte
	 * multiples: the receive ring stays aligned) */
	d->sq = malloc((size_t)d->sq_size * d->sq_stride + (size_t)d->rq_size * d->rq_stride);
	if (!d->sq) {
		free(d);
		return NULL;
	}
	d->rq = d->sq + (size_t)d->sq_size * d->sq_stride;
	pthread_mutex_init(&d->rk_lock, NULL);
	return d;
}

void shift_dqp_destroy(struct shift_dqp *d)
{
	if (!d)
		return;
	pthread_mutex_destroy(&d->rk_lock);
	free(d->rk);
	free(d->nwq);
	free(d->sq); /* (and d->rq, in the same block) */
	free(d);
}

static void dqp_free(void *d)
{
	shift_dqp_destroy(d);
}

void shift_dqp_destroy_later(struct shift_dqp *d)
{
	shift_limbo_put(d, dqp_free);
}

void shift_dqp_unprotect(struct shift_dqp *d, const char *what)
{
	shift_dqp_set_send_state(d, SHIFT_SEND_UNPROTECTED, what);
	shift_warn("%s QP %u: %s: QP unprotected", d->dev, d->qpn, what);
}

static int mirror_full(struct shift_dqp *d, const char *q)
{
	char what[96];

	snprintf(what, sizeof(what),
		 "%s mirror overflow (more outstanding WRs than the QP's capacity)", q);
	shift_dqp_unprotect(d, what);
	return -1;
}

void shift_dqp_sync_locked(struct shift_dqp *d)
{
	uint64_t st = __atomic_load_n(&d->sig_tail, __ATOMIC_RELAXED);

	if (shift_unlikely(st > d->sig_head))
		st = d->sig_head; /* counted on an unprotected QP: nothing to find */
	if (st != d->sig_synced) {
		uint64_t after = d->sig_head - st; /* signaled WRs still outstanding */

		for (uint64_t i = d->sq_head; i-- > d->sq_tail;) {
			if (!shift_dqp_signaled(d, i))
				continue;
			if (!after--) {
				d->sq_tail = i + 1;
				break;
			}
		}
		d->sig_synced = st;
	}
	d->sq_limit = shift_dqp_send_state(d) == SHIFT_SEND_DEFAULT ? d->sq_tail + d->sq_size : 0;
}

uint32_t shift_dqp_consumers_posted(const struct shift_dqp *d)
{
	uint32_t n = 0;

	for (unsigned op = 0; op < 12; op++)
		if (shift_wr_consumes_recv(op))
			n += d->posted_by_op[op];
	return n;
}

/*
 * post_lock held by another thread: spin a little, then give the holder
 * the CPU (shift_backoff). The holder may be in a long system call on this
 * very CPU: soft-RoCE transmits a post's data inside post_send, and a
 * failover spinning behind an application's post of large sends on a
 * one-CPU host took the holder's CPU for whole time slices (the testbed's
 * send failovers: up to 16 ms to stop the default QP, docs/failover.md).
 * A post holds the lock for a few hundred instructions, the provider's
 * included, on a NIC that does not transmit inside it: the spins cover it.
 */
void shift_dqp_lock_wait(struct shift_dqp *d)
{
	unsigned looks = 0;

	do {
		while (__atomic_load_n(&d->post_lock, __ATOMIC_RELAXED))
			shift_backoff(&looks);
	} while (!shift_dqp_trylock(d));
}

void shift_dqp_sync(struct shift_dqp *d)
{
	shift_dqp_lock(d);
	shift_dqp_sync_locked(d);
	shift_dqp_unlock(d);
}

void shift_dqp_retire_all_send(struct shift_dqp *d)
{
	shift_dqp_lock(d);
	/* as if each signaled WR had completed */
	__atomic_store_n(&d->sig_tail, d->sig_head, __ATOMIC_RELAXED);
	d->sig_synced = d->sig_head;
	d->sq_tail = d->sq_head;
	shift_dqp_sync_locked(d);
	shift_dqp_unlock(d);
}

static void unrecord_last(struct shift_dqp *d)
{
	struct shift_swqe *e = shift_dqp_swqe(d, --d->sq_head);

	d->posted_by_op[shift_dqp_opslot(e->opcode)]--;
	/* (a signaled one cannot have completed: it was never posted) */
	if (shift_dqp_signaled(d, d->sq_head))
		d->sig_head--;
}

void shift_dqp_unrecord_last_send(struct shift_dqp *d)
{
	unrecord_last(d);
}

/* Is wr beyond what the QP was created for (more SGEs, or more inline bytes,
 * than its capacities)? The provider refuses such a WR as it would without
 * SHIFT (the capacities are those it reported at create). */
static bool send_beyond_caps(const struct shift_dqp *d, const struct ibv_send_wr *wr, uint32_t n)
{
	uint64_t len = 0;

	if (n > d->max_send_sge)
		return true;
	if (!(wr->send_flags & IBV_SEND_INLINE))
		return false;
	for (uint32_t i = 0; i < n; i++)
		len += wr->sg_list[i].length;
	return len > d->max_inline;
}

int shift_dqp_record_send(struct shift_dqp *d, const struct ibv_send_wr *wr,
			  const struct ibv_send_wr **stop)
{
	for (; wr; wr = wr->next) {
		struct shift_swqe *e;
		uint32_t n = (uint32_t)(wr->num_sge > 0 ? wr->num_sge : 0);

		if (shift_unlikely(send_beyond_caps(d, wr, n))) {
			*stop = wr;
			return 1;
		}
		if (shift_unlikely(!shift_dqp_sq_free(d)))
			return mirror_full(d, "send");
		e = shift_dqp_swqe(d, d->sq_head);
		e->wr_id = wr->wr_id;
		e->opcode = (uint32_t)wr->opcode;
		e->send_flags = wr->send_flags;
		e->num_sge = n;
		e->imm = wr->imm_data;
		/* remote_addr starts both rdma and atomic in the union; rkey
		 * sits elsewhere in each */
		e->remote_addr = wr->wr.rdma.remote_addr;
		e->rkey = wr->wr.rdma.rkey;
		if (shift_unlikely(shift_wr_is_atomic(wr->opcode))) {
			e->rkey = wr->wr.atomic.rkey;
			e->compare_add = wr->wr.atomic.compare_add;
			e->swap = wr->wr.atomic.swap;
		}
		if (shift_likely(n == 1))
			e->sge[0] = wr->sg_list[0];
		else if (n) /* (a zero-length WR may have no list) */
			memcpy(e->sge, wr->sg_list, n * sizeof(struct ibv_sge));
		e->inline_len = 0;
		if (shift_unlikely(wr->send_flags & IBV_SEND_INLINE)) {
			/* the app may reuse the buffer when post returns: copy
			 * the bytes (send_beyond_caps: they fit) */
			uint8_t *dst = (uint8_t *)&e->sge[d->max_send_sge];
			uint32_t len = 0;

			for (uint32_t i = 0; i < n; i++) {
				memcpy(dst + len, (void *)(uintptr_t)wr->sg_list[i].addr,
				       wr->sg_list[i].length);
				len += wr->sg_list[i].length;
			}
			e->inline_len = len;
		}
		if ((wr->send_flags & IBV_SEND_SIGNALED) || d->sq_sig_all)
			d->sig_head++;
		d->posted_by_op[shift_dqp_opslot(wr->opcode)]++;
		d->sq_head++;
	}
	return 0;
}

void shift_dqp_unrecord_send(struct shift_dqp *d, const struct ibv_send_wr *wr,
			     const struct ibv_send_wr *bad, uint64_t head_before)
{
	uint64_t keep = head_before;

	for (; wr && wr != bad; wr = wr->next)
		keep++;
	while (d->sq_head > keep)
		unrecord_last(d);
}

int shift_dqp_record_recv(struct shift_dqp *d, const struct ibv_recv_wr *wr,
			  const struct ibv_recv_wr **stop)
{
	for (; wr; wr = wr->next) {
		uint32_t n = (uint32_t)(wr->num_sge > 0 ? wr->num_sge : 0);
		struct shift_rwqe *e;

		if (shift_unlikely(n > d->max_recv_sge)) {
			*stop = wr; /* (beyond the QP's capacity: see above) */
			return 1;
		}
		if (shift_unlikely(!shift_dqp_rq_free(d))) {
			shift_dqp_set_recv_state(d, SHIFT_RECV_DEFAULT, "receive mirror overflow");
			return mirror_full(d, "receive");
		}
		e = shift_dqp_rwqe(d, d->rq_head);
		e->wr_id = wr->wr_id;
		e->num_sge = n;
		if (shift_likely(n == 1))
			e->sge[0] = wr->sg_list[0];
		else if (n) /* (a zero-length receive may have no list) */
			memcpy(e->sge, wr->sg_list, n * sizeof(struct ibv_sge));
		d->rq_head++;
	}
	return 0;
}

void shift_dqp_unrecord_recv(struct shift_dqp *d, const struct ibv_recv_wr *wr,
			     const struct ibv_recv_wr *bad, uint64_t head_before)
{
	uint64_t keep = head_before;

	for (; wr && wr != bad; wr = wr->next)
		keep++;
	if (d->rq_head > keep)
		d->rq_head = keep;
}

void shift_dqp_set_send_state(struct shift_dqp *d, enum shift_send_state to, const char *why)
{
	enum shift_send_state from = __atomic_load_n(&d->send_state, __ATOMIC_RELAXED);

	/* (an illegal change is made all the same: the caller's view of the
	 * QP must hold; the count and the error line say it happened) */
	if (from != to)
		shift_state_send_change(from, to, d->dev, d->qpn, why);
	__atomic_store_n(&d->send_state, to, __ATOMIC_RELEASE);
	d->sq_limit = 0;
	d->rq_limit = 0;
}

void shift_dqp_set_recv_state(struct shift_dqp *d, enum shift_recv_state to, const char *why)
{
	enum shift_recv_state from = __atomic_load_n(&d->recv_state, __ATOMIC_RELAXED);

	if (from != to)
		shift_state_recv_change(from, to, d->dev, d->qpn, why);
	__atomic_store_n(&d->recv_state, to, __ATOMIC_RELEASE);
}

void shift_dqp_set_ep_wait(struct shift_dqp *d, enum shift_ep_wait to, const char *why)
{
	if (d->ep_wait != to)
		shift_state_ep_change(d->ep_wait, to, d->dev, d->qpn, why);
	d->ep_wait = to;
}

void shift_dqp_retire_app(struct shift_dqp *d, const struct ibv_wc *wc)
{
	if (wc->status == IBV_WC_SUCCESS)
		shift_dqp_retire_slow(d, wc);
	else if (d->dsrq && (wc->opcode & IBV_WC_RECV))
		shift_dsrq_retire(d->dsrq, wc->wr_id);
}

void shift_dqp_retire_slow(struct shift_dqp *d, const struct ibv_wc *wc)
{
	if (d->dsrq && (wc->opcode & IBV_WC_RECV))
		shift_dsrq_retire(d->dsrq, wc->wr_id);
	shift_dqp_retire(d, wc);
}
