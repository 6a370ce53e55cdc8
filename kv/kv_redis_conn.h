/*
 * kv/kv_redis_conn.h - one connection to one Redis server and the four
 * commands SHIFT sends on it (kv_redis.c).  Internal to the Redis
 * backends: kv_redis.c itself (redis://, rediss://, redis-sentinel://: one
 * connection per handle) and kv_redis_cluster.c (redis-cluster://: one
 * connection per cluster primary).
 *
 * A connection dials lazily, authenticates and selects its db within the
 * command's deadline, drops itself on any failed round trip and backs off
 * after repeated failures (kv_redis.c says how).  On a cluster connection
 * a MOVED or ASK reply is not an error but a redirect, returned as
 * KV_REDIS_REDIRECT with its target in redir; TRYAGAIN (a multi-key
 * command during a slot migration) is KV_REDIS_TRYAGAIN.  Neither code
 * ever leaves the kv layer.
 */
#ifndef SHIFT_KV_REDIS_CONN_H
#define SHIFT_KV_REDIS_CONN_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "kv/kv_backend.h"
#include "kv/kv_tls.h"

#define KV_REDIS_REDIRECT (-EXDEV)  /* MOVED/ASK: see redir */
#define KV_REDIS_TRYAGAIN (-EAGAIN) /* TRYAGAIN: the same node, shortly */

struct kv_redis_redirect {
	bool ask;                 /* ASK (one command) rather than MOVED */
	int slot;                 /* 0..16383 */
	struct shift_kv_addr to;  /* the node that serves it */
};

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
	/* redis-cluster:// only: this node's address, ASKING to be sent
	 * before the next command, and the last redirect */
	bool cluster;
	bool asking;
	struct shift_kv_addr node;
	struct kv_redis_redirect redir;
};

/* The keys a command reads, to name the one whose reply was refused. */
struct kv_keys {
	const char *const *k;
	const size_t *len;
	size_t n;
};

/* ---- the connection (kv_redis_conn.c) ---- */

/* Names (r->where) for the connection of a redis://, rediss:// or
 * redis-sentinel:// handle: "SCHEME://[user@]host:port/db" (no password). */
void kv_redis_url_init(const shift_kv *h, struct kv_redis *r);
/* "SCHEME://[user@]a1:p1,a2:p2..." of h's addresses (sentinels, seeds)
 * into buf; the length written. */
size_t kv_redis_where_addrs(const shift_kv *h, char *buf, size_t cap, const char *scheme);
/* The TLS context of a rediss*:// handle h (its settings' CA and client
 * certificate) into *ctx, NULL for the plaintext schemes: 0, or -EINVAL
 * naming where and why. */
int kv_redis_tls_ctx(const shift_kv *h, const char *where, SSL_CTX **ctx);
/* A connection (not yet dialled) to cluster node a of h: r zeroed first. */
void kv_redis_node_init(const shift_kv *h, struct kv_redis *r, const struct shift_kv_addr *a);
/* Close the socket, keep the rest (back-off, names). */
void kv_redis_drop(struct kv_redis *r);
/* Drop and schedule the next reconnect attempt; why is remembered. */
void kv_redis_fail(shift_kv *h, struct kv_redis *r, const char *why);

/* Make sure r is connected, authenticated, on the right db (and, for
 * Sentinel, to the primary), all before deadline. */
int kv_redis_connect(shift_kv *h, struct kv_redis *r, uint64_t deadline);
/* A command reached the server and came back: the link is healthy. */
void kv_redis_ok(struct kv_redis *r);
/* One command, formatted (redisFormatCommand) or argv, before deadline:
 * the reply (freeReplyObject), or NULL with *rc and r dropped. */
redisReply *kv_redis_cmd(shift_kv *h, struct kv_redis *r, uint64_t deadline, int *rc,
			 const struct kv_keys *keys, const char *fmt, ...);
redisReply *kv_redis_cmd_argv(shift_kv *h, struct kv_redis *r, uint64_t deadline, int *rc,
			      int argc, const char **argv, const size_t *argvlen,
			      const struct kv_keys *keys);
/* A reply that is an error or of the wrong type, as an errno code with a
 * message (KV_REDIS_REDIRECT/TRYAGAIN on a cluster connection); frees rep. */
int kv_redis_reply_err(struct kv_redis *r, redisReply *rep, const char *what);
/* Any other command (argv) whose reply may carry values up to max bytes,
 * connecting first: the reply (freeReplyObject; may be an error reply) or
 * NULL with *rc. */
redisReply *kv_redis_call(shift_kv *h, struct kv_redis *r, uint64_t deadline, int *rc, int argc,
			  const char **argv, size_t max);

/* ---- the commands (kv_redis.c) ---- */

/* The commands, on r, before deadline; as the backend operations of
 * kv_backend.h, plus KV_REDIS_REDIRECT / KV_REDIS_TRYAGAIN on a cluster
 * connection. */
int kv_redis_put_on(shift_kv *h, struct kv_redis *r, const char *k, size_t klen, const void *v,
		    size_t vlen, uint64_t ttl_ms, uint64_t deadline);
int kv_redis_get_on(shift_kv *h, struct kv_redis *r, const char *k, size_t klen, void **v,
		    size_t *vlen, uint64_t deadline);
int kv_redis_mget_on(shift_kv *h, struct kv_redis *r, const char *const *k, const size_t *klen,
		     size_t n, void **v, size_t *vlen, uint64_t deadline);
int kv_redis_del_on(shift_kv *h, struct kv_redis *r, const char *k, size_t klen,
		    uint64_t deadline);

#endif /* SHIFT_KV_REDIS_CONN_H */
