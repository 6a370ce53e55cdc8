/*
 * kv/kv_redis_io.h - one Redis round trip against an absolute deadline,
 * with a limit on what the reply may make us hold in memory.  Internal to
 * kv_redis.c.
 *
 * hiredis' synchronous API bounds each read(2) (SO_RCVTIMEO), not the
 * command: a server that drips its reply a byte at a time holds the caller
 * for ever, and its reader buffers a whole bulk string, however long, before
 * handing it over.  So the socket is put in non-blocking mode and this file
 * does the I/O itself: send() and recv() under poll() until the deadline,
 * each received chunk first checked by a small RESP header scanner (bulk
 * lengths, array sizes, line lengths, nesting) and only then fed to the
 * hiredis reader (redisReaderFeed), which builds the reply object.  A reply
 * that announces a value above the limit is refused as soon as its length
 * header arrives; its body is never read.
 */
#ifndef SHIFT_KV_REDIS_IO_H
#define SHIFT_KV_REDIS_IO_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "kv/kv_tls.h"

enum kv_rio_kind {
	KV_RIO_TIMEOUT = 1, /* the deadline passed (nothing or part received) */
	KV_RIO_IO,          /* send/recv/poll failed, or EOF */
	KV_RIO_TOOBIG,      /* a value or array above the limit was announced */
	KV_RIO_PROTO,       /* not RESP, nested array, bytes after the reply */
};

struct kv_rio_err {
	enum kv_rio_kind kind;
	long long size;  /* TOOBIG: announced length (bytes, or elements) */
	int idx;         /* TOOBIG: which value of the reply (0 = first;
			  * MGET: the i-th key) */
	size_t received; /* reply bytes received before the failure */
	char why[160];
};

/* Put the context's socket in non-blocking mode; 0 or -1 (errno). */
int kv_rio_nonblock(redisContext *c);

/*
 * Send the formatted command cmd[0..len) (through TLS session ssl unless
 * NULL) and read its one reply before
 * deadline_ns (CLOCK_MONOTONIC).  Every bulk string and status/error line of
 * the reply must be at most max_value bytes, and an array at most
 * max_elems elements.  Returns the reply (freeReplyObject) or NULL with *e
 * filled; after NULL the connection is in an unknown state and must be
 * dropped.  Never raises SIGPIPE (MSG_NOSIGNAL).
 */
redisReply *kv_rio_roundtrip(redisContext *c, SSL *ssl, const char *cmd, size_t len,
			     uint64_t deadline_ns, size_t max_value,
			     size_t max_elems, struct kv_rio_err *e);

#endif /* SHIFT_KV_REDIS_IO_H */
