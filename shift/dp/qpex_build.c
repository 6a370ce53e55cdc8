/*
 * The ibv_qp_ex builders of a protected QP (see qpex.h): each WR mirrored
 * (a batch in the Default state) or held as struct ibv_send_wr (failed over
 * or failing back), and forwarded to the provider's builder when the
 * provider builds the batch too.
 */
#include "shift/dp/qpex_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* (wr_start, wr_complete and wr_abort are qpex.c's) */
#define qx_wr_start qpx_wr_start
#define qx_wr_complete qpx_wr_complete
#define qx_wr_abort qpx_wr_abort

/* ---- Default: the mirror ------------------------------------------------------ */

/* Room for one more entry after a sync (the mirror looked full). */
static __attribute__((noinline)) bool rec_room(struct shift_dqp *d)
{
	shift_dqp_sync_locked(d);
	return d->sq_head < d->sq_tail + d->sq_size;
}

/* Mirror a new WR at sq_head with the QP's wr_id and wr_flags (room
 * checked; inline in each builder, where op is a constant). */
static inline __attribute__((always_inline)) void rec_fill(struct shift_qpx *x, unsigned op,
							     uint32_t rkey, uint64_t raddr,
							     uint32_t imm, uint64_t cmp_add,
							     uint64_t swap)
{
	struct shift_dqp *d = x->d;
	uint64_t h = d->sq_head;
	unsigned flags = x->qx->wr_flags & ~(unsigned)IBV_SEND_INLINE;
	struct shift_swqe *e = shift_dqp_swqe(d, h);

	e->wr_id = x->qx->wr_id;
	e->num_sge = 0;
	e->opcode = op;
	e->send_flags = flags;
	e->imm = imm;
	e->remote_addr = raddr;
	e->rkey = rkey;
	e->inline_len = 0;
	if (shift_wr_is_atomic(op)) {
		e->compare_add = cmp_add;
		e->swap = swap;
	}
	if ((flags & IBV_SEND_SIGNALED) || d->sq_sig_all)
		d->sig_head++;
	d->posted_by_op[shift_dqp_opslot(op)]++;
	d->sq_head = h + 1;
}

/* The same, checking for room first; the batch turns bad if there is none. */
static void rec_op(struct shift_qpx *x, unsigned op, uint32_t rkey, uint64_t raddr, uint32_t imm,
		   uint64_t cmp_add, uint64_t swap)
{
	struct shift_dqp *d = x->d;

	if (x->bad || (d->sq_head >= d->sq_limit && !rec_room(d))) {
		x->bad = true;
		return;
	}
	rec_fill(x, op, rkey, raddr, imm, cmp_add, swap);
}

/* The entry the setters apply to: the batch's last. */
static struct shift_swqe *rec_last(struct shift_qpx *x)
{
	if (x->bad)
		return NULL;
	if (x->d->sq_head == x->head) {
		x->bad = true; /* a setter before any WR */
		return NULL;
	}
	return shift_dqp_swqe(x->d, x->d->sq_head - 1);
}

/* Forget the batch's entries (aborted, refused, or not mirrored right). */
void qpx_rollback(struct shift_qpx *x)
{
	while (x->d->sq_head > x->head)
		shift_dqp_unrecord_last_send(x->d);
}

/* ---- not Default: the batch as struct ibv_send_wr ------------------------------ */

void qpx_hold_begin(struct shift_qpx *x)
{
	struct shift_dqp *d = x->d;

	x->mode = QPX_HOLD;
	x->n = 0;
	x->err = 0;
	if (x->wr)
		return;
	x->cap = d->sq_size / 2; /* >= the QP's max_send_wr (dqp.c) */
	x->wr = calloc(x->cap, sizeof(*x->wr));
	x->sge = calloc((size_t)x->cap * d->max_send_sge, sizeof(*x->sge));
	x->inl = malloc((size_t)x->cap * (d->max_inline ? d->max_inline : 1));
	if (!x->wr || !x->sge || !x->inl) {
		free(x->wr);
		free(x->sge);
		free(x->inl);
		x->wr = NULL;
		x->sge = NULL;
		x->inl = NULL;
		x->err = ENOMEM;
	}
}

static struct ibv_send_wr *hold_new(struct shift_qpx *x, unsigned op)
{
	struct ibv_send_wr *wr;

	if (x->err)
		return NULL;
	if (x->n == x->cap) {
		x->err = ENOMEM;
		return NULL;
	}
	wr = &x->wr[x->n];
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = x->qx->wr_id;
	wr->opcode = (enum ibv_wr_opcode)op;
	wr->send_flags = x->qx->wr_flags & ~(unsigned)IBV_SEND_INLINE;
	wr->sg_list = &x->sge[(size_t)x->n * x->d->max_send_sge];
	x->n++;
	return wr;
}

static struct ibv_send_wr *hold_last(struct shift_qpx *x)
{
	if (x->err)
		return NULL;
	if (!x->n) {
		x->err = EINVAL;
		return NULL;
	}
	return &x->wr[x->n - 1];
}

int qpx_hold_post(struct shift_qpx *x)
{
	struct ibv_send_wr *bad = NULL;

	if (x->err || !x->n)
		return x->err;
	for (unsigned i = 0; i + 1 < x->n; i++)
		x->wr[i].next = &x->wr[i + 1];
	x->wr[x->n - 1].next = NULL;
	return shift_dp_up.post_send_fallback(x->d, x->wr, &bad);
}

/* ---- what every builder does --------------------------------------------------- */

/* A new WR outside the Default state: held (HOLD). True if the provider's
 * builder is to be called (not in a batch, or unprotected). */
static __attribute__((noinline)) bool hold_op(struct shift_qpx *x, unsigned op, uint32_t rkey,
					      uint64_t raddr, uint32_t imm, uint64_t cmp_add,
					      uint64_t swap)
{
	if (x->mode != QPX_HOLD)
		return true;
	struct ibv_send_wr *wr = hold_new(x, op);

	if (wr) {
		wr->imm_data = imm;
		if (shift_wr_is_atomic(op)) {
			wr->wr.atomic.remote_addr = raddr;
			wr->wr.atomic.rkey = rkey;
			wr->wr.atomic.compare_add = cmp_add;
			wr->wr.atomic.swap = swap;
		} else {
			wr->wr.rdma.remote_addr = raddr;
			wr->wr.rdma.rkey = rkey;
		}
	}
	return false;
}

/* A new WR: mirrored (REC) or held. True if the provider's builder is to
 * be called too. */
static bool build(struct shift_qpx *x, unsigned op, uint32_t rkey, uint64_t raddr, uint32_t imm,
		  uint64_t cmp_add, uint64_t swap)
{
	if (x->mode == QPX_REC) {
		rec_op(x, op, rkey, raddr, imm, cmp_add, swap);
		return true;
	}
	return hold_op(x, op, rkey, raddr, imm, cmp_add, swap);
}

static bool set_sges(struct shift_qpx *x, size_t n, const struct ibv_sge *sg)
{
	uint32_t max = x->d->max_send_sge;

	if (shift_likely(x->mode == QPX_REC)) {
		struct shift_swqe *e = rec_last(x);

		if (e && n > max) {
			x->bad = true;
		} else if (e) {
			if (shift_likely(n == 1))
				e->sge[0] = sg[0];
			else
				memcpy(e->sge, sg, n * sizeof(*sg));
			e->num_sge = (uint32_t)n;
			e->inline_len = 0;
			e->send_flags &= ~(unsigned)IBV_SEND_INLINE;
		}
		return true;
	}
	if (x->mode != QPX_HOLD)
		return true;
	struct ibv_send_wr *wr = hold_last(x);

	if (wr && n > max) {
		x->err = EINVAL;
	} else if (wr) {
		memcpy(wr->sg_list, sg, n * sizeof(*sg));
		wr->num_sge = (int)n;
		wr->send_flags &= ~(unsigned)IBV_SEND_INLINE;
	}
	return false;
}

/* Copy inline data to dst (at most max bytes): its length, or -1. */
static long copy_inline(uint8_t *dst, uint32_t max, size_t n, const struct ibv_data_buf *b)
{
	size_t len = 0;

	for (size_t i = 0; i < n; i++) {
		if (b[i].length > max - len)
			return -1;
		memcpy(dst + len, b[i].addr, b[i].length);
		len += b[i].length;
	}
	return (long)len;
}

static bool set_inline(struct shift_qpx *x, size_t n, const struct ibv_data_buf *b)
{
	struct shift_dqp *d = x->d;
	long len;

	if (x->mode == QPX_REC) {
		struct shift_swqe *e = rec_last(x);

		if (!e)
			return true;
		/* the application may reuse its buffer once the setter returns */
		len = copy_inline((uint8_t *)&e->sge[d->max_send_sge], d->max_inline, n, b);
		if (len < 0) {
			x->bad = true;
			return true;
		}
		e->inline_len = (uint32_t)len;
		e->num_sge = 0;
		e->send_flags |= IBV_SEND_INLINE;
		return true;
	}
	if (x->mode != QPX_HOLD)
		return true;
	struct ibv_send_wr *wr = hold_last(x);

	if (!wr)
		return false;
	uint8_t *dst = x->inl + (size_t)(wr - x->wr) * d->max_inline;

	len = copy_inline(dst, d->max_inline, n, b);
	if (len < 0) {
		x->err = EINVAL;
		return false;
	}
	wr->sg_list[0].addr = (uintptr_t)dst;
	wr->sg_list[0].length = (uint32_t)len;
	wr->sg_list[0].lkey = 0;
	wr->num_sge = 1;
	wr->send_flags |= IBV_SEND_INLINE;
	return false;
}

/* An operation SHIFT does not mirror. Default: the QP leaves protection
 * (the batch goes on as the provider's); failed over: complete fails. */
static __attribute__((cold)) bool unsupported(struct shift_qpx *x, const char *what)
{
	if (x->mode == QPX_REC) {
		qpx_rollback(x);
		shift_dqp_set_send_state(x->d, SHIFT_SEND_UNPROTECTED, "an ibv_wr_* operation SHIFT cannot mirror");
		shift_warn("%s QP %u: ibv_wr_%s cannot be carried to a backup QP: QP unprotected",
			   x->d->dev, x->d->qpn, what);
		x->mode = QPX_PASS;
		return true;
	}
	if (x->mode != QPX_HOLD)
		return true;
	if (!x->err)
		x->err = EOPNOTSUPP;
	shift_warn("%s QP %u: ibv_wr_%s while failed over: refused (SHIFT cannot carry it)", x->d->dev,
		   x->d->qpn, what);
	return false;
}

/* ---- the builders ------------------------------------------------------------ *
 * The common call (a batch in the Default state, room in the mirror, the QP
 * first in its bucket) mirrors inline and tail-calls the provider's
 * builder; every other goes through op_slow(). */

/* The QP of a common builder call, or NULL. */
static inline struct shift_qpx *rec_quick(const struct ibv_qp_ex *q)
{
	struct shift_qpx *x = __atomic_load_n(&shift_qpx_tab[qpx_hash(q)], __ATOMIC_ACQUIRE);

	if (shift_likely(x->qx == q && x->mode == QPX_REC && !x->bad &&
			 x->d->sq_head < x->d->sq_limit))
		return x;
	return NULL;
}

/* The provider's builder of op. */
static void forward(struct shift_qpx *x, struct ibv_qp_ex *q, unsigned op, uint32_t rkey,
		    uint64_t raddr, uint32_t imm, uint64_t cmp_add, uint64_t swap)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
		x->fn.wr_rdma_write(q, rkey, raddr);
		break;
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		x->fn.wr_rdma_write_imm(q, rkey, raddr, imm);
		break;
	case IBV_WR_RDMA_READ:
		x->fn.wr_rdma_read(q, rkey, raddr);
		break;
	case IBV_WR_SEND:
		x->fn.wr_send(q);
		break;
	case IBV_WR_SEND_WITH_IMM:
		x->fn.wr_send_imm(q, imm);
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		x->fn.wr_atomic_cmp_swp(q, rkey, raddr, cmp_add, swap);
		break;
	default:
		x->fn.wr_atomic_fetch_add(q, rkey, raddr, cmp_add);
		break;
	}
}

static __attribute__((noinline)) void op_slow(struct ibv_qp_ex *q, unsigned op, uint32_t rkey,
					      uint64_t raddr, uint32_t imm, uint64_t cmp_add,
					      uint64_t swap)
{
	struct shift_qpx *x = qpx_find(q);

	if (x && build(x, op, rkey, raddr, imm, cmp_add, swap))
		forward(x, q, op, rkey, raddr, imm, cmp_add, swap);
}

static void qx_wr_rdma_write(struct ibv_qp_ex *q, uint32_t rkey, uint64_t raddr)
{
	struct shift_qpx *x = rec_quick(q);

	if (!x)
		return op_slow(q, IBV_WR_RDMA_WRITE, rkey, raddr, 0, 0, 0);
	rec_fill(x, IBV_WR_RDMA_WRITE, rkey, raddr, 0, 0, 0);
	x->fn.wr_rdma_write(q, rkey, raddr);
}

static void qx_wr_rdma_write_imm(struct ibv_qp_ex *q, uint32_t rkey, uint64_t raddr, __be32 imm)
{
	struct shift_qpx *x = rec_quick(q);

	if (!x)
		return op_slow(q, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, raddr, imm, 0, 0);
	rec_fill(x, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, raddr, imm, 0, 0);
	x->fn.wr_rdma_write_imm(q, rkey, raddr, imm);
}

static void qx_wr_rdma_read(struct ibv_qp_ex *q, uint32_t rkey, uint64_t raddr)
{
	struct shift_qpx *x = rec_quick(q);

	if (!x)
		return op_slow(q, IBV_WR_RDMA_READ, rkey, raddr, 0, 0, 0);
	rec_fill(x, IBV_WR_RDMA_READ, rkey, raddr, 0, 0, 0);
	x->fn.wr_rdma_read(q, rkey, raddr);
}

static void qx_wr_send(struct ibv_qp_ex *q)
{
	struct shift_qpx *x = rec_quick(q);

	if (!x)
		return op_slow(q, IBV_WR_SEND, 0, 0, 0, 0, 0);
	rec_fill(x, IBV_WR_SEND, 0, 0, 0, 0, 0);
	x->fn.wr_send(q);
}

static void qx_wr_send_imm(struct ibv_qp_ex *q, __be32 imm)
{
	struct shift_qpx *x = rec_quick(q);

	if (!x)
		return op_slow(q, IBV_WR_SEND_WITH_IMM, 0, 0, imm, 0, 0);
	rec_fill(x, IBV_WR_SEND_WITH_IMM, 0, 0, imm, 0, 0);
	x->fn.wr_send_imm(q, imm);
}

static void qx_wr_atomic_cmp_swp(struct ibv_qp_ex *q, uint32_t rkey, uint64_t raddr,
				 uint64_t cmp, uint64_t swap)
{
	struct shift_qpx *x = rec_quick(q);

	if (!x)
		return op_slow(q, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, raddr, 0, cmp, swap);
	rec_fill(x, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, raddr, 0, cmp, swap);
	x->fn.wr_atomic_cmp_swp(q, rkey, raddr, cmp, swap);
}

static void qx_wr_atomic_fetch_add(struct ibv_qp_ex *q, uint32_t rkey, uint64_t raddr,
				   uint64_t add)
{
	struct shift_qpx *x = rec_quick(q);

	if (!x)
		return op_slow(q, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, raddr, 0, add, 0);
	rec_fill(x, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, raddr, 0, add, 0);
	x->fn.wr_atomic_fetch_add(q, rkey, raddr, add);
}

static __attribute__((noinline)) void set_sge_slow(struct ibv_qp_ex *q, uint32_t lkey,
						   uint64_t addr, uint32_t length)
{
	struct shift_qpx *x = qpx_find(q);
	struct ibv_sge sge = { .addr = addr, .length = length, .lkey = lkey };

	if (x && set_sges(x, 1, &sge))
		x->fn.wr_set_sge(q, lkey, addr, length);
}

static void qx_wr_set_sge(struct ibv_qp_ex *q, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct shift_qpx *x = __atomic_load_n(&shift_qpx_tab[qpx_hash(q)], __ATOMIC_ACQUIRE);

	if (shift_unlikely(x->qx != q || x->mode != QPX_REC || x->bad ||
			   x->d->sq_head == x->head))
		return set_sge_slow(q, lkey, addr, length);
	struct shift_swqe *e = shift_dqp_swqe(x->d, x->d->sq_head - 1);

	e->sge[0].addr = addr;
	e->sge[0].length = length;
	e->sge[0].lkey = lkey;
	e->num_sge = 1;
	e->inline_len = 0;
	e->send_flags &= ~(unsigned)IBV_SEND_INLINE;
	x->fn.wr_set_sge(q, lkey, addr, length);
}

static void qx_wr_set_sge_list(struct ibv_qp_ex *q, size_t n, const struct ibv_sge *sg)
{
	struct shift_qpx *x = qpx_find(q);

	if (x && set_sges(x, n, sg))
		x->fn.wr_set_sge_list(q, n, sg);
}

static void qx_wr_set_inline_data(struct ibv_qp_ex *q, void *addr, size_t length)
{
	struct shift_qpx *x = qpx_find(q);
	struct ibv_data_buf b = { .addr = addr, .length = length };

	if (x && set_inline(x, 1, &b))
		x->fn.wr_set_inline_data(q, addr, length);
}

static void qx_wr_set_inline_data_list(struct ibv_qp_ex *q, size_t n,
				       const struct ibv_data_buf *b)
{
	struct shift_qpx *x = qpx_find(q);

	if (x && set_inline(x, n, b))
		x->fn.wr_set_inline_data_list(q, n, b);
}

/* Addressing of other transports: meaningless on RC, nothing to mirror. */
static void qx_wr_set_ud_addr(struct ibv_qp_ex *q, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey)
{
	struct shift_qpx *x = qpx_find(q);

	if (x && x->mode != QPX_HOLD)
		x->fn.wr_set_ud_addr(q, ah, qpn, qkey);
}

static void qx_wr_set_xrc_srqn(struct ibv_qp_ex *q, uint32_t srqn)
{
	struct shift_qpx *x = qpx_find(q);

	if (x && x->mode != QPX_HOLD)
		x->fn.wr_set_xrc_srqn(q, srqn);
}

static void qx_wr_bind_mw(struct ibv_qp_ex *q, struct ibv_mw *mw, uint32_t rkey,
			  const struct ibv_mw_bind_info *info)
{
	struct shift_qpx *x = qpx_find(q);

	if (x && unsupported(x, "bind_mw"))
		x->fn.wr_bind_mw(q, mw, rkey, info);
}

static void qx_wr_local_inv(struct ibv_qp_ex *q, uint32_t rkey)
{
	struct shift_qpx *x = qpx_find(q);

	if (x && unsupported(x, "local_inv"))
		x->fn.wr_local_inv(q, rkey);
}

static void qx_wr_send_inv(struct ibv_qp_ex *q, uint32_t rkey)
{
	struct shift_qpx *x = qpx_find(q);

	if (x && unsupported(x, "send_inv"))
		x->fn.wr_send_inv(q, rkey);
}

static void qx_wr_send_tso(struct ibv_qp_ex *q, void *hdr, uint16_t hdr_sz, uint16_t mss)
{
	struct shift_qpx *x = qpx_find(q);

	if (x && unsupported(x, "send_tso"))
		x->fn.wr_send_tso(q, hdr, hdr_sz, mss);
}

static void qx_wr_atomic_write(struct ibv_qp_ex *q, uint32_t rkey, uint64_t raddr,
			       const void *data)
{
	struct shift_qpx *x = qpx_find(q);

	if (x && unsupported(x, "atomic_write"))
		x->fn.wr_atomic_write(q, rkey, raddr, data);
}

/* ---- taking the builders over ---------------------------------------------------- */

#define QPX_INSTALL(n) if (x->qx->n) x->qx->n = qx_##n;
#define QPX_GIVE_BACK(n) x->qx->n = x->fn.n;

void qpx_install(struct shift_qpx *x)
{
	QPX_FNS(QPX_INSTALL)
}

void qpx_give_back(struct shift_qpx *x)
{
	QPX_FNS(QPX_GIVE_BACK)
}
