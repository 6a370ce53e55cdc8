/* main.c - shift-nccl-check: an ordinary verbs application that checks, byte
 * by byte and notification by notification, that traffic in NCCL's Simple
 * protocol survives whatever happens underneath (SHIFT failovers, or the
 * failures plain libibverbs reports). This file runs one side: bootstrap over
 * TCP, set up verbs, run the traffic loop, exchange verdicts, write JSON.
 * Usage and report fields: docs/checker.md. */
#include "nccl_check.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HELLO_MAGIC 0x53484946544e4343ull /* "SHIFTNCC" */
#define HELLO_VERSION 1
#define HELLO_WORDS 12
#define STATUS_WORDS 4
#define GO_WORD 0x474f21ull

static const char *role = "?";
static const struct nc_ctx *log_ctx;

double nc_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void nc_log(const char *fmt, ...)
{
	int saved = errno;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "shift-nccl-check[%s]: ", role);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	errno = saved;
}

void nc_error(struct nc_ctx *c, int qp, const char *op, const char *status,
              int code, unsigned vendor_err)
{
	double t = c->t0 > 0 ? nc_now() - c->t0 : 0;
	c->app_errors++;
	c->fatal = 1;
	if (c->nerrs < NC_MAX_ERRS) {
		struct nc_err *e = &c->errs[c->nerrs++];
		e->t = t;
		e->qp = qp;
		snprintf(e->op, sizeof(e->op), "%s", op);
		snprintf(e->status, sizeof(e->status), "%s", status);
		e->code = code;
		e->vendor_err = vendor_err;
	}
	if (qp >= 0)
		nc_log("ERROR qp %d: %s: %s (%d)", qp, op, status, code);
	else
		nc_log("ERROR %s: %s (%d)", op, status, code);
}

static void pack_hello(const struct nc_opts *o, uint64_t *w)
{
	w[0] = HELLO_MAGIC;
	w[1] = HELLO_VERSION;
	w[2] = o->mode;
	w[3] = o->qps;
	w[4] = o->msg_size;
	w[5] = o->chunk_size;
	w[6] = o->slots;
	w[7] = o->iters;
	w[8] = (uint64_t)(o->duration * 1000.0 + 0.5);
	w[9] = (uint64_t)o->bidir;
	w[10] = o->inject;
	w[11] = o->inject_at;
}

/* The server runs the client's traffic parameters. */
static int adopt_hello(struct nc_ctx *c, const uint64_t *w)
{
	struct nc_opts *o = c->o;
	char err[256];
	if (w[0] != HELLO_MAGIC || w[1] != HELLO_VERSION || w[2] > NC_READ ||
	    w[10] > NC_INJ_DUP) {
		nc_error(c, -1, "bootstrap", "the client speaks another protocol", EPROTO, 0);
		return -1;
	}
	o->mode = (enum nc_mode)w[2];
	o->qps = (unsigned)w[3];
	o->msg_size = w[4];
	o->chunk_size = w[5];
	o->slots = (unsigned)w[6];
	o->iters = w[7];
	o->duration = (double)w[8] / 1000.0;
	o->bidir = (int)w[9];
	if (c->inject == NC_INJ_NONE) {
		c->inject = (enum nc_inject)w[10];
		c->inject_at = w[11];
	}
	if (nc_opts_validate(o, err, sizeof(err))) {
		nc_error(c, -1, "bootstrap", err, EINVAL, 0);
		return -1;
	}
	nc_log("running the client's parameters: mode %s, %u QP(s), %llu-byte "
	       "messages in %llu-byte chunks, %u slots%s", nc_mode_name(o->mode),
	       o->qps, (unsigned long long)o->msg_size,
	       (unsigned long long)o->chunk_size, o->slots, o->bidir ? ", bidir" : "");
	return 0;
}

/* Bootstrap, verbs set-up and the handshake up to both sides being RTS and
 * having their receives posted. */
static int setup(struct nc_ctx *c)
{
	struct nc_opts *o = c->o;
	uint64_t w[HELLO_WORDS];
	double tmo = o->watchdog;

	c->sock = c->is_server ? nc_tcp_accept(o->tcp_port, tmo)
	                       : nc_tcp_connect(o->server, o->tcp_port, tmo);
	if (c->sock < 0) {
		nc_error(c, -1, "bootstrap", "no TCP connection to the peer",
		         errno ? errno : ETIMEDOUT, 0);
		return -1;
	}
	nc_hard_watchdog(c, 4 * tmo); /* connected: the set-up clock restarts */
	if (c->is_server) {
		if (nc_tcp_recv_u64(c->sock, w, HELLO_WORDS, tmo)) {
			nc_error(c, -1, "bootstrap", "no HELLO from the client", errno, 0);
			return -1;
		}
		if (adopt_hello(c, w))
			return -1;
	} else {
		pack_hello(o, w);
		if (nc_tcp_send_u64(c->sock, w, HELLO_WORDS)) {
			nc_error(c, -1, "bootstrap", "cannot send HELLO", errno, 0);
			return -1;
		}
	}

	/* Both sides open their verbs objects, then tell each other whether
	 * that worked (and which self-test the other asked for). */
	double t_open = nc_now();
	int ok = nc_rdma_open(c) == 0;
	if (ok)
		nc_log("%s: verbs objects ready in %.1f s", c->dev_name, nc_now() - t_open);
	if (ok)
		nc_roles_setup(c);
	uint64_t st[STATUS_WORDS] = {HELLO_MAGIC, (uint64_t)ok, o->inject, o->inject_at};
	uint64_t pst[STATUS_WORDS];
	if (nc_tcp_send_u64(c->sock, st, STATUS_WORDS) ||
	    nc_tcp_recv_u64(c->sock, pst, STATUS_WORDS, tmo)) {
		nc_error(c, -1, "bootstrap", "lost the peer during set-up", errno, 0);
		return -1;
	}
	if (!ok)
		return -1;
	if (pst[0] != HELLO_MAGIC || !pst[1]) {
		nc_error(c, -1, "bootstrap", "the peer failed its verbs set-up", EIO, 0);
		return -1;
	}
	if (!c->is_server && c->inject == NC_INJ_NONE && pst[2] <= NC_INJ_DUP) {
		c->inject = (enum nc_inject)pst[2];
		c->inject_at = pst[3];
	}

	for (unsigned i = 0; i < o->qps; i++) {
		uint64_t r[NC_REMOTE_WORDS];
		nc_remote_pack(c, &c->ch[i], r);
		if (nc_tcp_send_u64(c->sock, r, NC_REMOTE_WORDS)) {
			nc_error(c, -1, "bootstrap", "cannot send QP info", errno, 0);
			return -1;
		}
	}
	for (unsigned i = 0; i < o->qps; i++) {
		uint64_t r[NC_REMOTE_WORDS];
		if (nc_tcp_recv_u64(c->sock, r, NC_REMOTE_WORDS, tmo)) {
			nc_error(c, -1, "bootstrap", "no QP info from the peer", errno, 0);
			return -1;
		}
		nc_remote_unpack(&c->ch[i].rem, r);
	}

	/* RTR/RTS and receives posted before GO: the peer sends nothing
	 * before it has our GO, so nothing can arrive at a QP not ready. */
	t_open = nc_now();
	ok = nc_rdma_connect(c) == 0 && nc_traffic_prepost(c) == 0;
	if (ok)
		nc_log("QPs at RTS in %.1f s", nc_now() - t_open);
	uint64_t go[2] = {GO_WORD, (uint64_t)ok}, pgo[2];
	if (nc_tcp_send_u64(c->sock, go, 2) || nc_tcp_recv_u64(c->sock, pgo, 2, tmo)) {
		nc_error(c, -1, "bootstrap", "lost the peer before GO", errno, 0);
		return -1;
	}
	if (!ok)
		return -1;
	if (pgo[0] != GO_WORD || !pgo[1]) {
		nc_error(c, -1, "bootstrap", "the peer failed to connect its QPs", EIO, 0);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct nc_opts o;
	char err[2048];
	int rc = nc_opts_parse(&o, argc, argv, err, sizeof(err));
	if (rc == 1) {
		fputs(err, stdout);
		return 0;
	}
	if (rc < 0) {
		fprintf(stderr, "shift-nccl-check: %s\n%s", err, nc_usage);
		return 3;
	}

	static struct nc_ctx c; /* large (error table, TCP buffer): not on the stack */
	c.o = &o;
	c.is_server = o.server == NULL;
	c.sock = -1;
	c.inject = o.inject;
	c.inject_at = o.inject_at;
	role = c.is_server ? "server" : "client";
	log_ctx = &c;
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stderr, NULL, _IOLBF, 0);

	/* Set-up waits at most a few watchdog periods; the alarm backs it up. */
	nc_hard_watchdog(&c, 4 * o.watchdog);
	if (setup(&c) == 0) {
		nc_log("%s: %s mode, %u QP(s), %s, inject %s", c.dev_name,
		       nc_mode_name(o.mode), o.qps, o.bidir ? "bidir" : "one way",
		       nc_inject_name(c.inject));
		c.t0 = nc_now();
		nc_traffic_run(&c);
		nc_traffic_finish(&c);
	} else {
		c.t_end = nc_now();
	}
	nc_hard_watchdog(&c, o.watchdog);
	nc_rdma_close(&c);
	free(c.wrs);
	free(c.sges);
	if (c.sock >= 0)
		close(c.sock);

	int st = nc_exit_status(&c);
	if (nc_report_json(&c, o.json_path) && st == 0)
		st = 2;
	nc_log("%s: %llu messages verified, %llu corrupt bytes, %llu violations, "
	       "%llu application errors -> exit %d", st == 0 ? "PASS" : "FAIL",
	       (unsigned long long)c.msgs_rx, (unsigned long long)c.corrupt_bytes,
	       (unsigned long long)nc_violations(&c), (unsigned long long)c.app_errors,
	       st);
	nc_rdma_free_channels(&c);
	free(c.samples);
	alarm(0);
	return st;
}
