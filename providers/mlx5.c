/*
 * NVIDIA/Mellanox ConnectX (mlx5).
 *
 * No quirk SHIFT works around. Work queues: mlx5's direct-verbs API
 * describes a QP's send and receive buffers (mlx5dv_init_obj), so SHIFT can
 * in principle read the outstanding WQEs at failover instead of mirroring
 * every post; that reader is not written yet (it needs the WQE format
 * decoded segment by segment and a device or a faithful model to test it
 * on), so mlx5 keeps the mirror like every other provider.
 */
#include "providers/provider.h"

/* PCI vendor ids ConnectX devices report (Mellanox, and the same parts
 * under NVIDIA's id on recent firmware) */
#define MLX_VENDOR_ID 0x02c9
#define NVIDIA_VENDOR_ID 0x10de

static bool mlx5_match(const struct ibv_device_attr *attr)
{
	return attr->vendor_id == MLX_VENDOR_ID || attr->vendor_id == NVIDIA_VENDOR_ID;
}

const struct shift_provider shift_provider_mlx5 = {
	.name = "mlx5",
	.match = mlx5_match,
	.wq = SHIFT_WQ_MIRROR,
};
