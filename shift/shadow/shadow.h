/*
 * Shadow control verbs: every PD, MR, CQ and QP the application creates on
 * a NIC is recorded here (cheaply, on the application's thread) and replayed
 * on a backup NIC of the same host by one background thread per RNIC
 * (shift_rnic). Backup QP and MR attributes are exchanged with the peer
 * through the key-value store, keyed by what the application already
 * exchanged (its default GID and QPN, its rkeys): shadow/exchange.c.
 *
 * The objects themselves, and which lock guards which field, are in
 * types.h. The code: record.c (the application's side), replay.c (the
 * replay pass), connect.c (connecting backup QPs), rnic.c (the RNIC's
 * thread), status.c (status files, counters).
 */
#ifndef SHIFT_SHADOW_H
#define SHIFT_SHADOW_H

#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#include "shift/shadow/types.h"

struct shift_ctx;

/* Start shadowing a context the application opened: sctx->rnic is set
 * (before the RNIC's thread starts) and returned; NULL if this context
 * cannot be protected (logged once). Never fails the application. */
struct shift_rnic *shift_rnic_start(struct shift_ctx *sctx);
/* Stop the thread, destroy backup objects, delete this RNIC's KV keys. */
void shift_rnic_stop(struct shift_rnic *rnic);

/*
 * fork(): shadow's share of the front's handlers (shift/fork.c). prepare
 * waits until no RNIC thread is inside a pass and holds them there; parent
 * lets them go on. child: the child's RNICs are its parent's (threads,
 * backup objects, KV keys): it drops them, never to touch them again.
 */
void shift_shadow_fork_prepare(void);
void shift_shadow_fork_parent(void);
void shift_shadow_fork_child(void);

/* Recording, called on the application's thread after the lower verb
 * succeeded. Cheap: an allocation and a list insert under rnic->lock. */
void shift_shadow_pd(struct shift_rnic *r, struct ibv_pd *pd);
void shift_shadow_mr(struct shift_rnic *r, struct ibv_mr *mr,
		     enum shift_mr_kind kind, void *addr, size_t length,
		     uint64_t iova, uint64_t dmabuf_offset, int dmabuf_fd,
		     unsigned int access);
void shift_shadow_mr_rereg(struct shift_rnic *r, struct ibv_mr *mr, int flags,
			   int access);
void shift_shadow_cq(struct shift_rnic *r, struct ibv_cq *cq, int cqe,
		     struct ibv_comp_channel *channel, int comp_vector);
/* cq was resized (cq->cqe is its new size): its backup grows with it
 * before this returns, or its QPs run unprotected. */
void shift_shadow_cq_resized(struct shift_rnic *r, struct ibv_cq *cq);
/* Record a new QP; returns its record (NULL without memory), whose
 * send_cq and recv_cq are the CQs' records, found on the way. */
struct shift_qp *shift_shadow_qp(struct shift_rnic *r, struct ibv_qp *qp,
				 enum ibv_qp_type type, struct ibv_cq *send_cq,
				 struct ibv_cq *recv_cq, const struct ibv_qp_cap *cap,
				 int sq_sig_all, bool has_srq);
void shift_shadow_qp_modified(struct shift_rnic *r, struct ibv_qp *qp,
			      const struct ibv_qp_attr *attr, int mask);
/* Destroying an application object: its record, looked up before the
 * provider's destroy (NULL: none), then marked dead if that succeeded (the
 * thread reaps it). Looking up after the destroy could find the record of
 * a new object another thread got at the same address. */
struct shift_pd *shift_shadow_pd_of(struct shift_rnic *r, struct ibv_pd *pd);
struct shift_mr *shift_shadow_mr_of(struct shift_rnic *r, struct ibv_mr *mr);
struct shift_cq *shift_shadow_cq_of(struct shift_rnic *r, struct ibv_cq *cq);
struct shift_qp *shift_shadow_qp_of(struct shift_rnic *r, struct ibv_qp *qp);
void shift_shadow_pd_gone(struct shift_rnic *r, struct shift_pd *p);
void shift_shadow_mr_gone(struct shift_rnic *r, struct shift_mr *m);
void shift_shadow_cq_gone(struct shift_rnic *r, struct shift_cq *c);
void shift_shadow_qp_gone(struct shift_rnic *r, struct shift_qp *q);

/* Reset and reconnect a backup QP after a failback, PSNs advanced by gen
 * (shift/fo/; on the RNIC's thread). 0 or -1. */
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
/* The layer above has background work for r (KV reads or writes a
 * failover waits for): its thread runs a pass now instead of at its
 * period. Takes r->lock only (never held across I/O); no-op in
 * synchronous mode, whose caller runs the passes. */
void shift_rnic_wake(struct shift_rnic *r);
/* The pass that runs now has work it must not do before at_ms (a grace
 * that lets a fast-path poll finish): r's thread runs its next pass then
 * rather than at its period. Takes r->lock only; no-op in synchronous
 * mode. */
void shift_rnic_due(struct shift_rnic *r, uint64_t at_ms);
/* Arm backup CQ bk, if it reports to r's thread (its application CQ has
 * no completion channel), so the next completion there wakes the thread:
 * a peer's handshake message on a backup nobody polls. (One the provider
 * does not arm is polled at the thread's period.) */
void shift_rnic_arm_backup(struct shift_rnic *r, struct ibv_cq *bk);
/* Did port (1..SHIFT_WATCH_PORTS) of r's device report that it left ACTIVE
 * (an async event on the thread's own context, shadow/portev.c), with no
 * PORT_ACTIVE since? */
bool shift_rnic_port_event_down(struct shift_rnic *r, unsigned port);
/* What each pass runs for the layer above before replaying (failover's
 * background share: noticing peers' handshake messages), on the RNIC's
 * thread; NULL (the default): nothing. Set by the front before the first
 * context is opened. */
void shift_shadow_set_background(void (*fn)(struct shift_ctx *s));

/* Counters over all RNICs, for shiftctl and tests. */
struct shift_shadow_stats {
	unsigned long qps_ready, qps_unprotected, mrs_ready, kv_errors;
	unsigned long records_other; /* peer records of another connection, ignored */
	unsigned long peer_mrs_read; /* peer MR records read ahead through MR indexes */
	unsigned long peer_mri_bad;  /* peer MR indexes refused (malformed, torn) */
};
void shift_shadow_stats_get(struct shift_shadow_stats *out);

/* Write / remove this RNIC's per-QP status file (shiftctl reads them):
 * $SHIFT_STATUS_DIR/shift-<pid>-<dev>.status, one line per QP. Called by
 * the RNIC's own thread (it reads thread-owned fields). */
void shift_status_write(struct shift_rnic *r);
void shift_status_remove(struct shift_rnic *r);

/* What SHIFT knows of an application QP / MR (tests, tools). Reads
 * thread-owned fields: call with replay synchronous or quiescent. */
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
	uint64_t mri_id; /* its RNIC's MR index (shadow/mrindex.c) */
};
/* Everything, for tests and tools that run no RNIC thread (inline passes):
 * bk and bk_state are that thread's while it runs. */
int shift_shadow_qp_info(struct ibv_qp *qp, struct shift_qp_info *out);
/* Only the shadow state of an application QP (enum shift_shadow_state),
 * or -ENOENT: safe while the RNIC's thread runs. */
int shift_shadow_qp_state(struct ibv_qp *qp);
/* The same from the record itself (the one shift_shadow_qp() returned,
 * alive while its QP is), without the lock or a lookup: its writers
 * store the state atomically under the lock. */
int shift_shadow_state_of(const struct shift_qp *q);
struct ibv_mr *shift_shadow_mr_backup(struct ibv_mr *mr);
struct shift_rnic *shift_rnic_of(struct ibv_context *ctx);
/* The record of the peer's MR of rkey app_rkey, as q's peer's MR index led
 * the RNIC's thread to read it ahead (shadow/mrindex.c); false if none.
 * Any thread; takes only a leaf lock. */
bool shift_shadow_peer_mr(struct shift_qp *q, uint32_t app_rkey, struct shift_mr_value *out);
/* The record of my MR of rkey app_rkey on q's PD, as I publish it (its
 * backup registered, remote access granted): 1 with out filled; 0 if none;
 * -1 if one is registered and not shadowed yet (its replay pending: ask
 * again). What q's peer asks through its key mailbox (shadow/mbox.c; RNIC
 * thread). */
int shift_shadow_own_mr(struct shift_rnic *r, const struct shift_qp *q, uint32_t app_rkey,
			struct shift_mr_value *out);
#endif /* SHIFT_SHADOW_H */
