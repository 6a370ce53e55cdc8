/*
 * Internal structures of the simulated RNIC, shared by its files:
 * world.c (scheduler, faults, trace), ctl.c (control verbs, CQs, channels,
 * async events), qp.c (QP state machine), wire.c (data path and the RC
 * requester/responder engine), cqex.c (extended CQ polling), qpex.c
 * (the ibv_wr_* work-request builders).
 *
 * Every verbs object is embedded first in its sim_* struct ("must be
 * first"), so the verbs pointer and the sim pointer convert by a cast.
 */
#ifndef SHIFT_SIM_INT_H
#define SHIFT_SIM_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sim.h"

#define SIM_MAX_SGE 16
#define SIM_MAX_INLINE 256
#define SIM_MAX_WR 4096
#define SIM_MAX_CQE 65536
#define SIM_MAX_RD_ATOMIC 16
#define SIM_ATOMIC_CACHE 32
#define SIM_ASYNC_RING 256
#define SIM_PSN_MASK 0xffffffu

#define sim_container(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))

/* Signed distance a - b in the 24-bit PSN space. */
static inline int32_t sim_psn_diff(uint32_t a, uint32_t b)
{
	return (int32_t)((a - b) << 8) >> 8;
}

struct sim_ctx;
struct sim_qp;

#define SIM_UD_QPN_BASE 0x800000u
#define SIM_UD_QPS 8

struct sim_dev {
	struct ibv_device ibdev;	/* must be first */
	struct sim_world *w;
	struct sim_host *host;
	unsigned gidx;			/* index in w->devs */
	unsigned lidx;			/* index in its host */
	__be64 guid;
	union ibv_gid gid[2];
	uint16_t lid;
	enum ibv_port_state port_state;
	bool fatal;
	int die_after_exec;		/* -1: not armed */
	uint32_t key_seq;
	struct sim_mr **mrs;		/* index = key >> 8 */
	unsigned nmrs;
	struct sim_qp **qps;		/* index = qpn - SIM_QPN_BASE */
	/* UD QPs, numbered apart (SIM_UD_QPN_BASE + index), so that RC QPs
	 * keep the numbers a run without them gives (rnic/ud.c) */
	struct sim_qp *ud_qps[SIM_UD_QPS];
	unsigned nqps;
	unsigned qps_hint;		/* no free slot in qps below this */
	struct sim_ctx *ctxs;		/* open contexts, for async events */
};

#define SIM_QPN_BASE 0x100

struct sim_host {
	struct sim_world *w;
	unsigned idx;			/* in w->hosts */
	int slot;			/* in the process-wide lower tables */
	unsigned ndev;
	struct sim_dev *dev[SIM_MAX_DEVS_PER_HOST];
};

struct sim_ctx {
	struct verbs_context vctx;	/* must be first */
	struct sim_dev *dev;
	struct sim_ctx *next;		/* in dev->ctxs */
	int async_wfd;
	struct ibv_async_event async[SIM_ASYNC_RING];
	unsigned async_head, async_count;
	/* Everything allocated on the context, for teardown. */
	struct sim_cq *cqs;
	struct sim_pd *pds;
	struct sim_channel *chans;
	struct sim_srq *srqs;
};

struct sim_pd {
	struct ibv_pd pd;		/* must be first */
	struct sim_pd *next;		/* in ctx->pds */
};

struct sim_mr {
	struct ibv_mr mr;		/* must be first */
	struct sim_dev *dev;
	uint64_t iova;
	unsigned access;
};

struct sim_channel {
	struct ibv_comp_channel ch;	/* must be first */
	int wfd;
	struct sim_channel *next;	/* in ctx->chans */
};

struct sim_cq {
	struct ibv_cq_ex cq;		/* must be first; starts like ibv_cq */
	struct sim_ctx *ctx;
	struct sim_cq *next;		/* in ctx->cqs */
	struct ibv_wc *ring;
	unsigned cap, head, count;
	int armed;			/* 0, 1 = any, 2 = solicited only */
	unsigned events_reported;	/* channel events get_cq_event returned */
	bool overflow;
	struct ibv_wc cur;		/* ex polling cursor */
	bool polling;
};

/* One send WQE. psn is assigned at post time (one PSN per message). */
struct sim_swqe {
	uint64_t wr_id;
	enum ibv_wr_opcode opcode;
	unsigned flags;			/* IBV_SEND_* */
	uint32_t imm;
	uint64_t raddr;
	uint32_t rkey;
	uint64_t cmp, swp;
	unsigned num_sge;
	struct ibv_sge sge[SIM_MAX_SGE];
	uint32_t len;
	uint8_t *inl;			/* inline copy (IBV_SEND_INLINE) */
	uint32_t psn;
	bool acked;			/* response or covering ACK seen */
	enum ibv_wc_status err;		/* local error found at transmit */
};

struct sim_rwqe {
	uint64_t wr_id;
	unsigned num_sge;
	struct ibv_sge sge[SIM_MAX_SGE];
};

enum sim_pkt_kind {
	SIM_PKT_REQ,
	SIM_PKT_ACK,
	SIM_PKT_READ_RESP,
	SIM_PKT_ATOMIC_RESP,
	SIM_PKT_NAK_SEQ,
	SIM_PKT_NAK_RNR,
	SIM_PKT_NAK_ACCESS,
	SIM_PKT_NAK_INV,
};

struct sim_pkt {
	uint8_t kind;
	uint8_t op;			/* enum ibv_wr_opcode for REQ */
	uint8_t solicited;
	uint32_t psn;
	uint32_t src_qpn, dst_qpn;
	int dst_dev;			/* world device index, -1 unreachable */
	uint32_t len;
	uint8_t *payload;
	uint64_t raddr;
	uint32_t rkey;
	uint32_t imm;
	uint64_t cmp, swp;		/* atomic operands / result in cmp */
};

/* A shared receive queue: QPs created on it take their receive WQEs from
 * its ring, in the order posted (srq.c). */
struct sim_srq {
	struct ibv_srq srq;		/* must be first */
	struct sim_ctx *ctx;
	struct sim_srq *next;		/* in ctx->srqs */
	struct sim_rwqe *rq;
	unsigned rq_cap, max_sge;
	uint32_t rq_head, rq_tail;
	unsigned limit;			/* armed limit, 0 = not armed */
	unsigned nqps;			/* QPs attached */
};

struct sim_qp {
	union {				/* must be first */
		struct ibv_qp qp;
		struct ibv_qp_ex qpx;	/* its qp_base is qp */
	};
	bool ex;			/* created with send_ops_flags (qpex.c) */
	struct sim_wr_build *build;	/* ibv_wr_* batch being built (qpex.c) */
	struct sim_ctx *ctx;
	struct sim_srq *srq;		/* receives come from it, if set */
	struct sim_dev *dev;
	struct sim_qp *wnext, *wprev;	/* in the world's QP list */
	struct ibv_qp_attr attr;	/* current attributes */
	struct ibv_qp_cap cap;
	bool sq_sig_all;
	int peer_dev;			/* resolved at RTR, -1 unknown */

	/* Send queue: monotonic counters, slot = counter % sq_cap.
	 * head <= tx <= tail: [head, tx) transmitted and not completed,
	 * [tx, tail) not transmitted yet. */
	struct sim_swqe *sq;
	uint8_t *inl_arena;		/* sq_cap * max_inline bytes */
	unsigned sq_cap;
	uint32_t sq_head, sq_tx, sq_tail;
	uint32_t sq_hi;			/* highest tx ever reached */
	uint32_t next_psn;
	unsigned rd_out;		/* reads/atomics in [head, tx) */
	bool comp_in_read;		/* opts.rxe_stale_read: see sim.h */

	/* Receive queue. */
	struct sim_rwqe *rq;
	unsigned rq_cap;
	uint32_t rq_head, rq_tail;

	/* Wire: packets this QP sent, FIFO. */
	struct sim_pkt *out;
	unsigned out_cap, out_head, out_count;
	unsigned out_nreq, out_nresp;

	/* Requester timers. */
	uint64_t deadline;		/* retransmit timer */
	unsigned retry_left, rnr_left;
	bool rnr_wait;
	uint64_t rnr_deadline;
	bool sqd_notified;

	/* Responder. */
	uint32_t epsn;
	bool nak_sent;			/* one NAK per expected PSN */
	struct { uint32_t psn; uint64_t orig; bool valid; }
		acache[SIM_ATOMIC_CACHE];

	/* Fault hooks. */
	unsigned drop_req, drop_resp;

	/* mlx5 mode (mlx5img.c): the queues in mlx5's WQE format */
	uint8_t *img_sq, *img_rq;
	uint32_t img_sq_cnt;		/* 64-byte blocks */
	uint32_t img_rq_cnt, img_rq_stride;
	uint32_t img_cur, img_rq_head;	/* producer counters (16 bits) */
	uint32_t *img_db;		/* doorbell record: [0] receive, [1] send */
};

struct sim_timed {
	uint64_t at;
	enum sim_fault_kind kind;
	struct sim_dev *a, *b;
	unsigned arg;
};

#define SIM_MAX_TIMED 64

struct sim_world {
	struct sim_world_opts opts;
	uint64_t rng;
	uint64_t now;
	uint64_t hash;
	FILE *trace;
	struct sim_stats stats;
	unsigned nhosts, ndevs;
	struct sim_host *hosts[SIM_MAX_HOSTS];
	struct sim_dev *devs[SIM_MAX_DEVS];
	uint8_t cut[SIM_MAX_DEVS][SIM_MAX_DEVS];
	struct sim_timed timed[SIM_MAX_TIMED];
	unsigned ntimed;
	struct sim_qp *qps;		/* all QPs, creation order */
	struct sim_qp *qps_tail;
	/* scratch for the scheduler */
	struct sim_ev { uint8_t type; struct sim_qp *qp; } *evs;
	unsigned evs_cap;
};

/* world.c */
void sim_trace(struct sim_world *w, uint32_t tag, uint64_t a, uint64_t b);
/* An event printed in the trace but not hashed into it (a UD datagram,
 * ud.c: SHIFT's own traffic, which a run without SHIFT has not) */
void sim_trace_print(const struct sim_world *w, uint32_t tag, uint64_t a, uint64_t b);
uint64_t sim_rand(struct sim_world *w);
struct sim_dev *sim_dev_by_gid(struct sim_world *w, const union ibv_gid *g);
struct sim_dev *sim_dev_by_lid(struct sim_world *w, uint16_t lid);
bool sim_path_ok(struct sim_world *w, struct sim_dev *a, struct sim_dev *b);
void sim_world_add_qp(struct sim_world *w, struct sim_qp *qp);
void sim_world_del_qp(struct sim_world *w, struct sim_qp *qp);

/* ctl.c */
extern const struct shift_lower sim_lower_proto;
void sim_async(struct sim_ctx *ctx, enum ibv_event_type type, void *obj,
	       int port);
void sim_dev_async(struct sim_dev *d, enum ibv_event_type type);
void sim_cq_push(struct sim_cq *cq, const struct ibv_wc *wc, bool solicited);
void sim_cq_purge(struct sim_cq *cq, uint32_t qpn);
struct sim_mr *sim_mr_lookup(struct sim_dev *d, uint32_t key);
void sim_ctx_free_all(struct sim_dev *d);
int sim_query_port(struct ibv_context *c, uint8_t port,
		   struct ibv_port_attr *pa);

/* qp.c */
struct ibv_qp *sim_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia);
struct ibv_qp *sim_create_qp_ex(struct ibv_context *c,
				struct ibv_qp_init_attr_ex *ia);
int sim_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
int sim_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
		 struct ibv_qp_init_attr *ia);
int sim_destroy_qp(struct ibv_qp *qp);
void sim_qp_to_err(struct sim_qp *q);
void sim_qp_free(struct sim_qp *q);

/* wire.c */
int sim_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
		  struct ibv_send_wr **bad);
int sim_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
		  struct ibv_recv_wr **bad);
int sim_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int sim_req_notify_cq(struct ibv_cq *cq, int solicited_only);
void sim_qp_flush(struct sim_qp *q);
void sim_qp_clear_wire(struct sim_qp *q);
bool sim_qp_can_tx(struct sim_qp *q);
/* 0: no timer, 1: retransmit timer, 2: RNR timer; deadline set. */
int sim_qp_timer_armed(struct sim_qp *q, uint64_t *deadline);
void sim_qp_tx(struct sim_qp *q);
void sim_qp_deliver(struct sim_qp *q);
void sim_qp_timeout(struct sim_qp *q);
void sim_qp_rnr_fire(struct sim_qp *q);

/* srq.c */
int sim_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
		      struct ibv_recv_wr **bad);
struct ibv_srq *sim_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *ia);
struct ibv_srq *sim_create_srq_ex(struct ibv_context *c,
				  struct ibv_srq_init_attr_ex *ia);
int sim_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *a, int mask);
int sim_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *a);
int sim_destroy_srq(struct ibv_srq *srq);
void sim_srq_free_all(struct sim_ctx *ctx);
/* The receive WQE a message for q takes next (NULL: none posted, RNR), and
 * taking it (after which the SRQ's limit event may fire). */
/* wire.c: q's memory at an SGE with access need (NULL: a protection
 * error); len bytes scattered over an SGE list (false: likewise) */
uint8_t *sim_local(struct sim_qp *q, const struct ibv_sge *s, unsigned need);
bool sim_scatter(struct sim_qp *q, const struct ibv_sge *sge, unsigned n, const uint8_t *data,
		 uint32_t len);
/* ud.c: UD QPs (datagrams delivered at the post, lost on a dead path),
 * address handles */
bool sim_ud_modify_ok(enum ibv_qp_state cur, enum ibv_qp_state next, uint32_t mask);
int sim_ud_post_send(struct sim_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
struct ibv_ah *sim_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr);
int sim_destroy_ah(struct ibv_ah *ah);
struct sim_rwqe *sim_rq_peek(struct sim_qp *q);
void sim_rq_take(struct sim_qp *q);

/* mlx5img.c (sim_world_opts.mlx5; each a no-op on a QP without) */
int sim_img_init(struct sim_qp *q);
void sim_img_free(struct sim_qp *q);
void sim_img_reset(struct sim_qp *q);
void sim_img_send(struct sim_qp *q, const struct ibv_send_wr *wr);
void sim_img_send_done(struct sim_qp *q);
void sim_img_recv(struct sim_qp *q, const struct ibv_recv_wr *wr);
struct mlx5dv_obj;
int sim_mlx5dv_init_obj(struct mlx5dv_obj *obj, uint64_t obj_type);

/* cqex.c */
void sim_cq_ex_init(struct sim_cq *cq);
/* ibv_wc_read_completion_ts (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP): the
 * network time of the poll */
void sim_cq_ex_timestamps(struct sim_cq *cq);

/* qpex.c: the ibv_qp_ex work-request builders of a QP created with
 * IBV_QP_INIT_ATTR_SEND_OPS_FLAGS (0, or EOPNOTSUPP / ENOMEM). */
int sim_qp_ex_init(struct sim_qp *q, uint64_t send_ops_flags);
void sim_qp_ex_free(struct sim_qp *q);

#endif /* SHIFT_SIM_INT_H */
