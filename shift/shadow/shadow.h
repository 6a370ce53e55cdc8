/*
 * Shadow control verbs: every PD, MR, CQ and QP the application creates on
 * a NIC is recorded here (cheaply, on the application's thread) and replayed
 * on a backup NIC of the same host by one background thread per RNIC
 * (shift_rnic). Backup QP and MR attributes are exchanged with the peer
 * through the key-value store, keyed by what the application already
 * exchanged (its default GID and QPN, its rkeys): shift/exchange.c.
 *
 * Locking: rnic->lock guards the object lists and every field marked (L).
 * The background thread never holds it across a verb or a KV round trip, so
 * the application's control verbs never wait on either.
 */
#ifndef SHIFT_SHADOW_H
#define SHIFT_SHADOW_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#include "shift/shadow/exchange.h"

struct shift_ctx;
struct shift_rnic;

enum shift_shadow_state {
	SHIFT_SHADOW_PENDING,     /* recorded, not yet replayed */
	SHIFT_SHADOW_READY,       /* backup object exists (QP: RTS) */
	SHIFT_SHADOW_UNPROTECTED, /* could not be shadowed: runs as plain */
};

struct shift_pd {
	struct shift_pd *next;       /* (L) */
	struct ibv_pd *app;
	struct ibv_pd *bk;           /* thread-owned */
	enum shift_shadow_state state; /* (L) */
	bool dead;                   /* (L) the app deallocated it */
};

enum shift_mr_kind { SHIFT_MR_PLAIN, SHIFT_MR_IOVA, SHIFT_MR_DMABUF };

struct shift_mr {
	struct shift_mr *next;       /* (L) */
	struct ibv_mr *app;
	struct shift_pd *pd;
	enum shift_mr_kind kind;
	void *addr;
	size_t length;
	uint64_t iova;
	uint64_t dmabuf_offset;
	int dmabuf_fd;               /* our dup of the app's fd, or -1 */
	unsigned int access;
	uint32_t app_lkey, app_rkey;
	struct ibv_mr *bk;           /* thread-owned */
	unsigned int published;      /* thread-owned: bitmap over rnic->gids */
	enum shift_shadow_state state; /* (L) */
	bool dead;                   /* (L) */
};

struct shift_cq {
	struct shift_cq *next;       /* (L) */
	struct ibv_cq *app;
	int cqe;
	int comp_vector;
	bool app_has_channel;
	struct ibv_comp_channel *app_channel; /* (L) NULL once being destroyed */
	struct ibv_cq *bk;           /* thread-owned */
	struct ibv_comp_channel *bk_channel;
	unsigned synth_events;       /* backup events reported as the app CQ's,
				      * not acked yet (atomic; shift/chan.c) */
	enum shift_shadow_state state; /* (L) */
	bool dead;                   /* (L) */

	/* data path after a failover (shift/failover.c), under dp_lock:
	 * completions kept for the application, in order */
	pthread_mutex_t dp_lock;
	struct ibv_wc *kept;
	unsigned kept_cap;
	uint64_t kept_head, kept_tail;
};

struct shift_qp {
	struct shift_qp *next;       /* (L) */
	struct ibv_qp *app;
	uint32_t app_qpn;
	struct shift_pd *pd;
	struct shift_cq *send_cq, *recv_cq;
	struct ibv_qp_cap cap;
	int sq_sig_all;

	/* what the application passed to modify_qp, merged (L): the recipe
	 * to reset the default QP later, and the source of the backup's */
	struct ibv_qp_attr attr;
	int attr_mask;
	enum ibv_qp_state app_state;

	/* backup side, thread-owned */
	struct ibv_qp *bk;
	enum ibv_qp_state bk_state;
	uint32_t bk_psn;
	struct shift_qp_key my_key;     /* my default (GID, QPN) */
	struct shift_qp_key peer_key;   /* the peer's default (GID, QPN) */
	struct shift_qp_value my_bk;    /* what I publish */
	struct shift_qp_value peer_bk;  /* what the peer published */
	bool published;
	bool peer_known;
	uint64_t waiting_since_ms;
	bool warned_peer;

	enum shift_shadow_state state; /* (L) */
	const char *why;               /* (L) reason when UNPROTECTED */
	bool dead;                     /* (L) */
	bool ctrl_posted;              /* thread-owned: control receive posted */
};

#define SHIFT_RNIC_MAX_GIDS 4

struct shift_rnic {
	struct shift_ctx *sctx;
	char name[64];            /* default device name */
	char bk_name[64];         /* backup device name, "" if none */
	struct ibv_context *bk_ctx;

	pthread_t thread;
	bool thread_started;
	pthread_mutex_t lock;
	pthread_cond_t kick;
	bool stop;                /* (L) */
	bool dirty;               /* (L) something to replay */
	bool idle;                /* (L) the thread waits for a kick */

	struct shift_pd *pds;     /* (L) */
	struct shift_mr *mrs;     /* (L) */
	struct shift_cq *cqs;     /* (L) */
	struct shift_qp *qps;     /* (L) */

	/* default GIDs the app's QPs use; MRs are published under each */
	union ibv_gid gids[SHIFT_RNIC_MAX_GIDS]; /* thread-owned */
	int ngids;

	struct shift_kv *kv;      /* thread-owned */
	bool kv_warned;
	bool unprotected;         /* (L) whole RNIC runs unprotected */
	const char *why;          /* (L) */
};

/* Start shadowing a context the application opened; NULL if this context
 * cannot be protected (logged once). Never fails the application. */
struct shift_rnic *shift_rnic_start(struct shift_ctx *sctx);
/* Stop the thread, destroy backup objects, delete this RNIC's KV keys. */
void shift_rnic_stop(struct shift_rnic *rnic);

/* Recording, called on the application's thread after the lower verb
 * succeeded. Cheap: an allocation and a list insert under rnic->lock. */
void shift_shadow_pd(struct shift_rnic *r, struct ibv_pd *pd);
void shift_shadow_pd_gone(struct shift_rnic *r, struct ibv_pd *pd);
void shift_shadow_mr(struct shift_rnic *r, struct ibv_mr *mr,
		     enum shift_mr_kind kind, void *addr, size_t length,
		     uint64_t iova, uint64_t dmabuf_offset, int dmabuf_fd,
		     unsigned int access);
void shift_shadow_mr_gone(struct shift_rnic *r, struct ibv_mr *mr);
void shift_shadow_mr_rereg(struct shift_rnic *r, struct ibv_mr *mr, int flags,
			   int access);
void shift_shadow_cq(struct shift_rnic *r, struct ibv_cq *cq, int cqe,
		     struct ibv_comp_channel *channel, int comp_vector);
void shift_shadow_cq_gone(struct shift_rnic *r, struct ibv_cq *cq);
void shift_shadow_qp(struct shift_rnic *r, struct ibv_qp *qp,
		     enum ibv_qp_type type, struct ibv_cq *send_cq,
		     struct ibv_cq *recv_cq, const struct ibv_qp_cap *cap,
		     int sq_sig_all, bool has_srq);
void shift_shadow_qp_modified(struct shift_rnic *r, struct ibv_qp *qp,
			      const struct ibv_qp_attr *attr, int mask);
void shift_shadow_qp_gone(struct shift_rnic *r, struct ibv_qp *qp);

/* Reset and reconnect a backup QP after a failback, PSNs advanced by gen
 * (shift/failover.c; on the RNIC's thread). 0 or -1. */
int shift_shadow_rearm(struct shift_rnic *r, struct shift_qp *q, unsigned gen);

/*
 * Steps of connecting a QP whose attributes SHIFT sets itself (a backup QP,
 * a default QP reset after a failure): app and app_mask are what the
 * application set on its QP, used where given, defaults otherwise; access
 * flags are SHIFT_QP_ACCESS(app's). 0 or the provider's error.
 */
int shift_qp_reset(struct ibv_qp *qp);
int shift_qp_to_init(struct ibv_qp *qp, const struct ibv_qp_attr *app, uint8_t port);
int shift_qp_to_rtr(struct ibv_qp *qp, const struct ibv_qp_attr *app, int app_mask,
		    const struct ibv_ah_attr *ah, enum ibv_mtu mtu, uint32_t dest_qpn,
		    uint32_t rq_psn);
int shift_qp_to_rts(struct ibv_qp *qp, const struct ibv_qp_attr *app, int app_mask,
		    uint32_t sq_psn);

/* Run one replay pass now, on the caller's thread (tests). Returns the
 * number of objects still pending. */
int shift_rnic_pass(struct shift_rnic *r);
/* One pass over every RNIC (tests and the campaign, synchronous mode). */
void shift_rnic_pass_all(void);

/* Counters over all RNICs, for shiftctl and tests. */
struct shift_shadow_stats {
	unsigned long qps_ready, qps_unprotected, mrs_ready, kv_errors;
};
void shift_shadow_stats_get(struct shift_shadow_stats *out);

/* Write / remove this RNIC's per-QP status file (shiftctl reads them):
 * $SHIFT_STATUS_DIR/shift-<pid>-<dev>.status, one line per QP. Called by
 * the RNIC's own thread (it reads thread-owned fields). */
void shift_status_write(struct shift_rnic *r);
void shift_status_remove(struct shift_rnic *r);




/* What SHIFT knows of an application QP / MR (tests, tools). Reads
 * thread-owned fields: call with replay synchronous or quiescent. */
/* The shadow CQ of an application CQ / the shadow QP of an app QP, or NULL. */
struct shift_cq *shift_shadow_cq_of(struct shift_rnic *r, struct ibv_cq *cq);
struct shift_qp *shift_shadow_qp_of(struct shift_rnic *r, struct ibv_qp *qp);
/* The backup MR's lkey for an application lkey; 0 and -ENOENT if none. */
int shift_shadow_bk_lkey(struct shift_rnic *r, uint32_t app_lkey, uint32_t *bk_lkey);

struct shift_qp_info {
	enum shift_shadow_state state;
	const char *why;
	struct ibv_qp *bk;
	enum ibv_qp_state bk_state;
	uint32_t peer_bk_qpn;
	bool published;
	const char *bk_dev;
};
int shift_shadow_qp_info(struct ibv_qp *qp, struct shift_qp_info *out);
struct ibv_mr *shift_shadow_mr_backup(struct ibv_mr *mr);
struct shift_rnic *shift_rnic_of(struct ibv_context *ctx);
#endif /* SHIFT_SHADOW_H */
