/*
 * SHIFT's front: the entry points the drop-in exports (shift/verbs.c) and
 * the table that stacks them over the lower verbs. The data path's objects
 * are in shift/dp/ctx.h.
 */
#ifndef SHIFT_SHIFT_H
#define SHIFT_SHIFT_H

#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#include "shift/base/log.h"
#include "shift/base/lower.h"
#include "shift/dp/ctx.h"

/*
 * SHIFT's front, in the shape of the lower table: what the application
 * reaches. The drop-in exports these; unit tests and the fault campaign
 * stack them on the simulated RNIC (app -> shift_verbs -> shift_lower).
 */
extern const struct shift_lower shift_verbs;

/* Send WRs an RC QP of a protected context gets beyond the application's
 * max_send_wr (the application is told its own size): SHIFT's failback
 * notification and the empty READ that may precede it share the default
 * QP's send queue with the application's WRs moved back to it (a queue of
 * one WR, perftest's and ibv_rc_pingpong's, refused them). */
#define SHIFT_SQ_ROOM 2u

/* Connect a new QP's data-path state d (NULL: nothing to do) to its shadow
 * QP q (shift_shadow_qp's record) and CQs, before d is published
 * (shift_ctx_add_dqp; shift/vctx.c). */
void shift_dqp_link(struct shift_ctx *s, struct shift_dqp *d, struct shift_qp *q,
		    struct ibv_cq *send_cq, struct ibv_cq *recv_cq);

/* The extended-verb slots of a context SHIFT attached (shift/vctx.c):
 * taken after shift_ctx_attach(), given back before shift_ctx_detach(). */
void shift_vctx_take(struct shift_ctx *s);
/* A new protected QP (d may be NULL) reads its provider's queues back at
 * failover if the provider lets it (shift/dp/nwq.h), else keeps the mirror. */
void shift_qp_native(struct shift_dqp *d);
void shift_vctx_give_back(struct shift_ctx *s);

/* Install the fork() handlers (shift/fork.c); once, before the first
 * context is attached. */
void shift_fork_install(void);

/* Called by the drop-in for every call of an IBVERBS_1.0 compat symbol. */
void shift_compat_enter(unsigned int export_index);

/* The entry points (one per intercepted verb; the drop-in aliases them). */
struct ibv_device **shift_ibv_get_device_list(int *num_devices);
void shift_ibv_free_device_list(struct ibv_device **list);
const char *shift_ibv_get_device_name(struct ibv_device *device);
__be64 shift_ibv_get_device_guid(struct ibv_device *device);
struct ibv_context *shift_ibv_open_device(struct ibv_device *device);
int shift_ibv_close_device(struct ibv_context *context);
int shift_ibv_query_device(struct ibv_context *context,
			   struct ibv_device_attr *device_attr);
int shift_ibv_query_port(struct ibv_context *context, uint8_t port_num,
			 struct ibv_port_attr *port_attr);
int shift_ibv_query_gid(struct ibv_context *context, uint8_t port_num,
			int index, union ibv_gid *gid);
int shift_ibv_get_async_event(struct ibv_context *context,
			      struct ibv_async_event *event);
void shift_ibv_ack_async_event(struct ibv_async_event *event);
struct ibv_pd *shift_ibv_alloc_pd(struct ibv_context *context);
int shift_ibv_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *shift_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
				int access);
struct ibv_mr *shift_ibv_reg_mr_iova(struct ibv_pd *pd, void *addr,
				     size_t length, uint64_t iova, int access);
struct ibv_mr *shift_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr,
				      size_t length, uint64_t iova,
				      unsigned int access);
struct ibv_mr *shift_ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				       size_t length, uint64_t iova, int fd,
				       int access);
int shift_ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd,
		       void *addr, size_t length, int access);
int shift_ibv_dereg_mr(struct ibv_mr *mr);
struct ibv_comp_channel *shift_ibv_create_comp_channel(struct ibv_context *context);
int shift_ibv_destroy_comp_channel(struct ibv_comp_channel *channel);
struct ibv_cq *shift_ibv_create_cq(struct ibv_context *context, int cqe,
				   void *cq_context,
				   struct ibv_comp_channel *channel,
				   int comp_vector);
int shift_ibv_resize_cq(struct ibv_cq *cq, int cqe);
int shift_ibv_destroy_cq(struct ibv_cq *cq);
int shift_ibv_get_cq_event(struct ibv_comp_channel *channel,
			   struct ibv_cq **cq, void **cq_context);
void shift_ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents);
struct ibv_qp *shift_ibv_create_qp(struct ibv_pd *pd,
				   struct ibv_qp_init_attr *qp_init_attr);
int shift_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			int attr_mask);
int shift_ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
		       int attr_mask, struct ibv_qp_init_attr *init_attr);
int shift_ibv_destroy_qp(struct ibv_qp *qp);
int shift_ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece);
int shift_ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece);
struct ibv_qp_ex *shift_ibv_qp_to_qp_ex(struct ibv_qp *qp);

#endif /* SHIFT_SHIFT_H */
