/*
 * Provider quirks (see quirks.h).
 */
#include "providers/quirks.h"
#include "shift/base/lower.h"
#include "shift/base/log.h"

#include <pthread.h>

/* rdma_rxe reports this vendor id (the kernel's RXE_VENDOR_ID) */
#define RXE_VENDOR_ID 0xffffff

#define QUIRK_CACHE 64

static struct {
	struct ibv_context *ctx;
	int is_rxe;
} cache[QUIRK_CACHE];
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

int shift_provider_is_rxe(struct ibv_context *ctx)
{
	struct ibv_device_attr attr;
	int v = 0;

	if (!ctx)
		return 0;
	pthread_mutex_lock(&cache_lock);
	for (int i = 0; i < QUIRK_CACHE; i++) {
		if (cache[i].ctx == ctx) {
			v = cache[i].is_rxe;
			pthread_mutex_unlock(&cache_lock);
			return v;
		}
	}
	pthread_mutex_unlock(&cache_lock);
	if (shift_lower->query_device(ctx, &attr) == 0)
		v = attr.vendor_id == RXE_VENDOR_ID && attr.vendor_part_id == 0;
	pthread_mutex_lock(&cache_lock);
	for (int i = 0; i < QUIRK_CACHE; i++) {
		if (!cache[i].ctx || cache[i].ctx == ctx) {
			cache[i].ctx = ctx;
			cache[i].is_rxe = v;
			break;
		}
	}
	pthread_mutex_unlock(&cache_lock);
	return v;
}

uint8_t shift_provider_retry_cnt(struct ibv_context *ctx, uint8_t want)
{
	static int logged;

	if (want < 7 || !shift_provider_is_rxe(ctx))
		return want;
	if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
		shift_info("%s: retry_cnt 7 becomes 6 on soft-RoCE, which would retry a dead path "
			   "forever and never report the failure", ctx->device ? ctx->device->name : "rxe");
	return 6;
}
