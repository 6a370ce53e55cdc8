/*
 * Polling a CQ of a SHIFT context: what the context's ops.poll_cq and
 * req_notify_cq are once SHIFT took it over (dp/attach.c).
 *
 * In the Default state a poll is the provider's poll plus counting what
 * completed (retiring mirrored WRs, shift/dp/dqp.h). A completion in error
 * of a protected QP, or any poll of a context with a failed-over QP (slow:
 * its ops.poll_cq is shift_dp_poll_slow), goes to the failover layer
 * (shift_dp_up.poll_slow).
 */
#include "shift/dp/poll.h"
#include "shift/dp/ctx.h"
#include "shift/base/backoff.h"

#include <errno.h>
#include <stddef.h>

/*
 * Polling. Each of the first SHIFT_FAST_CTX contexts has a slot with its own
 * poll_cq (installed in the context's ops at attach), so the context is one
 * load from the table, not a lookup; the slot also keeps the QP of the last
 * completion polled. Contexts past those share one generic fast poll, which
 * looks its context up (shift_ctx_of) and keeps the last QP in it.
 */
static struct shift_dqp *shift_poll_last[SHIFT_FAST_CTX] = {
	[0 ... SHIFT_FAST_CTX - 1] = &shift_dqp_none,
};

/*
 * The provider's poll_cq of each slot's context: the fast poll calls it
 * straight from here. A context with a failed-over QP (slow) has
 * shift_dp_poll_slow in its ops instead of its fast poll
 * (shift_ctx_set_slow), so the fast path tests nothing for it.
 */
static int (*shift_prov_poll[SHIFT_FAST_CTX])(struct ibv_cq *, int, struct ibv_wc *);

/*
 * Who is inside a context's fast poll (each slot's word, or the context's
 * own poll_busy): the polls in it, and SHIFT_POLL_SLOW while the context
 * is slow. A fast poll enters with one locked add (a poll that loaded the
 * fast poll_cq before its context went slow sees the bit, leaves again and
 * takes the slow path) and leaves with one locked subtract once what it
 * polled is retired, or handed over to the slow path (shift_poll_slow
 * releases it then). A poll's completions, taken from the provider's CQ,
 * are in the mirror's counts only when it left: the failover layer judges
 * a QP's outstanding WRs only after the context went slow and no poll is
 * left inside (shift_dp_fast_polls_out), never by a time bound.
 * One cache line per slot: contexts polled by different threads do not
 * share one.
 */
static struct {
	int n;
} __attribute__((aligned(64))) shift_poll_busy[SHIFT_FAST_CTX];

int *shift_dp_poll_busy(struct shift_ctx *s)
{
	return s->slot < 0 ? &s->poll_busy : &shift_poll_busy[s->slot].n;
}

void shift_dp_poll_mark_slow(struct shift_ctx *s, bool slow)
{
	if (slow)
		__atomic_fetch_or(shift_dp_poll_busy(s), SHIFT_POLL_SLOW, __ATOMIC_SEQ_CST);
	else
		__atomic_fetch_and(shift_dp_poll_busy(s), ~SHIFT_POLL_SLOW, __ATOMIC_SEQ_CST);
}

bool shift_dp_fast_polls_out(struct shift_ctx *s)
{
	int v = __atomic_load_n(shift_dp_poll_busy(s), __ATOMIC_SEQ_CST);

	return (v & SHIFT_POLL_SLOW) && !(v & ~SHIFT_POLL_SLOW);
}

void shift_dp_fast_polls_wait(struct shift_ctx *s)
{
	/* (a poller preempted inside: let it run; shift_backoff's count
	 * stops short of the bound) */
	(void)shift_dp_fast_polls_out_within(s, UINT_MAX);
}

bool shift_dp_fast_polls_out_within(struct shift_ctx *s, unsigned max_looks)
{
	for (unsigned looks = 0; !shift_dp_fast_polls_out(s);) {
		if (looks >= max_looks)
			return false;
		shift_backoff(&looks);
	}
	return true;
}

void shift_dp_poll_fork_child(void)
{
	/* (the polls counted were other threads' of the parent: none here) */
	for (int i = 0; i < SHIFT_FAST_CTX; i++)
		__atomic_store_n(&shift_poll_busy[i].n, 0, __ATOMIC_RELAXED);
}

void shift_dp_poll_release(int *busy)
{
	if (busy)
		shift_dp_poll_leave(busy);
}

int shift_dp_poll_slow(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	struct shift_ctx *s = shift_ctx_of(cq->context);

	if (shift_unlikely(!s))
		return -1; /* the context is being closed */
	return shift_dp_up.poll_slow(s, cq, num_entries, wc, 0, 0, NULL);
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
	if (!d->scq_app || !d->rcq_app)
		return NULL;
	if (shift_likely(d->scq_app == d->rcq_app))
		return d->scq_app;
	shift_dqp_sync(d);
	if (d->sq_tail < d->sq_head && shift_dqp_swqe(d, d->sq_tail)->wr_id == wc->wr_id)
		return d->scq_app;
	if (d->rq_tail < d->rq_head && shift_dqp_rwqe(d, d->rq_tail)->wr_id == wc->wr_id)
		return d->rcq_app;
	return d->scq_app;
}

/*
 * Retire the n completions the provider returned, or hand them to the slow
 * path from the first error of a protected QP on. The slow path then fills
 * at most those n entries (the application asked for at least as many):
 * so the fast path need not keep num_entries across the provider's call.
 * cq is NULL for a lean poll (cq_of()). The poll leaves the fast path
 * here (busy released), or the slow path releases it once it has the
 * completions (shift_poll_slow).
 */
static __attribute__((noinline)) int poll_retire(struct shift_ctx *s, struct shift_dqp **last,
						 int *busy, struct ibv_cq *cq, struct ibv_wc *wc,
						 int n)
{
	for (int i = 0; s && i < n; i++) {
		struct shift_dqp *d = __atomic_load_n(last, __ATOMIC_RELAXED);

		if (d->qpn != wc[i].qp_num) {
			d = shift_dqp_by_qpn(s, wc[i].qp_num);
			if (!d)
				continue; /* not protected: as it is */
			/* (a QP on an SRQ is never cached: the fast poll's
			 * retire does not know its SRQ) */
			if (!d->dsrq)
				__atomic_store_n(last, d, __ATOMIC_RELAXED);
		}
		if (shift_likely(wc[i].status == IBV_WC_SUCCESS)) {
			if (shift_unlikely(d->dsrq))
				shift_dqp_retire_slow(d, &wc[i]);
			else
				shift_dqp_retire(d, &wc[i]);
		} else if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED && !d->failovers) {
			if (shift_unlikely(d->dsrq))
				shift_dqp_retire_app(d, &wc[i]); /* (the application's) */
		} else {
			/* (an unprotected QP that failed over may still flush
			 * SHIFT's own WRs: the slow path drops those) */
			struct ibv_cq *c = cq ? cq : cq_of(d, &wc[i]);

			if (c)
				return shift_dp_up.poll_slow(s, c, n, wc, i, n, busy);
		}
	}
	shift_dp_poll_release(busy);
	return n;
}

/*
 * 2..8 successful completions, all of cached QP d (NCCL polls 4 at once):
 * retired in one go, three instructions per completion (unrolled; x86
 * adds, ORs and ANDs straight from memory). Each completion's status and
 * opcode, one 64-bit word, are summed; its QPN is ANDed into one word and,
 * as the upper half of the 64-bit word it ends (imm_data below it, any
 * value, never looked at), ORed into another. All are d's if the OR's
 * upper half and the AND are both d's QPN (no bit more, none less); all
 * successes if the statuses sum to 0 (enum ibv_wc_status values, < 32:
 * eight cannot carry into the opcodes). An RC QP's opcodes are send-side
 * (0..15) or receive-side (128..143, IBV_WC_RECV set), so with at most 8
 * the sum of opcodes divided by 128 counts the receives. Else false: the
 * caller's loop.
 */
#define RETIRE_STEP(i)                                                            \
	do {                                                                      \
		sum += (uint64_t)wc[i].opcode << 32 | (uint32_t)wc[i].status;      \
		qor |= (uint64_t)wc[i].qp_num << 32 | wc[i].imm_data;             \
		qand &= wc[i].qp_num;                                             \
	} while (0)
static inline __attribute__((always_inline)) bool
retire_many(struct shift_dqp *d, const struct ibv_wc *wc, int n)
{
	const uint32_t qpn = d->qpn;
	uint64_t qor = (uint64_t)wc[0].qp_num << 32 | wc[0].imm_data;
	uint32_t qand = wc[0].qp_num;
	uint64_t sum = (uint64_t)wc[0].opcode << 32 | (uint32_t)wc[0].status;

	if (n < 2 || n > 8)
		__builtin_unreachable(); /* (the caller's 2..8) */
	switch (n) {
	case 8: RETIRE_STEP(7); /* fall through */
	case 7: RETIRE_STEP(6); /* fall through */
	case 6: RETIRE_STEP(5); /* fall through */
	case 5: RETIRE_STEP(4); /* fall through */
	case 4: RETIRE_STEP(3); /* fall through */
	case 3: RETIRE_STEP(2); /* fall through */
	case 2: RETIRE_STEP(1);
	}
	if (shift_unlikely(((uint32_t)(qor >> 32) ^ qpn) | (qand ^ qpn) | (uint32_t)sum))
		return false;
	uint32_t recvs = (uint32_t)(sum >> 39);

	if (recvs)
		__atomic_fetch_add(&d->rq_tail, recvs, __ATOMIC_RELAXED);
	if ((uint32_t)n != recvs)
		__atomic_fetch_add(&d->sig_tail, (uint32_t)n - recvs, __ATOMIC_RELAXED);
	return true;
}
#undef RETIRE_STEP
_Static_assert(IBV_WC_RECV == 128 && IBV_WC_RECV_RDMA_WITH_IMM == 129 &&
		       IBV_WC_ATOMIC_WRITE < 16 && IBV_WC_DRIVER3 < 144,
	       "retire_many(): receive-side opcodes have bit 7 set, none above 15 else");
_Static_assert(offsetof(struct ibv_wc, qp_num) == offsetof(struct ibv_wc, imm_data) + 4 &&
		       offsetof(struct ibv_wc, opcode) == offsetof(struct ibv_wc, status) + 4,
	       "retire_many(): the 64-bit words it reads");

/*
 * Default state: the provider's poll, then count what completed. A lean
 * poll keeps only wc across the provider's call (one saved register, no
 * stack adjustment); the full one keeps cq too, for contexts with a
 * protected QP whose send and receive CQs differ.
 */
static inline __attribute__((always_inline)) int poll_fast(shift_poll_fn const *prov,
							   struct shift_dqp **last,
							   struct shift_ctx *const *sp, bool lean,
							   int *busy, struct ibv_cq *cq,
							   int num_entries, struct ibv_wc *wc)
{
	/* in (one locked add; negative: the context went slow) */
	if (shift_unlikely(!shift_dp_poll_enter(busy)))
		return shift_dp_poll_slow(cq, num_entries, wc);
	/* (the provider's poll loaded once inside: a call through memory) */
	int n = (*prov)(cq, num_entries, wc);

	if (shift_likely(n == 1)) {
		struct shift_dqp *d = __atomic_load_n(last, __ATOMIC_RELAXED);

		/* the cached QP's, and a success (IBV_WC_SUCCESS is 0): one test */
		if (shift_likely(((d->qpn ^ wc->qp_num) | (uint32_t)wc->status) == 0)) {
			shift_dqp_retire(d, wc);
			shift_dp_poll_leave(busy);
			return 1;
		}
	} else if (n <= 0) {
		shift_dp_poll_leave(busy);
		return n;
	} else if (shift_likely(n <= 8) &&
		   retire_many(__atomic_load_n(last, __ATOMIC_RELAXED), wc, n)) {
		shift_dp_poll_leave(busy);
		return n;
	}
	return poll_retire(__atomic_load_n(sp, __ATOMIC_ACQUIRE), last, busy, lean ? NULL : cq, wc,
			   n);
}

#define POLL_SLOT(k)                                                                     \
	static __attribute__((hot)) int shift_poll_cq_##k(struct ibv_cq *cq, int num_entries, \
							  struct ibv_wc *wc)                  \
	{                                                                                \
		return poll_fast(&shift_prov_poll[k], &shift_poll_last[k], &shift_ctx_tab[k], \
				 false, &shift_poll_busy[k].n, cq, num_entries, wc);      \
	}                                                                                \
	static __attribute__((hot)) int shift_poll_cq_lean_##k(struct ibv_cq *cq,        \
							       int num_entries,           \
							       struct ibv_wc *wc)         \
	{                                                                                \
		return poll_fast(&shift_prov_poll[k], &shift_poll_last[k], &shift_ctx_tab[k], \
				 true, &shift_poll_busy[k].n, cq, num_entries, wc);       \
	}
#define POLL_SLOT8(b)                                                               \
	POLL_SLOT(0##b##0) POLL_SLOT(0##b##1) POLL_SLOT(0##b##2) POLL_SLOT(0##b##3) \
	POLL_SLOT(0##b##4) POLL_SLOT(0##b##5) POLL_SLOT(0##b##6) POLL_SLOT(0##b##7)
POLL_SLOT8(0) POLL_SLOT8(1) POLL_SLOT8(2) POLL_SLOT8(3)
POLL_SLOT8(4) POLL_SLOT8(5) POLL_SLOT8(6) POLL_SLOT8(7)
#define POLL_FN8(p, b)                                  \
	p##0##b##0, p##0##b##1, p##0##b##2, p##0##b##3, \
	p##0##b##4, p##0##b##5, p##0##b##6, p##0##b##7
_Static_assert(SHIFT_FAST_CTX == 64, "one poll_cq per context slot: 8 x POLL_SLOT8");
static int (*const shift_poll_cq_of_slot[SHIFT_FAST_CTX])(struct ibv_cq *, int, struct ibv_wc *) = {
	POLL_FN8(shift_poll_cq_, 0), POLL_FN8(shift_poll_cq_, 1), POLL_FN8(shift_poll_cq_, 2),
	POLL_FN8(shift_poll_cq_, 3), POLL_FN8(shift_poll_cq_, 4), POLL_FN8(shift_poll_cq_, 5),
	POLL_FN8(shift_poll_cq_, 6), POLL_FN8(shift_poll_cq_, 7),
};
static int (*const shift_poll_cq_lean_of_slot[SHIFT_FAST_CTX])(struct ibv_cq *, int,
							       struct ibv_wc *) = {
	POLL_FN8(shift_poll_cq_lean_, 0), POLL_FN8(shift_poll_cq_lean_, 1),
	POLL_FN8(shift_poll_cq_lean_, 2), POLL_FN8(shift_poll_cq_lean_, 3),
	POLL_FN8(shift_poll_cq_lean_, 4), POLL_FN8(shift_poll_cq_lean_, 5),
	POLL_FN8(shift_poll_cq_lean_, 6), POLL_FN8(shift_poll_cq_lean_, 7),
};

/* The fast poll of a context without a slot: its context looked up in the
 * table of those (one hash, a probe or two). */
static int shift_poll_cq_any(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	struct shift_ctx *s = shift_ctx_of_more(cq->context);

	if (shift_unlikely(!s))
		return -1; /* the context is being closed */
	return poll_fast(&s->poll_cq, &s->poll_last, &s, false, &s->poll_busy, cq, num_entries, wc);
}

/* The fast poll a context gets when not slow. */
shift_poll_fn shift_dp_fast_poll(const struct shift_ctx *s)
{
	if (s->slot < 0)
		return shift_poll_cq_any;
	return s->split_cqs ? shift_poll_cq_of_slot[s->slot] : shift_poll_cq_lean_of_slot[s->slot];
}

int shift_dp_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	struct shift_ctx *s = shift_ctx_of(cq->context);

	if (shift_unlikely(!s))
		return EINVAL;
	int rc = s->req_notify_cq(cq, solicited_only);

	if (shift_unlikely(cq->channel && s->rnic && !rc))
		shift_dp_up.cq_armed(s, cq, solicited_only); /* completions after a failover */
	return rc;
}

void shift_dp_poll_slot_init(struct shift_ctx *s)
{
	__atomic_store_n(&s->poll_last, &shift_dqp_none, __ATOMIC_RELAXED);
	shift_dp_poll_mark_slow(s, __atomic_load_n(&s->slow, __ATOMIC_ACQUIRE));
	if (s->slot < 0)
		return;
	__atomic_store_n(&shift_poll_last[s->slot], &shift_dqp_none, __ATOMIC_RELAXED);
	__atomic_store_n(&shift_prov_poll[s->slot], s->poll_cq, __ATOMIC_RELEASE);
}

void shift_dp_poll_forget(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_dqp **last = s->slot < 0 ? &s->poll_last : &shift_poll_last[s->slot];

	if (__atomic_load_n(last, __ATOMIC_RELAXED) == d)
		__atomic_store_n(last, &shift_dqp_none, __ATOMIC_RELAXED);
}
