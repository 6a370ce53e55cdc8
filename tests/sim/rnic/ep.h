/*
 * Application-side helper: one RC endpoint (context, PD, CQ, QP, a
 * registered buffer) opened and connected through a verbs table only, the
 * way an application (or perftest) does it. Used by the unit tests and the
 * workload drivers; the table may be sim_lower(host) directly or SHIFT's
 * front stacked over it.
 */
#ifndef SHIFT_SIM_EP_H
#define SHIFT_SIM_EP_H

#include <stddef.h>
#include <stdint.h>

#include "shift/base/lower.h"

struct sim_ep {
	const struct shift_lower *v;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;	/* only with SIM_EP_CHANNEL */
	struct ibv_cq *cq;		/* send and receive */
	struct ibv_qp *qp;
	struct ibv_cq_ex *cqx;		/* only with SIM_EP_EX: cq, extended */
	struct ibv_qp_ex *qpx;		/* only with SIM_EP_EX: qp's ibv_wr_* */
	uint8_t *buf;
	size_t len;
	struct ibv_mr *mr;
};

/* What one side tells the other out of band. */
struct sim_ep_info {
	uint32_t qpn;
	uint32_t psn;
	union ibv_gid gid;
};

struct sim_ep_conn {
	uint8_t timeout;	/* 14 */
	uint8_t retry_cnt;	/* 7 */
	uint8_t rnr_retry;	/* 7 */
	uint8_t min_rnr_timer;	/* 12 */
	uint8_t max_rd_atomic;	/* 16 */
	uint8_t rtr_only;	/* 0; 1: leave the QP at RTR (it never sends) */
};

#define SIM_EP_CHANNEL 1u	/* create a completion channel for the CQ */
/* the extended verbs: the CQ from ibv_create_cq_ex (wc_flags
 * IBV_WC_STANDARD_FLAGS), the QP from ibv_create_qp_ex with send_ops_flags
 * SIM_EP_EX_OPS (posted with ibv_wr_*) */
#define SIM_EP_EX 2u
#define SIM_EP_EX_OPS (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | \
		       IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |           \
		       IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |  \
		       IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)

/* Opens device devname through v, allocates PD, CQ (cqe entries), an RC
 * QP with cap, and a zeroed buffer of len bytes registered with access.
 * Returns 0 or an errno. */
int sim_ep_open(struct sim_ep *ep, const struct shift_lower *v,
		const char *devname, size_t len, int access,
		const struct ibv_qp_cap *cap, int cqe, unsigned flags);
/* The info to hand to the peer (GID index 1, the QP's first PSN). */
void sim_ep_info(const struct sim_ep *ep, uint32_t psn,
		 struct sim_ep_info *info);
/* RESET -> INIT -> RTR -> RTS towards the remote; conn may be NULL. */
int sim_ep_connect(struct sim_ep *ep, const struct sim_ep_info *local,
		   const struct sim_ep_info *remote,
		   const struct sim_ep_conn *conn);
void sim_ep_close(struct sim_ep *ep);

#endif /* SHIFT_SIM_EP_H */
