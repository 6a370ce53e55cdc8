/*
 * Workload drivers for the fault campaign: application traffic written
 * against the verbs API only (a `const struct shift_lower *` "app verbs"
 * table per host plus the inline data-path functions of verbs.h), so the
 * same driver runs directly on the simulated RNIC (pass-through) or on
 * SHIFT stacked over it.
 *
 * A workload is nconn RC connections between host A and host B (one QP on
 * each side, one shared CQ per side), carrying traffic in both directions
 * at once. The driver checks, as it consumes, the invariants of the
 * failover issue and counts app-visible errors separately from integrity
 * violations (see struct wl_report).
 */
#ifndef SHIFT_SIM_WORKLOAD_H
#define SHIFT_SIM_WORKLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "shift/base/lower.h"

struct sim_world;

enum wl_kind {
	WL_NCCL,	/* unsignaled writes + signaled write-with-imm, CTS */
	WL_SENDRECV,	/* two-sided sends with credits */
	WL_READ,	/* RDMA reads of a static remote pattern */
	WL_MIX,		/* NCCL + reads + fetch-add + compare-swap */
	WL_NKINDS
};

const char *wl_kind_name(enum wl_kind k);
int wl_kind_parse(const char *s, enum wl_kind *k); /* 0 or -1 */

struct wl_params {
	enum wl_kind kind;
	unsigned nconn;		/* connections (QP pairs), 1..4 */
	unsigned msgs;		/* messages per direction per connection */
	/* SHIFT mode: an app-visible error on idempotent traffic (no atomic
	 * in flight on that QP) or an unfinished connection is a violation. */
	bool strict;
	/* each QP completes its receives on a CQ of their own (one per side)
	 * instead of sharing the side's CQ with its sends */
	bool split_cq;
	/* the extended verbs: CQs from ibv_create_cq_ex polled with
	 * ibv_start_poll / next_poll / end_poll and ibv_wc_read_*, QPs from
	 * ibv_create_qp_ex posted with ibv_wr_* */
	bool ex_verbs;
	/* each side's QPs share one SRQ (receives of every connection come
	 * from it; sendrecv's land in a buffer of the side's) */
	bool srq;
	/* connection 0's side 0 posts one RDMA WRITE with a bad rkey (an
	 * error of the application's own) a third of the way in: it must see
	 * the remote access error on that WR, every later WR of both ends of
	 * that connection flushed, both QPs in ERR, exactly as without SHIFT */
	bool poison;
	/* every one-SGE send WR (not inline, not atomic) posted as 3 SGEs over
	 * the same bytes, every sendrecv receive as 2 */
	bool split_sge;
	/* the KV store fails too (the campaign's --kv-faults): a connection
	 * whose failover could not get what it needs from the store may fail
	 * for the application as plain's would (counted in kv_lost, not a
	 * violation); a stall, lost or corrupt data, a completion out of order
	 * still are */
	bool kv_faults;
	/* around the workload's own calls into the world (its trace notes),
	 * when other threads call into it too; NULL: none */
	void (*enter)(void), (*leave)(void);
};

struct wl_report {
	uint64_t msgs;		/* notifications consumed by receivers */
	uint64_t bytes;		/* bytes verified by receivers */
	uint64_t app_errors;	/* completions in error + failed posts */
	uint64_t conns_failed;	/* connections that saw an app error */
	uint64_t atomics_ok, atomics_err;
	uint64_t violations;	/* integrity violations (always a bug) */
	uint64_t unfinished;	/* healthy connections that did not finish */
	/* wl_params.poison: the requester saw its remote access error, or
	 * lost it to a path failure (a flush: its NIC failed before the
	 * refusal came back; the path's error: the WR was outstanding at a
	 * failover, which cannot carry a key the peer never published) */
	uint64_t poison_seen, poison_lost;
	/* wl_params.kv_faults: connections that failed for the application
	 * (an error on idempotent traffic, no atomic in flight) */
	uint64_t kv_lost;
	char first[200];	/* the first violation, for the log */
};

struct wl;

/* Opens the devices through the two tables, creates and connects the
 * QPs. Returns NULL (errno set) on a setup failure. */
struct wl *wl_create(struct sim_world *w, const struct wl_params *p,
		     const struct shift_lower *va, const char *deva,
		     const struct shift_lower *vb, const char *devb,
		     uint64_t seed);
/* One application action: poll a side's CQ and post what the traffic
 * allows. Returns true if anything happened. */
bool wl_step(struct wl *wl);
/* Every connection finished or failed, every expected completion seen. */
bool wl_done(const struct wl *wl);
/* Final checks (atomic accounting, liveness) and the report. Call once the
 * world is idle and wl_step() makes no progress. */
void wl_finish(struct wl *wl, struct wl_report *r);
void wl_destroy(struct wl *wl);

#endif /* SHIFT_SIM_WORKLOAD_H */
