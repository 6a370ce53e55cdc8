/*
 * The post verbs SHIFT installs on a context it took over (dp/post.c).
 */
#ifndef SHIFT_DP_POST_H
#define SHIFT_DP_POST_H

#include <infiniband/verbs.h>

int shift_dp_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int shift_dp_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
/* The same on a context whose provider gives native work-queue access
 * (dp/nwq.h; shift_ctx_set_native()) */
int shift_dp_post_send_native(struct ibv_qp *qp, struct ibv_send_wr *wr,
			      struct ibv_send_wr **bad_wr);
int shift_dp_post_recv_native(struct ibv_qp *qp, struct ibv_recv_wr *wr,
			      struct ibv_recv_wr **bad_wr);
int shift_dp_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
			   struct ibv_recv_wr **bad_wr);

#endif /* SHIFT_DP_POST_H */
