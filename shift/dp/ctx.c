/*
 * The data path's registry (see ctx.h): the context table, the QP lookup
 * tables, the upcalls into the layers above, statistics.
 */
#include "shift/dp/ctx.h"

#include <pthread.h>
#include <stddef.h>

struct shift_ctx *shift_ctx_tab[SHIFT_MAX_CTX];
struct shift_stats shift_stats;

/* Guards writers of shift_ctx_tab and the QP tables; readers are lock-free. */
pthread_mutex_t shift_ctx_lock = PTHREAD_MUTEX_INITIALIZER;

struct shift_dqp shift_dqp_none = { .qpn = UINT32_MAX }; /* QPNs have 24 bits */
struct shift_dqp *shift_dqp_tab[SHIFT_DQP_TAB] = {
	[0 ... SHIFT_DQP_TAB - 1] = &shift_dqp_none,
};

struct shift_dp_upcalls shift_dp_up;

void shift_dp_set_upcalls(const struct shift_dp_upcalls *up)
{
	shift_dp_up = *up;
}
