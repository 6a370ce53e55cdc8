/*
 * The campaign's verbs stack (see front.h). Pass-through hands the
 * application the simulated host's table directly.
 *
 * SHIFT mode is the hook for the SHIFT core: return a table whose slots
 * are SHIFT's application-facing verbs, with SHIFT's lower set to
 * sim_lower(h) (every slot of the per-host tables is the same except
 * get_device_list, which lists that host's devices: sim<h>_0 is the
 * default NIC the workload opens, sim<h>_1 the backup). Until that is
 * wired, --shift is refused with the message below.
 */
#include "front.h"

const struct shift_lower *campaign_front(struct sim_host *h, bool shift,
					 const char **why)
{
	if (!shift)
		return sim_lower(h);
	*why = "SHIFT is not wired into the campaign yet: fill campaign_front() "
	       "in tests/sim/driver/front.c with SHIFT's app-facing table";
	return NULL;
}

void campaign_front_done(struct sim_host *h, bool shift)
{
	(void)h;
	(void)shift;
}
