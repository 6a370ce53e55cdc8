/*
 * kv/kv_redis_sentinel.c - which server is the primary, asked of Redis
 * Sentinel (redis-sentinel:// URLs; rediss-sentinel:// asks the sentinels
 * over TLS too).  Internal to kv_redis.c.
 *
 * The client side of Sentinel is small and follows the Sentinel client
 * guidelines: at every (re)connect ask the sentinels in turn, starting
 * with the one that answered last, `SENTINEL get-master-addr-by-name M`;
 * the first that names an address wins, and a sentinel that does not
 * answer within its share of the command's deadline is skipped.  The
 * caller then connects there and checks with ROLE that the server really
 * is a primary: during a failover a sentinel may still name the old one,
 * and a demoted primary that came back is a replica.  A connection that
 * later breaks, or a write refused with READONLY, drops the context
 * (kv_redis.c), so the next command asks the sentinels again: a primary
 * that failed over is followed without a restart.
 *
 * Every step runs under the command's one deadline with the socket I/O of
 * kv_redis_io.c (non-blocking, bounded replies): a sentinel that hangs or
 * floods costs the caller no more than any other Redis server.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "kv/kv_backend.h"
#include "kv/kv_redis_io.h"
#include "kv/kv_redis_sentinel.h"

/* A sentinel's answer is two short strings; INFO replication a few lines
 * per replica.  Nothing longer is read. */
#define KV_SENTINEL_MAX_REPLY 512
#define KV_INFO_MAX_REPLY 16384

static int kv_sent_ms(uint64_t deadline, int connect_ms, int left_sentinels)
{
	int left = kv_ms_left(deadline);
	/* keep time for the primary itself: a sentinel gets at most half of
	 * what is left, shared with the sentinels still to try */
	int share = left / 2 / (left_sentinels > 0 ? left_sentinels : 1);

	if (share < 1)
		share = left > 0 ? 1 : 0;
	return share < connect_ms ? share : connect_ms;
}

/* One round trip of cmd (argv) to an already connected context (ssl: its
 * TLS session, or NULL). */
static redisReply *kv_sent_cmd(redisContext *c, SSL *ssl, uint64_t deadline, int argc,
			       const char **argv, size_t max, char *why, size_t whycap)
{
	struct kv_rio_err e;
	char *cmd = NULL;
	int len = redisFormatCommandArgv(&cmd, argc, argv, NULL);
	redisReply *rep;

	if (len < 0) {
		snprintf(why, whycap, "cannot format %s", argv[0]);
		return NULL;
	}
	rep = kv_rio_roundtrip(c, ssl, cmd, (size_t)len, deadline,
			       max, 4, &e);
	redisFreeCommand(cmd);
	if (!rep)
		snprintf(why, whycap, "%s: %s", argv[0], e.why);
	return rep;
}

/* Parse "[ip, port]" into out; 0 or -1 with why. */
static int kv_sent_parse(const redisReply *rep, struct shift_kv_addr *out,
			 char *why, size_t whycap)
{
	char *end = NULL;
	long port;

	if (rep->type == REDIS_REPLY_NIL) {
		snprintf(why, whycap, "does not know the master");
		return -1;
	}
	if (rep->type == REDIS_REPLY_ERROR) {
		snprintf(why, whycap, "refused: %.100s", rep->str);
		return -1;
	}
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
	    rep->element[0]->type != REDIS_REPLY_STRING ||
	    rep->element[1]->type != REDIS_REPLY_STRING ||
	    rep->element[0]->len == 0 ||
	    (size_t)rep->element[0]->len >= sizeof(out->host) ||
	    memchr(rep->element[0]->str, '\0', (size_t)rep->element[0]->len)) {
		snprintf(why, whycap, "answered something that is not [ip, port]");
		return -1;
	}
	port = strtol(rep->element[1]->str, &end, 10);
	if (!end || *end || port < 1 || port > 65535) {
		snprintf(why, whycap, "answered a bad port");
		return -1;
	}
	memcpy(out->host, rep->element[0]->str, (size_t)rep->element[0]->len);
	out->host[rep->element[0]->len] = '\0';
	out->port = (int)port;
	return 0;
}

/* Ask one sentinel; 0 with *out, or -1 with why. */
static int kv_sent_ask(const shift_kv *h, SSL_CTX *tls, const struct shift_kv_addr *s,
		       uint64_t deadline, int ms, struct shift_kv_addr *out,
		       char *why, size_t whycap)
{
	const char *argv[] = { "SENTINEL", "get-master-addr-by-name", h->url.master };
	struct timeval tv = { .tv_sec = ms / 1000,
			      .tv_usec = (suseconds_t)(ms % 1000) * 1000 };
	redisContext *c;
	redisReply *rep;
	SSL *ssl = NULL;
	int rc = -1;

	if (ms <= 0) {
		snprintf(why, whycap, "no time left");
		return -1;
	}
	c = redisConnectWithTimeout(s->host, s->port, tv);
	if (!c || c->err || kv_rio_nonblock(c)) {
		snprintf(why, whycap, "connect: %s",
			 !c ? "out of memory" : c->err ? c->errstr : "socket mode");
		if (c)
			redisFree(c);
		return -1;
	}
	/* the sentinel's share, not the whole command's deadline */
	uint64_t mine = kv_now_ns() + (uint64_t)ms * 1000000ull;

	if (mine > deadline)
		mine = deadline;
	if (tls && !(ssl = kv_tls_start(tls, c->fd, s->host, mine, why, whycap))) {
		redisFree(c);
		return -1;
	}
	rep = kv_sent_cmd(c, ssl, mine, 3, argv, KV_SENTINEL_MAX_REPLY, why, whycap);
	if (rep) {
		rc = kv_sent_parse(rep, out, why, whycap);
		freeReplyObject(rep);
	}
	kv_tls_free(ssl);
	redisFree(c);
	return rc;
}

int kv_sentinel_primary(const shift_kv *h, SSL_CTX *tls, int *next, uint64_t deadline,
			struct shift_kv_addr *out, char *why, size_t whycap)
{
	int n = h->url.naddrs;
	size_t used = 0;

	why[0] = '\0';
	for (int i = 0; i < n; i++) {
		int k = (*next + i) % n;
		const struct shift_kv_addr *s = &h->url.addr[k];
		char one[200];
		int ms = kv_sent_ms(deadline, h->opts.connect_timeout_ms, n - i);

		if (!kv_sent_ask(h, tls, s, deadline, ms, out, one, sizeof(one))) {
			*next = k;
			return 0;
		}
		if (used < whycap) {
			int w = snprintf(why + used, whycap - used, "%s%s:%d %s",
					 used ? "; " : "", s->host, s->port, one);

			used += w > 0 ? (size_t)w : 0;
		}
	}
	return -1;
}

int kv_sentinel_check_role(redisContext *c, SSL *ssl, uint64_t deadline, char *why,
			   size_t whycap)
{
	/* INFO, not ROLE: ROLE's reply nests arrays, which the bounded
	 * reader refuses */
	const char *argv[] = { "INFO", "replication" };
	redisReply *rep = kv_sent_cmd(c, ssl, deadline, 2, argv, KV_INFO_MAX_REPLY,
				      why, whycap);
	const char *role;
	int rc = 0;

	if (!rep)
		return -2; /* the connection is in an unknown state */
	/* a server that refuses INFO (an ACL user without +info) is taken
	 * on the sentinels' word; only a server that says it is a replica
	 * is refused */
	if (rep->type == REDIS_REPLY_STRING &&
	    (role = strstr(rep->str, "role:")) && strncmp(role + 5, "master", 6)) {
		snprintf(why, whycap, "is a replica, not the primary");
		rc = -1;
	}
	freeReplyObject(rep);
	return rc;
}
