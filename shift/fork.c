/*
 * fork() with SHIFT in the process: handlers installed once, with the
 * first context SHIFT opens (nothing needs them before).
 *
 * Before the fork, each layer holds its registries still, and the RNIC
 * threads are held outside their passes (shadow/rnic.c): the child then
 * inherits no lock a thread of SHIFT's held, neither SHIFT's own nor one of
 * the real library's or the provider's that a pass was using, and no
 * registry half changed. The wait is the end of the current pass, if one
 * runs (a pass waits for at most its KV commands' deadlines).
 *
 * The child has none of SHIFT's threads, and the contexts it inherited are
 * its parent's, whose backup objects, KV keys and status files SHIFT must
 * not touch from the child. So the child drops them: they run as plain
 * contexts there (provider's ops and slots back, no shadowing, channels
 * with their own fds), exactly what the plain library gives a child that
 * uses its parent's objects. What the child opens itself after the fork is
 * shadowed as in any process. The order of the layers is the lock order:
 * shadow (RNICs, then each thread's pass), dp, channels, providers.
 */
#include "shift/shift.h"
#include "shift/dp/cqex.h"
#include "shift/dp/qpex.h"
#include "shift/shadow/chan.h"
#include "shift/shadow/shadow.h"
#include "providers/provider.h"

#include <pthread.h>

static void prepare(void)
{
	shift_shadow_fork_prepare();
	shift_dp_fork_prepare();
	shift_chan_fork_prepare();
	shift_provider_fork_prepare();
}

static void parent(void)
{
	shift_provider_fork_done();
	shift_chan_fork_parent();
	shift_dp_fork_parent();
	shift_shadow_fork_parent();
}

/* A context the child inherited: its provider's slots, and its extended
 * QPs' and CQs' functions, back (as close_device does). */
static void child_drops(struct shift_ctx *s)
{
	shift_vctx_give_back(s);
	shift_qpx_detach_ctx(s);
	shift_cqx_detach_ctx(s);
}

static void child(void)
{
	shift_provider_fork_done();
	shift_chan_fork_child();
	shift_dp_fork_child(child_drops);
	shift_shadow_fork_child();
}

void shift_fork_install(void)
{
	if (pthread_atfork(prepare, parent, child))
		shift_warn("cannot install the fork() handlers: a child process that uses "
			   "verbs after fork() may hang");
}
