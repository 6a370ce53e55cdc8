/*
 * kv/kv_tls.c - TLS for the Redis backend (see kv_tls.h), OpenSSL's libssl.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "kv/kv_backend.h"
#include "kv/kv_tls.h"

/* ---- a socket BIO that never raises SIGPIPE ---- */

static int sock_write(BIO *b, const char *buf, int n)
{
	ssize_t k = send((int)(intptr_t)BIO_get_data(b), buf, (size_t)n, MSG_NOSIGNAL);

	BIO_clear_retry_flags(b);
	if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		BIO_set_retry_write(b);
	return (int)k;
}

static int sock_read(BIO *b, char *buf, int n)
{
	ssize_t k = recv((int)(intptr_t)BIO_get_data(b), buf, (size_t)n, 0);

	BIO_clear_retry_flags(b);
	if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		BIO_set_retry_read(b);
	return (int)k;
}

static long sock_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	(void)b;
	(void)num;
	(void)ptr;
	return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static BIO_METHOD *sock_meth;

static void sock_method_make(void)
{
	BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "shift-kv-socket");

	if (m && BIO_meth_set_write(m, sock_write) && BIO_meth_set_read(m, sock_read) &&
	    BIO_meth_set_ctrl(m, sock_ctrl))
		sock_meth = m;
	else if (m)
		BIO_meth_free(m);
}

static BIO *sock_bio(int fd)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	BIO *b;

	pthread_once(&once, sock_method_make);
	b = sock_meth ? BIO_new(sock_meth) : NULL;
	if (b) {
		BIO_set_data(b, (void *)(intptr_t)fd);
		BIO_set_init(b, 1);
	}
	return b;
}

/* ---- errors ---- */

/* OpenSSL's first queued error (or what), into why; the queue emptied. */
static void tls_why(const char *what, char *why, size_t cap)
{
	unsigned long e = ERR_get_error();
	char buf[200];

	if (e) {
		ERR_error_string_n(e, buf, sizeof(buf));
		snprintf(why, cap, "%s: %s", what, buf);
	} else {
		snprintf(why, cap, "%s", what);
	}
	ERR_clear_error();
}

SSL_CTX *kv_tls_ctx_new(const char *ca, const char *cert, const char *key, char *why,
			size_t cap)
{
	SSL_CTX *ctx;
	bool has_cert = cert && *cert, has_key = key && *key;

	if (has_cert != has_key) {
		snprintf(why, cap, "TLS: SHIFT_KV_TLS_CERT and SHIFT_KV_TLS_KEY go together");
		return NULL;
	}
	ERR_clear_error();
	ctx = SSL_CTX_new(TLS_client_method());
	if (!ctx) {
		tls_why("TLS: no context", why, cap);
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	if (ca && *ca ? SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1
		      : SSL_CTX_set_default_verify_paths(ctx) != 1) {
		tls_why(ca && *ca ? "TLS: SHIFT_KV_TLS_CA unusable" : "TLS: no system trust store",
			why, cap);
		goto fail;
	}
	if (has_cert && (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1 ||
			 SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
			 SSL_CTX_check_private_key(ctx) != 1)) {
		tls_why("TLS: SHIFT_KV_TLS_CERT/SHIFT_KV_TLS_KEY unusable", why, cap);
		goto fail;
	}
	return ctx;
fail:
	SSL_CTX_free(ctx);
	return NULL;
}

void kv_tls_ctx_free(SSL_CTX *ctx)
{
	SSL_CTX_free(ctx);
}

/* Is host an IPv4 or IPv6 literal? */
static bool is_ip(const char *host)
{
	unsigned char a[16];

	return inet_pton(AF_INET, host, a) == 1 || inet_pton(AF_INET6, host, a) == 1;
}

/* What to wait for after rc of an SSL call: POLLIN/POLLOUT, or 0 (an
 * error: why filled). */
static short tls_want(SSL *s, int rc, const char *what, char *why, size_t cap)
{
	int err = SSL_get_error(s, rc);

	if (err == SSL_ERROR_WANT_READ)
		return POLLIN;
	if (err == SSL_ERROR_WANT_WRITE)
		return POLLOUT;
	if (err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && !ERR_peek_error() &&
					     !errno)) {
		snprintf(why, cap, "%s: connection closed by the server", what);
		ERR_clear_error();
		return 0;
	}
	long v = SSL_get_verify_result(s);

	if (v != X509_V_OK) {
		snprintf(why, cap, "%s: server certificate refused: %s", what,
			 X509_verify_cert_error_string(v));
		ERR_clear_error();
		return 0;
	}
	if (err == SSL_ERROR_SYSCALL && !ERR_peek_error())
		snprintf(why, cap, "%s: %s", what, strerror(errno));
	else
		tls_why(what, why, cap);
	return 0;
}

SSL *kv_tls_start(SSL_CTX *ctx, int fd, const char *host, uint64_t deadline_ns, char *why,
		  size_t cap)
{
	SSL *s = SSL_new(ctx);
	BIO *b = s ? sock_bio(fd) : NULL;

	if (!b) {
		tls_why("TLS: no session", why, cap);
		SSL_free(s);
		return NULL;
	}
	SSL_set_bio(s, b, b);
	/* the server's certificate must name the host SHIFT asked for */
	if (is_ip(host) ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s), host) != 1
			: SSL_set1_host(s, host) != 1 || SSL_set_tlsext_host_name(s, host) != 1) {
		tls_why("TLS: host name", why, cap);
		SSL_free(s);
		return NULL;
	}
	for (;;) {
		errno = 0;
		int rc = SSL_connect(s);

		if (rc == 1)
			return s;
		short ev = tls_want(s, rc, "TLS handshake", why, cap);
		int ms = kv_ms_left(deadline_ns);
		struct pollfd p = { .fd = fd, .events = ev };

		if (!ev)
			break;
		if (ms <= 0) {
			snprintf(why, cap, "TLS handshake: no answer within the deadline");
			break;
		}
		if (poll(&p, 1, ms) < 0 && errno != EINTR) {
			snprintf(why, cap, "TLS handshake: poll: %s", strerror(errno));
			break;
		}
	}
	SSL_free(s);
	return NULL;
}

void kv_tls_free(SSL *s)
{
	SSL_free(s);
}

ssize_t kv_tls_send(SSL *s, const void *buf, size_t n, short *ev, char *why, size_t cap)
{
	size_t done = 0;

	errno = 0;
	if (SSL_write_ex(s, buf, n, &done) == 1)
		return (ssize_t)done;
	*ev = tls_want(s, 0, "TLS write", why, cap);
	return *ev ? 0 : -1;
}

ssize_t kv_tls_recv(SSL *s, void *buf, size_t n, short *ev, char *why, size_t cap)
{
	size_t got = 0;

	errno = 0;
	if (SSL_read_ex(s, buf, n, &got) == 1)
		return (ssize_t)got;
	*ev = tls_want(s, 0, "TLS read", why, cap);
	return *ev ? 0 : -1;
}
