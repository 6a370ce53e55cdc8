/*
 * NVIDIA/Mellanox ConnectX (mlx5).
 *
 * No quirk SHIFT works around. Work queues: native. mlx5's direct-verbs
 * API describes a QP's send and receive buffers and its doorbell record
 * (mlx5dv_init_obj, reached through the lower table: the real libmlx5 in
 * production, the simulated RNIC's mlx5 mode in tests), and SHIFT reads
 * the outstanding WQEs back at failover (providers/mlx5_wqe.c).
 */
#include "providers/provider.h"
#include "providers/mlx5_wqe.h"
#include "shift/base/lower.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* PCI vendor ids ConnectX devices report (Mellanox, and the same parts
 * under NVIDIA's id on recent firmware) */
#define MLX_VENDOR_ID 0x02c9
#define NVIDIA_VENDOR_ID 0x10de

static bool mlx5_match(const struct ibv_device_attr *attr)
{
	return attr->vendor_id == MLX_VENDOR_ID || attr->vendor_id == NVIDIA_VENDOR_ID;
}

static int mlx5_native_wq(struct ibv_qp *qp, struct shift_nwq **out)
{
	struct mlx5dv_qp dv;
	struct mlx5dv_obj obj;
	struct shift_nwq *q;
	int rc;

	if (!shift_lower->mlx5dv_init_obj)
		return ENOSYS;
	memset(&dv, 0, sizeof(dv));
	memset(&obj, 0, sizeof(obj));
	obj.qp.in = qp;
	obj.qp.out = &dv;
	rc = shift_lower->mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP);
	if (rc)
		return rc < 0 ? -rc : rc;
	q = malloc(sizeof(*q));
	if (!q)
		return ENOMEM;
	if (shift_mlx5_nwq_init(q, &dv, qp->qp_num)) {
		free(q);
		return EPROTO;
	}
	*out = q;
	return 0;
}

const struct shift_provider shift_provider_mlx5 = {
	.name = "mlx5",
	.match = mlx5_match,
	.wq = SHIFT_WQ_NATIVE,
	.native_wq = mlx5_native_wq,
};
