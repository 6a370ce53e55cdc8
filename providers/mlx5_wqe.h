/*
 * The mlx5 work-queue format, read back (providers/mlx5_wqe.c): a QP's
 * send and receive WQEs decoded into SHIFT's mirror entries at failover
 * (shift/dp/nwq.h), from the description mlx5's direct-verbs API gives
 * (struct mlx5dv_qp).
 *
 * Send queue: wqe_cnt basic blocks of 64 bytes; a WQE is a control segment
 * (its index and opcode, the QP number and its size in 16-byte units, the
 * completion and fence flags, the immediate) followed by, per opcode, a
 * remote-address segment, an atomic segment, and data segments or one
 * inline segment. Segments wrap from the end of the buffer to its start.
 * Receive queue: wqe_cnt WQEs of `stride` bytes, each a list of data
 * segments ended by one with the invalid lkey when shorter than the stride.
 */
#ifndef SHIFT_PROVIDERS_MLX5_WQE_H
#define SHIFT_PROVIDERS_MLX5_WQE_H

#include <infiniband/mlx5dv.h>

#include "shift/dp/nwq.h"

/* Describe qp's queues from its mlx5dv_qp (what mlx5dv_init_obj gave):
 * 0, or -1 if the description is not one SHIFT can read (logged by the
 * caller). */
int shift_mlx5_nwq_init(struct shift_nwq *q, const struct mlx5dv_qp *dv, uint32_t qpn);

/* The readers shift_mlx5_nwq_init() installs (for the unit tests too). */
int shift_mlx5_read_send(const struct shift_nwq *q, uint32_t idx, struct shift_swqe *e,
			 uint32_t max_sge, uint32_t max_inline);
int shift_mlx5_read_recv(const struct shift_nwq *q, uint32_t idx, struct shift_rwqe *e,
			 uint32_t max_sge);

#endif /* SHIFT_PROVIDERS_MLX5_WQE_H */
