/* traffic.c - the data path of shift-nccl-check: one single-threaded event
 * loop per process that drives every channel's producer and consumer, polls
 * the one CQ, returns credit, reports per-second throughput, and ends the run
 * (normally, on the first error, or by the no-progress watchdog).
 *
 * Protocols (docs/checker.md has the full description):
 *  write - NCCL Simple: the producer waits for credit, fills its tx slot
 *          seq % S with the pattern, and posts the message as a chain of
 *          unsignaled RDMA WRITEs of chunks into the consumer's rx slot, the
 *          last chunk being a signaled WRITE_WITH_IMM (imm = seq). The
 *          consumer verifies the slot when that notification arrives, reposts
 *          the receive, and returns credit with an inline RDMA WRITE of its
 *          consumed count into the producer's credit word (CTS).
 *  send  - the same with one SEND_WITH_IMM per message into posted receives.
 *  read  - the owner fills slots and announces them with an inline RDMA WRITE
 *          of its ready count; the reader RDMA READs each announced slot in
 *          chunks (the last signaled), verifies it, and returns credit.
 *
 * SQ rule: a WR is signaled if it ends a message or if the unsignaled run
 * since the last signaled WR reached half the SQ; a message chain is at most
 * half the SQ (rdma.c sizes it so), so a full SQ always holds a signaled WR
 * whose completion frees room. */
#include "nccl_check.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { K_CHUNK = 1, K_DATA, K_CTRL, K_READ, K_RECV };
#define TAG_TXDONE 0x5458444f4e45ull /* "TXDONE" */
#define TAG_FIN 0x46494eull           /* "FIN" */
#define TAG_MR2 0x4d5232ull           /* "MR2": the keys of --mr2-reg-at */

static inline uint64_t wrid(unsigned kind, unsigned ch, uint64_t payload)
{
	return ((uint64_t)kind << 60) | ((uint64_t)(ch & 0xfff) << 48) |
	       (payload & 0xffffffffffffull);
}
static inline unsigned wrid_kind(uint64_t id) { return (unsigned)(id >> 60); }
static inline unsigned wrid_chan(uint64_t id) { return (unsigned)(id >> 48) & 0xfff; }
static inline uint64_t wrid_val(uint64_t id) { return id & 0xffffffffffffull; }

static const char *kind_name(unsigned k)
{
	switch (k) {
	case K_CHUNK: return "rdma_write(chunk)";
	case K_DATA: return "data notification";
	case K_CTRL: return "rdma_write(inline ctrl)";
	case K_READ: return "rdma_read";
	case K_RECV: return "recv";
	}
	return "unknown wr_id";
}

static volatile sig_atomic_t hard_stop_armed;

static void on_alarm(int sig)
{
	static const char m[] = "shift-nccl-check: hard watchdog expired, exiting\n";
	(void)sig;
	if (write(2, m, sizeof(m) - 1) < 0) {
		/* nothing else to do */
	}
	_exit(2);
}

/* Last-resort deadline for a hang outside the loop's control (a blocking
 * verb, a stuck teardown): re-armed as long as the run makes progress. */
void nc_hard_watchdog(const struct nc_ctx *c, double extra)
{
	if (!hard_stop_armed) {
		signal(SIGALRM, on_alarm);
		hard_stop_armed = 1;
	}
	alarm((unsigned)(c->o->watchdog + extra + 30));
}

void nc_roles_setup(struct nc_ctx *c)
{
	const struct nc_opts *o = c->o;
	/* The forward stream: client to server for write/send; in read mode
	 * the client is the reader (as ib_read_bw), so the server owns it. */
	int fwd_producer = (o->mode != NC_READ) ? !c->is_server : c->is_server;
	for (unsigned i = 0; i < o->qps; i++) {
		struct nc_chan *ch = &c->ch[i];
		if (fwd_producer) {
			ch->producing = 1, ch->tx_dir = 0;
			ch->consuming = o->bidir, ch->rx_dir = 1;
		} else {
			ch->consuming = 1, ch->rx_dir = 0;
			ch->producing = o->bidir, ch->tx_dir = 1;
		}
		ch->tx_key = check_stream_key(i, ch->tx_dir);
		ch->rx_key = check_stream_key(i, ch->rx_dir);
		check_seq_init(&ch->tx_acc);
		check_seq_init(&ch->rx_acc);
	}
}

/* ---- send queue bookkeeping ---- */

static inline unsigned sq_space(const struct nc_ctx *c, const struct nc_chan *ch)
{
	return c->sq_depth - (unsigned)(ch->sq_posted - ch->sq_done);
}

static int sq_post(struct nc_ctx *c, struct nc_chan *ch, struct ibv_send_wr *wr,
                   unsigned n, int signaled)
{
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(ch->qp, wr, &bad);
	if (rc) {
		nc_error(c, (int)ch->idx, "ibv_post_send", strerror(rc), rc, 0);
		return -1;
	}
	ch->sq_posted += n;
	if (signaled) {
		ch->sig_fifo[(ch->sig_head + ch->sig_count) % c->sq_depth] = ch->sq_posted;
		ch->sig_count++;
		ch->sq_last_sig = ch->sq_posted;
	}
	return 0;
}

/* A signaled send WR completed: it retires everything posted before it. */
static void sq_complete(struct nc_ctx *c, struct nc_chan *ch)
{
	if (ch->sig_count == 0) {
		nc_error(c, (int)ch->idx, "ibv_poll_cq",
		         "send completion without an outstanding signaled WR", 0, 0);
		return;
	}
	ch->sq_done = ch->sig_fifo[ch->sig_head];
	ch->sig_head = (ch->sig_head + 1) % c->sq_depth;
	ch->sig_count--;
}

/* The peer's key for RDMA now: its second MR from --mr2-at on. */
static uint32_t rkey_now(struct nc_ctx *c, struct nc_chan *ch)
{
	static int said;

	if (c->o->mr2_at <= 0 || nc_now() < c->t0 + c->o->mr2_at)
		return ch->rem.rkey;
	if (c->o->mr2_reg_at > 0 && !ch->rem.rkey2_known)
		return ch->rem.rkey; /* (its key not here yet) */
	if (!said) {
		said = 1;
		nc_log("from %.1f s on: RDMA to the peer's second MR (rkey %u)", c->o->mr2_at,
		       ch->rem.rkey2);
	}
	return ch->rem.rkey2;
}

/* An 8-byte inline RDMA WRITE of an encoded counter into the peer's memory. */
static int post_ctrl(struct nc_ctx *c, struct nc_chan *ch, uint64_t raddr,
                     uint64_t count)
{
	uint64_t val = check_counter_encode((uint32_t)count); /* inline: copied at post */
	struct ibv_sge sge = {.addr = (uintptr_t)&val, .length = sizeof(val),
	                      .lkey = ch->mr->lkey};
	int sig = ch->sq_posted + 1 - ch->sq_last_sig >= c->sq_depth / 2;
	struct ibv_send_wr wr = {
		.wr_id = wrid(K_CTRL, ch->idx, count), .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_INLINE | (sig ? IBV_SEND_SIGNALED : 0),
		.wr.rdma = {.remote_addr = raddr, .rkey = rkey_now(c, ch)},
	};
	return sq_post(c, ch, &wr, 1, sig);
}

static int post_recv(struct nc_ctx *c, struct nc_chan *ch, unsigned slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(ch->rx_ring + (size_t)slot * c->o->msg_size),
		.length = (uint32_t)c->o->msg_size, .lkey = ch->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = wrid(K_RECV, ch->idx, slot)}, *bad;
	if (c->o->mode == NC_SEND) {
		wr.sg_list = &sge;
		wr.num_sge = 1;
	} /* write mode: the notification carries no payload into the RQ */
	int rc = ibv_post_recv(ch->qp, &wr, &bad);
	if (rc) {
		nc_error(c, (int)ch->idx, "ibv_post_recv", strerror(rc), rc, 0);
		return -1;
	}
	ch->rq_posted++;
	return 0;
}

int nc_traffic_prepost(struct nc_ctx *c)
{
	c->wrs = calloc(c->nchunks, sizeof(*c->wrs));
	c->sges = calloc(c->nchunks, sizeof(*c->sges));
	if (!c->wrs || !c->sges) {
		nc_error(c, -1, "calloc", strerror(ENOMEM), ENOMEM, 0);
		return -1;
	}
	if (c->o->mode == NC_READ)
		return 0;
	for (unsigned i = 0; i < c->o->qps; i++) {
		struct nc_chan *ch = &c->ch[i];
		if (!ch->consuming)
			continue;
		for (unsigned s = 0; s < c->rq_depth; s++)
			if (post_recv(c, ch, s % c->o->slots))
				return -1;
	}
	return 0;
}

/* ---- producer ---- */

static void maybe_corrupt(struct nc_ctx *c, struct nc_chan *ch, uint8_t *slot,
                          uint64_t seq)
{
	if (c->inject != NC_INJ_CORRUPT || c->injected || ch->idx != 0 ||
	    ch->tx_dir != 0 || seq != c->inject_at)
		return;
	size_t off = (size_t)((seq * 2654435761ull) % c->o->msg_size);
	slot[off] ^= 0xff;
	c->injected = 1;
	nc_log("inject: flipped byte %zu of message %llu on qp 0", off,
	       (unsigned long long)seq);
}

/* Build the chunk chain of message `seq`: local slot -> remote address
 * `raddr`; the last WR gets `last_op`, is signaled and carries `last_id`. */
static unsigned build_chain(struct nc_ctx *c, struct nc_chan *ch, uint8_t *local,
                            uint64_t raddr, enum ibv_wr_opcode op,
                            enum ibv_wr_opcode last_op, uint64_t seq,
                            unsigned last_kind)
{
	const struct nc_opts *o = c->o;
	unsigned n = c->nchunks;
	for (unsigned i = 0; i < n; i++) {
		uint64_t off = (uint64_t)i * o->chunk_size;
		uint64_t len = o->msg_size - off < o->chunk_size ? o->msg_size - off
		                                                 : o->chunk_size;
		c->sges[i] = (struct ibv_sge){.addr = (uintptr_t)(local + off),
		                              .length = (uint32_t)len,
		                              .lkey = ch->mr->lkey};
		c->wrs[i] = (struct ibv_send_wr){
			.wr_id = wrid(K_CHUNK, ch->idx, seq),
			.next = i + 1 < n ? &c->wrs[i + 1] : NULL,
			.sg_list = &c->sges[i], .num_sge = 1, .opcode = op,
			.wr.rdma = {.remote_addr = raddr + off, .rkey = rkey_now(c, ch)},
		};
	}
	struct ibv_send_wr *last = &c->wrs[n - 1];
	last->opcode = last_op;
	last->send_flags = IBV_SEND_SIGNALED;
	last->wr_id = wrid(last_kind, ch->idx, seq);
	if (last_op == IBV_WR_RDMA_WRITE_WITH_IMM)
		last->imm_data = htonl((uint32_t)seq);
	return n;
}

static int produce(struct nc_ctx *c, struct nc_chan *ch, uint64_t limit)
{
	const struct nc_opts *o = c->o;
	int progress = 0;
	while (!c->fatal && ch->produced < limit) {
		uint64_t seq = ch->produced;
		size_t soff = (size_t)(seq % o->slots) * o->msg_size;
		uint8_t *slot = ch->tx_ring + soff;
		if (seq >= ch->credited + o->slots)
			break; /* no credit: the peer still owns the slot */
		if (o->mode == NC_READ) {
			/* Owner: fill, then announce (below) in one ready write. */
			check_pattern_fill(slot, o->msg_size, ch->tx_key, seq, 0);
			maybe_corrupt(c, ch, slot, seq);
			ch->produced++;
			progress = 1;
			continue;
		}
		if (seq >= ch->tx_completed + o->slots)
			break; /* our HCA may still be reading the slot */
		unsigned need = o->mode == NC_SEND ? 1 : c->nchunks;
		if (sq_space(c, ch) < need)
			break;
		check_pattern_fill(slot, o->msg_size, ch->tx_key, seq, 0);
		maybe_corrupt(c, ch, slot, seq);
		if (o->mode == NC_SEND) {
			struct ibv_sge sge = {.addr = (uintptr_t)slot,
			                      .length = (uint32_t)o->msg_size,
			                      .lkey = ch->mr->lkey};
			struct ibv_send_wr wr = {
				.wr_id = wrid(K_DATA, ch->idx, seq), .sg_list = &sge,
				.num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
				.send_flags = IBV_SEND_SIGNALED,
				.imm_data = htonl((uint32_t)seq),
			};
			if (sq_post(c, ch, &wr, 1, 1))
				return progress;
		} else {
			unsigned n = build_chain(c, ch, slot, ch->rem.rx_ring + soff,
			                         IBV_WR_RDMA_WRITE,
			                         IBV_WR_RDMA_WRITE_WITH_IMM, seq, K_DATA);
			if (sq_post(c, ch, c->wrs, n, 1))
				return progress;
		}
		ch->produced++;
		progress = 1;
	}
	if (o->mode == NC_READ && ch->produced > ch->ready_sent && sq_space(c, ch) >= 1 &&
	    !c->fatal) {
		if (post_ctrl(c, ch, ch->rem.ready, ch->produced) == 0)
			ch->ready_sent = ch->produced;
		progress = 1;
	}
	return progress;
}

/* Pick up the credit word the peer consumer writes. */
static int poll_credit(struct nc_ctx *c, struct nc_chan *ch)
{
	uint64_t w = __atomic_load_n(&ch->ctrl->credit, __ATOMIC_ACQUIRE);
	uint32_t v;
	if (!check_counter_decode(w, &v))
		return 0; /* torn: read again next time */
	uint64_t cr = check_seq_widen(ch->credited, v);
	if (cr <= ch->credited)
		return 0;
	if (cr > ch->produced) {
		if (!c->credit_bad++)
			nc_error(c, (int)ch->idx, "credit word",
			         "peer returned credit for messages never sent", 0, 0);
		return 0;
	}
	if (c->o->mode == NC_READ) { /* the owner counts a message when consumed */
		c->msgs_tx += cr - ch->credited;
		c->bytes_tx += (cr - ch->credited) * c->o->msg_size;
	}
	ch->credited = cr;
	return 1;
}

/* ---- consumer ---- */

/* Account for notification `seq` and verify its `len` received bytes in buf.
 * Returns the accounting verdict (a duplicate is neither verified nor
 * credited: its slot may already hold a newer message). */
static enum check_seq_verdict consume(struct nc_ctx *c, struct nc_chan *ch,
                                      uint64_t seq, const uint8_t *buf,
                                      uint64_t len)
{
	const struct nc_opts *o = c->o;
	enum check_seq_verdict v = check_seq_note(&ch->rx_acc, seq);
	if (c->inject == NC_INJ_DUP && !c->injected && ch->idx == 0 &&
	    ch->rx_dir == 0 && seq == c->inject_at) {
		c->injected = 1;
		nc_log("inject: feeding notification %llu to the accounting twice",
		       (unsigned long long)seq);
		(void)check_seq_note(&ch->rx_acc, seq);
	}
	if (v == CHECK_SEQ_DUP) {
		nc_log("qp %u: duplicate notification for message %llu", ch->idx,
		       (unsigned long long)seq);
		return v;
	}
	if (v == CHECK_SEQ_LATE)
		nc_log("qp %u: message %llu notified out of order", ch->idx,
		       (unsigned long long)seq);
	struct check_mismatch mm;
	uint64_t n = len < o->msg_size ? len : o->msg_size;
	size_t bad = check_pattern_verify(buf, (size_t)n, ch->rx_key, seq, 0, &mm);
	if (len != o->msg_size) {
		uint64_t d = len > o->msg_size ? len - o->msg_size : o->msg_size - len;
		nc_log("qp %u: message %llu arrived with %llu bytes, expected %llu",
		       ch->idx, (unsigned long long)seq, (unsigned long long)len,
		       (unsigned long long)o->msg_size);
		if (!bad)
			mm = (struct check_mismatch){.first_off = (size_t)n};
		bad += (size_t)d;
	}
	if (bad) {
		if (!c->have_first_bad) {
			c->have_first_bad = 1;
			c->first_bad.qp = ch->idx;
			c->first_bad.seq = seq;
			c->first_bad.mm = mm;
		}
		if (c->corrupt_bytes < 1000000)
			nc_log("qp %u: message %llu: %zu corrupt bytes, first at offset %zu "
			       "(expected 0x%02x, got 0x%02x)", ch->idx,
			       (unsigned long long)seq, bad, mm.first_off, mm.expected,
			       mm.got);
	}
	c->corrupt_bytes += bad;
	c->bytes_verified += o->msg_size;
	c->msgs_rx++;
	ch->consumed++;
	return v;
}

/* Reader (read mode): pick up the ready count and READ announced slots. */
static int read_step(struct nc_ctx *c, struct nc_chan *ch)
{
	const struct nc_opts *o = c->o;
	int progress = 0;
	uint64_t w = __atomic_load_n(&ch->ctrl->ready, __ATOMIC_ACQUIRE);
	uint32_t v;
	if (check_counter_decode(w, &v)) {
		uint64_t r = check_seq_widen(ch->ready_seen, v);
		if (r > ch->ready_seen) {
			ch->ready_seen = r;
			progress = 1;
		}
	}
	while (!c->fatal && ch->read_next < ch->ready_seen &&
	       ch->read_next < ch->consumed + o->slots &&
	       sq_space(c, ch) >= c->nchunks) {
		uint64_t seq = ch->read_next;
		size_t soff = (size_t)(seq % o->slots) * o->msg_size;
		unsigned n = build_chain(c, ch, ch->rx_ring + soff, ch->rem.tx_ring + soff,
		                         IBV_WR_RDMA_READ, IBV_WR_RDMA_READ, seq, K_READ);
		if (sq_post(c, ch, c->wrs, n, 1))
			break;
		ch->read_next++;
		progress = 1;
	}
	return progress;
}

static int flush_cts(struct nc_ctx *c, struct nc_chan *ch)
{
	if (ch->consumed <= ch->cts_sent || sq_space(c, ch) < 1 || c->fatal)
		return 0;
	if (post_ctrl(c, ch, ch->rem.credit, ch->consumed) == 0)
		ch->cts_sent = ch->consumed;
	return 1;
}

static void on_completion(struct nc_ctx *c, const struct ibv_wc *wc)
{
	unsigned kind = wrid_kind(wc->wr_id), ci = wrid_chan(wc->wr_id);
	uint64_t val = wrid_val(wc->wr_id);
	if (ci >= c->o->qps) {
		nc_error(c, -1, "ibv_poll_cq", "completion with an unknown wr_id", 0, 0);
		return;
	}
	struct nc_chan *ch = &c->ch[ci];
	if (wc->status != IBV_WC_SUCCESS) {
		nc_error(c, (int)ci, kind_name(kind), ibv_wc_status_str(wc->status),
		         wc->status, wc->vendor_err);
		return;
	}
	switch (kind) {
	case K_DATA:
		sq_complete(c, ch);
		if (check_seq_note(&ch->tx_acc, val) != CHECK_SEQ_DUP) {
			ch->tx_completed++;
			c->msgs_tx++;
			c->bytes_tx += c->o->msg_size;
		} else {
			nc_log("qp %u: duplicate send completion for message %llu", ci,
			       (unsigned long long)val);
		}
		break;
	case K_CTRL:
		sq_complete(c, ch);
		break;
	case K_READ: {
		sq_complete(c, ch);
		size_t soff = (size_t)(val % c->o->slots) * c->o->msg_size;
		(void)consume(c, ch, val, ch->rx_ring + soff, c->o->msg_size);
		break;
	}
	case K_RECV: {
		ch->rq_posted--;
		if (!ch->consuming || !(wc->wc_flags & IBV_WC_WITH_IMM)) {
			nc_error(c, (int)ci, "recv", "receive without an immediate", 0, 0);
			return;
		}
		uint64_t seq = check_seq_widen(ch->rx_acc.max_seen1, ntohl(wc->imm_data));
		unsigned slot = (unsigned)val;
		if (c->o->mode == NC_SEND)
			(void)consume(c, ch, seq,
			              ch->rx_ring + (size_t)slot * c->o->msg_size,
			              wc->byte_len);
		else
			(void)consume(c, ch, seq,
			              ch->rx_ring + (size_t)(seq % c->o->slots) * c->o->msg_size,
			              c->o->msg_size);
		/* Verified first, reposted second: the slot is free again. */
		if (!c->fatal)
			(void)post_recv(c, ch, slot);
		break;
	}
	default:
		/* K_CHUNK WRs are unsignaled: a successful one never shows up. */
		nc_error(c, (int)ci, "ibv_poll_cq", "unexpected completion", 0, 0);
	}
}

/* ---- per-second series ---- */

static void sample(struct nc_ctx *c, double t, uint64_t *last_tx, uint64_t *last_rx,
                   uint64_t *last_mtx, uint64_t *last_mrx, double dt)
{
	if (c->nsamples == c->samples_cap) {
		size_t cap = c->samples_cap ? 2 * c->samples_cap : 64;
		struct nc_sample *s = realloc(c->samples, cap * sizeof(*s));
		if (!s)
			return;
		c->samples = s;
		c->samples_cap = cap;
	}
	uint64_t brx = c->bytes_verified;
	struct nc_sample *s = &c->samples[c->nsamples++];
	s->t = t;
	s->tx_mbps = (double)(c->bytes_tx - *last_tx) / dt / 1e6;
	s->rx_mbps = (double)(brx - *last_rx) / dt / 1e6;
	s->mbps = s->tx_mbps + s->rx_mbps;
	s->tx_msgs = c->msgs_tx - *last_mtx;
	s->rx_msgs = c->msgs_rx - *last_mrx;
	s->msgs = s->tx_msgs + s->rx_msgs;
	*last_tx = c->bytes_tx, *last_rx = brx;
	*last_mtx = c->msgs_tx, *last_mrx = c->msgs_rx;
	if (!c->o->quiet)
		fprintf(stderr, "[%6.1f s] %9.2f MB/s (tx %9.2f rx %9.2f) %8llu msgs\n",
		        t, s->mbps, s->tx_mbps, s->rx_mbps, (unsigned long long)s->msgs);
}

/* ---- the loop ---- */

static void send_txdone(struct nc_ctx *c)
{
	uint64_t w[2 + NC_MAX_QPS];
	w[0] = TAG_TXDONE;
	w[1] = c->o->qps;
	for (unsigned i = 0; i < c->o->qps; i++)
		w[2 + i] = c->ch[i].producing ? c->ch[i].produced : 0;
	if (nc_tcp_send_u64(c->sock, w, 2 + c->o->qps))
		nc_error(c, -1, "tcp", "cannot send TXDONE to the peer", errno, 0);
}

/* --mr2-reg-at: register the second MRs now, and tell the peer their keys
 * (memory registered while the run goes on: a KV store killed before it
 * holds no record of them) */
static void send_mr2(struct nc_ctx *c)
{
	uint64_t w[2 + NC_MAX_QPS];

	c->mr2_sent = 1;
	w[0] = TAG_MR2;
	w[1] = c->o->qps;
	for (unsigned i = 0; i < c->o->qps; i++) {
		if (nc_reg_mr2(c, &c->ch[i]))
			return;
		w[2 + i] = c->ch[i].mr2->rkey;
	}
	nc_log("second MRs registered %.1f s into the run (rkey %u first)",
	       nc_now() - c->t0, c->ch[0].mr2->rkey);
	if (nc_tcp_send_u64(c->sock, w, 2 + c->o->qps))
		nc_error(c, -1, "tcp", "cannot send MR2 to the peer", errno, 0);
}

static void got_mr2(struct nc_ctx *c, const uint64_t *w)
{
	if (w[1] != c->o->qps) {
		nc_error(c, -1, "tcp", "malformed MR2 from the peer", EPROTO, 0);
		return;
	}
	for (unsigned i = 0; i < c->o->qps; i++) {
		c->ch[i].rem.rkey2 = (uint32_t)w[2 + i];
		c->ch[i].rem.rkey2_known = 1;
	}
}

static void got_txdone(struct nc_ctx *c, const uint64_t *w)
{
	c->peer_txdone = 1;
	if (w[0] != TAG_TXDONE || w[1] != c->o->qps) {
		nc_error(c, -1, "tcp", "malformed TXDONE from the peer", EPROTO, 0);
		return;
	}
	for (unsigned i = 0; i < c->o->qps; i++) {
		c->ch[i].peer_total = w[2 + i];
		c->ch[i].peer_total_known = 1;
	}
}

static void got_fin(struct nc_ctx *c, const uint64_t *w)
{
	struct nc_peer_summary *p = &c->peer;
	c->peer_fin = 1;
	if (w[0] != TAG_FIN) {
		nc_error(c, -1, "tcp", "malformed FIN from the peer", EPROTO, 0);
		return;
	}
	*p = (struct nc_peer_summary){
		.received = 1, .fatal = w[1], .app_errors = w[2], .corrupt_bytes = w[3],
		.missing = w[4], .duplicate = w[5], .out_of_order = w[6],
		.unexpected = w[7], .messages = w[8], .bytes_verified = w[9]};
}

#define FIN_WORDS 10

/* Read the peer's pending TCP messages; `deadline` > 0 makes it block. */
static int poll_peer(struct nc_ctx *c, double deadline)
{
	uint64_t w[2 + NC_MAX_QPS];
	for (;;) {
		int r = 0;
		if (!c->peer_txdone) {
			r = nc_tcp_poll_u64(c, w, 2 + c->o->qps);
			if (r == 1 && w[0] == TAG_MR2)
				got_mr2(c, w);
			else if (r == 1)
				got_txdone(c, w);
		} else if (!c->peer_fin) {
			r = nc_tcp_poll_u64(c, w, FIN_WORDS);
			if (r == 1) {
				got_fin(c, w);
				if (c->peer.fatal && !c->fatal)
					nc_error(c, -1, "peer", "the peer ended with an error",
					         0, 0);
			}
		} else {
			return 0;
		}
		if (r < 0) {
			if (!c->fatal)
				nc_error(c, -1, "tcp", "the peer closed the connection",
				         ECONNRESET, 0);
			c->peer_txdone = c->peer_fin = 1; /* nothing more will come */
			return -1;
		}
		if (r == 1)
			continue;
		if (deadline <= 0 || nc_now() >= deadline)
			return 0;
		/* Keep reaping completions while we wait (a library that does its
		 * work inside ibv_poll_cq must see a live application); not after
		 * an error, when the rest would only be flushes. */
		struct ibv_wc wc[16];
		int n = c->fatal || !c->cq ? 0 : ibv_poll_cq(c->cq, 16, wc);
		for (int i = 0; i < n && !c->fatal; i++)
			on_completion(c, &wc[i]);
		struct timespec ts = {0, 1000 * 1000};
		nanosleep(&ts, NULL);
	}
}

void nc_traffic_run(struct nc_ctx *c)
{
	const struct nc_opts *o = c->o;
	struct ibv_wc wc[32];
	uint64_t ltx = 0, lrx = 0, lmtx = 0, lmrx = 0;
	int txdone_sent = 0, stop_tx = 0;
	unsigned idle = 0;
	double last_progress = nc_now(), next_tick = c->t0 + 1;

	nc_hard_watchdog(c, o->duration);
	while (!c->fatal) {
		int progress = 0;
		double now = nc_now();
		if (o->duration > 0 && now >= c->t0 + o->duration)
			stop_tx = 1;
		uint64_t limit = stop_tx ? 0 : (o->iters ? o->iters : UINT64_MAX);
		if (o->mr2_reg_at > 0 && !c->mr2_sent && now >= c->t0 + o->mr2_reg_at)
			send_mr2(c);

		int n = ibv_poll_cq(c->cq, 32, wc);
		if (n < 0) {
			nc_error(c, -1, "ibv_poll_cq", "poll failed", n, 0);
			break;
		}
		for (int i = 0; i < n && !c->fatal; i++)
			on_completion(c, &wc[i]);
		progress |= n > 0;

		int drained = 1, rx_done = c->peer_txdone;
		for (unsigned i = 0; i < o->qps && !c->fatal; i++) {
			struct nc_chan *ch = &c->ch[i];
			if (ch->producing) {
				progress |= poll_credit(c, ch);
				if (limit > ch->produced)
					progress |= produce(c, ch, limit);
				else if (o->mode == NC_READ && ch->produced > ch->ready_sent)
					progress |= produce(c, ch, ch->produced);
				drained &= ch->credited == ch->produced &&
				           (o->mode == NC_READ || ch->tx_completed == ch->produced);
			}
			if (ch->consuming) {
				if (o->mode == NC_READ)
					progress |= read_step(c, ch);
				progress |= flush_cts(c, ch);
				rx_done &= ch->peer_total_known &&
				           ch->consumed >= ch->peer_total &&
				           ch->cts_sent == ch->consumed;
			}
		}
		if (c->fatal)
			break;
		int finished_tx = o->iters ? 1 : stop_tx;
		if (o->iters)
			for (unsigned i = 0; i < o->qps; i++)
				if (c->ch[i].producing && c->ch[i].produced < o->iters)
					finished_tx = 0;
		if (!txdone_sent && finished_tx && drained) {
			send_txdone(c);
			txdone_sent = 1;
			progress = 1;
		}
		if (!c->peer_fin)
			(void)poll_peer(c, 0);
		if (txdone_sent && rx_done)
			break;

		now = nc_now();
		if (now >= next_tick) {
			double t = next_tick - c->t0;
			sample(c, t, &ltx, &lrx, &lmtx, &lmrx, 1.0);
			next_tick += 1;
			nc_hard_watchdog(c, 0); /* the loop is alive */
		}
		if (progress) {
			last_progress = now;
			idle = 0;
		} else if (now - last_progress > o->watchdog) {
			char m[96];
			snprintf(m, sizeof(m), "no progress for %.0f s", o->watchdog);
			nc_error(c, -1, "watchdog", m, ETIMEDOUT, 0);
			break;
		} else if (++idle > 4096) {
			struct timespec ts = {0, 50 * 1000};
			nanosleep(&ts, NULL);
		} else if (idle > 64) {
			sched_yield();
		}
	}
	c->t_end = nc_now();
	/* A last partial second, so the series covers the whole run. */
	double tail = c->t_end - (next_tick - 1);
	if (tail > 0.05)
		sample(c, c->t_end - c->t0, &ltx, &lrx, &lmtx, &lmrx, tail);
	if (!txdone_sent)
		send_txdone(c);
}

static void send_fin(struct nc_ctx *c)
{
	const struct nc_opts *o = c->o;
	uint64_t w[FIN_WORDS] = {TAG_FIN, (uint64_t)c->fatal, c->app_errors,
	                         c->corrupt_bytes, 0, 0, 0, 0, c->msgs_rx,
	                         c->bytes_verified};
	for (unsigned i = 0; i < o->qps; i++) {
		const struct check_seq *a[2] = {&c->ch[i].rx_acc, &c->ch[i].tx_acc};
		for (int k = 0; k < 2; k++) {
			w[4] += a[k]->missing;
			w[5] += a[k]->duplicate;
			w[6] += a[k]->out_of_order;
			w[7] += a[k]->unexpected;
		}
	}
	if (nc_tcp_send_u64(c->sock, w, FIN_WORDS) && !c->fatal)
		nc_error(c, -1, "tcp", "cannot send FIN to the peer", errno, 0);
}

void nc_traffic_finish(struct nc_ctx *c)
{
	const struct nc_opts *o = c->o;
	double wait = o->watchdog < 30 ? o->watchdog : 30;
	nc_hard_watchdog(c, wait);
	/* A side that failed tells its peer at once: the peer may never be able
	 * to send its TXDONE (its QP stalls against a dead one: on rxe, whose
	 * retry_cnt 7 retries for ever, that lasts until its watchdog), and
	 * without this FIN both would wait for each other. The FIN then carries
	 * this side's counts so far; the peer ends its loop on it. */
	int early = c->fatal && !c->peer_txdone;
	if (early)
		send_fin(c);
	/* The peer's totals let the accounting name the missing messages. */
	(void)poll_peer(c, c->peer_txdone ? 0 : nc_now() + wait);
	for (unsigned i = 0; i < o->qps; i++) {
		struct nc_chan *ch = &c->ch[i];
		if (ch->consuming && ch->peer_total_known)
			check_seq_finish(&ch->rx_acc, ch->peer_total);
		if (ch->producing && o->mode != NC_READ && !c->fatal)
			check_seq_finish(&ch->tx_acc, ch->produced);
	}
	if (!early)
		send_fin(c);
	(void)poll_peer(c, nc_now() + wait);
	if (!c->peer_fin && !c->fatal)
		nc_error(c, -1, "tcp", "the peer did not finish", ETIMEDOUT, 0);
}
