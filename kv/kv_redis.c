/*
 * kv/kv_redis.c - Redis kv backend on the hiredis synchronous API.
 *
 * Only calls present in hiredis 0.14.1 are used (redisConnectWithTimeout,
 * redisSetTimeout, redisvCommand, freeReplyObject, redisFree), so the code
 * builds against hiredis 1.x too.  One redisContext per handle; kv.c holds
 * the handle lock around every call here, since a context is not
 * thread-safe.
 *
 * Failure model (hiredis semantics): a NULL reply means the context is
 * broken (I/O error, EOF, or a command timeout which shows as EAGAIN) - it
 * is freed and the next call reconnects; a REDIS_REPLY_ERROR is the server
 * refusing.  Reconnects back off exponentially (retry_min_ms .. retry_max_ms)
 * after repeated failures, and a call made during the back-off fails at once
 * with -ENOTCONN, so an outage never turns into a tight loop or a hang.  The
 * first reconnect after a working connection broke is immediate.
 *
 * hiredis writes with write(2), so a peer that vanished could raise SIGPIPE
 * and kill an application that never asked for networking; every call that
 * may write blocks SIGPIPE in the calling thread and swallows one it caused.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "kv/kv.h"
#include "kv/kv_backend.h"

struct kv_redis {
	redisContext *c;       /* NULL while disconnected */
	int cur_timeout_ms;    /* last value given to redisSetTimeout, -1 none */
	uint64_t next_try_ns;  /* no reconnect attempt before this */
	int backoff_ms;        /* 0 = healthy; else next back-off step */
	char last_err[160];    /* why the last connection attempt/context died */
	char where[300];       /* "redis://[user@]host:port/db" without password */
};

/* ---- SIGPIPE guard ---- */

struct kv_sigpipe {
	sigset_t old;
	bool was_pending;
};

static void kv_sigpipe_block(struct kv_sigpipe *g)
{
	sigset_t set, pend;

	sigemptyset(&set);
	sigaddset(&set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &set, &g->old);
	sigpending(&pend);
	g->was_pending = sigismember(&pend, SIGPIPE) == 1;
}

static void kv_sigpipe_restore(struct kv_sigpipe *g)
{
	sigset_t set, pend;

	sigemptyset(&set);
	sigaddset(&set, SIGPIPE);
	sigpending(&pend);
	if (!g->was_pending && sigismember(&pend, SIGPIPE) == 1) {
		struct timespec zero = { 0, 0 };

		sigtimedwait(&set, NULL, &zero); /* ours: consume it */
	}
	pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* ---- connection state ---- */

static struct timeval kv_tv(int ms)
{
	struct timeval tv = { .tv_sec = ms / 1000,
			      .tv_usec = (suseconds_t)(ms % 1000) * 1000 };
	return tv;
}

/* Drop the context (if any) and schedule the next reconnect attempt. */
static void kv_redis_fail(shift_kv *h, struct kv_redis *r, const char *why)
{
	uint64_t now = kv_now_ns();

	if (why)
		snprintf(r->last_err, sizeof(r->last_err), "%s", why);
	if (r->c) {
		redisFree(r->c);
		r->c = NULL;
	}
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

/* Run one command bounded by min(command timeout, deadline): a printf-style
 * format (fmt, ap), or an argument vector (argc, argv, argvlen) when fmt is
 * NULL.  Returns the reply (caller frees) or NULL with *rc set and the
 * context dropped. */
static redisReply *kv_redis_cmd_v(shift_kv *h, struct kv_redis *r,
				  uint64_t deadline, int *rc, const char *fmt,
				  va_list *ap, int argc, const char **argv,
				  const size_t *argvlen)
{
	int left = kv_ms_left(deadline);
	int to = h->opts.command_timeout_ms;
	struct kv_sigpipe g;
	redisReply *rep;

	if (left <= 0) {
		*rc = kv_err(-ENOTCONN, "%s: deadline passed before the command",
			     r->where);
		return NULL;
	}
	if (left < to)
		to = left;
	if (to != r->cur_timeout_ms) {
		if (redisSetTimeout(r->c, kv_tv(to)) != REDIS_OK) {
			kv_redis_fail(h, r, "cannot set socket timeout");
			*rc = kv_err(-ENOTCONN, "%s: cannot set socket timeout",
				     r->where);
			return NULL;
		}
		r->cur_timeout_ms = to;
	}
	kv_sigpipe_block(&g);
	if (fmt)
		rep = redisvCommand(r->c, fmt, *ap);
	else
		rep = redisCommandArgv(r->c, argc, argv, argvlen);
	kv_sigpipe_restore(&g);
	if (!rep) {
		char why[160];
		bool timeout = r->c->err == REDIS_ERR_IO &&
			       (errno == EAGAIN || errno == EWOULDBLOCK);

		if (timeout)
			snprintf(why, sizeof(why), "no reply within %d ms", to);
		else
			snprintf(why, sizeof(why), "%s",
				 r->c->errstr[0] ? r->c->errstr : "connection lost");
		kv_redis_fail(h, r, why);
		*rc = kv_err(-ENOTCONN, "%s: %s", r->where, why);
		return NULL;
	}
	return rep;
}

static redisReply *kv_redis_cmd(shift_kv *h, struct kv_redis *r,
				uint64_t deadline, int *rc, const char *fmt,
				...)
{
	redisReply *rep;
	va_list ap;

	va_start(ap, fmt);
	rep = kv_redis_cmd_v(h, r, deadline, rc, fmt, &ap, 0, NULL, NULL);
	va_end(ap);
	return rep;
}

static redisReply *kv_redis_cmd_argv(shift_kv *h, struct kv_redis *r,
				     uint64_t deadline, int *rc, int argc,
				     const char **argv, const size_t *argvlen)
{
	return kv_redis_cmd_v(h, r, deadline, rc, NULL, NULL, argc, argv,
			      argvlen);
}

/* Map a REDIS_REPLY_ERROR to an errno code with a message.  Frees rep. */
static int kv_redis_reply_err(struct kv_redis *r, redisReply *rep,
			      const char *what)
{
	int rc = -EPROTO;

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

/* Make sure r->c is a connected, authenticated context on the right db. */
static int kv_redis_connect(shift_kv *h, struct kv_redis *r, uint64_t deadline)
{
	uint64_t now = kv_now_ns();
	int to = h->opts.connect_timeout_ms, left, rc = 0;
	struct kv_sigpipe g;
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
	kv_sigpipe_block(&g);
	r->c = redisConnectWithTimeout(h->url.host, h->url.port, kv_tv(to));
	kv_sigpipe_restore(&g);
	r->cur_timeout_ms = -1;
	if (!r->c || r->c->err) {
		char why[160];

		snprintf(why, sizeof(why), "connect (limit %d ms): %s", to,
			 r->c ? r->c->errstr : "out of memory");
		kv_redis_fail(h, r, why);
		return kv_err(-ENOTCONN, "%s: %s", r->where, why);
	}

	if (h->url.password[0]) {
		if (h->url.user[0])
			rep = kv_redis_cmd(h, r, deadline, &rc, "AUTH %b %b",
					   h->url.user, strlen(h->url.user),
					   h->url.password, strlen(h->url.password));
		else
			rep = kv_redis_cmd(h, r, deadline, &rc, "AUTH %b",
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
		rep = kv_redis_cmd(h, r, deadline, &rc, "SELECT %d", h->url.db);
		if (!rep)
			return kv_redis_setup_failed(h, r, rc);
		if (rep->type != REDIS_REPLY_STATUS) {
			rc = kv_redis_reply_err(r, rep, "SELECT");
			kv_redis_fail(h, r, "SELECT refused");
			return rc;
		}
		freeReplyObject(rep);
	}
	return 0;
}

/* A command reached the server and came back: the link is healthy. */
static void kv_redis_ok(struct kv_redis *r)
{
	r->backoff_ms = 0;
	r->next_try_ns = 0;
}

/* ---- backend operations ---- */

static int kv_redis_open(shift_kv *h)
{
	struct kv_redis *r = calloc(1, sizeof(*r));
	const char *fmt;
	int rc;

	if (!r)
		return kv_err(-ENOMEM, "kv redis: out of memory");
	fmt = strchr(h->url.host, ':') ? "redis://%s%s[%s]:%d/%d"
				       : "redis://%s%s%s:%d/%d";
	snprintf(r->where, sizeof(r->where), fmt, h->url.user,
		 h->url.user[0] ? "@" : "", h->url.host, h->url.port, h->url.db);
	snprintf(r->last_err, sizeof(r->last_err), "not connected yet");
	r->cur_timeout_ms = -1;
	h->priv = r;
	if (h->opts.lazy_connect)
		return 0;
	rc = kv_redis_connect(h, r, kv_now_ns() +
				     (uint64_t)(h->opts.connect_timeout_ms +
						h->opts.command_timeout_ms) *
					     1000000ull);
	if (rc) {
		if (r->c)
			redisFree(r->c);
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
	if (r->c)
		redisFree(r->c);
	free(r);
	h->priv = NULL;
}

static int kv_redis_put(shift_kv *h, const char *k, size_t klen, const void *v,
			size_t vlen, uint64_t ttl_ms, uint64_t deadline_ns)
{
	struct kv_redis *r = h->priv;
	redisReply *rep;
	int rc = kv_redis_connect(h, r, deadline_ns);

	if (rc)
		return rc;
	if (ttl_ms)
		rep = kv_redis_cmd(h, r, deadline_ns, &rc, "SET %b %b PX %llu",
				   k, klen, v, vlen, (unsigned long long)ttl_ms);
	else
		rep = kv_redis_cmd(h, r, deadline_ns, &rc, "SET %b %b", k, klen,
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
	redisReply *rep;
	int rc = kv_redis_connect(h, r, deadline_ns);

	if (rc)
		return rc;
	rep = kv_redis_cmd(h, r, deadline_ns, &rc, "GET %b", k, klen);
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
				argvlen);
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
	redisReply *rep;
	int rc = kv_redis_connect(h, r, deadline_ns);

	if (rc)
		return rc;
	rep = kv_redis_cmd(h, r, deadline_ns, &rc, "DEL %b", k, klen);
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
