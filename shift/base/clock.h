/*
 * Time, as SHIFT reads it: one interface, replaced as a whole.
 *
 * In production it is the system's: CLOCK_MONOTONIC for every interval
 * SHIFT measures (probe periods, graces, the episode bound, switch times)
 * and the wall clock for what `shiftctl status` shows. A program that runs
 * SHIFT's background passes itself (shift_config.inline_passes: the
 * simulator's fault campaign, the unit tests) installs a logical clock that
 * advances when a pass says so (tick), so that a schedule replays exactly
 * from its seed.
 *
 * The per-RNIC threads' own sleeps (pthread_cond_timedwait) are real waits
 * and stay on the system clock; they exist only without inline passes.
 */
#ifndef SHIFT_BASE_CLOCK_H
#define SHIFT_BASE_CLOCK_H

#include <stdint.h>

struct shift_clock {
	uint64_t (*mono_us)(void *arg); /* monotonic time, microseconds */
	uint64_t (*wall_s)(void *arg);  /* seconds since the epoch */
	/* a background pass reached its failback stage (NULL: ignored) */
	void (*tick)(void *arg);
	void *arg;
};

/* Install c (NULL: the system's). Before any verb, like shift_lower_set(). */
void shift_clock_set(const struct shift_clock *c);

uint64_t shift_clock_us(void);
uint64_t shift_clock_ms(void);
uint64_t shift_clock_wall_s(void);
void shift_clock_tick(void);

/* The calling thread's CPU time so far (user and system, microseconds)
 * and how often the kernel took the CPU from it (involuntary context
 * switches), by getrusage(RUSAGE_THREAD): how much of an interval the
 * thread spent running. Always the system's, whatever clock is installed;
 * zeros where the system cannot tell. */
void shift_clock_thread(uint64_t *cpu_us, uint32_t *preempted);

#endif /* SHIFT_BASE_CLOCK_H */
