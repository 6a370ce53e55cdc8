/*
 * The wait's looks (backoff.h).
 */
#include "shift/base/backoff.h"
#include "shift/base/cpu.h"

#include <sched.h>
#include <time.h>

static __thread unsigned yielded, slept;

void shift_backoff_counts(unsigned *yields, unsigned *sleeps)
{
	*yields = yielded;
	*sleeps = slept;
}

void shift_backoff(unsigned *looks)
{
	unsigned n = (*looks)++;

	if (n < SHIFT_BACKOFF_SPINS) {
		shift_cpu_relax();
	} else if (n < SHIFT_BACKOFF_SPINS + SHIFT_BACKOFF_YIELDS) {
		yielded++;
		sched_yield();
	} else {
		/* 20, 40, 80, 160 us, then 200 us a look: each wake takes the
		 * CPU from the thread waited for, a late one delays the waiter */
		unsigned k = n - SHIFT_BACKOFF_SPINS - SHIFT_BACKOFF_YIELDS;
		long us = k < 4 ? (long)SHIFT_BACKOFF_SLEEP_US << k : SHIFT_BACKOFF_SLEEP_MAX_US;
		struct timespec ts = { .tv_sec = 0, .tv_nsec = us * 1000L };

		if (k >= 4)
			*looks = n; /* (no wrap) */
		slept++;
		nanosleep(&ts, NULL);
	}
}
