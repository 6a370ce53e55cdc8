/*
 * The clock SHIFT reads (see clock.h): the system's unless a driver
 * installed its own.
 */
#include "shift/base/clock.h"

#include <stddef.h>
#include <sys/resource.h>
#include <time.h>

static uint64_t sys_mono_us(void *arg)
{
	struct timespec ts;

	(void)arg;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t sys_wall_s(void *arg)
{
	(void)arg;
	return (uint64_t)time(NULL);
}

static const struct shift_clock sys_clock = { .mono_us = sys_mono_us, .wall_s = sys_wall_s };
static const struct shift_clock *clk = &sys_clock;

void shift_clock_set(const struct shift_clock *c)
{
	__atomic_store_n(&clk, c ? c : &sys_clock, __ATOMIC_RELEASE);
}

static const struct shift_clock *cur(void)
{
	return __atomic_load_n(&clk, __ATOMIC_ACQUIRE);
}

uint64_t shift_clock_us(void)
{
	const struct shift_clock *c = cur();

	return c->mono_us(c->arg);
}

uint64_t shift_clock_ms(void)
{
	return shift_clock_us() / 1000u;
}

uint64_t shift_clock_wall_s(void)
{
	const struct shift_clock *c = cur();

	return c->wall_s(c->arg);
}

void shift_clock_tick(void)
{
	const struct shift_clock *c = cur();

	if (c->tick)
		c->tick(c->arg);
}

void shift_clock_thread(uint64_t *cpu_us, uint32_t *preempted)
{
	struct rusage ru;

	if (getrusage(RUSAGE_THREAD, &ru)) {
		*cpu_us = 0;
		*preempted = 0;
		return;
	}
	*cpu_us = (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000u +
		  (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
	*preempted = (uint32_t)ru.ru_nivcsw;
}
