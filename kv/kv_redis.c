/*
 * kv/kv_redis.c - Redis kv backend on hiredis (0.14.1 subset, so it also
 * builds on 1.x) for redis://, rediss:// and redis-sentinel:// URLs: one
 * connection per handle (kv_redis_conn.c: dial, AUTH/SELECT, the primary
 * asked of Sentinel, the deadline-bound round trip) and the four commands
 * on it, which kv_redis_cluster.c also sends on each cluster node's
 * connection.  kv.c holds the handle lock around every call here, since a
 * context is not thread-safe.
 *
 * Every command - the (re)connect, AUTH and SELECT when one is needed, the
 * write and the whole reply - ends by one deadline (command_timeout_ms,
 * SHIFT_KV_TIMEOUT_MS): a server that never answers, or drips its reply,
 * costs the caller that much and no more.  A reply that announces a value
 * above max_reply (SHIFT_KV_MAX_REPLY) is refused when its length header
 * arrives, with -EMSGSIZE, one log line (at most one a second per handle)
 * and a count (shift_kv_oversize_replies); its body is never read.
 *
 * Failure model: a failed round trip (deadline, I/O error, EOF, a reply
 * that is not RESP, a refused size) drops the context - a connection is
 * never reused mid-reply - and the next call reconnects; a
 * REDIS_REPLY_ERROR is the server refusing and keeps it.  Reconnects back
 * off exponentially (retry_min_ms .. retry_max_ms) after repeated
 * connectivity failures, and a call made during the back-off fails at once
 * with -ENOTCONN, so an outage never turns into a tight loop or a hang.  The
 * first reconnect after a working connection broke is immediate, and a
 * refused size does not count as an outage.
 *
 * Writes use send(MSG_NOSIGNAL): a vanished server never raises SIGPIPE in
 * an application that never asked for networking.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "kv/kv.h"
#include "kv/kv_backend.h"
#include "kv/kv_redis_conn.h"

/* ---- backend operations ---- */

static int kv_redis_open(shift_kv *h)
{
	struct kv_redis *r = calloc(1, sizeof(*r));
	int rc;

	if (!r)
		return kv_err(-ENOMEM, "kv redis: out of memory");
	kv_redis_url_init(h, r);
	rc = kv_redis_tls_ctx(h, r->where, &r->tls_ctx);
	if (rc) {
		free(r);
		return rc;
	}
	h->priv = r;
	if (h->opts.lazy_connect)
		return 0;
	rc = kv_redis_connect(h, r, kv_now_ns() +
				     (uint64_t)h->opts.command_timeout_ms *
					     1000000ull);
	if (rc) {
		kv_redis_drop(r);
		kv_tls_ctx_free(r->tls_ctx);
		free(r);
		h->priv = NULL;
	}
	return rc;
}

static void kv_redis_close(shift_kv *h)
{
	struct kv_redis *r = h->priv;

	if (!r)
		return;
	kv_redis_drop(r);
	kv_tls_ctx_free(r->tls_ctx);
	free(r);
	h->priv = NULL;
}

int kv_redis_put_on(shift_kv *h, struct kv_redis *r, const char *k, size_t klen, const void *v,
		    size_t vlen, uint64_t ttl_ms, uint64_t deadline_ns)
{
	const struct kv_keys keys = { &k, &klen, 1 };
	redisReply *rep;
	int rc = kv_redis_connect(h, r, deadline_ns);

	if (rc)
		return rc;
	if (ttl_ms)
		rep = kv_redis_cmd(h, r, deadline_ns, &rc, &keys, "SET %b %b PX %llu",
				   k, klen, v, vlen, (unsigned long long)ttl_ms);
	else
		rep = kv_redis_cmd(h, r, deadline_ns, &rc, &keys, "SET %b %b", k, klen,
				   v, vlen);
	if (!rep)
		return rc;
	kv_redis_ok(r);
	if (rep->type != REDIS_REPLY_STATUS)
		return kv_redis_reply_err(r, rep, "SET");
	freeReplyObject(rep);
	return 0;
}

int kv_redis_get_on(shift_kv *h, struct kv_redis *r, const char *k, size_t klen, void **v,
		    size_t *vlen, uint64_t deadline_ns)
{
	const struct kv_keys keys = { &k, &klen, 1 };
	redisReply *rep;
	int rc = kv_redis_connect(h, r, deadline_ns);

	if (rc)
		return rc;
	rep = kv_redis_cmd(h, r, deadline_ns, &rc, &keys, "GET %b", k, klen);
	if (!rep)
		return rc;
	kv_redis_ok(r);
	if (rep->type == REDIS_REPLY_NIL) {
		rc = kv_err(-ENOENT, "kv: no key '%s'", k);
	} else if (rep->type != REDIS_REPLY_STRING) {
		return kv_redis_reply_err(r, rep, "GET");
	} else if (!(*v = kv_dup_value(rep->str, (size_t)rep->len))) {
		rc = kv_err(-ENOMEM, "kv redis get: out of memory");
	} else {
		*vlen = (size_t)rep->len;
	}
	freeReplyObject(rep);
	return rc;
}

int kv_redis_mget_on(shift_kv *h, struct kv_redis *r, const char *const *k, const size_t *klen,
		     size_t n, void **v, size_t *vlen, uint64_t deadline_ns)
{
	const char *argv[SHIFT_KV_MGET_MAX + 1];
	size_t argvlen[SHIFT_KV_MGET_MAX + 1];
	const struct kv_keys keys = { k, klen, n };
	redisReply *rep;
	int rc = kv_redis_connect(h, r, deadline_ns);

	if (rc)
		return rc;
	argv[0] = "MGET";
	argvlen[0] = 4;
	for (size_t i = 0; i < n; i++) {
		argv[i + 1] = k[i];
		argvlen[i + 1] = klen[i];
	}
	rep = kv_redis_cmd_argv(h, r, deadline_ns, &rc, (int)n + 1, argv,
				argvlen, &keys);
	if (!rep)
		return rc;
	kv_redis_ok(r);
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements != n)
		return kv_redis_reply_err(r, rep, "MGET");
	for (size_t i = 0; i < n && !rc; i++) {
		redisReply *e = rep->element[i];

		if (e->type == REDIS_REPLY_NIL)
			continue;
		if (e->type != REDIS_REPLY_STRING) {
			rc = kv_err(-EPROTO, "%s: MGET: unexpected reply type %d",
				    r->where, e->type);
		} else if (!(v[i] = kv_dup_value(e->str, (size_t)e->len))) {
			rc = kv_err(-ENOMEM, "kv redis mget: out of memory");
		} else {
			vlen[i] = (size_t)e->len;
		}
	}
	freeReplyObject(rep);
	return rc;
}

int kv_redis_del_on(shift_kv *h, struct kv_redis *r, const char *k, size_t klen,
		    uint64_t deadline_ns)
{
	const struct kv_keys keys = { &k, &klen, 1 };
	redisReply *rep;
	int rc = kv_redis_connect(h, r, deadline_ns);

	if (rc)
		return rc;
	rep = kv_redis_cmd(h, r, deadline_ns, &rc, &keys, "DEL %b", k, klen);
	if (!rep)
		return rc;
	kv_redis_ok(r);
	if (rep->type != REDIS_REPLY_INTEGER)
		return kv_redis_reply_err(r, rep, "DEL");
	rc = rep->integer > 0 ? 0 : kv_err(-ENOENT, "kv: no key '%s'", k);
	freeReplyObject(rep);
	return rc;
}

static int kv_redis_put(shift_kv *h, const char *k, size_t klen, const void *v, size_t vlen,
			uint64_t ttl_ms, uint64_t deadline_ns)
{
	return kv_redis_put_on(h, h->priv, k, klen, v, vlen, ttl_ms, deadline_ns);
}

static int kv_redis_get(shift_kv *h, const char *k, size_t klen, void **v, size_t *vlen,
			uint64_t deadline_ns)
{
	return kv_redis_get_on(h, h->priv, k, klen, v, vlen, deadline_ns);
}

static int kv_redis_mget(shift_kv *h, const char *const *k, const size_t *klen, size_t n,
			 void **v, size_t *vlen, uint64_t deadline_ns)
{
	return kv_redis_mget_on(h, h->priv, k, klen, n, v, vlen, deadline_ns);
}

static int kv_redis_del(shift_kv *h, const char *k, size_t klen, uint64_t deadline_ns)
{
	return kv_redis_del_on(h, h->priv, k, klen, deadline_ns);
}

const struct kv_backend kv_backend_redis = {
	.name = "redis",
	.open = kv_redis_open,
	.close = kv_redis_close,
	.put = kv_redis_put,
	.get = kv_redis_get,
	.mget = kv_redis_mget,
	.del = kv_redis_del,
	.wait = NULL, /* kv.c polls GET with bounded sleeps */
};
