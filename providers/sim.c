/*
 * The project's simulated RNIC (tests/sim/rnic): the unit tests' and the
 * fault campaigns' device. It has no quirk SHIFT works around (it models
 * rxe's stale read-response state only when a campaign asks for it, and
 * SHIFT handles that for every provider). Work queues: mirrored.
 */
#include "providers/provider.h"

/* what the simulated devices report (tests/sim/rnic/ctl.c) */
#define SIM_VENDOR_ID 0x5348
#define SIM_VENDOR_PART_ID 1

static bool sim_match(const struct ibv_device_attr *attr)
{
	return attr->vendor_id == SIM_VENDOR_ID && attr->vendor_part_id == SIM_VENDOR_PART_ID;
}

const struct shift_provider shift_provider_sim = {
	.name = "sim",
	.match = sim_match,
	.wq = SHIFT_WQ_MIRROR,
};
