/* nccl_check.h - shared state of shift-nccl-check, the NCCL-pattern traffic
 * and integrity checker (docs/checker.md).
 *
 * One process is one side of a run. It owns one verbs context, one PD, one CQ
 * and `qps` channels; a channel is one RC QP plus one registered buffer that
 * holds a transmit ring, a receive ring and the control words the peer writes
 * (credit and ready counters). Each channel carries up to two data streams:
 * the forward stream (client to server in write/send mode; server to client,
 * read by the client, in read mode) and, with --bidir, the reverse one. On a
 * given side a channel therefore produces at most one stream and consumes at
 * most one.
 *
 * Files: bootstrap.c (TCP), rdma.c (verbs objects and QP states),
 * traffic.c (the event loop and the protocols), report.c (JSON),
 * check.c (pure pattern and accounting), opts.c (command line), main.c.
 */
#ifndef SHIFT_TOOLS_NCCL_CHECK_H
#define SHIFT_TOOLS_NCCL_CHECK_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "opts.h"

/* What the peer needs to reach one of our channels. */
struct nc_remote {
	uint32_t qpn, psn, lid, rkey;
	uint32_t rkey2;   /* its second MR over the same buffer (--mr2-at) */
	int rkey2_known;  /* rkey2 told (at setup; with --mr2-reg-at, later over TCP) */
	uint8_t gid[16];
	uint64_t tx_ring; /* its transmit ring (read mode: what we READ) */
	uint64_t rx_ring; /* its receive ring (write mode: where we WRITE) */
	uint64_t credit;  /* its credit word (we return credit there) */
	uint64_t ready;   /* its ready word (read mode: we announce there) */
};

/* Control words, each alone in a cache line of the channel buffer. The peer
 * writes `credit` and `ready` with 8-byte inline RDMA writes; we read them
 * with atomic loads (check_counter_decode rejects a torn value). */
struct nc_ctrl {
	uint64_t credit;       /* peer consumer: how many of ours it consumed */
	uint8_t pad0[56];
	uint64_t ready;        /* read mode, peer owner: how many it made ready */
	uint8_t pad1[56];
};

#define NC_FIFO_MAX 65536u /* bound on SQ depth, and on its signal FIFO */

struct nc_chan {
	unsigned idx;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	struct ibv_mr *mr2; /* the same buffer again (--mr2-at), or NULL */
	uint8_t *buf;          /* [tx ring][rx ring][ctrl] */
	size_t buflen;
	uint8_t *tx_ring, *rx_ring;
	struct nc_ctrl *ctrl;
	uint32_t psn;
	struct nc_remote rem;

	/* Send queue occupancy: WRs posted, WRs known complete. A signaled WR
	 * completing retires every WR posted before it (RC completes in order),
	 * so each signaled WR pushes its running post count on `sig_fifo`. */
	uint64_t sq_posted, sq_done, sq_last_sig;
	uint64_t *sig_fifo;
	unsigned sig_head, sig_count;
	unsigned rq_posted;

	/* Producer side of the stream this side sends (or owns, in read mode). */
	int producing;
	unsigned tx_dir;
	uint64_t tx_key;
	uint64_t produced;      /* messages posted (read mode: made ready) */
	uint64_t tx_completed;  /* distinct local completions of messages */
	uint64_t credited;      /* messages the peer consumed (credit word) */
	uint64_t ready_sent;    /* read mode: last ready value posted */
	struct check_seq tx_acc; /* local completion accounting */

	/* Consumer side. */
	int consuming;
	unsigned rx_dir;
	uint64_t rx_key;
	uint64_t consumed;      /* distinct messages verified */
	uint64_t cts_sent;      /* last credit value posted to the peer */
	uint64_t read_next;     /* read mode: next seq to READ */
	uint64_t ready_seen;    /* read mode: ready counter from the peer */
	struct check_seq rx_acc;
	uint64_t peer_total;    /* messages the peer produced, from TXDONE */
	int peer_total_known;
};

#define NC_MAX_ERRS 32

struct nc_err {
	double t;
	int qp;               /* -1 when not tied to a QP */
	char op[32];          /* verb or completion opcode */
	char status[96];      /* ibv_wc_status_str or strerror */
	int code;             /* wc status or errno */
	unsigned vendor_err;
};

struct nc_sample {
	double t;
	double mbps, tx_mbps, rx_mbps;
	uint64_t msgs, tx_msgs, rx_msgs;
};

/* Summary a side sends its peer at the end (FIN). */
struct nc_peer_summary {
	int received;
	uint64_t fatal, app_errors, corrupt_bytes, missing, duplicate,
		out_of_order, unexpected, messages, bytes_verified;
};

struct nc_ctx {
	struct nc_opts *o;
	int is_server;
	enum nc_inject inject; /* effective: ours, or the peer's */
	uint64_t inject_at;
	int injected;

	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_device_attr dev_attr;
	struct ibv_port_attr port_attr;
	union ibv_gid gid;
	char dev_name[64];
	unsigned nchunks, sq_depth, rq_depth, max_rd, cq_size;
	enum ibv_mtu mtu;
	struct nc_chan *ch;
	struct ibv_send_wr *wrs; /* scratch WR chain of one message */
	struct ibv_sge *sges;

	int sock;
	uint8_t rxb[8 * (2 + NC_MAX_QPS)]; /* partial TCP message */
	size_t rxb_have;
	int peer_txdone, peer_fin;
	int mr2_sent;     /* --mr2-reg-at: my second MRs registered, keys sent */
	struct nc_peer_summary peer;

	/* Results. */
	double t0, t_end;
	int fatal;
	uint64_t app_errors;
	unsigned nerrs;
	struct nc_err errs[NC_MAX_ERRS];
	uint64_t corrupt_bytes, bytes_verified, msgs_rx, msgs_tx, bytes_tx;
	uint64_t credit_bad;
	int have_first_bad;
	struct { unsigned qp; uint64_t seq; struct check_mismatch mm; } first_bad;
	struct nc_sample *samples;
	size_t nsamples, samples_cap;
};

double nc_now(void);
/* Record an application-visible error (failed verb, error completion,
 * watchdog); marks the run fatal. */
void nc_error(struct nc_ctx *c, int qp, const char *op, const char *status,
              int code, unsigned vendor_err);
void nc_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* bootstrap.c */
int nc_tcp_connect(const char *host, unsigned port, double timeout);
int nc_tcp_accept(unsigned port, double timeout);
int nc_tcp_send_u64(int fd, const uint64_t *v, size_t n);
int nc_tcp_recv_u64(int fd, uint64_t *v, size_t n, double timeout);
/* Non-blocking: accumulate into c->rxb until `n` words are there. Returns
 * 1 when complete (decoded into v, buffer reset), 0 if not yet, -1 on EOF. */
int nc_tcp_poll_u64(struct nc_ctx *c, uint64_t *v, size_t n);

/* rdma.c */
int nc_rdma_open(struct nc_ctx *c);
int nc_rdma_connect(struct nc_ctx *c);
void nc_rdma_close(struct nc_ctx *c);
void nc_rdma_free_channels(struct nc_ctx *c);
/* --mr2-at: the second registration of ch's buffer (0, or -1 logged) */
int nc_reg_mr2(struct nc_ctx *c, struct nc_chan *ch);
void nc_remote_pack(const struct nc_ctx *c, const struct nc_chan *ch, uint64_t *w);
void nc_remote_unpack(struct nc_remote *r, const uint64_t *w);
#define NC_REMOTE_WORDS 11

/* traffic.c */
void nc_roles_setup(struct nc_ctx *c);
int nc_traffic_prepost(struct nc_ctx *c);
void nc_traffic_run(struct nc_ctx *c);
void nc_traffic_finish(struct nc_ctx *c);
/* Arm (or re-arm) SIGALRM to _exit(2) after watchdog + extra + 30 s: the
 * backstop for a hang inside a verb, the bootstrap or the teardown. */
void nc_hard_watchdog(const struct nc_ctx *c, double extra);

/* report.c */
uint64_t nc_violations(const struct nc_ctx *c);
int nc_exit_status(const struct nc_ctx *c);
int nc_report_json(const struct nc_ctx *c, const char *path);

#endif
