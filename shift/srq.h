/*
 * The front's shared receive queues (shift/srq.c): the SRQ entry points,
 * the context's create_srq_ex slot, and what creating or connecting a QP
 * on an SRQ needs (shift/verbs.c, shift/vctx.c).
 */
#ifndef SHIFT_SRQ_H
#define SHIFT_SRQ_H

#include <stdbool.h>
#include <infiniband/verbs.h>

#include "shift/dp/ctx.h"

struct ibv_srq *shift_ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *srq_init_attr);
int shift_ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr, int srq_attr_mask);
int shift_ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr);
int shift_ibv_destroy_srq(struct ibv_srq *srq);

/* The create_srq_ex slot of a context SHIFT attached. */
void shift_srq_vctx_take(struct shift_ctx *s);
void shift_srq_vctx_give_back(struct shift_ctx *s);

/* Can an RC QP on srq (NULL: none) be protected? */
bool shift_srq_ok(struct ibv_srq *srq);
/* A QP was created on srq (type as created; d: its data-path state, not yet
 * published, or NULL if SHIFT does not protect it): links d to the SRQ's
 * mirror, or turns the SRQ unprotected if the QP cannot fail over with the
 * others. Returns the capabilities its backup QP gets: for a QP on an SRQ,
 * a receive queue of its own for what arrives on the backup path
 * (fo/srq.c). */
struct ibv_qp_cap shift_srq_qp_created(struct shift_dqp *d, struct ibv_qp *qp,
				       enum ibv_qp_type type, struct ibv_srq *srq,
				       const struct ibv_qp_cap *cap);
/* An application's modify_qp SHIFT refuses (EINVAL, logged): a QP whose
 * SRQ's receives SHIFT took over must not read the default SRQ again. */
bool shift_srq_refuse_modify(struct ibv_qp *qp, const struct ibv_qp_attr *attr, int mask);

#endif /* SHIFT_SRQ_H */
