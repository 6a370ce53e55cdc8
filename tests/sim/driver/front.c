/*
 * The campaign's verbs stack (see front.h). Pass-through hands the
 * application the simulated host's table directly. SHIFT mode stacks
 * SHIFT's application-facing table (shift_verbs) over the simulated world:
 * SHIFT's lower is sim_lower_world(w), its KV store an in-memory one, and
 * its per-RNIC replay runs inline with a logical clock (tests/sim/fixture/shift_inline.h), driven by
 * campaign_front_progress() from the campaign's event loop, so a schedule
 * stays deterministic.
 */
#include "front.h"

#include <stdio.h>
#include <stdlib.h>

#include "kv/kv.h"
#include "shift/base/config.h"
#include "shift_inline.h"
#include "shift/fo/failover.h"
#include "shift/shadow/shadow.h"
#include "shift/shift.h"
#include "shift/dp/state.h"

const struct shift_lower *campaign_front(struct sim_host *h, bool shift,
					 const char **why)
{
	if (!shift)
		return sim_lower(h);
	if (sim_host_index(h) == 0) {
		/* once per schedule: both hosts share the process-wide SHIFT */
		shift_lower_set(sim_lower_world(sim_host_world(h)));
		setenv("SHIFT_KV_URL", "mem://campaign", 1);
		setenv("SHIFT_KV_NAMESPACE", "campaign", 1);
		setenv("SHIFT_STATUS_DIR", "", 1);
		setenv("SHIFT_BACKUP", "", 1);
		shift_inline_load();
		shift_inline_clock_reset();
		shift_kv_mem_clear("campaign");
	}
	(void)why;
	return &shift_verbs;
}

void campaign_front_progress(bool shift)
{
	if (shift)
		shift_rnic_pass_all();
}

bool campaign_front_waiting(bool shift)
{
	return shift && shift_failover_waiting();
}

unsigned long campaign_front_illegal_transitions(bool shift)
{
	return shift ? shift_dqp_illegal_transitions() : 0;
}

void campaign_front_done(struct sim_host *h, bool shift)
{
	(void)h;
	(void)shift;
}
