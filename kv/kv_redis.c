/*
 * kv/kv_redis.c - Redis kv backend on hiredis (0.14.1 subset, so it also
 * builds on 1.x): redisConnectWithTimeout for the connection, the
 * redisFormatCommand* family for the request, the hiredis reader for the
 * reply; the socket I/O in between is kv_redis_io.c's, non-blocking under
 * poll() against each command's absolute deadline.  One redisContext per
 * handle; kv.c holds the handle lock around every call here, since a
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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "kv/kv.h"
#include "kv/kv_backend.h"
#include "kv/kv_redis_io.h"
#include "kv/kv_redis_sentinel.h"
#include "shift/base/log.h"

struct kv_redis {
	redisContext *c;       /* NULL while disconnected */
	SSL_CTX *tls_ctx;      /* rediss:// only */
	SSL *ssl;              /* rediss:// only: c's session */
	uint64_t next_try_ns;  /* no reconnect attempt before this */
	int backoff_ms;        /* 0 = healthy; else next back-off step */
	uint64_t big_log_ns;   /* last "reply refused" log line, 0 none */
	uint64_t big_quiet;    /* refusals not logged since that line */
	char last_err[160];    /* why the last connection attempt/context died */
	char where[300];       /* "redis://[user@]host:port/db" without password */
	/* redis-sentinel:// only: the sentinel to ask first, and the primary
	 * they named last (port 0: none yet) */
	int sent_next;
	struct shift_kv_addr primary;
};

/* The keys a command reads, to name the one whose reply was refused. */
struct kv_keys {
	const char *const *k;
	const size_t *len;
	size_t n;
};

/* ---- connection state ---- */

static struct timeval kv_tv(int ms)
{
	struct timeval tv = { .tv_sec = ms / 1000,
			      .tv_usec = (suseconds_t)(ms % 1000) * 1000 };
	return tv;
}

static void kv_redis_drop(struct kv_redis *r)
{
	kv_tls_free(r->ssl);
	r->ssl = NULL;
	if (r->c) {
		redisFree(r->c);
		r->c = NULL;
	}
}

/* Drop the context (if any) and schedule the next reconnect attempt. */
static void kv_redis_fail(shift_kv *h, struct kv_redis *r, const char *why)
{
	uint64_t now = kv_now_ns();

	/* cut to the buffer on purpose: the precision says so to the compiler */
	if (why)
		snprintf(r->last_err, sizeof(r->last_err), "%.*s", (int)sizeof(r->last_err) - 1, why);
	kv_redis_drop(r);
	if (r->backoff_ms == 0) {
		/* it was working: one immediate retry is fine */
		r->next_try_ns = now;
		r->backoff_ms = h->opts.retry_min_ms;
	} else {
		r->next_try_ns = now + (uint64_t)r->backoff_ms * 1000000ull;
		r->backoff_ms = r->backoff_ms * 2 > h->opts.retry_max_ms
					? h->opts.retry_max_ms
					: r->backoff_ms * 2;
	}
}

/* A reply announced more than max_reply: the connection is dropped (the
 * body is still on its way) without a back-off, counted, and logged - one
 * line per dropped connection, at most one a second per handle. */
static int kv_redis_too_big(shift_kv *h, struct kv_redis *r,
			    const struct kv_rio_err *e,
			    const struct kv_keys *keys)
{
	uint64_t now = kv_now_ns();
	const char *k = "-";
	size_t kl = 1;

	if (keys && e->idx >= 0 && (size_t)e->idx < keys->n) {
		k = keys->k[e->idx];
		kl = keys->len[e->idx] > 200 ? 200 : keys->len[e->idx];
	}
	kv_redis_drop(r);
	h->oversize++;
	kv_err(-EMSGSIZE,
	       "%s: reply for key '%.*s' refused: %s (SHIFT_KV_MAX_REPLY %zu); "
	       "connection dropped", r->where, (int)kl, k, e->why,
	       h->opts.max_reply);
	if (!r->big_log_ns || now - r->big_log_ns >= 1000000000ull) {
		shift_warn("kv: %s [%llu more not logged]", shift_kv_last_error(),
			   (unsigned long long)r->big_quiet);
		r->big_log_ns = now;
		r->big_quiet = 0;
	} else {
		r->big_quiet++;
	}
	return -EMSGSIZE;
}

/* Run one formatted command (cmd, len from redisFormatCommand*, freed
 * here) before the deadline.  Returns the reply (caller frees) or NULL
 * with *rc set and the context dropped. */
static redisReply *kv_redis_run(shift_kv *h, struct kv_redis *r,
				uint64_t deadline, int *rc, char *cmd, int len,
				const struct kv_keys *keys)
{
	struct kv_rio_err e;
	redisReply *rep;
	char why[240];

	if (len < 0) {
		*rc = kv_err(-ENOMEM, "%s: cannot format the command", r->where);
		return NULL;
	}
	if (kv_ms_left(deadline) <= 0) {
		redisFreeCommand(cmd);
		*rc = kv_err(-ENOTCONN, "%s: deadline passed before the command",
			     r->where);
		return NULL;
	}
	rep = kv_rio_roundtrip(r->c, r->ssl, cmd, (size_t)len, deadline,
			       h->opts.max_reply, SHIFT_KV_MGET_MAX, &e);
	redisFreeCommand(cmd);
	if (rep)
		return rep;
	if (e.kind == KV_RIO_TOOBIG) {
		*rc = kv_redis_too_big(h, r, &e, keys);
		return NULL;
	}
	if (e.kind == KV_RIO_TIMEOUT)
		snprintf(why, sizeof(why), "%s within %d ms (%zu reply bytes)",
			 e.why, h->opts.command_timeout_ms, e.received);
	else
		snprintf(why, sizeof(why), "%s", e.why);
	kv_redis_fail(h, r, why);
	*rc = kv_err(-ENOTCONN, "%s: %s", r->where, why);
	return NULL;
}

static redisReply *kv_redis_cmd(shift_kv *h, struct kv_redis *r,
				uint64_t deadline, int *rc,
				const struct kv_keys *keys, const char *fmt, ...)
{
	char *cmd = NULL;
	va_list ap;
	int len;

	va_start(ap, fmt);
	len = redisvFormatCommand(&cmd, fmt, ap);
	va_end(ap);
	return kv_redis_run(h, r, deadline, rc, cmd, len, keys);
}

static redisReply *kv_redis_cmd_argv(shift_kv *h, struct kv_redis *r,
				     uint64_t deadline, int *rc, int argc,
				     const char **argv, const size_t *argvlen,
				     const struct kv_keys *keys)
{
	char *cmd = NULL;
	int len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);

	return kv_redis_run(h, r, deadline, rc, cmd, len, keys);
}

/* Map a REDIS_REPLY_ERROR to an errno code with a message.  Frees rep. */
static int kv_redis_reply_err(struct kv_redis *r, redisReply *rep,
			      const char *what)
{
	int rc = -EPROTO;

	/* a write to a server that became a replica (its primary failed
	 * over): drop the context, the next command finds the new primary */
	if (rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "READONLY", 8)) {
		kv_redis_drop(r);
		rc = -ENOTCONN;
	}

	if (rep->type == REDIS_REPLY_ERROR &&
	    (!strncmp(rep->str, "NOAUTH", 6) || !strncmp(rep->str, "WRONGPASS", 9) ||
	     !strncmp(rep->str, "NOPERM", 6)))
		rc = -EACCES;
	if (rep->type == REDIS_REPLY_ERROR)
		kv_err(rc, "%s: %s refused: %.200s", r->where, what, rep->str);
	else
		kv_err(rc, "%s: %s: unexpected reply type %d", r->where, what,
		       rep->type);
	freeReplyObject(rep);
	return rc;
}

/* AUTH or SELECT got no reply (or no time was left to send it): a context
 * that skipped its setup must never be reused, so drop it.  Returns rc. */
static int kv_redis_setup_failed(shift_kv *h, struct kv_redis *r, int rc)
{
	if (r->c)
		kv_redis_fail(h, r, "connection setup did not complete");
	return rc;
}

/* redis-sentinel://: set r->primary from the sentinels; a primary other
 * than the last one is logged (once per change). */
static int kv_redis_ask_sentinels(shift_kv *h, struct kv_redis *r,
				  uint64_t deadline)
{
	struct shift_kv_addr a;
	char why[400];

	if (kv_sentinel_primary(h, &r->sent_next, deadline, &a, why, sizeof(why))) {
		char w[160];

		snprintf(w, sizeof(w), "no sentinel named the primary of '%s'",
			 h->url.master);
		kv_redis_fail(h, r, w);
		return kv_err(-ENOTCONN, "%s: %s (%.300s)", r->where, w, why);
	}
	if (r->primary.port && (a.port != r->primary.port ||
				strcmp(a.host, r->primary.host)))
		shift_info("kv: %s: the primary of '%s' is now %s:%d (was %s:%d)",
			   r->where, h->url.master, a.host, a.port,
			   r->primary.host, r->primary.port);
	r->primary = a;
	return 0;
}

/* redis-sentinel://: the server the sentinels named must say it is the
 * primary (during a failover a sentinel may still name the old one). */
static int kv_redis_check_primary(shift_kv *h, struct kv_redis *r,
				  uint64_t deadline)
{
	char why[200], w[480];
	int rc = kv_sentinel_check_role(r->c, deadline, why, sizeof(why));

	if (!rc)
		return 0;
	snprintf(w, sizeof(w), "%.256s:%d %.200s", r->primary.host, r->primary.port, why);
	kv_redis_fail(h, r, w);
	return kv_err(-ENOTCONN, "%s: %s", r->where, w);
}

/* The TCP connection to host:port (at most to ms) and, for rediss://, the
 * TLS handshake (before deadline): r->c, or a failure counted and said. */
static int kv_redis_dial(shift_kv *h, struct kv_redis *r, const char *host, int port, int to,
			 uint64_t deadline)
{
	char why[200];

	r->c = redisConnectWithTimeout(host, port, kv_tv(to > 0 ? to : 1));
	if (!r->c || r->c->err || kv_rio_nonblock(r->c)) {
		snprintf(why, sizeof(why), "connect (limit %d ms): %s", to,
			 !r->c ? "out of memory"
			 : r->c->err ? r->c->errstr
				     : "cannot make the socket non-blocking");
		kv_redis_fail(h, r, why);
		return kv_err(-ENOTCONN, "%s: %s", r->where, why);
	}
	if (h->url.tls) {
		r->ssl = kv_tls_start(r->tls_ctx, r->c->fd, host, deadline, why, sizeof(why));
		if (!r->ssl) {
			kv_redis_fail(h, r, why);
			return kv_err(-ENOTCONN, "%s: %s", r->where, why);
		}
	}
	return 0;
}

/* Make sure r->c is a connected, authenticated context on the right db,
 * all before the deadline. */
static int kv_redis_connect(shift_kv *h, struct kv_redis *r, uint64_t deadline)
{
	uint64_t now = kv_now_ns();
	int to = h->opts.connect_timeout_ms, left, rc = 0;
	redisReply *rep;

	if (r->c)
		return 0;
	if (now < r->next_try_ns)
		return kv_err(-ENOTCONN,
			      "%s unreachable (%s); next reconnect attempt in %d ms",
			      r->where, r->last_err, kv_ms_left(r->next_try_ns));
	left = kv_ms_left(deadline);
	if (left <= 0)
		return kv_err(-ENOTCONN, "%s: no time left to connect", r->where);
	if (left < to)
		to = left;
	const char *host = h->url.host;
	int port = h->url.port;

	if (h->url.scheme == SHIFT_KV_SCHEME_SENTINEL) {
		rc = kv_redis_ask_sentinels(h, r, deadline);
		if (rc)
			return rc;
		host = r->primary.host;
		port = r->primary.port;
		left = kv_ms_left(deadline);
		to = left < to ? left : to;
	}
	rc = kv_redis_dial(h, r, host, port, to, deadline);
	if (rc)
		return rc;
	if (h->url.password[0]) {
		if (h->url.user[0])
			rep = kv_redis_cmd(h, r, deadline, &rc, NULL, "AUTH %b %b",
					   h->url.user, strlen(h->url.user),
					   h->url.password, strlen(h->url.password));
		else
			rep = kv_redis_cmd(h, r, deadline, &rc, NULL, "AUTH %b",
					   h->url.password, strlen(h->url.password));
		if (!rep)
			return kv_redis_setup_failed(h, r, rc);
		if (rep->type != REDIS_REPLY_STATUS) {
			char why[240];

			kv_redis_reply_err(r, rep, "AUTH");
			/* a wrong password, an unknown ACL user, or AUTH sent to
			 * a server without a password: all are auth failures */
			rc = -EACCES;
			snprintf(why, sizeof(why), "%s", shift_kv_last_error());
			kv_err(rc, "%s: authentication failed (%s)", r->where, why);
			kv_redis_fail(h, r, "authentication failed");
			return rc;
		}
		freeReplyObject(rep);
	}
	if (h->url.db) {
		rep = kv_redis_cmd(h, r, deadline, &rc, NULL, "SELECT %d", h->url.db);
		if (!rep)
			return kv_redis_setup_failed(h, r, rc);
		if (rep->type != REDIS_REPLY_STATUS) {
			rc = kv_redis_reply_err(r, rep, "SELECT");
			kv_redis_fail(h, r, "SELECT refused");
			return rc;
		}
		freeReplyObject(rep);
	}
	if (h->url.scheme == SHIFT_KV_SCHEME_SENTINEL)
		return kv_redis_check_primary(h, r, deadline);
	return 0;
}

/* A command reached the server and came back: the link is healthy. */
static void kv_redis_ok(struct kv_redis *r)
{
	r->backoff_ms = 0;
	r->next_try_ns = 0;
}

/* ---- backend operations ---- */

/* "redis-sentinel://[user@]s1:p1,s2:p2/master/db" (no password). */
static void kv_redis_sentinel_where(const shift_kv *h, struct kv_redis *r)
{
	size_t cap = sizeof(r->where), n;

	n = (size_t)snprintf(r->where, cap, "redis-sentinel://%s%s", h->url.user,
			     h->url.user[0] ? "@" : "");
	for (int i = 0; i < h->url.nsentinels && n < cap; i++) {
		const struct shift_kv_addr *a = &h->url.sentinel[i];
		bool v6 = strchr(a->host, ':') != NULL;
		int w = snprintf(r->where + n, cap - n, "%s%s%s%s:%d", i ? "," : "",
				 v6 ? "[" : "", a->host, v6 ? "]" : "", a->port);

		n += w > 0 ? (size_t)w : 0;
	}
	if (n < cap)
		snprintf(r->where + n, cap - n, "/%s/%d", h->url.master, h->url.db);
}

static int kv_redis_open(shift_kv *h)
{
	struct kv_redis *r = calloc(1, sizeof(*r));
	const char *fmt;
	int rc;

	if (!r)
		return kv_err(-ENOMEM, "kv redis: out of memory");
	if (h->url.scheme == SHIFT_KV_SCHEME_SENTINEL) {
		kv_redis_sentinel_where(h, r);
	} else {
		fmt = strchr(h->url.host, ':') ? "%s://%s%s[%s]:%d/%d" : "%s://%s%s%s:%d/%d";
		snprintf(r->where, sizeof(r->where), fmt, h->url.tls ? "rediss" : "redis", h->url.user,
			 h->url.user[0] ? "@" : "", h->url.host, h->url.port,
			 h->url.db);
	}
	snprintf(r->last_err, sizeof(r->last_err), "not connected yet");
	if (h->url.tls) {
		char why[300];

		r->tls_ctx = kv_tls_ctx_new(h->opts.tls_ca, h->opts.tls_cert, h->opts.tls_key, why,
					    sizeof(why));
		if (!r->tls_ctx) {
			rc = kv_err(-EINVAL, "%s: %s", r->where, why);
			free(r);
			return rc;
		}
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

static int kv_redis_put(shift_kv *h, const char *k, size_t klen, const void *v,
			size_t vlen, uint64_t ttl_ms, uint64_t deadline_ns)
{
	struct kv_redis *r = h->priv;
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

static int kv_redis_get(shift_kv *h, const char *k, size_t klen, void **v,
			size_t *vlen, uint64_t deadline_ns)
{
	struct kv_redis *r = h->priv;
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

static int kv_redis_mget(shift_kv *h, const char *const *k,
			 const size_t *klen, size_t n, void **v, size_t *vlen,
			 uint64_t deadline_ns)
{
	struct kv_redis *r = h->priv;
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

static int kv_redis_del(shift_kv *h, const char *k, size_t klen,
			uint64_t deadline_ns)
{
	struct kv_redis *r = h->priv;
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
