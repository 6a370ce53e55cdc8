/*
 * SHIFT's core objects and the entry points the drop-in exports.
 *
 * A struct shift_ctx shadows every context SHIFT opened for the application:
 * it keeps the provider's data-path ops and extended-verb slots that SHIFT
 * replaced on that context, so SHIFT's replacements can call through to
 * them. Applications always hold the provider's own objects; SHIFT never
 * wraps or reallocates them (mlx5dv and friends keep working on them).
 */
#ifndef SHIFT_SHIFT_H
#define SHIFT_SHIFT_H

#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#include "shift/base/log.h"
#include "shift/base/lower.h"
#include "shift/dp/dqp.h"

#define SHIFT_MAX_CTX 64
#define SHIFT_DQP_BUCKETS 1024 /* power of two */
#define SHIFT_MAX_FO 256 /* failed-over QPs per context */
#define SHIFT_WATCH_PORTS 4 /* ports per device the port watch covers */
#define SHIFT_POKE_GIDS 4   /* default GIDs per context the poke read covers */

struct shift_rnic;

struct shift_ctx {
	struct ibv_context *ibctx; /* the provider's context, as the app sees it */

	/* the provider's data path, saved before SHIFT installed its own */
	int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr,
			 struct ibv_send_wr **bad_wr);
	int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr,
			 struct ibv_recv_wr **bad_wr);
	int (*post_srq_recv)(struct ibv_srq *srq, struct ibv_recv_wr *wr,
			     struct ibv_recv_wr **bad_wr);
	int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
	int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);

	/* the provider's struct verbs_context slots SHIFT routes through itself
	 * (NULL where the provider's context has none) */
	int (*query_port)(struct ibv_context *context, uint8_t port_num,
			  struct ibv_port_attr *port_attr, size_t port_attr_len);
	int (*query_device_ex)(struct ibv_context *context,
			       const struct ibv_query_device_ex_input *input,
			       struct ibv_device_attr_ex *attr, size_t attr_size);
	struct ibv_qp *(*create_qp_ex)(struct ibv_context *context,
				       struct ibv_qp_init_attr_ex *qp_init_attr_ex);
	struct ibv_cq_ex *(*create_cq_ex)(struct ibv_context *context,
					  struct ibv_cq_init_attr_ex *init_attr);
	int slot; /* index in the context table */
	/* data-path state of the app's protected QPs, by QPN (chained);
	 * written under the context lock, read lock-free */
	struct shift_dqp *dqp[SHIFT_DQP_BUCKETS];
	/* set once a QP of this context failed over: polls take the slow path
	 * (written through shift_ctx_set_slow(), which swaps ops.poll_cq) */
	bool slow;
	bool detached; /* (under the context lock) */
	/* serializes the slow path (polls of a slow context, the background
	 * pass): it may complete WRs on any CQ of a QP, the one polled or
	 * not; taken before any CQ's dp_lock */
	pthread_mutex_t slow_lock;
	/* a protected QP has different send and receive CQs: the full fast
	 * poll, which keeps its cq (shift/ctx.c, cq_of) */
	bool split_cqs;
	struct shift_dqp *fo[SHIFT_MAX_FO]; /* the failed-over QPs (slow path) */
	int nfo;
	struct shift_rnic *rnic; /* shadow verbs of this RNIC, NULL if unprotected */
	/* port watch (background thread only): since when each port has not
	 * been ACTIVE (ms, 0 = active), and whether any is down now */
	uint64_t port_down_since[SHIFT_WATCH_PORTS + 1];
	bool ports_down;
	/* pokes (background thread only, failover.c): the values last read
	 * under the poke keys of this context's default GIDs */
	struct shift_poke {
		union ibv_gid gid;
		char seen[48];
		bool read;
	} poke[SHIFT_POKE_GIDS];
	int npoke;
	uint64_t poke_at;
};

/* The contexts SHIFT manages, for the data path's lookup (shift/ctx.c). */
extern struct shift_ctx *shift_ctx_tab[SHIFT_MAX_CTX];

/*
 * Find the shift_ctx of a provider context. Lock-free: the table only grows
 * under the registry lock, and a slot is cleared before its context closes.
 * Contexts are few (one per device), so a short scan beats a hash.
 */
static inline struct shift_ctx *shift_ctx_of(const struct ibv_context *ibctx)
{
	for (int i = 0; i < SHIFT_MAX_CTX; i++) {
		struct shift_ctx *s = __atomic_load_n(&shift_ctx_tab[i], __ATOMIC_ACQUIRE);

		if (shift_likely(s && s->ibctx == ibctx))
			return s;
	}
	return 0;
}

/*
 * Take over a context the lower open_device returned: save its data-path ops
 * and extended slots, install SHIFT's. On failure the context is left
 * untouched (unprotected) and one line is logged; the app never notices.
 */
struct shift_ctx *shift_ctx_attach(struct ibv_context *ibctx);
/* Give the context back its own ops and forget it; call before closing it. */
void shift_ctx_detach(struct ibv_context *ibctx);
/* Polls of s's context take the slow path (shift_poll_slow) or the fast
 * one again: sets s->slow and the context's ops.poll_cq. */
void shift_ctx_set_slow(struct shift_ctx *s, bool slow);

/* The data-path state of an application QP, or NULL (unprotected). */
static inline struct shift_dqp *shift_dqp_by_qpn(struct shift_ctx *s, uint32_t qpn)
{
	struct shift_dqp *d = __atomic_load_n(&s->dqp[qpn & (SHIFT_DQP_BUCKETS - 1)],
					      __ATOMIC_ACQUIRE);

	while (shift_unlikely(d && d->qpn != qpn))
		d = d->next_in_bucket;
	return d;
}

/*
 * Every protected QP, by its address: the post path's lookup.
 * Written under the context lock, read lock-free. Empty buckets and chain
 * ends hold shift_dqp_none (no QP, no QPN) instead of NULL, so the common
 * lookup is one load and one compare.
 */
#define SHIFT_DQP_TAB 4096
extern struct shift_dqp *shift_dqp_tab[SHIFT_DQP_TAB];
extern struct shift_dqp shift_dqp_none;

static inline unsigned shift_dqp_hash(const struct ibv_qp *qp)
{
	/* not by QPN: two devices number their QPs alike. Fibonacci hashing
	 * of the address's low 32 bits (the top 12 bits of the product mix
	 * every bit above the allocator's alignment): one multiply, one shift */
	return ((uint32_t)(uintptr_t)qp * 0x9e3779b1u) >> 20; /* 12 bits */
}

static inline struct shift_dqp *shift_dqp_of_qp(const struct ibv_qp *qp)
{
	struct shift_dqp *d = __atomic_load_n(&shift_dqp_tab[shift_dqp_hash(qp)],
					      __ATOMIC_ACQUIRE);

	while (d != &shift_dqp_none && d->qp != qp)
		d = __atomic_load_n(&d->next_by_qp, __ATOMIC_ACQUIRE);
	return d != &shift_dqp_none ? d : 0;
}

/* Register / forget the data-path state of a QP of this context. */
void shift_ctx_add_dqp(struct shift_ctx *s, struct shift_dqp *d);
struct shift_dqp *shift_ctx_remove_dqp(struct shift_ctx *s, struct ibv_qp *qp);
/* Connect a QP's data-path state to its shadow QP and CQs. */
void shift_dqp_link(struct shift_ctx *s, struct ibv_qp *qp, struct ibv_cq *send_cq,
		    struct ibv_cq *recv_cq);

/* Statistics kept cheaply (relaxed atomics) for shiftctl and tests. */
struct shift_stats {
	unsigned long contexts_attached;
	unsigned long contexts_unprotected;
	unsigned long compat_1_0_calls;
	/* peers' failover records read while failed over, and the KV
	 * commands that read them (batched: fewer commands than records) */
	unsigned long ep_records_read, ep_read_commands;
};
extern struct shift_stats shift_stats;

/*
 * SHIFT's front, in the shape of the lower table: what the application
 * reaches. The drop-in exports these; unit tests and the fault campaign
 * stack them on the simulated RNIC (app -> shift_verbs -> shift_lower).
 */
extern const struct shift_lower shift_verbs;

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

#endif /* SHIFT_SHIFT_H */
