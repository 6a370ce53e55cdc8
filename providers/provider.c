/*
 * Finding a device's provider table (see provider.h): by its device
 * attributes, once per context.
 */
#include "providers/provider.h"
#include "shift/base/config.h"
#include "shift/base/log.h"
#include "shift/base/lower.h"

#include <pthread.h>
#include <string.h>

static const struct shift_provider *const providers[] = {
	&shift_provider_rxe,
	&shift_provider_mlx5,
	&shift_provider_sim,
	&shift_provider_generic, /* last: takes everything */
};

#define CACHE 64

static struct {
	struct ibv_context *ctx;
	const struct shift_provider *p;
} cache[CACHE];
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

const struct shift_provider *shift_provider_match(const struct ibv_device_attr *attr)
{
	for (unsigned i = 0; i < sizeof(providers) / sizeof(providers[0]); i++)
		if (providers[i]->match(attr))
			return providers[i];
	return &shift_provider_generic;
}

/* Read without the lock: a slot's p is stored before its ctx (release),
 * and the taken slots are the first ones (shift_provider_forget). */
static const struct shift_provider *cached(struct ibv_context *ctx)
{
	for (int i = 0; i < CACHE; i++) {
		struct ibv_context *c = __atomic_load_n(&cache[i].ctx, __ATOMIC_ACQUIRE);

		if (c == ctx)
			return __atomic_load_n(&cache[i].p, __ATOMIC_RELAXED);
		if (!c)
			break;
	}
	return NULL;
}

const struct shift_provider *shift_provider_of(struct ibv_context *ctx)
{
	struct ibv_device_attr attr;
	const struct shift_provider *p;

	if (!ctx)
		return &shift_provider_generic;
	p = cached(ctx);
	if (p)
		return p;
	p = shift_lower->query_device(ctx, &attr) == 0 ? shift_provider_match(&attr)
						       : &shift_provider_generic;
	pthread_mutex_lock(&cache_lock);
	for (int i = 0; i < CACHE; i++) {
		if (cache[i].ctx == ctx)
			break; /* (another thread's answer: the same) */
		if (!cache[i].ctx) {
			__atomic_store_n(&cache[i].p, p, __ATOMIC_RELAXED);
			__atomic_store_n(&cache[i].ctx, ctx, __ATOMIC_RELEASE);
			break;
		}
	}
	pthread_mutex_unlock(&cache_lock);
	return p;
}

void shift_provider_fork_prepare(void)
{
	pthread_mutex_lock(&cache_lock);
}

void shift_provider_fork_done(void)
{
	pthread_mutex_unlock(&cache_lock);
}

void shift_provider_forget(struct ibv_context *ctx)
{
	int last = -1, at = -1;

	/* (the last slot taken moves into the freed one: the taken slots
	 * stay in front, so a reader stops at the first free one; a reader
	 * that misses a slot while it moves asks the device again) */
	pthread_mutex_lock(&cache_lock);
	for (int i = 0; i < CACHE && cache[i].ctx; i++) {
		if (cache[i].ctx == ctx)
			at = i;
		last = i;
	}
	if (at >= 0) {
		__atomic_store_n(&cache[at].p, cache[last].p, __ATOMIC_RELAXED);
		__atomic_store_n(&cache[at].ctx, cache[last].ctx, __ATOMIC_RELEASE);
		__atomic_store_n(&cache[last].ctx, NULL, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&cache_lock);
}

uint8_t shift_provider_retry_cnt(struct ibv_context *ctx, uint8_t want)
{
	const struct shift_provider *p = shift_provider_of(ctx);

	if (!p->retry_cnt)
		return want;
	return p->retry_cnt(ctx && ctx->device ? ctx->device->name : "?", want);
}

const char *shift_provider_wq_name(const struct shift_provider *p)
{
	return p->wq == SHIFT_WQ_NATIVE ? "native" : "mirror";
}

struct shift_nwq *shift_provider_native_wq(struct ibv_qp *qp)
{
	const struct shift_provider *p = shift_provider_of(qp->context);
	struct shift_nwq *q = NULL;
	static bool said;
	int rc;

	if (p->wq != SHIFT_WQ_NATIVE || !p->native_wq || !shift_config.native_wq)
		return NULL;
	rc = p->native_wq(qp, &q);
	if (rc) {
		if (!__atomic_exchange_n(&said, true, __ATOMIC_RELAXED))
			shift_warn("%s QP %u: the %s provider's queues cannot be read (%s): its "
				   "posts are mirrored (said once)",
				   qp->context->device ? qp->context->device->name : "?",
				   qp->qp_num, p->name, strerror(rc));
		return NULL;
	}
	return q;
}
