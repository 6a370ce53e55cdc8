/*
 * What SHIFT knows of each provider (the driver behind a device), as one
 * ops table per provider, one file each (the model: rdma-core's
 * struct verbs_context_ops, UCX's per-transport tables). Everything
 * provider-specific lives under providers/; the rest of SHIFT asks
 * shift_provider_of(ctx).
 *
 *   providers/rxe.c      soft-RoCE (rdma_rxe)
 *   providers/mlx5.c     NVIDIA/Mellanox ConnectX (mlx5)
 *   providers/sim.c      the project's simulated RNIC (tests/sim)
 *   providers/generic.c  any other device
 *
 * Work-queue access: at failover SHIFT needs every outstanding send and
 * receive WQE of the failed QP, as work requests to repost on the backup
 * QP. The generic way is SHIFT's own mirror of every posted WR
 * (shift/dp/dqp.h). A provider whose queues SHIFT can read back (mlx5,
 * through its direct-verbs description of the QP buffers) sets wq to
 * SHIFT_WQ_NATIVE and native_wq: its posts then record only the wr_id and
 * where the WQE starts (shift/dp/nwq.h). A QP whose queues cannot be
 * described keeps the mirror, as does every QP when SHIFT_NATIVE_WQ=0.
 */
#ifndef SHIFT_PROVIDERS_PROVIDER_H
#define SHIFT_PROVIDERS_PROVIDER_H

#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

enum shift_wq_access {
	SHIFT_WQ_MIRROR, /* SHIFT mirrors every posted WR (shift/dp/dqp.h) */
	SHIFT_WQ_NATIVE, /* read from the provider's own queues at failover */
};

struct shift_nwq;

struct shift_provider {
	const char *name;
	/* Is the device behind these attributes this provider's? */
	bool (*match)(const struct ibv_device_attr *attr);
	/* The retry_cnt SHIFT gives a QP of device dev the application asked
	 * `want` for (NULL: want, unchanged). */
	uint8_t (*retry_cnt)(const char *dev, uint8_t want);
	enum shift_wq_access wq;
	/* SHIFT_WQ_NATIVE only: describe qp's queues (*out malloc'ed): 0,
	 * or a positive errno (the QP then keeps the mirror) */
	int (*native_wq)(struct ibv_qp *qp, struct shift_nwq **out);
};

extern const struct shift_provider shift_provider_rxe;
extern const struct shift_provider shift_provider_mlx5;
extern const struct shift_provider shift_provider_sim;
extern const struct shift_provider shift_provider_generic;

/* The provider of ctx's device (cached per context; generic if none
 * matches or the device cannot be queried). Never NULL. */
const struct shift_provider *shift_provider_of(struct ibv_context *ctx);
/* The provider table whose match() takes these attributes. */
const struct shift_provider *shift_provider_match(const struct ibv_device_attr *attr);
/* Forget ctx (it is being closed). */
void shift_provider_forget(struct ibv_context *ctx);
/* fork() (shift/fork.c): the cache stays whole across it (done: in the
 * parent and in the child alike). */
void shift_provider_fork_prepare(void);
void shift_provider_fork_done(void);
/* The retry_cnt SHIFT gives a QP of ctx the application asked want for. */
uint8_t shift_provider_retry_cnt(struct ibv_context *ctx, uint8_t want);
/* "mirror" or "native", for status and logs. */
const char *shift_provider_wq_name(const struct shift_provider *p);
/* Native access to qp's queues if its provider gives it and SHIFT_NATIVE_WQ
 * allows: the description (malloc'ed), or NULL (the mirror; a provider
 * that should have given it and did not is logged once). */
struct shift_nwq *shift_provider_native_wq(struct ibv_qp *qp);

#endif /* SHIFT_PROVIDERS_PROVIDER_H */
