/*
 * Deferred frees (see limbo.h): a list, oldest first, under one lock held
 * only to link and unlink (the frees run outside it).
 */
#include "shift/dp/limbo.h"
#include "shift/base/clock.h"
#include "shift/base/config.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

struct limbo {
	struct limbo *next;
	void *p;
	void (*fn)(void *p);
	uint64_t since_ms;
};

static pthread_mutex_t limbo_lock = PTHREAD_MUTEX_INITIALIZER;
static struct limbo *head, **tail = &head;
static unsigned long waiting, leaked;

/* Unlink the entries that have waited the grace (limbo_lock held). */
static struct limbo *take_due(uint64_t now)
{
	struct limbo *due = NULL, **end = &due;

	/* (a logical clock that was reset runs "backwards": due at once) */
	while (head && now - head->since_ms >= shift_config.free_grace_ms) {
		struct limbo *l = head;

		head = l->next;
		l->next = NULL;
		*end = l;
		end = &l->next;
	}
	if (!head)
		tail = &head;
	return due;
}

void shift_limbo_reclaim(void)
{
	uint64_t now = shift_clock_ms();

	pthread_mutex_lock(&limbo_lock);
	struct limbo *l = take_due(now);
	pthread_mutex_unlock(&limbo_lock);
	while (l) {
		struct limbo *n = l->next;

		l->fn(l->p);
		free(l);
		__atomic_fetch_sub(&waiting, 1, __ATOMIC_RELAXED);
		l = n;
	}
}

void shift_limbo_put(void *p, void (*fn)(void *p))
{
	struct limbo *l;

	if (!p)
		return;
	shift_limbo_reclaim(); /* (only the entries before this one) */
	l = malloc(sizeof(*l));
	if (!l) {
		__atomic_fetch_add(&leaked, 1, __ATOMIC_RELAXED);
		return;
	}
	l->next = NULL;
	l->p = p;
	l->fn = fn;
	l->since_ms = shift_clock_ms();
	__atomic_fetch_add(&waiting, 1, __ATOMIC_RELAXED);
	pthread_mutex_lock(&limbo_lock);
	*tail = l;
	tail = &l->next;
	pthread_mutex_unlock(&limbo_lock);
}

unsigned long shift_limbo_waiting(void)
{
	return __atomic_load_n(&waiting, __ATOMIC_RELAXED);
}

unsigned long shift_limbo_leaked(void)
{
	return __atomic_load_n(&leaked, __ATOMIC_RELAXED);
}

void shift_limbo_fork_prepare(void)
{
	pthread_mutex_lock(&limbo_lock);
}

void shift_limbo_fork_done(void)
{
	pthread_mutex_unlock(&limbo_lock);
}
