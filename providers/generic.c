/*
 * Any device no other table claims: no quirk, the mirror.
 */
#include "providers/provider.h"

static bool generic_match(const struct ibv_device_attr *attr)
{
	(void)attr;
	return true;
}

const struct shift_provider shift_provider_generic = {
	.name = "generic",
	.match = generic_match,
	.wq = SHIFT_WQ_MIRROR,
};
