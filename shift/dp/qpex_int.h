/*
 * Private to the ibv_qp_ex builders (qpex.c: the batch and the registry;
 * qpex_build.c: mirroring or holding each WR, the builders themselves).
 */
#ifndef SHIFT_DP_QPEX_INT_H
#define SHIFT_DP_QPEX_INT_H

#include "shift/dp/ctx.h"

enum { QPX_IDLE, QPX_REC, QPX_PASS, QPX_HOLD };

/* Every builder of struct ibv_qp_ex (rdma-core 44's verbs.h) */
#define QPX_FNS(X)                                                                       \
	X(wr_atomic_cmp_swp) X(wr_atomic_fetch_add) X(wr_bind_mw) X(wr_local_inv)        \
	X(wr_rdma_read) X(wr_rdma_write) X(wr_rdma_write_imm) X(wr_send) X(wr_send_imm)  \
	X(wr_send_inv) X(wr_send_tso) X(wr_set_ud_addr) X(wr_set_xrc_srqn)               \
	X(wr_set_inline_data) X(wr_set_inline_data_list) X(wr_set_sge) X(wr_set_sge_list) \
	X(wr_start) X(wr_complete) X(wr_abort) X(wr_atomic_write)

#define QPX_FIELD(n) __typeof__(((struct ibv_qp_ex *)0)->n) n;
struct qpx_fns {
	QPX_FNS(QPX_FIELD)
};

struct shift_qpx {
	struct ibv_qp_ex *qx;     /* the provider's, as the application holds it */
	struct shift_qpx *next;   /* lookup chain */
	struct shift_ctx *s;
	struct shift_dqp *d;
	struct qpx_fns fn;        /* the provider's builders */
	/* the batch (under d's post_lock, from wr_start to complete/abort) */
	uint8_t mode;             /* QPX_* */
	bool bad;                 /* REC: a WR the mirror cannot hold */
	uint64_t head;            /* REC: d->sq_head at wr_start */
	/* HOLD: the batch as struct ibv_send_wr (allocated at the first) */
	struct ibv_send_wr *wr;
	struct ibv_sge *sge;      /* max_send_sge per WR */
	uint8_t *inl;             /* max_inline bytes per WR */
	unsigned n, cap;
	int err;                  /* the first bad argument: complete fails */
};

/* The registry (qpex.c): by the QP's address; written under a lock, read
 * lock-free. Empty buckets and chain ends are shift_qpx_none. */
#define QPX_TAB 1024
extern struct shift_qpx *shift_qpx_tab[QPX_TAB];
extern struct shift_qpx shift_qpx_none;

static inline unsigned qpx_hash(const void *qp)
{
	return ((uint32_t)(uintptr_t)qp * 0x9e3779b1u) >> 22; /* 10 bits */
}

/* (out of line: not found, the QP is being destroyed) */
struct shift_qpx *qpx_lost(void);

static inline struct shift_qpx *qpx_find(const struct ibv_qp_ex *qx)
{
	struct shift_qpx *x = __atomic_load_n(&shift_qpx_tab[qpx_hash(qx)], __ATOMIC_ACQUIRE);

	while (shift_unlikely(x->qx != qx)) {
		if (x == &shift_qpx_none)
			return qpx_lost();
		x = __atomic_load_n(&x->next, __ATOMIC_ACQUIRE);
	}
	return x;
}

/* qpex_build.c */
void qpx_rollback(struct shift_qpx *x);
void qpx_hold_begin(struct shift_qpx *x);
int qpx_hold_post(struct shift_qpx *x);
/* SHIFT's builders into x's ibv_qp_ex (where the provider has one), and
 * the provider's back */
void qpx_install(struct shift_qpx *x);
void qpx_give_back(struct shift_qpx *x);

/* qpex.c: the batch */
void qpx_wr_start(struct ibv_qp_ex *q);
int qpx_wr_complete(struct ibv_qp_ex *q);
void qpx_wr_abort(struct ibv_qp_ex *q);

#endif /* SHIFT_DP_QPEX_INT_H */
