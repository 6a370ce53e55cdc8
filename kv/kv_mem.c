/*
 * kv/kv_mem.c - in-memory kv backend (mem://NAME), for unit tests.
 *
 * Stores are process-wide and named: every handle opened on mem://NAME in
 * this process shares one store, so two simulated "hosts" in one test binary
 * see each other's keys.  A store is a hash map guarded by its own mutex,
 * with a condition variable (on CLOCK_MONOTONIC) that put() broadcasts so
 * wait() needs no polling.  TTLs expire lazily on access.  Stores live until
 * the process exits.  Fault injection: shift_kv_mem_set_down() makes every
 * operation fail with -ENOTCONN, like an unreachable Redis.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv.h"
#include "kv/kv_backend.h"

struct kv_mem_store {
	struct kv_mem_store *next; /* registry list, guarded by kv_mem_reg_lock */
	char name[SHIFT_KV_MEM_NAME_MAX + 1];
	pthread_mutex_t lock;      /* guards everything below */
	pthread_cond_t changed;    /* broadcast on put and on set_down */
	struct kv_map map;
	bool down;
};

static pthread_mutex_t kv_mem_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kv_mem_store *kv_mem_stores; /* guarded by kv_mem_reg_lock */

/* Find or create the store called name.  NULL on ENOMEM. */
static struct kv_mem_store *kv_mem_store_get(const char *name)
{
	struct kv_mem_store *s;
	pthread_condattr_t ca;

	pthread_mutex_lock(&kv_mem_reg_lock);
	for (s = kv_mem_stores; s; s = s->next)
		if (!strcmp(s->name, name))
			goto out;
	s = calloc(1, sizeof(*s));
	if (!s)
		goto out;
	strcpy(s->name, name); /* validated by the caller */
	pthread_mutex_init(&s->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->changed, &ca);
	pthread_condattr_destroy(&ca);
	s->next = kv_mem_stores;
	kv_mem_stores = s;
out:
	pthread_mutex_unlock(&kv_mem_reg_lock);
	return s;
}

/* Look a store up by a user-supplied name (validated). */
static int kv_mem_lookup(const char *name, struct kv_mem_store **out)
{
	char url[SHIFT_KV_URL_MAX + 8];
	struct shift_kv_url u;
	int rc;

	if (!name)
		return kv_err(-EINVAL, "kv mem: NULL store name");
	snprintf(url, sizeof(url), "mem://%s", name);
	rc = shift_kv_url_parse(url, &u);
	if (rc)
		return rc;
	*out = kv_mem_store_get(u.name);
	return *out ? 0 : kv_err(-ENOMEM, "kv mem: out of memory");
}

int shift_kv_mem_set_down(const char *name, bool down)
{
	struct kv_mem_store *s;
	int rc = kv_mem_lookup(name, &s);

	if (rc)
		return rc;
	pthread_mutex_lock(&s->lock);
	s->down = down;
	pthread_cond_broadcast(&s->changed); /* waiters must see the outage */
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int shift_kv_mem_clear(const char *name)
{
	struct kv_mem_store *s;
	int rc = kv_mem_lookup(name, &s);

	if (rc)
		return rc;
	pthread_mutex_lock(&s->lock);
	kv_map_clear(&s->map);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

struct kv_mem_spoil_arg {
	uint64_t *seqs; /* first pass: every entry's seq */
	size_t n;
	uint64_t seq; /* second pass: the one spoiled */
	bool garble;
	bool done;
};

static int kv_mem_spoil_collect(void *arg, struct kv_entry *e)
{
	struct kv_mem_spoil_arg *a = arg;

	a->seqs[a->n++] = e->seq;
	return 0;
}

static int kv_mem_spoil_one(void *arg, struct kv_entry *e)
{
	struct kv_mem_spoil_arg *a = arg;

	if (e->seq != a->seq)
		return 0;
	a->done = true;
	if (!a->garble || !e->val || !e->vlen)
		return 1; /* (deleted; an empty value cannot be garbled) */
	/* a byte flipped in the middle of the value, as a torn or tampered
	 * write would leave it */
	((unsigned char *)e->val)[e->vlen / 2] ^= 0x5a;
	return -1;
}

static int kv_mem_cmp_seq(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;

	return (a > b) - (a < b);
}

int shift_kv_mem_spoil(const char *name, uint64_t pick, bool garble)
{
	struct kv_mem_store *s;
	int rc = kv_mem_lookup(name, &s);
	struct kv_mem_spoil_arg a = { .garble = garble };
	bool nomem;

	if (rc)
		return rc;
	pthread_mutex_lock(&s->lock);
	/* the order of creation, not the buckets': a key's bytes (random
	 * generations and nonces) would move the pick from run to run */
	a.seqs = s->map.count ? malloc(s->map.count * sizeof(*a.seqs)) : NULL;
	nomem = s->map.count && !a.seqs;
	if (a.seqs) {
		kv_map_each(&s->map, kv_mem_spoil_collect, &a);
		qsort(a.seqs, a.n, sizeof(*a.seqs), kv_mem_cmp_seq);
		a.seq = a.seqs[pick % a.n];
		kv_map_each(&s->map, kv_mem_spoil_one, &a);
	}
	pthread_mutex_unlock(&s->lock);
	rc = nomem ? -ENOMEM : a.done ? 0 : -ENOENT;
	free(a.seqs);
	return rc;
}

/* Error for an operation on a store that is down.  Store lock held. */
static int kv_mem_down_err(const struct kv_mem_store *s)
{
	return kv_err(-ENOTCONN, "kv mem://%s is down (fault injected)", s->name);
}

/* The live entry for key, dropping it if its TTL passed.  Lock held. */
static struct kv_entry *kv_mem_find(struct kv_mem_store *s, const char *k,
				    size_t klen)
{
	struct kv_entry *e = kv_map_find(&s->map, k, klen);

	if (e && e->expire_ns && e->expire_ns <= kv_now_ns()) {
		kv_map_remove(&s->map, k, klen);
		e = NULL;
	}
	return e;
}

static int kv_mem_open(shift_kv *h)
{
	struct kv_mem_store *s = kv_mem_store_get(h->url.name);
	bool down;

	if (!s)
		return kv_err(-ENOMEM, "kv mem: out of memory");
	pthread_mutex_lock(&s->lock);
	down = s->down;
	pthread_mutex_unlock(&s->lock);
	if (down && !h->opts.lazy_connect)
		return kv_mem_down_err(s);
	h->priv = s;
	return 0;
}

static void kv_mem_close(shift_kv *h)
{
	h->priv = NULL; /* the store outlives its handles */
}

static int kv_mem_put(shift_kv *h, const char *k, size_t klen, const void *v,
		      size_t vlen, uint64_t ttl_ms, uint64_t deadline_ns)
{
	struct kv_mem_store *s = h->priv;
	struct kv_entry *e;
	void *copy;
	int rc = 0;

	(void)deadline_ns; /* never blocks */
	copy = kv_dup_value(v, vlen);
	if (!copy)
		return kv_err(-ENOMEM, "kv mem put: out of memory");
	pthread_mutex_lock(&s->lock);
	if (s->down) {
		rc = kv_mem_down_err(s);
	} else if (!(e = kv_map_upsert(&s->map, k, klen))) {
		rc = kv_err(-ENOMEM, "kv mem put: out of memory");
	} else {
		free(e->val);
		e->val = copy;
		e->vlen = vlen;
		e->expire_ns = ttl_ms ? kv_now_ns() + ttl_ms * 1000000ull : 0;
		copy = NULL;
		pthread_cond_broadcast(&s->changed);
	}
	pthread_mutex_unlock(&s->lock);
	free(copy);
	return rc;
}

/* Copy the live value of k out.  Store lock held. */
static int kv_mem_get_locked(struct kv_mem_store *s, const char *k,
			     size_t klen, void **v, size_t *vlen)
{
	struct kv_entry *e;

	if (s->down)
		return kv_mem_down_err(s);
	e = kv_mem_find(s, k, klen);
	if (!e)
		return kv_err(-ENOENT, "kv: no key '%s'", k);
	*v = kv_dup_value(e->val, e->vlen);
	if (!*v)
		return kv_err(-ENOMEM, "kv mem get: out of memory");
	*vlen = e->vlen;
	return 0;
}

static int kv_mem_get(shift_kv *h, const char *k, size_t klen, void **v,
		      size_t *vlen, uint64_t deadline_ns)
{
	struct kv_mem_store *s = h->priv;
	int rc;

	(void)deadline_ns;
	pthread_mutex_lock(&s->lock);
	rc = kv_mem_get_locked(s, k, klen, v, vlen);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

static int kv_mem_mget(shift_kv *h, const char *const *k, const size_t *klen,
		       size_t n, void **v, size_t *vlen, uint64_t deadline_ns)
{
	struct kv_mem_store *s = h->priv;
	int rc = 0;

	(void)deadline_ns;
	pthread_mutex_lock(&s->lock);
	if (s->down)
		rc = kv_mem_down_err(s);
	for (size_t i = 0; i < n && !rc; i++) {
		rc = kv_mem_get_locked(s, k[i], klen[i], &v[i], &vlen[i]);
		if (rc == -ENOENT)
			rc = 0; /* absent: NULL */
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

static int kv_mem_del(shift_kv *h, const char *k, size_t klen,
		      uint64_t deadline_ns)
{
	struct kv_mem_store *s = h->priv;
	int rc = 0;

	(void)deadline_ns;
	pthread_mutex_lock(&s->lock);
	if (s->down)
		rc = kv_mem_down_err(s);
	else if (!kv_mem_find(s, k, klen) || !kv_map_remove(&s->map, k, klen))
		rc = kv_err(-ENOENT, "kv: no key '%s'", k);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* Native wait: sleep on the store's condition variable until a put (or an
 * outage) changes something, re-checking the key each time. */
static int kv_mem_wait(shift_kv *h, const char *k, size_t klen, void **v,
		       size_t *vlen, uint64_t deadline_ns)
{
	struct kv_mem_store *s = h->priv;
	struct timespec ts = { .tv_sec = (time_t)(deadline_ns / 1000000000ull),
			       .tv_nsec = (long)(deadline_ns % 1000000000ull) };
	int rc;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		rc = kv_mem_get_locked(s, k, klen, v, vlen);
		if (rc != -ENOENT)
			break;
		if (kv_now_ns() >= deadline_ns ||
		    pthread_cond_timedwait(&s->changed, &s->lock, &ts) ==
			    ETIMEDOUT) {
			/* one last look: a put may have raced the timeout */
			rc = kv_mem_get_locked(s, k, klen, v, vlen);
			if (rc == -ENOENT)
				rc = -ETIMEDOUT;
			break;
		}
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

const struct kv_backend kv_backend_mem = {
	.name = "mem",
	.open = kv_mem_open,
	.close = kv_mem_close,
	.put = kv_mem_put,
	.get = kv_mem_get,
	.mget = kv_mem_mget,
	.del = kv_mem_del,
	.wait = kv_mem_wait,
};
