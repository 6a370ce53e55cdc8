/*
 * The simulated RNIC: a deterministic, single-threaded, fault-injecting
 * backend for the lower-verbs table (shift/lower.h).
 *
 * A world holds hosts, a host holds devices (one port each), and the world
 * owns "network time". Nothing moves on the wire unless sim_world_step() (or
 * one of the run helpers) is called: posting a WR only queues it. Each step
 * picks one enabled event (transmit the next WQE of a QP, deliver the packet
 * at the head of a QP's wire queue, fire a retransmit or RNR timer) with a
 * PRNG seeded from the world seed, so the same seed and the same sequence of
 * verbs calls produce the same trace; its FNV-1a hash is sim_world_hash().
 *
 * Objects handed out are real verbs objects: contexts are embedded in a
 * struct verbs_context, and QPs, CQs, PDs and MRs are struct ibv_qp, ibv_cq,
 * ibv_pd and ibv_mr, so the inline functions of <infiniband/verbs.h>
 * (ibv_post_send, ibv_poll_cq, ibv_req_notify_cq, ibv_post_recv,
 * ibv_create_qp_ex, ibv_create_cq_ex, ...) work on them unchanged, also
 * after a layer above swaps ctx->ops. See docs/sim.md for the model.
 */
#ifndef SHIFT_SIM_H
#define SHIFT_SIM_H

#include <stdint.h>
#include <stdio.h>

#include "shift/base/lower.h"

#define SIM_MAX_HOSTS 16	/* per process, across worlds */
#define SIM_MAX_DEVS_PER_HOST 8
#define SIM_MAX_DEVS 64	/* per world */

struct sim_world;
struct sim_host;
struct sim_dev;

struct sim_world_opts {
	uint64_t seed;
	/* Random loss of request / response packets, in parts per million
	 * of deliveries. RC retransmission recovers from them unless they
	 * exhaust the retry budget. */
	uint32_t drop_req_ppm;
	uint32_t drop_resp_ppm;
	/* Network ticks per unit of the QP attributes timeout and
	 * min_rnr_timer (0: defaults, see docs/sim.md). */
	uint32_t timeout_ticks;
	uint32_t rnr_ticks;
	/* Checker self-test only: responders execute duplicate requests again
	 * instead of re-ACKing them, as a NIC that lost its state would (what
	 * naive retransmission on another NIC does). Breaks exactly-once. */
	int reexecute_duplicates;
	/* soft-RoCE's stale read-response state: a QP that goes to ERR with
	 * an RDMA READ outstanding keeps its completer "inside a read
	 * response" across a reset; until a read response arrives, the first
	 * ACK (or NAK, atomic response) it gets completes the head WQE with
	 * success and moves the QP to ERR, the rest flushed (rxe_comp.c
	 * check_ack / COMPST_ERROR, and rxe_qp_reset not clearing comp.opcode).
	 * Conservative: every outstanding READ counts, not only one whose
	 * first response packet arrived. */
	int rxe_stale_read;
	/* Providers that refuse posts on a QP in ERR (EINVAL) instead of
	 * taking and flushing them as rxe and mlx5 do. */
	int refuse_posts_in_err;
	/* What query_device reports as vendor id and part (both 0: the
	 * simulator's own), so SHIFT takes the devices for another provider's
	 * (rxe: 0xffffff, 0) and applies its quirks. */
	uint32_t vendor_id, vendor_part_id;
	/* mlx5 mode (rnic/mlx5img.c): the devices report Mellanox's vendor
	 * id and keep each QP's queues in the mlx5 WQE format too, described
	 * by an mlx5dv_init_obj of their own (the lower table's) */
	int mlx5;
};

/* Statistics of a world, for summaries. */
struct sim_stats {
	uint64_t steps;
	uint64_t tx, retx, delivered, dropped, executed, dup_requests;
	uint64_t timeouts, rnr_naks, seq_naks, err_completions;
	uint64_t faults;
	uint64_t ud_delivered, ud_lost; /* datagrams of UD QPs (rnic/ud.c) */
};

/* --- world, hosts, devices -------------------------------------------- */

/* A new world; opts may be NULL (seed 0, no random loss). */
struct sim_world *sim_world_create(const struct sim_world_opts *opts);
/* Turns the rxe_stale_read quirk (sim_world_opts) on or off. */
void sim_world_set_rxe_stale_read(struct sim_world *w, int on);
/* Turns refuse_posts_in_err (sim_world_opts) on or off. */
void sim_world_set_refuse_posts_in_err(struct sim_world *w, int on);
/* Sets the vendor id and part the devices report (sim_world_opts). */
void sim_world_set_vendor(struct sim_world *w, uint32_t id, uint32_t part);
/* Turns the mlx5 mode (sim_world_opts) on or off: for QPs created after. */
void sim_world_set_mlx5(struct sim_world *w, int on);
/* Frees every object the world still holds (contexts, QPs, ...). */
void sim_world_destroy(struct sim_world *w);

/* A host with ndev devices named sim<host>_<dev>, port 1 ACTIVE, GID
 * index 1 = ::ffff:10.<host>.<dev>.1 (RoCE v2), index 0 link-local. */
struct sim_host *sim_host_create(struct sim_world *w, unsigned ndev);
struct sim_dev *sim_host_dev(struct sim_host *h, unsigned i);
unsigned sim_host_index(const struct sim_host *h);
struct sim_world *sim_host_world(const struct sim_host *h);

/* The lower-verbs table of one host: get_device_list lists that host's
 * devices only; every other slot dispatches through the object. */
const struct shift_lower *sim_lower(struct sim_host *h);

/* The same table, but get_device_list lists every device of the world
 * (sim0_0, sim0_1, sim1_0, ...): for a single SHIFT instance serving all
 * simulated hosts of the process. One world at a time. */
const struct shift_lower *sim_lower_world(struct sim_world *w);

/* From a context opened on the sim (also one SHIFT wrapped: the context
 * object itself is the sim's). */
struct sim_dev *sim_dev_of_context(struct ibv_context *ctx);
struct sim_host *sim_dev_host(const struct sim_dev *d);
unsigned sim_dev_index(const struct sim_dev *d);	/* in its host */
struct ibv_device *sim_dev_ibv(struct sim_dev *d);
const char *sim_dev_name(const struct sim_dev *d);

/* --- stepping --------------------------------------------------------- */

/* Runs one event. Returns 1 if something happened, 0 if the world is idle
 * (nothing enabled now and no timer or scheduled fault in the future). */
int sim_world_step(struct sim_world *w);
/* Steps until idle or max_steps; returns the number of steps taken. */
uint64_t sim_world_run(struct sim_world *w, uint64_t max_steps);
static inline uint64_t sim_world_run_until_idle(struct sim_world *w)
{
	return sim_world_run(w, UINT64_MAX);
}
uint64_t sim_world_now(const struct sim_world *w);
/* The world's seeded PRNG (also for drivers that want one stream). */
uint64_t sim_world_rand(struct sim_world *w);

/* --- trace ------------------------------------------------------------ */

uint64_t sim_world_hash(const struct sim_world *w);
const struct sim_stats *sim_world_stats(const struct sim_world *w);
/* Print each event to f (NULL: stop). */
void sim_world_set_trace(struct sim_world *w, FILE *f);
/* Mix an application-level record into the trace hash. */
void sim_world_note(struct sim_world *w, uint32_t tag, uint64_t a, uint64_t b);

/* --- faults ------------------------------------------------------------ */

/* NIC death: port DOWN (IBV_EVENT_PORT_ERR); every packet from or to the
 * device is lost, so its peers time out. fatal also raises
 * IBV_EVENT_DEVICE_FATAL and moves every QP of the device to ERR, flushing
 * its queues. */
void sim_dev_kill(struct sim_dev *d, int fatal);
/* Port ACTIVE again (IBV_EVENT_PORT_ACTIVE), fatal state cleared. QPs moved
 * to ERR stay there until the application resets them. */
void sim_dev_revive(struct sim_dev *d);
/* The device executes its next n incoming requests, then dies (not fatal)
 * before the ACK of the n-th leaves it. */
void sim_dev_kill_after_exec(struct sim_dev *d, unsigned n);
int sim_dev_alive(const struct sim_dev *d);

/* Cut / restore the link between two devices (both directions). */
void sim_link_cut(struct sim_dev *a, struct sim_dev *b);
void sim_link_restore(struct sim_dev *a, struct sim_dev *b);

/* Drop the next n request (resp = 0) or response (resp = 1: ACK, NAK,
 * read or atomic response) packets a QP sends. */
void sim_qp_drop_next(struct ibv_qp *qp, int resp, unsigned n);
/* QP to ERR with IBV_EVENT_QP_FATAL, queues flushed. */
void sim_qp_inject_fatal(struct ibv_qp *qp);

/* Scheduled faults, applied when network time reaches at. */
enum sim_fault_kind {
	SIM_FAULT_KILL,		/* a, fatal = arg */
	SIM_FAULT_REVIVE,	/* a */
	SIM_FAULT_CUT,		/* a, b */
	SIM_FAULT_RESTORE,	/* a, b */
	SIM_FAULT_KILL_AFTER_EXEC, /* a, n = arg */
};
int sim_world_schedule_fault(struct sim_world *w, uint64_t at,
			     enum sim_fault_kind kind, struct sim_dev *a,
			     struct sim_dev *b, unsigned arg);

/* Ticks a QP waits for an ACK before retrying, from its attributes. */
uint64_t sim_qp_timeout_ticks(struct ibv_qp *qp);
/* Completion events get_cq_event has returned for a sim CQ (what the
 * kernel reports to rdma-core's destroy_cq; destroy_cq fails with EDEADLK
 * unless comp_events_completed equals it). */
unsigned sim_cq_events_reported(struct ibv_cq *cq);

#endif /* SHIFT_SIM_H */
