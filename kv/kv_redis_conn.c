/*
 * kv/kv_redis_conn.c - one connection to one Redis server (kv_redis_conn.h):
 * redisConnectWithTimeout for the TCP connection, the redisFormatCommand*
 * family for the request, the hiredis reader for the reply; the socket I/O
 * in between is kv_redis_io.c's, non-blocking under poll() against each
 * command's absolute deadline.  The failure model and the back-off are
 * kv_redis.c's (its header comment); on a cluster connection MOVED, ASK and
 * TRYAGAIN become KV_REDIS_REDIRECT and KV_REDIS_TRYAGAIN.
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
#include "kv/kv_redis_conn.h"
#include "kv/kv_redis_io.h"
#include "kv/kv_redis_sentinel.h"
#include "shift/base/log.h"

/* ---- connection state ---- */

static struct timeval kv_tv(int ms)
{
	struct timeval tv = { .tv_sec = ms / 1000,
			      .tv_usec = (suseconds_t)(ms % 1000) * 1000 };
	return tv;
}

void kv_redis_drop(struct kv_redis *r)
{
	kv_tls_free(r->ssl);
	r->ssl = NULL;
	if (r->c) {
		redisFree(r->c);
		r->c = NULL;
	}
}

/* Drop the context (if any) and schedule the next reconnect attempt. */
void kv_redis_fail(shift_kv *h, struct kv_redis *r, const char *why)
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

/* ASK: the next command alone may touch the slot being imported.  False
 * (with *e) if the round trip failed. */
static bool kv_redis_asking(struct kv_redis *r, uint64_t deadline, struct kv_rio_err *e)
{
	static const char asking[] = "*1\r\n$6\r\nASKING\r\n";
	redisReply *rep;

	r->asking = false;
	rep = kv_rio_roundtrip(r->c, r->ssl, asking, sizeof(asking) - 1, deadline, 64, 1, e);
	if (rep)
		freeReplyObject(rep);
	return rep != NULL;
}

/* Run one formatted command (cmd, len from redisFormatCommand*, freed
 * here) before the deadline.  Returns the reply (caller frees) or NULL
 * with *rc set and the context dropped. */
static redisReply *kv_redis_run(shift_kv *h, struct kv_redis *r,
				uint64_t deadline, int *rc, char *cmd, int len,
				const struct kv_keys *keys, size_t max)
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
	rep = NULL;
	if (!r->asking || kv_redis_asking(r, deadline, &e))
		rep = kv_rio_roundtrip(r->c, r->ssl, cmd, (size_t)len, deadline, max,
				       SHIFT_KV_MGET_MAX, &e);
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

redisReply *kv_redis_cmd(shift_kv *h, struct kv_redis *r,
				uint64_t deadline, int *rc,
				const struct kv_keys *keys, const char *fmt, ...)
{
	char *cmd = NULL;
	va_list ap;
	int len;

	va_start(ap, fmt);
	len = redisvFormatCommand(&cmd, fmt, ap);
	va_end(ap);
	return kv_redis_run(h, r, deadline, rc, cmd, len, keys, h->opts.max_reply);
}

redisReply *kv_redis_cmd_argv(shift_kv *h, struct kv_redis *r,
				     uint64_t deadline, int *rc, int argc,
				     const char **argv, const size_t *argvlen,
				     const struct kv_keys *keys)
{
	char *cmd = NULL;
	int len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);

	return kv_redis_run(h, r, deadline, rc, cmd, len, keys, h->opts.max_reply);
}

/* "MOVED slot host:port" or "ASK slot host:port" into r->redir: 0, or
 * -1 for any other error (or one that does not parse). */
static int kv_redis_redirected(struct kv_redis *r, const char *e)
{
	struct kv_redis_redirect d = { .ask = !strncmp(e, "ASK ", 4) };
	const char *p = d.ask ? e + 4 : !strncmp(e, "MOVED ", 6) ? e + 6 : NULL;
	const char *colon;
	char *end;
	long v;

	if (!p)
		return -1;
	v = strtol(p, &end, 10);
	if (end == p || *end != ' ' || v < 0 || v > 16383)
		return -1;
	d.slot = (int)v;
	p = end + 1;
	colon = strrchr(p, ':');
	if (!colon || colon == p || (size_t)(colon - p) >= sizeof(d.to.host))
		return -1;
	v = strtol(colon + 1, &end, 10);
	if (end == colon + 1 || *end || v < 1 || v > 65535)
		return -1;
	memcpy(d.to.host, p, (size_t)(colon - p));
	d.to.host[colon - p] = '\0';
	d.to.port = (int)v;
	r->redir = d;
	return 0;
}

/* Map a REDIS_REPLY_ERROR to an errno code with a message.  Frees rep. */
int kv_redis_reply_err(struct kv_redis *r, redisReply *rep,
			      const char *what)
{
	int rc = -EPROTO;

	if (r->cluster && rep->type == REDIS_REPLY_ERROR && !kv_redis_redirected(r, rep->str)) {
		freeReplyObject(rep);
		return KV_REDIS_REDIRECT;
	}
	if (r->cluster && rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "TRYAGAIN", 8)) {
		freeReplyObject(rep);
		return kv_err(KV_REDIS_TRYAGAIN, "%s: %s: TRYAGAIN", r->where, what);
	}
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
	/* a cluster that lost a slot's every copy */
	if (rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "CLUSTERDOWN", 11))
		rc = -ENOTCONN;
	if (rep->type == REDIS_REPLY_ERROR)
		kv_err(rc, "%s: %s refused: %.200s%s", r->where, what, rep->str,
		       !r->cluster && !strncmp(rep->str, "MOVED ", 6)
			       ? " (a Redis Cluster: use a redis-cluster:// URL)" : "");
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

size_t kv_redis_where_addrs(const shift_kv *h, char *buf, size_t cap, const char *scheme)
{
	size_t n = (size_t)snprintf(buf, cap, "%s://%s%s", scheme, h->url.user,
				    h->url.user[0] ? "@" : "");

	for (int i = 0; i < h->url.naddrs && n < cap; i++) {
		const struct shift_kv_addr *a = &h->url.addr[i];
		bool v6 = strchr(a->host, ':') != NULL;
		int w = snprintf(buf + n, cap - n, "%s%s%s%s:%d", i ? "," : "", v6 ? "[" : "",
				 a->host, v6 ? "]" : "", a->port);

		n += w > 0 ? (size_t)w : 0;
	}
	return n < cap ? n : cap - 1;
}

/* redis-sentinel://: set r->primary from the sentinels; a primary other
 * than the last one is logged (once per change). */
static int kv_redis_ask_sentinels(shift_kv *h, struct kv_redis *r, uint64_t deadline)
{
	struct shift_kv_addr a;
	char why[400];

	if (kv_sentinel_primary(h, r->tls_ctx, &r->sent_next, deadline, &a, why, sizeof(why))) {
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
static int kv_redis_check_primary(shift_kv *h, struct kv_redis *r, uint64_t deadline)
{
	char why[200], w[480];
	int rc = kv_sentinel_check_role(r->c, r->ssl, deadline, why, sizeof(why));

	if (!rc)
		return 0;
	snprintf(w, sizeof(w), "%.256s:%d %.200s", r->primary.host, r->primary.port, why);
	kv_redis_fail(h, r, w);
	return kv_err(-ENOTCONN, "%s: %s", r->where, w);
}

/* "redis-sentinel://[user@]s1:p1,s2:p2/master/db". */
static void kv_redis_sentinel_where(const shift_kv *h, struct kv_redis *r)
{
	size_t cap = sizeof(r->where);
	size_t n = kv_redis_where_addrs(h, r->where, cap,
					h->url.tls ? "rediss-sentinel" : "redis-sentinel");

	if (n < cap)
		snprintf(r->where + n, cap - n, "/%s/%d", h->url.master, h->url.db);
	snprintf(r->last_err, sizeof(r->last_err), "not connected yet");
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
int kv_redis_connect(shift_kv *h, struct kv_redis *r, uint64_t deadline)
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
	const char *host = r->cluster ? r->node.host : h->url.host;
	int port = r->cluster ? r->node.port : h->url.port;

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
void kv_redis_ok(struct kv_redis *r)
{
	r->backoff_ms = 0;
	r->next_try_ns = 0;
}

/* "redis://[user@]host:port/db", without the password. */
static void kv_redis_where(const shift_kv *h, struct kv_redis *r, const char *scheme,
			   const char *host, int port)
{
	const char *fmt = strchr(host, ':') ? "%s://%s%s[%s]:%d/%d" : "%s://%s%s%s:%d/%d";

	snprintf(r->where, sizeof(r->where), fmt, scheme, h->url.user, h->url.user[0] ? "@" : "",
		 host, port, h->url.db);
	snprintf(r->last_err, sizeof(r->last_err), "not connected yet");
}


void kv_redis_url_init(const shift_kv *h, struct kv_redis *r)
{
	if (h->url.scheme == SHIFT_KV_SCHEME_SENTINEL)
		kv_redis_sentinel_where(h, r);
	else
		kv_redis_where(h, r, h->url.tls ? "rediss" : "redis", h->url.host, h->url.port);
}

int kv_redis_tls_ctx(const shift_kv *h, const char *where, SSL_CTX **ctx)
{
	char why[300];

	*ctx = NULL;
	if (!h->url.tls)
		return 0;
	*ctx = kv_tls_ctx_new(h->opts.tls_ca, h->opts.tls_cert, h->opts.tls_key, why, sizeof(why));
	return *ctx ? 0 : kv_err(-EINVAL, "%s: %s", where, why);
}

void kv_redis_node_init(const shift_kv *h, struct kv_redis *r, const struct shift_kv_addr *a)
{
	memset(r, 0, sizeof(*r));
	r->cluster = true;
	r->node = *a;
	kv_redis_where(h, r, h->url.tls ? "rediss-cluster" : "redis-cluster", a->host, a->port);
}

redisReply *kv_redis_call(shift_kv *h, struct kv_redis *r, uint64_t deadline, int *rc, int argc,
			  const char **argv, size_t max)
{
	char *cmd = NULL;
	int len;
	redisReply *rep;

	*rc = kv_redis_connect(h, r, deadline);
	if (*rc)
		return NULL;
	len = redisFormatCommandArgv(&cmd, argc, argv, NULL);
	rep = kv_redis_run(h, r, deadline, rc, cmd, len, NULL, max);
	if (rep)
		kv_redis_ok(r);
	return rep;
}
