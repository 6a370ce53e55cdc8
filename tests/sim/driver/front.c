/*
 * The campaign's verbs stack (see front.h). Pass-through hands the
 * application the simulated host's table directly. SHIFT mode stacks
 * SHIFT's application-facing table (shift_verbs) over the simulated world:
 * SHIFT's lower is sim_lower_world(w), its KV store an in-memory one, and
 * its per-RNIC replay runs inline with a logical clock
 * (tests/sim/fixture/shift_inline.h), driven by campaign_front_progress()
 * from the campaign's event loop, so a schedule stays deterministic.
 * Threads mode (front.h) runs SHIFT's real threads instead.
 */
#include "front.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv.h"
#include "shift/base/clock.h"
#include "shift/base/config.h"
#include "shift_inline.h"
#include "shift/fo/failover.h"
#include "shift/shadow/shadow.h"
#include "shift/shift.h"
#include "shift/dp/ctx.h"
#include "shift/dp/state.h"
#include "sim_locked.h"

static bool threads;

void campaign_front_threads(bool on)
{
	threads = on;
}

void campaign_front_enter(void)
{
	if (threads)
		sim_locked_enter();
}

void campaign_front_leave(void)
{
	if (threads)
		sim_locked_leave();
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* SHIFT's timing for threads mode, where the environment does not set it:
 * periods short enough that a schedule (a few ms of network) ends within
 * a second or so, the failover wait (SHIFT_FAILOVER_MS) long enough for
 * the slowest side under TSan. */
static void threads_env(void)
{
	static const char *const knobs[][2] = {
		{ "SHIFT_PROBE_MS", "20" }, { "SHIFT_PORT_DOWN_MS", "30" },
		{ "SHIFT_POKE_MS", "50" }, { "SHIFT_IDLE_MS", "50" },
		{ "SHIFT_FAILOVER_MS", "3000" }, { "SHIFT_KV_WAIT_MS", "1000" },
	};

	for (size_t i = 0; i < sizeof(knobs) / sizeof(knobs[0]); i++)
		setenv(knobs[i][0], knobs[i][1], 0);
}

const struct shift_lower *campaign_front(struct sim_host *h, bool shift,
					 const char **why)
{
	if (!shift)
		return sim_lower(h);
	if (sim_host_index(h) == 0) {
		/* once per schedule: both hosts share the process-wide SHIFT */
		setenv("SHIFT_KV_URL", "mem://campaign", 1);
		setenv("SHIFT_KV_NAMESPACE", "campaign", 1);
		setenv("SHIFT_STATUS_DIR", "", 1);
		setenv("SHIFT_BACKUP", "", 1);
		if (threads) {
			shift_lower_set(sim_locked_lower(sim_host_world(h)));
			threads_env();
			if (shift_config_load(NULL)) {
				*why = "a SHIFT_* variable has a bad value";
				return NULL;
			}
			shift_clock_set(NULL);
		} else {
			shift_lower_set(sim_lower_world(sim_host_world(h)));
			shift_inline_load();
			shift_inline_clock_reset();
		}
		/* (a schedule of --kv-faults may have left it down) */
		shift_kv_mem_set_down("campaign", false);
		shift_kv_mem_clear("campaign");
	}
	return &shift_verbs;
}

void campaign_front_progress(bool shift, bool idle)
{
	if (shift && !threads)
		shift_rnic_pass_all();
	else if (shift && idle)
		sleep_ms(1);
}

void campaign_front_fault(bool shift)
{
	if (shift && !threads)
		shift_rnic_pass_all();
	else if (shift)
		sleep_ms(50);
}

/* the schedule's rest tracking (reset by campaign_front_settle) */
static struct {
	unsigned idle;
	bool waiting;
	uint64_t start, app, wait;
} rest;

void campaign_front_settle(bool shift, unsigned nqps)
{
	struct shift_shadow_stats st;

	memset(&rest, 0, sizeof(rest));
	rest.start = rest.app = rest.wait = shift_clock_ms();
	if (!shift)
		return;
	if (!threads) {
		for (int i = 0; i < 8; i++)
			shift_rnic_pass_all();
		return;
	}
	for (unsigned ms = 0; ms < 5000; ms++) {
		shift_shadow_stats_get(&st);
		if (st.qps_ready >= nqps)
			return;
		sleep_ms(1);
	}
	fprintf(stderr, "shift-campaign: %lu of %u QPs shadowed after 5 s\n", st.qps_ready, nqps);
}

/* Threads mode: how long the real clock may pass with nothing moving
 * before a schedule is at rest. An unfinished workload gets longer: under
 * TSan every thread runs 5-15x slower, and with two such tests on two
 * CPUs a background pass can come 300 ms after the last one: seed 2 of
 * the nccl campaign with backup faults was then called stalled in 4 runs
 * of 12 (three at once), and finished in 24 of 24 given 1.5 s. */
#define REST_DONE_MS 300u
#define REST_UNFINISHED_MS 1500u

bool campaign_front_at_rest(bool shift, bool moved, bool app, bool done)
{
	if (!threads || !shift) {
		rest.idle = moved ? 0 : rest.idle + 1;
		if (!moved && shift)
			rest.waiting = shift_failover_waiting();
		return rest.idle >= (rest.waiting ? 256u : 4u);
	}
	uint64_t now = shift_clock_ms();

	if (app)
		rest.app = now;
	if (shift_failover_waiting())
		rest.wait = now;
	uint64_t quiet = done ? REST_DONE_MS : REST_UNFINISHED_MS;

	return (now - rest.app >= quiet && now - rest.wait >= quiet) || now - rest.start >= 60000;
}

unsigned long campaign_front_illegal_transitions(bool shift)
{
	return shift ? shift_dqp_illegal_transitions() : 0;
}

unsigned long campaign_front_read_back(unsigned long *unreadable)
{
	*unreadable = __atomic_load_n(&shift_stats.wqes_unreadable, __ATOMIC_RELAXED);
	return __atomic_load_n(&shift_stats.wqes_read_back, __ATOMIC_RELAXED);
}

void campaign_front_done(struct sim_host *h, bool shift)
{
	(void)h;
	(void)shift;
}
