/*
 * kv/kv_redis_io.c - a Redis round trip bounded by an absolute deadline and
 * by a reply size limit (see kv_redis_io.h).
 *
 * The scanner follows RESP2 as far as needed to know where a reply ends and
 * how large its parts claim to be: a type byte (+ - : $ *), a header line up
 * to CRLF, and for a bulk string ($N) N body bytes plus CRLF.  `pending`
 * counts the values still expected: 1 at the start, +N-1 for an array of N,
 * -1 per finished value; the reply is complete at 0.  SHIFT's commands
 * (SET, GET, DEL, MGET, AUTH, SELECT) never answer with nested arrays, so an
 * array anywhere but at the top is refused.  Checking the reply byte for
 * byte is the scanner's job; building it is left to the hiredis reader.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <hiredis/read.h>

#include "kv/kv_backend.h"
#include "kv/kv_redis_io.h"

#define KV_RIO_NUMLINE_MAX 24 /* "$" or "*" header: sign and digits */

enum kv_scan_st { SC_TYPE, SC_LINE, SC_BODY };
enum kv_scan_rc { SCAN_MORE, SCAN_DONE, SCAN_BIG, SCAN_BAD };

struct kv_scan {
	size_t max_value, max_elems;
	long long pending; /* values still expected; 0 = reply complete */
	enum kv_scan_st st;
	char type;         /* of the value being read */
	size_t line;       /* header bytes after the type byte */
	long long num;     /* "$" / "*" length so far */
	bool neg, digits;
	bool first;        /* no header finished yet */
	size_t body;       /* bulk bytes (with CRLF) still to pass */
	int vals;          /* non-array values finished */
	const char *bad;   /* SCAN_BAD: why */
	bool partial;      /* SCAN_BIG: the chunk ended inside the length */
};

static void kv_scan_init(struct kv_scan *s, size_t max_value, size_t max_elems)
{
	memset(s, 0, sizeof(*s));
	s->max_value = max_value;
	s->max_elems = max_elems;
	s->pending = 1;
	s->first = true;
}

static enum kv_scan_rc kv_scan_value_done(struct kv_scan *s)
{
	s->vals++;
	s->st = SC_TYPE;
	return --s->pending == 0 ? SCAN_DONE : SCAN_MORE;
}

static enum kv_scan_rc kv_scan_bad(struct kv_scan *s, const char *why)
{
	s->bad = why;
	return SCAN_BAD;
}

/* A header line ended (at '\n'). */
static enum kv_scan_rc kv_scan_line_end(struct kv_scan *s)
{
	bool first = s->first;

	s->first = false;
	if (s->type != '$' && s->type != '*')
		return kv_scan_value_done(s);
	if (!s->digits)
		return kv_scan_bad(s, "length header without digits");
	if (s->neg)
		return s->num == 1 ? kv_scan_value_done(s) /* nil */
				   : kv_scan_bad(s, "negative length");
	if (s->type == '$') {
		s->body = (size_t)s->num + 2;
		s->st = SC_BODY;
		return SCAN_MORE;
	}
	if (!first)
		return kv_scan_bad(s, "nested array");
	if (s->num == 0)
		return kv_scan_value_done(s);
	s->pending += s->num - 1;
	s->st = SC_TYPE;
	return SCAN_MORE;
}

/* One header byte after the type byte. */
static enum kv_scan_rc kv_scan_line_byte(struct kv_scan *s, char c)
{
	if (c == '\n')
		return kv_scan_line_end(s);
	s->line++;
	if (c == '\r')
		return SCAN_MORE;
	if (s->type != '$' && s->type != '*')
		return s->line > s->max_value ? SCAN_BIG : SCAN_MORE;
	if (s->line > KV_RIO_NUMLINE_MAX)
		return kv_scan_bad(s, "length header too long");
	if (c == '-' && s->line == 1) {
		s->neg = true;
		return SCAN_MORE;
	}
	if (c < '0' || c > '9')
		return kv_scan_bad(s, "non-digit in a length header");
	s->digits = true;
	s->num = s->num * 10 + (c - '0');
	if (s->neg)
		return s->num > 1 ? kv_scan_bad(s, "negative length") : SCAN_MORE;
	/* refuse as soon as the announced length passes the limit: the body
	 * (or the elements) are never read */
	if ((size_t)s->num > (s->type == '$' ? s->max_value : s->max_elems))
		return SCAN_BIG;
	return SCAN_MORE;
}

/* Scan buf[0..n).  *used = bytes that belong to the reply (all of them
 * unless SCAN_DONE came early, or the scan stopped). */
static enum kv_scan_rc kv_scan_feed(struct kv_scan *s, const char *buf,
				    size_t n, size_t *used)
{
	enum kv_scan_rc rc = SCAN_MORE;
	size_t i = 0;

	while (i < n && rc == SCAN_MORE) {
		if (s->st == SC_BODY) {
			size_t k = n - i < s->body ? n - i : s->body;

			s->body -= k;
			i += k;
			if (!s->body)
				rc = kv_scan_value_done(s);
			continue;
		}
		char c = buf[i++];

		if (s->st == SC_LINE) {
			rc = kv_scan_line_byte(s, c);
			/* refused: read the rest of the length in this chunk,
			 * for the message only */
			while (rc == SCAN_BIG && s->type != '+' && s->type != '-' &&
			       s->type != ':' && i < n && buf[i] >= '0' &&
			       buf[i] <= '9' && s->num < 100000000000000LL)
				s->num = s->num * 10 + (buf[i++] - '0');
			s->partial = rc == SCAN_BIG && i == n;
			continue;
		}
		if (!c || !strchr("+-:$*", c))
			return kv_scan_bad(s, "unknown reply type byte");
		s->type = c;
		s->line = 0;
		s->num = 0;
		s->neg = s->digits = false;
		s->st = SC_LINE;
	}
	*used = i;
	return rc;
}

/* ---- socket I/O against the deadline ---- */

int kv_rio_nonblock(redisContext *c)
{
	int fl = fcntl(c->fd, F_GETFL);

	if (fl < 0 || fcntl(c->fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -1;
	return 0;
}

static void kv_rio_set(struct kv_rio_err *e, enum kv_rio_kind kind,
		       const char *fmt, const char *arg)
{
	e->kind = kind;
	snprintf(e->why, sizeof(e->why), fmt, arg);
}

/* Wait until fd is ready for ev or the deadline passes; 0, or -1 with *e. */
static int kv_rio_wait(int fd, short ev, uint64_t deadline,
		       struct kv_rio_err *e)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = ev };
		int ms = kv_ms_left(deadline), n;

		if (ms <= 0) {
			kv_rio_set(e, KV_RIO_TIMEOUT, "%s",
				   ev == POLLOUT ? "command not sent"
				   : e->received ? "reply incomplete"
						 : "no reply");
			return -1;
		}
		n = poll(&p, 1, ms);
		if (n > 0)
			return 0; /* also POLLERR/POLLHUP: the I/O call tells */
		if (n < 0 && errno != EINTR) {
			kv_rio_set(e, KV_RIO_IO, "poll: %s", strerror(errno));
			return -1;
		}
	}
}

/* One send (or TLS write) of up to len bytes: bytes written, 0 when the
 * socket must be ready for *ev first, -1 with *e. */
static ssize_t kv_rio_put(int fd, SSL *ssl, const char *buf, size_t len, short *ev,
			  struct kv_rio_err *e)
{
	if (ssl) {
		ssize_t n = kv_tls_send(ssl, buf, len, ev, e->why, sizeof(e->why));

		if (n < 0)
			e->kind = KV_RIO_IO;
		return n;
	}
	ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);

	*ev = POLLOUT;
	if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)))
		return n > 0 ? n : 0;
	kv_rio_set(e, KV_RIO_IO, "send: %s", n < 0 ? strerror(errno) : "nothing written");
	return -1;
}

static int kv_rio_send(int fd, SSL *ssl, const char *cmd, size_t len, uint64_t deadline,
		       struct kv_rio_err *e)
{
	size_t off = 0;

	while (off < len) {
		short ev = POLLOUT;
		ssize_t n = kv_rio_put(fd, ssl, cmd + off, len - off, &ev, e);

		if (n < 0)
			return -1;
		off += (size_t)n;
		if (!n && kv_rio_wait(fd, ev, deadline, e))
			return -1;
	}
	return 0;
}

/* One recv (or TLS read) into buf: bytes read, 0 when the socket must be
 * ready for *ev first, -1 with *e (an error, or the server's close). */
static ssize_t kv_rio_get(int fd, SSL *ssl, char *buf, size_t cap, short *ev,
			  struct kv_rio_err *e)
{
	if (ssl) {
		ssize_t n = kv_tls_recv(ssl, buf, cap, ev, e->why, sizeof(e->why));

		if (n < 0)
			e->kind = KV_RIO_IO;
		return n;
	}
	ssize_t n = recv(fd, buf, cap, 0);

	*ev = POLLIN;
	if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)))
		return n > 0 ? n : 0;
	kv_rio_set(e, KV_RIO_IO, "%s", n ? strerror(errno) : "connection closed by the server");
	return -1;
}

/* The scanner's verdict on one received chunk: 1 = reply complete, 0 =
 * more to come, -1 = refused (*e filled). */
static int kv_rio_check(struct kv_scan *s, const char *buf, size_t n,
			struct kv_rio_err *e)
{
	size_t used;

	switch (kv_scan_feed(s, buf, n, &used)) {
	case SCAN_MORE:
		return 0;
	case SCAN_DONE:
		if (used == n)
			return 1;
		kv_rio_set(e, KV_RIO_PROTO, "%s", "bytes after the reply");
		return -1;
	case SCAN_BIG:
		e->kind = KV_RIO_TOOBIG;
		e->size = s->type == '$' || s->type == '*' ? s->num
							   : (long long)s->line;
		e->idx = s->vals;
		snprintf(e->why, sizeof(e->why), "%s of %s%lld %s over the limit",
			 s->type == '*' ? "array" : "value",
			 s->partial ? "at least " : "", e->size,
			 s->type == '*' ? "elements" : "bytes");
		return -1;
	default:
		kv_rio_set(e, KV_RIO_PROTO, "bad reply: %s", s->bad);
		return -1;
	}
}

static redisReply *kv_rio_recv(redisContext *c, SSL *ssl, uint64_t deadline,
			       struct kv_scan *s, struct kv_rio_err *e)
{
	char buf[4096];

	for (;;) {
		short ev = POLLIN;
		ssize_t n = kv_rio_get(c->fd, ssl, buf, sizeof(buf), &ev, e);
		void *rep = NULL;
		int done;

		if (n < 0)
			return NULL;
		if (n == 0) {
			if (kv_rio_wait(c->fd, ev, deadline, e))
				return NULL;
			continue;
		}
		e->received += (size_t)n;
		done = kv_rio_check(s, buf, (size_t)n, e);
		if (done < 0)
			return NULL;
		if (redisReaderFeed(c->reader, buf, (size_t)n) != REDIS_OK) {
			kv_rio_set(e, KV_RIO_PROTO, "%s", "reader: out of memory");
			return NULL;
		}
		if (done) {
			if (redisReaderGetReply(c->reader, &rep) == REDIS_OK && rep)
				return rep;
			kv_rio_set(e, KV_RIO_PROTO, "bad reply: %s",
				   c->reader->err ? c->reader->errstr : "incomplete");
			return NULL;
		}
		/* a fast stream must not outlive the deadline either */
		if (kv_ms_left(deadline) <= 0) {
			kv_rio_set(e, KV_RIO_TIMEOUT, "%s", "reply incomplete");
			return NULL;
		}
	}
}

redisReply *kv_rio_roundtrip(redisContext *c, SSL *ssl, const char *cmd, size_t len,
			     uint64_t deadline_ns, size_t max_value,
			     size_t max_elems, struct kv_rio_err *e)
{
	struct kv_scan s;

	memset(e, 0, sizeof(*e));
	kv_scan_init(&s, max_value, max_elems);
	if (kv_rio_send(c->fd, ssl, cmd, len, deadline_ns, e))
		return NULL;
	return kv_rio_recv(c, ssl, deadline_ns, &s, e);
}
