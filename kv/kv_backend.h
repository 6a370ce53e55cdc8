/*
 * kv/kv_backend.h - internals shared by the kv front end (kv.c) and its
 * backends (kv_redis.c, kv_mem.c).  Not installed, not for other modules.
 *
 * A backend is a table of operations in the style of Redis' ae.c /
 * ConnectionType: kv.c validates arguments, builds the namespaced key and
 * holds the handle lock, then makes one indirect call.  Backends only see
 * full keys ("shift:<ns>:<key>") and absolute CLOCK_MONOTONIC deadlines.
 *
 * Dependencies go one way: this header needs only the kv types
 * (kv_types.h) and the map (kv_map.h), never the public API (kv.h).  The
 * front end (kv.c) sits above it; the backends implement it below.
 */
#ifndef SHIFT_KV_BACKEND_H
#define SHIFT_KV_BACKEND_H

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_map.h"
#include "kv/kv_types.h"

/* ---- handle and backend table ---- */

#define KV_SECRET_MIN 16   /* bytes of a per-job secret (kv_auth.c) */
#define KV_SECRET_MAX 4096

struct kv_backend {
	const char *name;
	/* Called once from shift_kv_open() before the handle is shared; may
	 * connect (unless h->opts.lazy_connect).  Sets h->priv. */
	int (*open)(shift_kv *h);
	/* Releases h->priv.  No other call is in progress. */
	void (*close)(shift_kv *h);
	/* The three commands below run with h->lock held. */
	int (*put)(shift_kv *h, const char *k, size_t klen, const void *v,
		   size_t vlen, uint64_t ttl_ms, uint64_t deadline_ns);
	int (*get)(shift_kv *h, const char *k, size_t klen, void **v,
		   size_t *vlen, uint64_t deadline_ns);
	int (*del)(shift_kv *h, const char *k, size_t klen,
		   uint64_t deadline_ns);
	/* n keys in one round trip (n <= SHIFT_KV_MGET_MAX): v[i] stays
	 * NULL for an absent key; an error is the whole call's. */
	int (*mget)(shift_kv *h, const char *const *k, const size_t *klen,
		    size_t n, void **v, size_t *vlen, uint64_t deadline_ns);
	/* Optional native wait, called WITHOUT h->lock.  When NULL, kv.c polls
	 * get() with bounded sleeps. */
	int (*wait)(shift_kv *h, const char *k, size_t klen, void **v,
		    size_t *vlen, uint64_t deadline_ns);
};

struct shift_kv {
	const struct kv_backend *be;
	struct shift_kv_url url;
	struct shift_kv_options opts; /* defaults filled in */
	char ns[SHIFT_KV_NS_MAX + 1];
	char prefix[2 * SHIFT_KV_NS_MAX + 9]; /* "shift:<ns>:" or "shift:<ns>:<job>:" */
	size_t prefix_len;
	/* Serialises backend commands (hiredis contexts are not thread-safe)
	 * and guards own. */
	pthread_mutex_t lock;
	struct kv_map own; /* full keys this handle put, with their (sealed)
			    * values and TTLs; guarded by lock */
	size_t refresh_at; /* shift_kv_refresh_own()'s place in own */
	void *priv;        /* backend state */
	uint64_t commands; /* backend commands issued; guarded by lock */
	uint64_t oversize; /* replies refused over max_reply; guarded by lock */
	/* the store failing (a command's outage error) since its last answer,
	 * and how often it answered again after that; guarded by lock */
	bool failing;
	uint64_t recoveries;
	/* authenticated records (kv_auth.c): the per-job secret, 0 bytes =
	 * none; values that failed to open (relaxed atomic) */
	unsigned char secret[KV_SECRET_MAX];
	size_t secret_len;
	uint64_t auth_failures;
};

/* Deadline for one command: everything it takes, a reconnect included. */
uint64_t kv_op_deadline(const shift_kv *h);
/* A backend command's rc noted (h->lock held): an outage (the store
 * unreachable, slow, closing on us) sets failing, an answer after one
 * counts a recovery. Returns rc. */
static inline int kv_note(shift_kv *h, int rc)
{
	if (rc < 0 && rc != -ENOENT && rc != -EINVAL && rc != -EMSGSIZE && rc != -ENOMEM) {
		h->failing = true;
	} else if (h->failing) {
		h->failing = false;
		h->recoveries++;
	}
	return rc;
}
/* A key the store accepted from a put (kv_own.c; h->lock held). */
int kv_own_remember(shift_kv *h, const char *fk, size_t klen, const void *val, size_t len,
		    uint64_t ttl_ms);

/* ---- authenticated records (kv_auth.c) ---- */

/* Read the secret file at path into h (nothing for NULL or ""); 0 or a
 * negative errno with the reason as the last error. */
int kv_auth_load(shift_kv *h, const char *path);
/* The sealed form of value v under full key fk (malloc'd, NUL after it). */
int kv_auth_seal(const shift_kv *h, const char *fk, size_t klen, const void *v,
		 size_t vlen, void **out, size_t *outlen);
/* Open a value read under fk in place (*v, *vlen become the payload).
 * Without a secret: 0, unchanged. One that does not open: freed, *v NULL,
 * counted, logged once per handle, -ENOENT (it reads as absent). */
int kv_auth_open(shift_kv *h, const char *fk, size_t klen, void **v, size_t *vlen);

extern const struct kv_backend kv_backend_redis;
extern const struct kv_backend kv_backend_redis_cluster;
extern const struct kv_backend kv_backend_mem;

/* ---- helpers (kv.c) ---- */

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t kv_now_ns(void);
/* Milliseconds left until deadline_ns (0 if passed), rounded up. */
int kv_ms_left(uint64_t deadline_ns);
/* Sleep ms milliseconds (EINTR-safe). */
void kv_sleep_ms(int ms);
/* Record a printf-style message as the calling thread's last error and
 * return rc unchanged (so `return kv_err(-EINVAL, "...")` reads well). */
int kv_err(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Copy a value into a fresh malloc'd buffer with a trailing NUL. */
void *kv_dup_value(const void *v, size_t len);

#endif /* SHIFT_KV_BACKEND_H */
