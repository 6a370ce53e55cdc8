/*
 * Polling an extended CQ of a SHIFT context (see cqex.h): SHIFT's
 * start_poll / next_poll / end_poll and read_* in the provider's struct
 * ibv_cq_ex.
 *
 * A poll session (start_poll succeeded, until end_poll) is one of:
 *  - the provider's (CQX_PROV): the provider's own session, each
 *    completion retired in the mirror as it becomes current;
 *  - SHIFT's (CQX_MINE): completions the slow poll returned, buffered here
 *    (buf[bi..bn)), handed out one by one with SHIFT's read_* answering.
 * A provider session becomes SHIFT's at an error completion of a protected
 * QP (the error and what follows it go to the slow poll) or when the
 * context turned slow meanwhile; the provider's session is always ended
 * first, so the slow poll may poll the same CQ (no provider lock held).
 *
 * Sessions exclude each other as the provider's do (rdma-core's providers
 * lock the CQ from start_poll to end_poll): a spin lock per CQ, taken by
 * start_poll and released by end_poll (or by a start_poll that finds
 * nothing: the application then must not call end_poll). The buffer, the
 * current completion and the read_* pointers change only under it.
 */
#include "shift/dp/cqex.h"
#include "shift/dp/ctx.h"
#include "shift/dp/dsrq.h"
#include "shift/dp/poll.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define CQX_BUF 16 /* completions taken from the slow poll at once */

enum { CQX_IDLE, CQX_PROV, CQX_MINE };

/* The provider's functions SHIFT replaces (always, or while it hands out
 * its own completions). */
struct cqx_fns {
	int (*start_poll)(struct ibv_cq_ex *cq, struct ibv_poll_cq_attr *attr);
	int (*next_poll)(struct ibv_cq_ex *cq);
	void (*end_poll)(struct ibv_cq_ex *cq);
	enum ibv_wc_opcode (*read_opcode)(struct ibv_cq_ex *cq);
	uint32_t (*read_vendor_err)(struct ibv_cq_ex *cq);
	uint32_t (*read_byte_len)(struct ibv_cq_ex *cq);
	__be32 (*read_imm_data)(struct ibv_cq_ex *cq);
	uint32_t (*read_qp_num)(struct ibv_cq_ex *cq);
	uint32_t (*read_src_qp)(struct ibv_cq_ex *cq);
	unsigned int (*read_wc_flags)(struct ibv_cq_ex *cq);
	uint32_t (*read_slid)(struct ibv_cq_ex *cq);
	uint8_t (*read_sl)(struct ibv_cq_ex *cq);
	uint8_t (*read_dlid_path_bits)(struct ibv_cq_ex *cq);
};

struct shift_cqx {
	struct ibv_cq_ex *cq;    /* the provider's, as the application holds it */
	struct shift_cqx *next;  /* lookup chain */
	struct shift_ctx *s;
	int *busy;               /* its context's fast-path count (dp/poll.h) */
	int lock;                /* the poll session's */
	uint8_t mode;            /* CQX_* (under lock) */
	bool wrapped;            /* false: left alone (its wc_flags), QPs on it unprotected */
	bool reads_mine;         /* the read_* pointers are SHIFT's (under lock) */
	bool quick;              /* no completion of SHIFT's buffered, reads the
				  * provider's: start_poll may open the provider's
				  * session unless the context is slow (under lock) */
	uint64_t app_flags;      /* the wc_flags the application asked for */
	struct cqx_fns fn;       /* the provider's */
	unsigned bi, bn;         /* SHIFT's completions: buf[bi] is current (under lock) */
	struct ibv_wc buf[CQX_BUF];
};

/* ---- registry: by the CQ's address; written under reg, read lock-free --- */

#define CQX_TAB 1024
static struct shift_cqx none; /* empty buckets and chain ends (its cq, NULL, is no one's) */
static struct shift_cqx *cqx_tab[CQX_TAB] = { [0 ... CQX_TAB - 1] = &none };
static pthread_mutex_t reg = PTHREAD_MUTEX_INITIALIZER;

static inline unsigned cqx_hash(const void *cq)
{
	return ((uint32_t)(uintptr_t)cq * 0x9e3779b1u) >> 22; /* 10 bits */
}

static inline struct shift_cqx *cqx_find(const void *cq)
{
	struct shift_cqx *x = __atomic_load_n(&cqx_tab[cqx_hash(cq)], __ATOMIC_ACQUIRE);

	while (shift_unlikely(x->cq != cq)) {
		if (x == &none)
			return NULL;
		x = __atomic_load_n(&x->next, __ATOMIC_ACQUIRE);
	}
	return x;
}

static void cqx_link(struct shift_cqx *x)
{
	struct shift_cqx **b = &cqx_tab[cqx_hash(x->cq)];

	x->next = *b;
	__atomic_store_n(b, x, __ATOMIC_RELEASE);
}

static void cqx_unlink(struct shift_cqx *x)
{
	struct shift_cqx **pp = &cqx_tab[cqx_hash(x->cq)];

	while (*pp != &none && *pp != x)
		pp = &(*pp)->next;
	if (*pp == x)
		__atomic_store_n(pp, x->next, __ATOMIC_RELEASE);
}

/* ---- the session lock (as dqp.h's post_lock) ------------------------------ */

static inline void cqx_lock(struct shift_cqx *x)
{
	while (shift_unlikely(__atomic_exchange_n(&x->lock, 1, __ATOMIC_ACQUIRE)))
		while (__atomic_load_n(&x->lock, __ATOMIC_RELAXED))
			shift_cpu_relax();
}

static inline void cqx_unlock(struct shift_cqx *x)
{
	__atomic_store_n(&x->lock, 0, __ATOMIC_RELEASE);
}

/* ---- SHIFT's read_*: the current buffered completion ---------------------- */

static const struct ibv_wc *cur(struct ibv_cq_ex *cq)
{
	static const struct ibv_wc none;
	struct shift_cqx *x = cqx_find(cq);

	return x && x->bi < x->bn ? &x->buf[x->bi] : &none;
}

static enum ibv_wc_opcode rd_opcode(struct ibv_cq_ex *cq) { return cur(cq)->opcode; }
static uint32_t rd_vendor_err(struct ibv_cq_ex *cq) { return cur(cq)->vendor_err; }
static uint32_t rd_byte_len(struct ibv_cq_ex *cq) { return cur(cq)->byte_len; }
/* (imm_data shares its bits with invalidated_rkey: ibv_wc_read_invalidated_rkey) */
static __be32 rd_imm_data(struct ibv_cq_ex *cq) { return cur(cq)->imm_data; }
static uint32_t rd_qp_num(struct ibv_cq_ex *cq) { return cur(cq)->qp_num; }
static uint32_t rd_src_qp(struct ibv_cq_ex *cq) { return cur(cq)->src_qp; }
static unsigned int rd_wc_flags(struct ibv_cq_ex *cq) { return cur(cq)->wc_flags; }
static uint32_t rd_slid(struct ibv_cq_ex *cq) { return cur(cq)->slid; }
static uint8_t rd_sl(struct ibv_cq_ex *cq) { return cur(cq)->sl; }
static uint8_t rd_dlid_path_bits(struct ibv_cq_ex *cq) { return cur(cq)->dlid_path_bits; }

static const struct cqx_fns mine = {
	.read_opcode = rd_opcode, .read_vendor_err = rd_vendor_err,
	.read_byte_len = rd_byte_len, .read_imm_data = rd_imm_data,
	.read_qp_num = rd_qp_num, .read_src_qp = rd_src_qp,
	.read_wc_flags = rd_wc_flags, .read_slid = rd_slid, .read_sl = rd_sl,
	.read_dlid_path_bits = rd_dlid_path_bits,
};

/* Point cq's read_* at f's (SHIFT's or the provider's). */
static void set_reads(struct ibv_cq_ex *cq, const struct cqx_fns *f)
{
	cq->read_opcode = f->read_opcode;
	cq->read_vendor_err = f->read_vendor_err;
	cq->read_byte_len = f->read_byte_len;
	cq->read_imm_data = f->read_imm_data;
	cq->read_qp_num = f->read_qp_num;
	cq->read_src_qp = f->read_src_qp;
	cq->read_wc_flags = f->read_wc_flags;
	cq->read_slid = f->read_slid;
	cq->read_sl = f->read_sl;
	cq->read_dlid_path_bits = f->read_dlid_path_bits;
}

/* ---- polling ------------------------------------------------------------- */

/* The provider's current completion as an ibv_wc: every field its CQ
 * answers (the application's wc_flags, and the QP number SHIFT added). */
static void provider_wc(struct shift_cqx *x, struct ibv_cq_ex *cq, struct ibv_wc *wc)
{
	uint64_t f = x->app_flags;

	memset(wc, 0, sizeof(*wc));
	wc->wr_id = cq->wr_id;
	wc->status = cq->status;
	wc->opcode = x->fn.read_opcode(cq);
	wc->vendor_err = x->fn.read_vendor_err ? x->fn.read_vendor_err(cq) : 0;
	wc->qp_num = x->fn.read_qp_num(cq);
	wc->wc_flags = x->fn.read_wc_flags ? x->fn.read_wc_flags(cq) : 0;
	if ((f & IBV_WC_EX_WITH_BYTE_LEN) && x->fn.read_byte_len)
		wc->byte_len = x->fn.read_byte_len(cq);
	if ((f & IBV_WC_EX_WITH_IMM) && x->fn.read_imm_data)
		wc->imm_data = x->fn.read_imm_data(cq);
	if ((f & IBV_WC_EX_WITH_SRC_QP) && x->fn.read_src_qp)
		wc->src_qp = x->fn.read_src_qp(cq);
	if ((f & IBV_WC_EX_WITH_SLID) && x->fn.read_slid)
		wc->slid = (uint16_t)x->fn.read_slid(cq);
	if ((f & IBV_WC_EX_WITH_SL) && x->fn.read_sl)
		wc->sl = x->fn.read_sl(cq);
	if ((f & IBV_WC_EX_WITH_DLID_PATH_BITS) && x->fn.read_dlid_path_bits)
		wc->dlid_path_bits = x->fn.read_dlid_path_bits(cq);
}

/* Hand out buf[bi] (0), or ENOENT when the buffer is empty; a start_poll
 * (first) that finds nothing ends the session itself. */
static int serve(struct shift_cqx *x, struct ibv_cq_ex *cq, bool first)
{
	if (x->bi >= x->bn) {
		x->bi = x->bn = 0;
		if (first) {
			x->mode = CQX_IDLE;
			cqx_unlock(x);
		}
		return ENOENT;
	}
	if (!x->reads_mine) {
		set_reads(cq, &mine);
		x->reads_mine = true;
		x->quick = false;
	}
	cq->wr_id = x->buf[x->bi].wr_id;
	cq->status = x->buf[x->bi].status;
	return 0;
}

/* The slow poll's next completions into the (empty) buffer (busy: the
 * fast-path count this call holds, the slow poll releases it). */
static void fill(struct shift_cqx *x, struct ibv_cq_ex *cq, int have, int *busy)
{
	int n = shift_dp_up.poll_slow(x->s, ibv_cq_ex_to_cq(cq), CQX_BUF, x->buf, 0, have, busy);

	x->bi = 0;
	x->bn = n > 0 ? (unsigned)n : 0;
}

/* An error completion of a protected QP is current in the provider's
 * session: end that session, and the slow poll decides (it may start a
 * failover, keep the error for the application, ...). */
static __attribute__((noinline, cold)) int prov_error(struct shift_cqx *x, struct ibv_cq_ex *cq,
						       bool first)
{
	provider_wc(x, cq, &x->buf[0]);
	x->fn.end_poll(cq);
	x->mode = CQX_MINE;
	fill(x, cq, 1, x->busy);
	return serve(x, cq, first);
}

/*
 * The context's fast path (dp/poll.h): a call of the provider's session
 * is inside it from before the provider makes a completion current until
 * that completion is retired (cqx_leave) or handed to the slow poll.
 * cqx_enter is false, and the call stays out, when the context is slow.
 */
#define cqx_enter(x) shift_dp_poll_enter((x)->busy)
#define cqx_leave(x) shift_dp_poll_leave((x)->busy)

/* The provider's session made a completion current: retire it (a protected
 * QP's success), or hand an error to the slow poll; out of the fast path
 * either way. */
static inline __attribute__((always_inline)) int retire(struct shift_cqx *x, struct ibv_cq_ex *cq,
						       bool first)
{
	struct shift_dqp *d = shift_dqp_by_qpn(x->s, x->fn.read_qp_num(cq));

	if (!d) {
		cqx_leave(x);
		return 0; /* not protected: as it is */
	}
	if (shift_likely(cq->status == IBV_WC_SUCCESS)) {
		if (x->fn.read_opcode(cq) & IBV_WC_RECV) {
			/* (a QP on an SRQ: the SRQ's entry too, dp/dsrq.h) */
			if (shift_unlikely(d->dsrq))
				shift_dsrq_retire(d->dsrq, cq->wr_id);
			__atomic_fetch_add(&d->rq_tail, 1, __ATOMIC_RELAXED);
		} else
			__atomic_fetch_add(&d->sig_tail, 1, __ATOMIC_RELAXED);
		cqx_leave(x);
		return 0;
	}
	/* (an unprotected QP that failed over may still flush SHIFT's own
	 * WRs: the slow path drops those) */
	if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED && !d->failovers) {
		cqx_leave(x);
		return 0;
	}
	return prov_error(x, cq, first);
}

/* The provider's session (lock held, inside the fast path). */
static inline __attribute__((always_inline)) int prov_start(struct shift_cqx *x,
							   struct ibv_cq_ex *cq,
			     struct ibv_poll_cq_attr *attr)
{
	int rc = x->fn.start_poll(cq, attr);

	if (shift_unlikely(rc)) {
		cqx_leave(x);
		cqx_unlock(x);
		return rc; /* (ENOENT: no session, no end_poll) */
	}
	x->mode = CQX_PROV;
	return retire(x, cq, true);
}

/* start_poll when SHIFT has completions of its own, the context is slow,
 * or the read_* pointers are still SHIFT's (lock held). */
static __attribute__((noinline)) int start_slow(struct shift_cqx *x, struct ibv_cq_ex *cq,
						 struct ibv_poll_cq_attr *attr)
{
	if (x->bi == x->bn && cqx_enter(x)) {
		set_reads(cq, &x->fn);
		x->reads_mine = false;
		x->quick = true;
		return prov_start(x, cq, attr);
	}
	x->mode = CQX_MINE;
	if (x->bi == x->bn)
		fill(x, cq, 0, NULL);
	return serve(x, cq, true);
}

static int cqx_start_poll(struct ibv_cq_ex *cq, struct ibv_poll_cq_attr *attr)
{
	struct shift_cqx *x = cqx_find(cq);

	if (shift_unlikely(!x))
		return EINVAL; /* (the CQ is being destroyed) */
	cqx_lock(x);
	if (shift_unlikely(!x->quick || !cqx_enter(x)))
		return start_slow(x, cq, attr);
	return prov_start(x, cq, attr);
}

/* next_poll in SHIFT's session, or in the provider's once the context
 * turned slow (that session ends: the rest comes through the slow poll). */
static __attribute__((noinline)) int next_slow(struct shift_cqx *x, struct ibv_cq_ex *cq)
{
	if (x->mode == CQX_PROV) {
		x->fn.end_poll(cq);
		x->mode = CQX_MINE;
	} else if (x->bi < x->bn) {
		x->bi++;
	}
	if (x->bi >= x->bn)
		fill(x, cq, 0, NULL);
	return serve(x, cq, false);
}

static int cqx_next_poll(struct ibv_cq_ex *cq)
{
	struct shift_cqx *x = cqx_find(cq);
	int rc;

	if (shift_unlikely(!x))
		return ENOENT;
	if (shift_likely(x->mode == CQX_PROV && cqx_enter(x))) {
		rc = x->fn.next_poll(cq);
		if (rc) {
			cqx_leave(x);
			return rc;
		}
		return retire(x, cq, false);
	}
	return next_slow(x, cq);
}

static void cqx_end_poll(struct ibv_cq_ex *cq)
{
	struct shift_cqx *x = cqx_find(cq);

	if (shift_unlikely(!x))
		return;
	if (shift_likely(x->mode == CQX_PROV))
		x->fn.end_poll(cq);
	else if (x->bi < x->bn)
		x->bi++; /* the current one is consumed */
	x->mode = CQX_IDLE;
	cqx_unlock(x);
}

/* ---- taking a CQ over and giving it back ------------------------------------ */

static void save_fns(struct cqx_fns *f, const struct ibv_cq_ex *cq)
{
	f->start_poll = cq->start_poll;
	f->next_poll = cq->next_poll;
	f->end_poll = cq->end_poll;
	f->read_opcode = cq->read_opcode;
	f->read_vendor_err = cq->read_vendor_err;
	f->read_byte_len = cq->read_byte_len;
	f->read_imm_data = cq->read_imm_data;
	f->read_qp_num = cq->read_qp_num;
	f->read_src_qp = cq->read_src_qp;
	f->read_wc_flags = cq->read_wc_flags;
	f->read_slid = cq->read_slid;
	f->read_sl = cq->read_sl;
	f->read_dlid_path_bits = cq->read_dlid_path_bits;
}

static void install(struct shift_cqx *x)
{
	x->cq->start_poll = cqx_start_poll;
	x->cq->next_poll = cqx_next_poll;
	x->cq->end_poll = cqx_end_poll;
}

/* The provider's pointers back (reg held). */
static void give_back(struct shift_cqx *x)
{
	if (!x->wrapped)
		return;
	x->cq->start_poll = x->fn.start_poll;
	x->cq->next_poll = x->fn.next_poll;
	x->cq->end_poll = x->fn.end_poll;
	set_reads(x->cq, &x->fn);
	x->reads_mine = false;
	x->quick = x->bi == x->bn;
}

int shift_cqx_attach(struct shift_ctx *s, struct ibv_cq_ex *cq, uint64_t app_flags)
{
	struct shift_cqx *x;

	if (!cq->start_poll || !cq->next_poll || !cq->end_poll || !cq->read_opcode ||
	    !cq->read_qp_num)
		return -1;
	x = calloc(1, sizeof(*x));
	if (!x)
		return -1;
	x->cq = cq;
	x->s = s;
	x->busy = shift_dp_poll_busy(s);
	x->wrapped = true;
	x->quick = true;
	x->app_flags = app_flags;
	save_fns(&x->fn, cq);
	pthread_mutex_lock(&reg);
	cqx_link(x); /* found before its functions can be called */
	install(x);
	pthread_mutex_unlock(&reg);
	return 0;
}

void shift_cqx_unwrapped(struct shift_ctx *s, struct ibv_cq_ex *cq)
{
	struct shift_cqx *x = calloc(1, sizeof(*x));

	if (!x)
		return; /* (its QPs then get their mirror, which overflows: logged) */
	x->cq = cq;
	x->s = s;
	x->busy = shift_dp_poll_busy(s);
	pthread_mutex_lock(&reg);
	cqx_link(x);
	pthread_mutex_unlock(&reg);
}

bool shift_cqx_blocks(const struct ibv_cq *cq)
{
	struct shift_cqx *x = cq ? cqx_find(cq) : NULL;

	return x && !x->wrapped;
}

struct shift_cqx *shift_cqx_forget(struct ibv_cq *cq)
{
	struct shift_cqx *x;

	pthread_mutex_lock(&reg);
	x = cqx_find(cq);
	if (x) {
		give_back(x);
		cqx_unlink(x);
	}
	pthread_mutex_unlock(&reg);
	return x;
}

void shift_cqx_restore(struct shift_cqx *x)
{
	if (!x)
		return;
	pthread_mutex_lock(&reg);
	cqx_link(x);
	if (x->wrapped)
		install(x);
	pthread_mutex_unlock(&reg);
}

void shift_cqx_free(struct shift_cqx *x)
{
	free(x);
}

void shift_cqx_detach_ctx(struct shift_ctx *s)
{
	pthread_mutex_lock(&reg);
	for (int i = 0; i < CQX_TAB; i++) {
		struct shift_cqx **pp = &cqx_tab[i];

		while (*pp != &none) {
			struct shift_cqx *x = *pp;

			if (x->s != s) {
				pp = &x->next;
				continue;
			}
			give_back(x);
			__atomic_store_n(pp, x->next, __ATOMIC_RELEASE);
			free(x);
		}
	}
	pthread_mutex_unlock(&reg);
}

void shift_cqx_fork_prepare(void)
{
	pthread_mutex_lock(&reg);
}

void shift_cqx_fork_done(void)
{
	pthread_mutex_unlock(&reg);
}
