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

/* The app verbs of host h, or NULL with *why set. */
const struct shift_lower *campaign_front(struct sim_host *h, bool shift,
					 const char **why);
/* Let SHIFT's per-RNIC work (shadow replay) run once; SHIFT mode only. */
void campaign_front_progress(bool shift);
/* SHIFT waits for a peer's part of a failover (a few more passes finish it) */
bool campaign_front_waiting(bool shift);
/* Called once per host after the schedule's objects are destroyed and
 * before the world is. */
void campaign_front_done(struct sim_host *h, bool shift);
/* Changes of a QP's data-path state that its state machine does not allow
 * (shift/dp/state.h), process-wide: must stay 0. */
unsigned long campaign_front_illegal_transitions(bool shift);

#endif /* SHIFT_SIM_FRONT_H */
