/*
 * kv/kv_own.c - the keys a handle wrote: remembered with their (sealed)
 * values and TTLs, written again while the handle lives
 * (shift_kv_refresh_own), deleted at the end (shift_kv_delete_own).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"
#include "kv/kv_backend.h"

/* Only keys the store accepted are owned (h->lock held). ENOMEM while
 * remembering is reported: the value is stored but delete_own() would miss
 * it. A key with a TTL keeps its value: shift_kv_refresh_own() writes it
 * again while this handle lives. */
int kv_own_remember(shift_kv *h, const char *fk, size_t klen, const void *val, size_t len,
		    uint64_t ttl_ms)
{
	struct kv_entry *e = kv_map_upsert(&h->own, fk, klen);

	if (!e)
		return kv_err(-ENOMEM, "kv put: out of memory tracking own key");
	free(e->val);
	e->val = NULL;
	e->vlen = 0;
	e->ttl_ms = ttl_ms;
	if (ttl_ms && (e->val = malloc(len ? len : 1))) {
		memcpy(e->val, val ? val : "", len);
		e->vlen = len;
	} else if (ttl_ms) {
		e->ttl_ms = 0; /* (not refreshed: it expires) */
	}
	return 0;
}

struct kv_refresh_ctx {
	shift_kv *h;
	size_t skip, max, done;
	int err;
};

static int kv_refresh_one(void *arg, struct kv_entry *e)
{
	struct kv_refresh_ctx *c = arg;

	if (c->skip) {
		c->skip--;
		return 0;
	}
	if (c->done == c->max)
		return -1;
	c->done++;
	if (!e->ttl_ms)
		return 0;
	c->h->commands++;
	int rc = kv_note(c->h, c->h->be->put(c->h, e->key, e->klen, e->val ? e->val : "",
					     e->vlen, e->ttl_ms, kv_op_deadline(c->h)));

	if (rc) {
		c->err = rc;
		return -1; /* (the store will not get better within this call) */
	}
	return 0;
}

int shift_kv_refresh_own(shift_kv *h, size_t max)
{
	if (!h)
		return kv_err(-EINVAL, "kv: NULL handle");
	pthread_mutex_lock(&h->lock);
	if (h->refresh_at >= h->own.count)
		h->refresh_at = 0;
	struct kv_refresh_ctx c = { .h = h, .skip = h->refresh_at, .max = max };

	kv_map_each(&h->own, kv_refresh_one, &c);
	h->refresh_at += c.done - (c.err ? 1 : 0);
	pthread_mutex_unlock(&h->lock);
	return c.err ? c.err : (int)c.done;
}

struct kv_del_ctx {
	shift_kv *h;
	int deleted;
	int err;
};

static int kv_del_one(void *arg, struct kv_entry *e)
{
	struct kv_del_ctx *c = arg;
	int rc = c->h->be->del(c->h, e->key, e->klen, kv_op_deadline(c->h));

	if (rc == 0) {
		c->deleted++;
		return 1;
	}
	if (rc == -ENOENT) /* expired or deleted by someone else */
		return 1;
	c->err = rc;
	/* an unreachable store will not get better within this call */
	return rc == -ENOTCONN || rc == -EACCES ? -1 : 0;
}

int shift_kv_delete_own(shift_kv *h)
{
	struct kv_del_ctx c = { .h = h };

	if (!h)
		return kv_err(-EINVAL, "kv: NULL handle");
	pthread_mutex_lock(&h->lock);
	kv_map_each(&h->own, kv_del_one, &c);
	pthread_mutex_unlock(&h->lock);
	return c.err ? c.err : c.deleted;
}

size_t shift_kv_own_count(shift_kv *h)
{
	size_t n;

	if (!h)
		return 0;
	pthread_mutex_lock(&h->lock);
	n = h->own.count;
	pthread_mutex_unlock(&h->lock);
	return n;
}
