/*
 * kv/kv_tls.h - TLS under the Redis backend's own socket I/O (rediss://),
 * on OpenSSL's libssl.  Internal to kv_redis.c and kv_redis_io.c.
 *
 * The handshake and every read and write run on the non-blocking socket
 * against the command's absolute deadline, like the plaintext I/O
 * (kv_redis_io.h): a server that stalls the handshake or drips records
 * costs no more than the deadline.  The socket's BIO sends with
 * MSG_NOSIGNAL, so a peer that hangs up never raises SIGPIPE in the
 * application.  The server is verified against SHIFT_KV_TLS_CA (else the
 * system's trust store) and the URL's host name or IP; SHIFT_KV_TLS_CERT
 * and SHIFT_KV_TLS_KEY present a client certificate (Redis's
 * tls-auth-clients).
 */
#ifndef SHIFT_KV_TLS_H
#define SHIFT_KV_TLS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <openssl/ssl.h>

/* A client context for ca (NULL/"": the system's trust store) and the
 * optional cert + key pair (both or neither); NULL with why on failure. */
SSL_CTX *kv_tls_ctx_new(const char *ca, const char *cert, const char *key, char *why,
			size_t cap);
void kv_tls_ctx_free(SSL_CTX *ctx);

/* The handshake on connected non-blocking socket fd, verifying host,
 * before deadline_ns (CLOCK_MONOTONIC); the session, or NULL with why. */
SSL *kv_tls_start(SSL_CTX *ctx, int fd, const char *host, uint64_t deadline_ns, char *why,
		  size_t cap);
/* (no close_notify: the socket is about to be closed anyway) */
void kv_tls_free(SSL *s);

/* One write or read: bytes moved (> 0); 0 when the socket must first be
 * ready for *ev (POLLIN or POLLOUT, either way round for TLS); -1 on an
 * error or the server's close, with why. */
ssize_t kv_tls_send(SSL *s, const void *buf, size_t n, short *ev, char *why, size_t cap);
ssize_t kv_tls_recv(SSL *s, void *buf, size_t n, short *ev, char *why, size_t cap);

#endif /* SHIFT_KV_TLS_H */
