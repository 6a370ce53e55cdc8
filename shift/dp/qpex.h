/*
 * QPs posted through ibv_qp_ex (ibv_wr_start, ibv_wr_send, ...,
 * ibv_wr_complete): the work-request builders SHIFT puts into the
 * provider's struct ibv_qp_ex (dp/qpex.c).
 *
 * The application keeps its provider's ibv_qp_ex (ibv_qp_to_qp_ex) and
 * sets wr_id and wr_flags on it; SHIFT replaces its function pointers in
 * place. A batch (ibv_wr_start .. ibv_wr_complete / ibv_wr_abort) holds the
 * QP's post_lock, as the provider holds its send queue's lock, and is one
 * of:
 *  - Default: each WR is mirrored (shift/dp/dqp.h, the same mirror
 *    ibv_post_send fills; inline data copied at its setter) and built by
 *    the provider as well; ibv_wr_complete posts it. A batch the provider
 *    refuses is forgotten again, unless the QP failed (the failover layer
 *    keeps it, as for a refused ibv_post_send).
 *  - not Default (failed over, failing back): the batch is built as
 *    struct ibv_send_wr and handed to the failover layer at complete
 *    (shift_dp_up.post_send_fallback), as ibv_post_send would be.
 *  - unprotected: the provider's, untouched.
 * SHIFT mirrors SEND, SEND_WITH_IMM, RDMA_WRITE(_WITH_IMM), RDMA_READ and
 * the two atomics (SHIFT_QPX_OPS). A QP created for other operations is
 * not protected (shift_qpx_supported()); a builder SHIFT cannot mirror,
 * called anyway, leaves the QP unprotected with one line.
 */
#ifndef SHIFT_DP_QPEX_H
#define SHIFT_DP_QPEX_H

#include <stdint.h>
#include <infiniband/verbs.h>

struct shift_ctx;
struct shift_dqp;
struct shift_qpx;

#define SHIFT_QPX_OPS                                                                   \
	((uint64_t)(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |     \
		    IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |                 \
		    IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |       \
		    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD))

/* Take over the work-request builders of qx, the ibv_qp_ex of protected QP
 * d of context s. -1 (nothing changed: out of memory) or 0. */
int shift_qpx_attach(struct shift_ctx *s, struct shift_dqp *d, struct ibv_qp_ex *qx);
/* Forget the ibv_qp_ex of qp about to be destroyed (its provider pointers
 * back): a handle for shift_qpx_restore() if the destroy fails, else for
 * shift_qpx_free(); NULL if SHIFT holds none. */
struct shift_qpx *shift_qpx_forget(struct ibv_qp *qp);
void shift_qpx_restore(struct shift_qpx *x);
void shift_qpx_free(struct shift_qpx *x);
/* Context s is being closed: every ibv_qp_ex of it gets its pointers back. */
void shift_qpx_detach_ctx(struct shift_ctx *s);
/* fork() (through shift_dp_fork_*): the registry stays whole across it
 * (done: in the parent and in the child alike). */
void shift_qpx_fork_prepare(void);
void shift_qpx_fork_done(void);

#endif /* SHIFT_DP_QPEX_H */
