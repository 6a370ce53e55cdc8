/*
 * The hook between the campaign and the verbs stack the application sees.
 * Pass-through: the simulated host's own lower table. SHIFT mode: SHIFT's
 * application-facing table stacked over the simulated host (wired by the
 * SHIFT core, see front.c).
 */
#ifndef SHIFT_SIM_FRONT_H
#define SHIFT_SIM_FRONT_H

#include <stdbool.h>

#include "sim.h"

/*
 * Threads mode (--threads; before the first campaign_front): SHIFT runs its
 * real per-RNIC threads on the real clock over the simulator made
 * thread-safe (tests/sim/fixture/sim_locked.h: one process-wide lock around
 * every call into it), as a program linked to SHIFT does. Schedules are then
 * not deterministic. The campaign takes the same lock around its own calls
 * into the world (campaign_front_enter/leave).
 */
void campaign_front_threads(bool on);
void campaign_front_enter(void);
void campaign_front_leave(void);
/* Let SHIFT shadow the schedule's QPs (at least nqps of them ready in
 * threads mode, within 5 s) before the first fault. */
void campaign_front_settle(bool shift, unsigned nqps);
/* Has the schedule come to rest? Called after each round of the
 * campaign's loop with what moved in it (app: the workload; moved: the
 * workload or the network). Inline: a few rounds in a row where nothing
 * moved, more while SHIFT waits for a peer's part of a failover (a KV
 * record, a handshake message). Threads mode: the workload still for
 * 300 ms of real time with no failover waiting in them (the network may
 * still carry SHIFT's probes of a dead path), 1.5 s while the workload
 * is not done (wl_done(): done), or 60 s in all. */
bool campaign_front_at_rest(bool shift, bool moved, bool app, bool done);

/* The app verbs of host h, or NULL with *why set. */
const struct shift_lower *campaign_front(struct sim_host *h, bool shift,
					 const char **why);
/* Let SHIFT's per-RNIC work (shadow replay) run once; SHIFT mode only
 * (threads mode: the threads run on their own; idle, the caller sleeps
 * 1 ms for them). */
void campaign_front_progress(bool shift, bool idle);
/* A fault just hit the world: SHIFT sees it before the network moves on
 * (inline: a pass; threads mode: 50 ms for the threads, which take in the
 * device's async events, against microseconds of simulated outage). */
void campaign_front_fault(bool shift);
/* Called once per host after the schedule's objects are destroyed and
 * before the world is. */
void campaign_front_done(struct sim_host *h, bool shift);
/* Changes of a QP's data-path state that its state machine does not allow
 * (shift/dp/state.h), process-wide: must stay 0. */
unsigned long campaign_front_illegal_transitions(bool shift);
/* WRs SHIFT read back from the provider's queues (native work-queue
 * access), and those it could not (*unreadable) */
unsigned long campaign_front_read_back(unsigned long *unreadable);

#endif /* SHIFT_SIM_FRONT_H */
