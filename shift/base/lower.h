/*
 * The lower verbs: the one table through which all of SHIFT reaches the
 * verbs below it.
 *
 * In production (libibverbs/dropin.c) every slot is filled with dlvsym() from
 * the distro's real libibverbs; unit tests fill it with the simulated RNIC
 * (tests/sim/rnic). No other path from SHIFT to the real library exists.
 *
 * Only control verbs live here. The data path (post_send, post_recv,
 * poll_cq, req_notify_cq, post_srq_recv) and the extended verbs
 * (create_qp_ex, create_cq_ex, query_port, ...) are reached through the
 * objects themselves, exactly as verbs.h's inline functions do: through
 * ctx->ops and struct verbs_context of the context the lower open_device
 * returned. A lower backend must therefore hand out contexts that verbs.h can
 * use (abi_compat = __VERBS_ABI_IS_EXTENDED inside a struct verbs_context
 * whose sz covers the slots it implements).
 *
 * Every slot keeps verbs semantics: int verbs return 0 or a positive errno,
 * pointer verbs return NULL and set errno.
 */
#ifndef SHIFT_LOWER_H
#define SHIFT_LOWER_H

#include <infiniband/verbs.h>

struct mlx5dv_obj;

struct shift_lower {
	const char *name; /* "rdma-core <path>", "sim", ... for logs */

	/* devices */
	struct ibv_device **(*get_device_list)(int *num_devices);
	void (*free_device_list)(struct ibv_device **list);
	const char *(*get_device_name)(struct ibv_device *device);
	__be64 (*get_device_guid)(struct ibv_device *device);
	struct ibv_context *(*open_device)(struct ibv_device *device);
	int (*close_device)(struct ibv_context *context);
	int (*query_device)(struct ibv_context *context,
			    struct ibv_device_attr *device_attr);
	int (*query_port)(struct ibv_context *context, uint8_t port_num,
			  struct ibv_port_attr *port_attr);
	int (*query_gid)(struct ibv_context *context, uint8_t port_num,
			 int index, union ibv_gid *gid);
	int (*get_async_event)(struct ibv_context *context,
			       struct ibv_async_event *event);
	void (*ack_async_event)(struct ibv_async_event *event);

	/* protection domains and memory */
	struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length,
				 int access);
	struct ibv_mr *(*reg_mr_iova)(struct ibv_pd *pd, void *addr,
				      size_t length, uint64_t iova, int access);
	struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *pd, void *addr,
				       size_t length, uint64_t iova,
				       unsigned int access);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset,
					size_t length, uint64_t iova, int fd,
					int access);
	int (*rereg_mr)(struct ibv_mr *mr, int flags, struct ibv_pd *pd,
			void *addr, size_t length, int access);
	int (*dereg_mr)(struct ibv_mr *mr);

	/* completion queues and channels */
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *context);
	int (*destroy_comp_channel)(struct ibv_comp_channel *channel);
	struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe,
				    void *cq_context,
				    struct ibv_comp_channel *channel,
				    int comp_vector);
	int (*resize_cq)(struct ibv_cq *cq, int cqe);
	int (*destroy_cq)(struct ibv_cq *cq);
	int (*get_cq_event)(struct ibv_comp_channel *channel,
			    struct ibv_cq **cq, void **cq_context);
	void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);

	/* queue pairs */
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd,
				    struct ibv_qp_init_attr *qp_init_attr);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			 int attr_mask);
	int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			int attr_mask, struct ibv_qp_init_attr *init_attr);
	int (*destroy_qp)(struct ibv_qp *qp);
	int (*query_ece)(struct ibv_qp *qp, struct ibv_ece *ece);
	int (*set_ece)(struct ibv_qp *qp, struct ibv_ece *ece);
	/* the ibv_qp_ex of a QP created with send_ops_flags, or NULL (NULL
	 * slot: the library has none; such QPs then run unprotected) */
	struct ibv_qp_ex *(*qp_to_qp_ex)(struct ibv_qp *qp);

	/* shared receive queues (ibv_create_srq_ex is a context slot) */
	struct ibv_srq *(*create_srq)(struct ibv_pd *pd,
				      struct ibv_srq_init_attr *srq_init_attr);
	int (*modify_srq)(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr,
			  int srq_attr_mask);
	int (*query_srq)(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr);
	int (*destroy_srq)(struct ibv_srq *srq);

	/* provider direct verbs: mlx5's description of a QP's queues
	 * (mlx5dv_init_obj), for native work-queue access (providers/mlx5.c);
	 * NULL: none */
	int (*mlx5dv_init_obj)(struct mlx5dv_obj *obj, uint64_t obj_type);

	/* address handles: SHIFT's service channel of datagrams on the
	 * backup NIC (shift/shadow/svc.c) */
	struct ibv_ah *(*create_ah)(struct ibv_pd *pd, struct ibv_ah_attr *attr);
	int (*destroy_ah)(struct ibv_ah *ah);
};

/*
 * The table SHIFT uses. Set once, before any verb is called: by the drop-in's
 * constructor, or by a unit test (shift_lower_set()).
 */
extern const struct shift_lower *shift_lower;

void shift_lower_set(const struct shift_lower *lower);

#endif /* SHIFT_LOWER_H */
