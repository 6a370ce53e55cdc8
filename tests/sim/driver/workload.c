/*
 * Workload drivers of the fault campaign (see workload.h): the NCCL Simple
 * pattern, two-sided send/recv, RDMA reads and a mix with atomics, over
 * nconn RC connections used in both directions at once.
 *
 * Every endpoint owns one registered buffer laid out as below; the peer
 * knows its address and rkey. Message m of a direction has a length and
 * content derived from (connection, direction, m), so a receiver can check
 * every byte it consumes without a side channel. Receivers "consume" a
 * message on its notification (write-with-imm or receive completion):
 * they check the sequence number (exactly once, in order) and the bytes,
 * poison the slot, repost the receive and return a credit with an inline
 * RDMA write (NCCL's CTS). Senders reuse a staging slot only after their
 * own completion for the message that used it.
 *
 * With wl_params.srq each side's QPs share one SRQ: every connection's
 * receives are posted to it (as many per connection as without), a
 * receive carries its buffer slot of the side's receive buffer and a
 * side-wide sequence number in its wr_id, and a receiver checks that each
 * receive completes once (in any order across connections: any QP takes
 * the SRQ's next one) besides the per-connection order of the messages.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep.h"
#include "sim.h"
#include "workload.h"

#define WL_MAX_CONN 4
#define SLOTS 4		/* NCCL slots in flight per direction */
#define SLOT 512
#define NRECV 8		/* receives posted per endpoint */
#define RSRC 1024	/* read source size */
#define NRD 4		/* reads in flight */
#define NAT 256		/* max atomics of each kind per endpoint */
#define SQ_DEPTH 128

enum {
	O_SLOTS = 0,
	O_STAGE = O_SLOTS + SLOTS * SLOT,
	O_RECV = O_STAGE + SLOTS * SLOT,
	O_RSRC = O_RECV + NRECV * SLOT,
	O_RDST = O_RSRC + RSRC,
	O_CREDIT = O_RDST + NRD * RSRC,
	O_ACNT = O_CREDIT + 8,
	O_CAS = O_ACNT + 8,
	O_ARES = O_CAS + 8,
	BUFSZ = O_ARES + 8 * 8,
};

/* wr_id = kind << 56 | sequence */
enum { K_DATA = 1, K_NOTIFY, K_CTS, K_SEND, K_READ, K_FADD, K_CAS, K_RECV, K_POISON };
#define WRID(k, s) ((uint64_t)(k) << 56 | (uint64_t)(s))
#define WR_K(id) ((unsigned)((id) >> 56))
#define WR_S(id) ((uint32_t)(id))

struct wl_ep {
	struct wl *wl;
	unsigned conn, side;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;		/* ex_verbs: its ibv_wr_* builders */
	uint8_t *buf;
	struct ibv_mr *mr;
	uint64_t raddr;			/* the peer's buffer */
	uint32_t rkey;
	/* totals for this endpoint as a sender */
	uint32_t n_msg, n_rd, n_fa, n_cas;
	/* sender */
	uint32_t tx_next, tx_done, cts_sent;
	bool cts_pending;
	uint64_t ring[SQ_DEPTH];	/* posted WRs, in order */
	uint8_t ring_sig[SQ_DEPTH];
	uint32_t r_head, r_tail;
	/* receiver */
	uint32_t rx_next, recv_posted, recv_done;
	/* reads and atomics */
	uint32_t rd_next, rd_done, rd_out;
	uint32_t fa_next, fa_ok, fa_err;
	uint8_t fa_seen[NAT];
	uint32_t cas_next, cas_ok, cas_err;
	uint64_t cas_expect;
	bool errored;			/* saw an app-visible error */
};

#define SRQ_SLOTS (NRECV * WL_MAX_CONN)

struct wl_side {
	const struct shift_lower *v;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_cq *rcq; /* receives: cq, or its own (wl_params.split_cq) */
	struct ibv_cq_ex *cqx, *rcqx; /* ex_verbs: the same CQs, extended */
	/* wl_params.srq: the side's SRQ, its receive buffer (SRQ_SLOTS
	 * slots, the free ones listed), and which receives completed */
	struct ibv_srq *srq;
	uint8_t *rbuf;
	struct ibv_mr *rmr;
	uint32_t free_slot[SRQ_SLOTS], nfree;
	uint32_t srq_posted;
	uint8_t *rx_used;
	uint32_t rx_cap;
};

struct wl_conn {
	struct wl_ep ep[2];
	bool dead;
	/* SHIFT may fail a connection only because an atomic was in flight
	 * at one of its ends (retrying it could apply it twice); the other
	 * end then sees errors too, possibly first */
	bool atomic_error;
	char unexplained[160];
	/* wl_params.poison: the application's own error was posted, and
	 * refused by the responder (its remote access error seen) */
	bool poisoned, refused;
};

struct wl {
	struct sim_world *w;
	struct wl_params p;
	uint64_t rng;
	struct wl_side side[2];
	struct wl_conn conn[WL_MAX_CONN];
	struct wl_report rep;
	uint32_t poison_at;		/* WRs posted by (0, 0) before its poison */
};

static const char *const kind_names[WL_NKINDS] = {
	"nccl", "sendrecv", "read", "mix",
};

const char *wl_kind_name(enum wl_kind k)
{
	return k < WL_NKINDS ? kind_names[k] : "?";
}

int wl_kind_parse(const char *s, enum wl_kind *k)
{
	for (int i = 0; i < WL_NKINDS; i++) {
		if (!strcmp(s, kind_names[i])) {
			*k = (enum wl_kind)i;
			return 0;
		}
	}
	return -1;
}

static uint64_t wl_rand(struct wl *wl)
{
	uint64_t z = (wl->rng += 0x9E3779B97F4A7C15ULL);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

static uint32_t mix32(uint32_t a, uint32_t b, uint32_t c, uint32_t d)
{
	uint32_t x = a * 0x9E3779B1u ^ b * 0x85EBCA77u ^ c * 0xC2B2AE3Du ^
		     d * 0x27D4EB2Fu;

	x ^= x >> 15;
	x *= 0x2C1B3C6Du;
	x ^= x >> 12;
	x *= 0x297A2D39u;
	x ^= x >> 15;
	return x;
}

/* Byte off of message m sent by side dir on connection conn. */
static uint8_t pat(const struct wl_ep *s, uint32_t m, uint32_t off)
{
	return (uint8_t)mix32(s->conn, s->side, m, off);
}

static uint32_t msg_len(const struct wl_ep *s, uint32_t m)
{
	uint32_t h = mix32(s->conn, s->side, m, 0xffffffffu);

	if (s->wl->p.kind == WL_SENDRECV)
		return 8 + h % (SLOT - 8);
	return 1 + h % SLOT;
}

static const char *wc_status_name(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_SUCCESS: return "success";
	case IBV_WC_LOC_LEN_ERR: return "local length error";
	case IBV_WC_LOC_PROT_ERR: return "local protection error";
	case IBV_WC_WR_FLUSH_ERR: return "flush error";
	case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request";
	case IBV_WC_REM_ACCESS_ERR: return "remote access error";
	case IBV_WC_REM_OP_ERR: return "remote operation error";
	case IBV_WC_RETRY_EXC_ERR: return "retry exceeded";
	case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry exceeded";
	default: return "error";
	}
}

/* A note in the world's trace (what the application saw, in order). */
static void wl_note(struct wl *wl, uint32_t tag, uint64_t a, uint64_t b)
{
	if (wl->p.enter)
		wl->p.enter();
	sim_world_note(wl->w, tag, a, b);
	if (wl->p.leave)
		wl->p.leave();
}

static void violation(struct wl *wl, const char *fmt, ...)
{
	va_list ap;

	wl->rep.violations++;
	if (wl->rep.violations > 1)
		return;
	va_start(ap, fmt);
	vsnprintf(wl->rep.first, sizeof(wl->rep.first), fmt, ap);
	va_end(ap);
}

static struct wl_ep *peer(struct wl_ep *e)
{
	return &e->wl->conn[e->conn].ep[!e->side];
}

/* --- posting ------------------------------------------------------------- */

static uint32_t ring_room(const struct wl_ep *e)
{
	return SQ_DEPTH - (e->r_tail - e->r_head);
}

static void first_error(struct wl_ep *e, const char *what, uint64_t wr_id);
static bool atomics_out(struct wl_ep *e);

/* One WR through the ibv_wr_* builders (wr_id and flags set already). */
static void build_ex(struct ibv_qp_ex *q, const struct ibv_send_wr *wr)
{
	switch (wr->opcode) {
	case IBV_WR_RDMA_WRITE:
		ibv_wr_rdma_write(q, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr);
		break;
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		ibv_wr_rdma_write_imm(q, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, wr->imm_data);
		break;
	case IBV_WR_RDMA_READ:
		ibv_wr_rdma_read(q, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr);
		break;
	case IBV_WR_SEND:
		ibv_wr_send(q);
		break;
	case IBV_WR_SEND_WITH_IMM:
		ibv_wr_send_imm(q, wr->imm_data);
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		ibv_wr_atomic_cmp_swp(q, wr->wr.atomic.rkey, wr->wr.atomic.remote_addr,
				      wr->wr.atomic.compare_add, wr->wr.atomic.swap);
		break;
	default:
		ibv_wr_atomic_fetch_add(q, wr->wr.atomic.rkey, wr->wr.atomic.remote_addr,
					wr->wr.atomic.compare_add);
		break;
	}
}

/* ibv_post_send's chain through ibv_wr_start .. ibv_wr_complete: all or
 * nothing (*bad = the chain on failure). */
static int post_ex(struct ibv_qp_ex *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	int rc;

	ibv_wr_start(q);
	for (struct ibv_send_wr *x = wr; x; x = x->next) {
		q->wr_id = x->wr_id;
		q->wr_flags = x->send_flags & ~(unsigned)IBV_SEND_INLINE;
		build_ex(q, x);
		if (x->send_flags & IBV_SEND_INLINE) {
			struct ibv_data_buf b[4];

			for (int i = 0; i < x->num_sge && i < 4; i++) {
				b[i].addr = (void *)(uintptr_t)x->sg_list[i].addr;
				b[i].length = x->sg_list[i].length;
			}
			if (x->num_sge == 1)
				ibv_wr_set_inline_data(q, b[0].addr, b[0].length);
			else
				ibv_wr_set_inline_data_list(q, (size_t)x->num_sge, b);
		} else if (x->num_sge == 1) {
			ibv_wr_set_sge(q, x->sg_list[0].lkey, x->sg_list[0].addr,
				       x->sg_list[0].length);
		} else {
			ibv_wr_set_sge_list(q, (size_t)x->num_sge, x->sg_list);
		}
	}
	rc = ibv_wr_complete(q);
	if (rc)
		*bad = wr;
	return rc;
}

/* Posts a chain; records each WR in the ring. A failed post is an
 * app-visible error. */
/* split_sge: each one-SGE WR's buffer as 3 SGEs over the same bytes (the
 * first 8 of a chain; atomics and inline WRs as they are) */
static void split_sges(struct ibv_send_wr *wr, struct ibv_sge (*sp)[3], struct ibv_sge **saved)
{
	unsigned k = 0;

	for (struct ibv_send_wr *x = wr; x && k < 8; x = x->next, k++) {
		const struct ibv_sge *g = x->sg_list;

		saved[k] = x->sg_list;
		if (x->num_sge != 1 || g->length < 3 || (x->send_flags & IBV_SEND_INLINE) ||
		    x->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || x->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
			continue;
		uint32_t a = g->length / 3, b = g->length / 2 - a / 2;

		sp[k][0] = (struct ibv_sge){ g->addr, a, g->lkey };
		sp[k][1] = (struct ibv_sge){ g->addr + a, b, g->lkey };
		sp[k][2] = (struct ibv_sge){ g->addr + a + b, g->length - a - b, g->lkey };
		x->sg_list = sp[k];
		x->num_sge = 3;
	}
}

static void unsplit_sges(struct ibv_send_wr *wr, struct ibv_sge **saved)
{
	unsigned k = 0;

	for (struct ibv_send_wr *x = wr; x && k < 8; x = x->next, k++) {
		if (x->sg_list != saved[k])
			x->num_sge = 1;
		x->sg_list = saved[k];
	}
}

static bool post(struct wl_ep *e, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad = NULL;
	struct ibv_sge split[8][3], *saved[8];
	int rc;

	for (struct ibv_send_wr *x = wr; x; x = x->next) {
		e->ring[e->r_tail % SQ_DEPTH] = x->wr_id;
		e->ring_sig[e->r_tail % SQ_DEPTH] =
			(x->send_flags & IBV_SEND_SIGNALED) != 0;
		e->r_tail++;
	}
	if (e->wl->p.split_sge)
		split_sges(wr, split, saved);
	rc = e->qpx ? post_ex(e->qpx, wr, &bad) : ibv_post_send(e->qp, wr, &bad);
	if (e->wl->p.split_sge)
		unsplit_sges(wr, saved);
	if (rc) {
		/* un-record what was not posted */
		for (struct ibv_send_wr *x = bad; x; x = x->next)
			e->r_tail--;
		e->wl->rep.app_errors++;
		first_error(e, "failed post", bad ? bad->wr_id : wr->wr_id);
		e->wl->conn[e->conn].dead = true;
		return false;
	}
	return true;
}

/* A receive on the side's SRQ: wr_id = K_RECV, buffer slot, side-wide
 * sequence number. */
static int post_srq_recv(struct wl_ep *e, struct ibv_recv_wr *wr)
{
	struct wl_side *sd = &e->wl->side[e->side];
	struct ibv_sge sge;
	struct ibv_recv_wr *bad;
	uint32_t slot;

	if (!sd->nfree)
		return ENOMEM; /* (never: one slot per receive in flight) */
	slot = sd->free_slot[--sd->nfree];
	wr->wr_id = WRID(K_RECV, sd->srq_posted) | (uint64_t)slot << 32;
	sge.addr = (uintptr_t)sd->rbuf + (size_t)slot * SLOT;
	sge.length = SLOT;
	sge.lkey = sd->rmr->lkey;
	wr->sg_list = &sge;
	wr->num_sge = 1;
	if (ibv_post_srq_recv(sd->srq, wr, &bad)) {
		sd->free_slot[sd->nfree++] = slot;
		return EIO;
	}
	sd->srq_posted++;
	return 0;
}

static void post_recv(struct wl_ep *e)
{
	struct ibv_sge sge;
	struct ibv_recv_wr wr, *bad;
	uint32_t b = e->recv_posted % NRECV;

	if (e->wl->p.srq) {
		memset(&wr, 0, sizeof(wr));
		if (post_srq_recv(e, &wr)) {
			e->wl->rep.app_errors++;
			first_error(e, "failed post", wr.wr_id);
			e->wl->conn[e->conn].dead = true;
			return;
		}
		e->recv_posted++;
		return;
	}

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = WRID(K_RECV, e->recv_posted);
	struct ibv_sge two[2];

	if (e->wl->p.kind == WL_SENDRECV) {
		sge.addr = (uintptr_t)e->buf + O_RECV + b * SLOT;
		sge.length = SLOT;
		sge.lkey = e->mr->lkey;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		if (e->wl->p.split_sge) {
			two[0] = (struct ibv_sge){ sge.addr, SLOT / 2 - 8, sge.lkey };
			two[1] = (struct ibv_sge){ sge.addr + SLOT / 2 - 8, SLOT / 2 + 8, sge.lkey };
			wr.sg_list = two;
			wr.num_sge = 2;
		}
	}
	if (ibv_post_recv(e->qp, &wr, &bad)) {
		e->wl->rep.app_errors++;
		first_error(e, "failed post", wr.wr_id);
		e->wl->conn[e->conn].dead = true;
		return;
	}
	e->recv_posted++;
}

static uint64_t credit(const struct wl_ep *e)
{
	uint64_t c;

	memcpy(&c, e->buf + O_CREDIT, 8);
	return c;
}

static bool post_cts(struct wl_ep *e)
{
	uint64_t v = e->rx_next;
	struct ibv_sge sge = { (uintptr_t)&v, 8, 0 };
	struct ibv_send_wr wr;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = WRID(K_CTS, e->cts_sent);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_INLINE |
			(e->cts_sent % 4 == 3 ? IBV_SEND_SIGNALED : 0);
	wr.wr.rdma.remote_addr = e->raddr + O_CREDIT;
	wr.wr.rdma.rkey = e->rkey;
	e->cts_pending = false;
	e->cts_sent++;
	return post(e, &wr);
}

/* NCCL Simple: unsignaled writes of the data, then a signaled
 * write-with-imm carrying the message number. */
static bool post_nccl(struct wl_ep *e)
{
	uint32_t m = e->tx_next, len = msg_len(e, m), slot = m % SLOTS;
	uint32_t h = mix32(e->conn, e->side, m, 0xabcdu);
	uint32_t nchunk = 1 + h % 3, imm_carries = (h >> 4) & 1;
	struct ibv_send_wr wr[4];
	struct ibv_sge sge[4];
	uint8_t *stage = e->buf + O_STAGE + slot * SLOT;
	uint32_t off = 0, nw;

	for (uint32_t i = 0; i < len; i++)
		stage[i] = pat(e, m, i);
	if (nchunk > len)
		nchunk = len;
	nw = nchunk + !imm_carries;	/* WRs including the notification */
	memset(wr, 0, sizeof(wr));
	for (uint32_t i = 0; i < nw; i++) {
		uint32_t clen = i < nchunk ? (i + 1 == nchunk ? len - off :
					      len / nchunk) : 0;

		sge[i].addr = (uintptr_t)stage + off;
		sge[i].length = clen;
		sge[i].lkey = e->mr->lkey;
		wr[i].sg_list = &sge[i];
		wr[i].num_sge = 1;
		wr[i].opcode = IBV_WR_RDMA_WRITE;
		wr[i].wr_id = WRID(K_DATA, m);
		wr[i].wr.rdma.remote_addr = e->raddr + O_SLOTS + slot * SLOT + off;
		wr[i].wr.rdma.rkey = e->rkey;
		wr[i].next = i + 1 < nw ? &wr[i + 1] : NULL;
		off += clen;
	}
	wr[nw - 1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr[nw - 1].imm_data = htobe32(m);
	wr[nw - 1].wr_id = WRID(K_NOTIFY, m);
	wr[nw - 1].send_flags = IBV_SEND_SIGNALED;
	e->tx_next++;
	return post(e, wr);
}

static bool post_send_msg(struct wl_ep *e)
{
	uint32_t m = e->tx_next, len = msg_len(e, m), slot = m % SLOTS;
	uint8_t *stage = e->buf + O_STAGE + slot * SLOT;
	struct ibv_sge sge = { (uintptr_t)stage, len, e->mr->lkey };
	struct ibv_send_wr wr;
	uint64_t hdr = m;
	bool sig = (m & 1) || m + 1 == e->n_msg || m + 1 >= e->tx_done + SLOTS;

	memcpy(stage, &hdr, 8);
	for (uint32_t i = 8; i < len; i++)
		stage[i] = pat(e, m, i);
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = WRID(K_SEND, m);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = sig ? IBV_SEND_SIGNALED : 0;
	e->tx_next++;
	return post(e, &wr);
}

static void read_geom(const struct wl_ep *e, uint32_t r, uint32_t *off,
		      uint32_t *len)
{
	uint32_t h = mix32(e->conn, e->side, r, 0x5eadu);

	*off = h % (RSRC / 2);
	*len = 1 + (h >> 12) % (RSRC / 2);
}

static bool post_read(struct wl_ep *e)
{
	uint32_t r = e->rd_next, off, len;
	struct ibv_sge sge;
	struct ibv_send_wr wr;

	read_geom(e, r, &off, &len);
	sge.addr = (uintptr_t)e->buf + O_RDST + (r % NRD) * RSRC;
	sge.length = len;
	sge.lkey = e->mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = WRID(K_READ, r);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = e->raddr + O_RSRC + off;
	wr.wr.rdma.rkey = e->rkey;
	e->rd_next++;
	e->rd_out++;
	return post(e, &wr);
}

static bool post_atomic(struct wl_ep *e, bool cas)
{
	uint32_t s = cas ? e->cas_next : e->fa_next;
	struct ibv_sge sge = { (uintptr_t)e->buf + O_ARES + (cas ? 8 : 0), 8,
			       e->mr->lkey };
	struct ibv_send_wr wr;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = WRID(cas ? K_CAS : K_FADD, s);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = cas ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.atomic.remote_addr = e->raddr + (cas ? O_CAS : O_ACNT);
	wr.wr.atomic.rkey = e->rkey;
	wr.wr.atomic.compare_add = cas ? e->cas_expect : 1;
	wr.wr.atomic.swap = e->cas_expect + 1;
	/* counted as issued only once posted: a provider that refuses posts on
	 * a failed QP never issues it */
	if (!post(e, &wr))
		return false;
	if (cas)
		e->cas_next++;
	else
		e->fa_next++;
	return true;
}

/* wl_params.poison: an RDMA WRITE with a bad rkey, the application's own
 * error (its completion: the remote access error) */
static bool post_poison(struct wl_ep *e)
{
	struct ibv_sge sge = { (uintptr_t)e->buf + O_CREDIT, 8, e->mr->lkey };
	struct ibv_send_wr wr;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = WRID(K_POISON, 0);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = e->raddr + O_SLOTS;
	wr.wr.rdma.rkey = e->rkey ^ 0x5a5a00u;
	e->wl->conn[e->conn].poisoned = true;
	return post(e, &wr);
}

/* Posts one unit of work on e if the traffic allows it. */
static bool try_post(struct wl_ep *e)
{
	struct wl *wl = e->wl;
	bool can[4];
	unsigned n = 0, pick;
	uint32_t win = wl->p.kind == WL_SENDRECV ? NRECV : SLOTS;

	if (wl->conn[e->conn].dead)
		return false;
	if (wl->p.poison && !e->conn && !e->side && !wl->conn[0].poisoned && ring_room(e) >= 1 &&
	    e->tx_next + e->rd_next + e->fa_next + e->cas_next >= wl->poison_at)
		return post_poison(e);
	if (e->cts_pending && ring_room(e) >= 1)
		return post_cts(e);
	can[0] = e->tx_next < e->n_msg && e->tx_next < e->tx_done + SLOTS &&
		 e->tx_next - credit(e) < win && ring_room(e) >= 4;
	can[1] = e->rd_next < e->n_rd && e->rd_out < NRD && ring_room(e) >= 1;
	/* one atomic of each kind at a time: results share a buffer */
	can[2] = e->fa_next < e->n_fa && e->fa_next == e->fa_ok + e->fa_err &&
		 ring_room(e) >= 1;
	can[3] = e->cas_next < e->n_cas &&
		 e->cas_next == e->cas_ok + e->cas_err && ring_room(e) >= 1;
	for (int i = 0; i < 4; i++)
		n += can[i];
	if (!n)
		return false;
	pick = (unsigned)(wl_rand(wl) % n);
	for (int i = 0; i < 4; i++) {
		if (!can[i] || pick--)
			continue;
		switch (i) {
		case 0:
			return wl->p.kind == WL_SENDRECV ? post_send_msg(e) :
							   post_nccl(e);
		case 1: return post_read(e);
		case 2: return post_atomic(e, false);
		default: return post_atomic(e, true);
		}
	}
	return false;
}

/* --- completions --------------------------------------------------------- */

/* Retires WRs up to wr_id; a signaled WR passed over is a completion out of
 * order. */
static bool ring_retire(struct wl_ep *e, uint64_t wr_id)
{
	uint32_t i;

	for (i = e->r_head; i != e->r_tail; i++)
		if (e->ring[i % SQ_DEPTH] == wr_id)
			break;
	if (i == e->r_tail) {
		violation(e->wl, "conn %u side %u: completion for unknown wr %#llx",
			  e->conn, e->side, (unsigned long long)wr_id);
		return false;
	}
	for (uint32_t j = e->r_head; j != i; j++) {
		if (e->ring_sig[j % SQ_DEPTH]) {
			violation(e->wl, "conn %u side %u: completion of wr %#llx "
				  "before signaled wr %#llx", e->conn, e->side,
				  (unsigned long long)wr_id,
				  (unsigned long long)e->ring[j % SQ_DEPTH]);
			break;
		}
	}
	e->r_head = i + 1;
	return true;
}

/* The first error an endpoint sees (an error completion or a failed
 * post): SHIFT may surface an error only on a connection with an atomic in
 * flight; anything else must be hidden (judged at the end, see wl_finish). */
static void first_error(struct wl_ep *e, const char *what, uint64_t wr_id)
{
	struct wl *wl = e->wl;
	struct wl_conn *cn = &wl->conn[e->conn];

	if (e->errored)
		return;
	e->errored = true;
	if (!cn->dead)
		wl->rep.conns_failed++;
	if (cn->poisoned) {
		/* (the application's own: on_error checks it; an atomic in
		 * flight at either end may fail the connection first) */
		if (atomics_out(e))
			cn->atomic_error = true;
		return;
	}
	if (e->fa_next != e->fa_ok + e->fa_err || e->cas_next != e->cas_ok + e->cas_err)
		cn->atomic_error = true;
	else if (!cn->unexplained[0])
		snprintf(cn->unexplained, sizeof(cn->unexplained),
			 "conn %u side %u: app-visible %s on idempotent traffic (wr %#llx)",
			 e->conn, e->side, what, (unsigned long long)wr_id);
}

/* An atomic in flight at either end of e's connection (SHIFT then fails the
 * connection, as without SHIFT, on a path failure). */
static bool atomics_out(struct wl_ep *e)
{
	struct wl_conn *cn = &e->wl->conn[e->conn];

	if (cn->atomic_error)
		return true;
	for (int s = 0; s < 2; s++) {
		struct wl_ep *x = &cn->ep[s];

		if (x->fa_next != x->fa_ok + x->fa_err || x->cas_next != x->cas_ok + x->cas_err)
			return true;
	}
	return false;
}

static void on_error(struct wl_ep *e, const struct ibv_wc *wc)
{
	struct wl *wl = e->wl;
	unsigned k = WR_K(wc->wr_id);

	wl->rep.app_errors++;
	if (wl->conn[e->conn].poisoned && !e->errored && wl->p.strict && !atomics_out(e)) {
		/* the application's error reaches it as without SHIFT: the
		 * poisoned WR's remote access error first at the requester,
		 * a flush first at the responder (its QP went to ERR) */
		bool req = !e->side;
		int want = req ? IBV_WC_REM_ACCESS_ERR : IBV_WC_WR_FLUSH_ERR;
		/* (the requester's NIC may have failed before the refusal
		 * came back: SHIFT's failover then finds the peer's QP ended
		 * and the requester's WRs flush, the poisoned one too; or the
		 * poisoned WR was outstanding at a failover, which cannot carry
		 * a key the peer never published: the connection fails as it
		 * would have without SHIFT, with the path's error) */
		bool lost = req && (wc->status == IBV_WC_WR_FLUSH_ERR ||
				    wc->status == IBV_WC_RETRY_EXC_ERR);

		if (req && k == K_POISON && wc->status == IBV_WC_REM_ACCESS_ERR) {
			wl->rep.poison_seen++;
			wl->conn[e->conn].refused = true;
		}
		else if (lost)
			wl->rep.poison_lost++;
		else if (wc->status != (enum ibv_wc_status)want || (req && k != K_POISON))
			violation(wl, "conn %u side %u: first error %s (wr %#llx), expected %s",
				  e->conn, e->side, wc_status_name(wc->status),
				  (unsigned long long)wc->wr_id, wc_status_name(want));
	}
	first_error(e, wc_status_name(wc->status), wc->wr_id);
	wl->conn[e->conn].dead = true;
	if (k == K_RECV) {
		e->recv_done++;
		return;
	}
	ring_retire(e, wc->wr_id);
	if (k == K_FADD) {
		e->fa_err++;
		wl->rep.atomics_err++;
	} else if (k == K_CAS) {
		e->cas_err++;
		wl->rep.atomics_err++;
	} else if (k == K_READ) {
		e->rd_out--;
	}
}

static void on_recv(struct wl_ep *e, const struct ibv_wc *wc)
{
	struct wl *wl = e->wl;
	struct wl_ep *s = peer(e);	/* the sender of what arrives here */
	uint32_t m, len;
	const uint8_t *data;

	struct wl_side *sd = &wl->side[e->side];
	uint32_t slot = (uint32_t)(wc->wr_id >> 32) & 0xffffff;

	if (wl->p.srq) {
		uint32_t r = WR_S(wc->wr_id);

		/* any QP takes the SRQ's next receive: each one once */
		if (r >= sd->srq_posted || r >= sd->rx_cap || sd->rx_used[r] ||
		    slot >= SRQ_SLOTS) {
			violation(wl, "conn %u side %u: SRQ receive %u (slot %u) completed "
				  "twice or never posted", e->conn, e->side, r, slot);
			return;
		}
		sd->rx_used[r] = 1;
	} else if (WR_S(wc->wr_id) != e->recv_done) {
		violation(wl, "conn %u side %u: receive %u completed, expected %u",
			  e->conn, e->side, WR_S(wc->wr_id), e->recv_done);
	}
	e->recv_done++;
	if (wl->p.kind == WL_SENDRECV) {
		uint64_t hdr;

		data = wl->p.srq ? sd->rbuf + (size_t)slot * SLOT :
				   e->buf + O_RECV + (WR_S(wc->wr_id) % NRECV) * SLOT;
		memcpy(&hdr, data, 8);
		m = (uint32_t)hdr;
		if (wc->opcode != IBV_WC_RECV) {
			violation(wl, "conn %u side %u: opcode %d for a send",
				  e->conn, e->side, wc->opcode);
			return;
		}
	} else {
		if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM ||
		    !(wc->wc_flags & IBV_WC_WITH_IMM)) {
			violation(wl, "conn %u side %u: opcode %d, not write-imm",
				  e->conn, e->side, wc->opcode);
			return;
		}
		m = be32toh(wc->imm_data);
		data = e->buf + O_SLOTS + (m % SLOTS) * SLOT;
	}
	if (m != e->rx_next) {
		violation(wl, "conn %u side %u: notification %u, expected %u "
			  "(duplicate or out of order)", e->conn, e->side, m,
			  e->rx_next);
		return;
	}
	len = msg_len(s, m);
	if (wl->p.kind == WL_SENDRECV && wc->byte_len != len)
		violation(wl, "conn %u side %u: message %u byte_len %u != %u",
			  e->conn, e->side, m, wc->byte_len, len);
	for (uint32_t i = wl->p.kind == WL_SENDRECV ? 8 : 0; i < len; i++) {
		if (data[i] != pat(s, m, i)) {
			violation(wl, "conn %u side %u: message %u byte %u is %#x, "
				  "sent %#x", e->conn, e->side, m, i, data[i],
				  pat(s, m, i));
			break;
		}
	}
	memset((uint8_t *)data, 0xee, SLOT);	/* consumed: poison */
	if (wl->p.srq)
		sd->free_slot[sd->nfree++] = slot;
	wl_note(wl, 0x56434552 /* "RECV" */, e->conn << 1 | e->side, m);
	e->rx_next++;
	wl->rep.msgs++;
	wl->rep.bytes += len;
	if (!wl->conn[e->conn].dead) {
		post_recv(e);
		e->cts_pending = true;
	}
}

static void on_send_done(struct wl_ep *e, const struct ibv_wc *wc)
{
	struct wl *wl = e->wl;
	unsigned k = WR_K(wc->wr_id);
	uint32_t s = WR_S(wc->wr_id);

	if (!ring_retire(e, wc->wr_id))
		return;
	switch (k) {
	case K_NOTIFY:
	case K_SEND:
		if (s + 1 <= e->tx_done)
			violation(wl, "conn %u side %u: message %u completed twice",
				  e->conn, e->side, s);
		else
			e->tx_done = s + 1;
		break;
	case K_READ: {
		uint32_t off, len;
		const uint8_t *d = e->buf + O_RDST + (s % NRD) * RSRC;
		struct wl_ep *p = peer(e);

		read_geom(e, s, &off, &len);
		for (uint32_t i = 0; i < len; i++) {
			if (d[i] != pat(p, 0xffffffffu, off + i)) {
				violation(wl, "conn %u side %u: read %u byte %u wrong",
					  e->conn, e->side, s, i);
				break;
			}
		}
		e->rd_out--;
		e->rd_done++;
		break;
	}
	case K_FADD: {
		uint64_t v;

		memcpy(&v, e->buf + O_ARES, 8);
		if (v >= NAT || e->fa_seen[v])
			violation(wl, "conn %u side %u: fetch-add returned %llu twice "
				  "(applied twice)", e->conn, e->side,
				  (unsigned long long)v);
		else
			e->fa_seen[v] = 1;
		e->fa_ok++;
		wl->rep.atomics_ok++;
		break;
	}
	case K_CAS: {
		uint64_t v;

		memcpy(&v, e->buf + O_ARES + 8, 8);
		if (v != e->cas_expect)
			violation(wl, "conn %u side %u: compare-swap %u found %llu, "
				  "expected %llu (applied twice or lost)", e->conn,
				  e->side, s, (unsigned long long)v,
				  (unsigned long long)e->cas_expect);
		e->cas_expect++;
		e->cas_ok++;
		wl->rep.atomics_ok++;
		break;
	}
	default:
		break;
	}
}

static struct wl_ep *ep_of(struct wl *wl, unsigned side, uint32_t qpn)
{
	for (unsigned c = 0; c < wl->p.nconn; c++)
		if (wl->conn[c].ep[side].qp->qp_num == qpn)
			return &wl->conn[c].ep[side];
	return NULL;
}

static bool poll_cq_of(struct wl *wl, unsigned side, struct ibv_cq *cq);

static bool poll_side(struct wl *wl, unsigned side)
{
	struct wl_side *sd = &wl->side[side];
	bool moved = poll_cq_of(wl, side, sd->cq);

	if (sd->rcq != sd->cq)
		moved |= poll_cq_of(wl, side, sd->rcq);
	return moved;
}

/* ibv_poll_cq's answer through ibv_start_poll .. ibv_end_poll and the
 * ibv_wc_read_* accessors (the CQ's wc_flags: byte_len, imm, qp_num). */
static int poll_ex(struct ibv_cq_ex *cq, int max, struct ibv_wc *wc)
{
	struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
	int n = 0, rc = ibv_start_poll(cq, &attr);

	if (rc)
		return rc == ENOENT ? 0 : -1;
	do {
		memset(&wc[n], 0, sizeof(wc[n]));
		wc[n].wr_id = cq->wr_id;
		wc[n].status = cq->status;
		wc[n].opcode = ibv_wc_read_opcode(cq);
		wc[n].vendor_err = ibv_wc_read_vendor_err(cq);
		wc[n].qp_num = ibv_wc_read_qp_num(cq);
		wc[n].wc_flags = ibv_wc_read_wc_flags(cq);
		if (wc[n].status == IBV_WC_SUCCESS) {
			wc[n].byte_len = ibv_wc_read_byte_len(cq);
			if (wc[n].wc_flags & IBV_WC_WITH_IMM)
				wc[n].imm_data = ibv_wc_read_imm_data(cq);
		}
		n++;
	} while (n < max && !(rc = ibv_next_poll(cq)));
	ibv_end_poll(cq);
	return rc && rc != ENOENT ? -1 : n;
}

static bool poll_cq_of(struct wl *wl, unsigned side, struct ibv_cq *cq)
{
	struct ibv_wc wc[16];
	struct wl_side *sd = &wl->side[side];
	struct ibv_cq_ex *cqx = !sd->cqx ? NULL : cq == sd->cq ? sd->cqx : sd->rcqx;
	int n = cqx ? poll_ex(cqx, 16, wc) : ibv_poll_cq(cq, 16, wc);

	if (n < 0) {
		violation(wl, "side %u: poll_cq failed", side);
		return false;
	}
	for (int i = 0; i < n; i++) {
		struct wl_ep *e = ep_of(wl, side, wc[i].qp_num);

		wl_note(wl, 0x4c4c4f50 /* "POLL" */, wc[i].wr_id,
			(uint64_t)wc[i].status << 32 | wc[i].qp_num);
		if (!e) {
			violation(wl, "side %u: completion for unknown qp %u",
				  side, wc[i].qp_num);
			continue;
		}
		/* (with a CQ per queue, a success polled from one may come
		 * after a flush polled from the other) */
		if (wc[i].status == IBV_WC_SUCCESS && e->errored && wl->conn[e->conn].poisoned &&
		    !wl->p.split_cq)
			violation(wl, "conn %u side %u: success (wr %#llx) after its QP failed",
				  e->conn, e->side, (unsigned long long)wc[i].wr_id);
		if (wc[i].status != IBV_WC_SUCCESS)
			on_error(e, &wc[i]);
		else if (wc[i].opcode & IBV_WC_RECV)
			on_recv(e, &wc[i]);
		else
			on_send_done(e, &wc[i]);
	}
	return n > 0;
}

bool wl_step(struct wl *wl)
{
	unsigned n = 2 * wl->p.nconn, start = (unsigned)(wl_rand(wl) % n);

	for (unsigned k = 0; k < n; k++) {
		unsigned i = (start + k) % n;
		struct wl_ep *e = &wl->conn[i >> 1].ep[i & 1];

		if (poll_side(wl, e->side) | try_post(e))
			return true;
	}
	return false;
}

static bool ep_finished(const struct wl_ep *e)
{
	return e->tx_done == e->n_msg && e->rx_next == peer((struct wl_ep *)e)->n_msg &&
	       e->rd_done == e->n_rd && e->fa_ok == e->n_fa &&
	       e->cas_ok == e->n_cas && !e->cts_pending;
}

bool wl_done(const struct wl *wl)
{
	for (unsigned c = 0; c < wl->p.nconn; c++)
		if (!wl->conn[c].dead && (!ep_finished(&wl->conn[c].ep[0]) ||
					  !ep_finished(&wl->conn[c].ep[1])))
			return false;
	return true;
}

/* The poisoned connection: its requester saw the error, and both QPs are in
 * ERR as the application reads them. */
static void poison_finish(struct wl *wl)
{
	struct wl_conn *cn = &wl->conn[0];

	if (!cn->poisoned)
		return;
	if (wl->p.strict && !cn->ep[0].errored && !cn->atomic_error)
		violation(wl, "conn 0: the application's error never reached it");
	for (unsigned s = 0; s < 2; s++) {
		struct ibv_qp_attr attr;
		struct ibv_qp_init_attr init;

		/* (the requester's QP fails with its first error; the
		 * responder's when it refused the poisoned WR) */
		if (s ? !cn->refused : !cn->ep[0].errored)
			continue;
		memset(&attr, 0, sizeof(attr));
		if (wl->side[s].v->query_qp(cn->ep[s].qp, &attr, IBV_QP_STATE, &init) ||
		    attr.qp_state != IBV_QPS_ERR)
			violation(wl, "conn 0 side %u: QP state %d after the application's error, not ERR",
				  s, (int)attr.qp_state);
	}
}

void wl_finish(struct wl *wl, struct wl_report *r)
{
	bool strict = wl->p.strict;

	poison_finish(wl);

	for (unsigned c = 0; c < wl->p.nconn; c++) {
		struct wl_conn *cn = &wl->conn[c];

		if (strict && cn->unexplained[0] && !cn->atomic_error) {
			if (wl->p.kv_faults)
				wl->rep.kv_lost++;
			else
				violation(wl, "%s", cn->unexplained);
		}
		if (!cn->dead && (!ep_finished(&cn->ep[0]) ||
				  !ep_finished(&cn->ep[1]))) {
			wl->rep.unfinished++;
			if (strict)
				violation(wl, "conn %u: did not finish (stalled)", c);
		}
		for (int s = 0; s < 2; s++) {
			struct wl_ep *e = &cn->ep[s];
			struct wl_ep *p = &cn->ep[!s];
			uint64_t fa, cas;

			memcpy(&fa, p->buf + O_ACNT, 8);
			memcpy(&cas, p->buf + O_CAS, 8);
			/* an atomic is applied at most once, and every one in
			 * flight at a failure surfaced (ok or error) */
			if (fa < e->fa_ok || fa > e->fa_ok + e->fa_err)
				violation(wl, "conn %u side %u: fetch-add counter %llu, "
					  "%u ok %u failed", c, s,
					  (unsigned long long)fa, e->fa_ok, e->fa_err);
			if (cas < e->cas_ok || cas > e->cas_ok + e->cas_err)
				violation(wl, "conn %u side %u: compare-swap word %llu, "
					  "%u ok %u failed", c, s,
					  (unsigned long long)cas, e->cas_ok,
					  e->cas_err);
			if (e->fa_next != e->fa_ok + e->fa_err ||
			    e->cas_next != e->cas_ok + e->cas_err)
				violation(wl, "conn %u side %u: an atomic never "
					  "completed", c, s);
		}
	}
	*r = wl->rep;
}

/* --- setup and teardown -------------------------------------------------- */

static struct ibv_cq_ex *create_cq_ex(struct ibv_context *ctx)
{
	struct ibv_cq_init_attr_ex a = {
		.cqe = 2048,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM,
	};

	return ibv_create_cq_ex(ctx, &a);
}

/* The side's SRQ, its receive buffer and bookkeeping (wl_params.srq). */
static int open_srq(struct wl_side *sd, const struct wl_params *p)
{
	struct ibv_srq_init_attr sa;

	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = 2 * SRQ_SLOTS;
	sa.attr.max_sge = 1;
	sd->srq = sd->v->create_srq(sd->pd, &sa);
	sd->rbuf = calloc(SRQ_SLOTS, SLOT);
	sd->rx_cap = p->nconn * (p->msgs + 2 * NRECV) + 16;
	sd->rx_used = calloc(sd->rx_cap, 1);
	if (!sd->srq || !sd->rbuf || !sd->rx_used)
		return -1;
	sd->rmr = sd->v->reg_mr(sd->pd, sd->rbuf, SRQ_SLOTS * SLOT, IBV_ACCESS_LOCAL_WRITE);
	for (uint32_t i = 0; i < SRQ_SLOTS; i++)
		sd->free_slot[sd->nfree++] = SRQ_SLOTS - 1 - i;
	return sd->rmr ? 0 : -1;
}

static int open_side(struct wl_side *sd, const struct shift_lower *v,
		     const char *dev, const struct wl_params *p)
{
	bool split_cq = p->split_cq, ex = p->ex_verbs;
	struct ibv_device **list;
	int n = 0;

	sd->v = v;
	list = v->get_device_list(&n);
	if (!list)
		return -1;
	for (int i = 0; i < n && !sd->ctx; i++)
		if (!strcmp(v->get_device_name(list[i]), dev))
			sd->ctx = v->open_device(list[i]);
	v->free_device_list(list);
	if (!sd->ctx)
		return -1;
	sd->pd = v->alloc_pd(sd->ctx);
	if (!sd->pd)
		return -1;
	if (ex) {
		sd->cqx = create_cq_ex(sd->ctx);
		sd->rcqx = split_cq ? create_cq_ex(sd->ctx) : sd->cqx;
		sd->cq = sd->cqx ? ibv_cq_ex_to_cq(sd->cqx) : NULL;
		sd->rcq = sd->rcqx ? ibv_cq_ex_to_cq(sd->rcqx) : NULL;
		if (!sd->cq || !sd->rcq)
			return -1;
		return p->srq ? open_srq(sd, p) : 0;
	}
	sd->cq = v->create_cq(sd->ctx, 2048, NULL, NULL, 0);
	if (!sd->cq)
		return -1;
	sd->rcq = split_cq ? v->create_cq(sd->ctx, 2048, NULL, NULL, 0) : sd->cq;
	if (!sd->rcq)
		return -1;
	return p->srq ? open_srq(sd, p) : 0;
}

static int open_ep(struct wl *wl, struct wl_ep *e, unsigned conn,
		   unsigned side)
{
	struct wl_side *sd = &wl->side[side];
	struct ibv_qp_init_attr ia;

	e->wl = wl;
	e->conn = conn;
	e->side = side;
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = sd->cq;
	ia.recv_cq = sd->rcq;
	ia.cap.max_send_wr = SQ_DEPTH;
	ia.cap.max_recv_wr = sd->srq ? 0 : NRECV * 2;
	ia.srq = sd->srq;
	ia.cap.max_send_sge = wl->p.split_sge ? 3 : 1;
	ia.cap.max_recv_sge = wl->p.split_sge ? 2 : 1;
	ia.cap.max_inline_data = 64;
	ia.qp_type = IBV_QPT_RC;
	if (wl->p.ex_verbs) {
		struct ibv_qp_init_attr_ex ax;

		memset(&ax, 0, sizeof(ax));
		ax.send_cq = ia.send_cq;
		ax.recv_cq = ia.recv_cq;
		ax.cap = ia.cap;
		ax.srq = ia.srq;
		ax.qp_type = IBV_QPT_RC;
		ax.pd = sd->pd;
		ax.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		ax.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
				    IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_READ |
				    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
				    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
		e->qp = ibv_create_qp_ex(sd->ctx, &ax);
		e->qpx = e->qp ? ibv_qp_to_qp_ex(e->qp) : NULL;
		if (!e->qpx)
			return -1;
	} else {
		e->qp = sd->v->create_qp(sd->pd, &ia);
	}
	if (!e->qp)
		return -1;
	e->buf = calloc(1, BUFSZ);
	if (!e->buf)
		return -1;
	for (uint32_t i = 0; i < RSRC; i++)
		e->buf[O_RSRC + i] = pat(e, 0xffffffffu, i);
	e->mr = sd->v->reg_mr(sd->pd, e->buf, BUFSZ,
			      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	if (!e->mr)
		return -1;
	switch (wl->p.kind) {
	case WL_NCCL:
	case WL_SENDRECV:
		e->n_msg = wl->p.msgs;
		break;
	case WL_READ:
		e->n_rd = wl->p.msgs;
		break;
	case WL_MIX:
		e->n_msg = wl->p.msgs;
		e->n_rd = wl->p.msgs / 2;
		e->n_fa = wl->p.msgs / 4 < NAT ? wl->p.msgs / 4 : NAT;
		e->n_cas = wl->p.msgs / 4;
		break;
	default:
		break;
	}
	return 0;
}

struct wl *wl_create(struct sim_world *w, const struct wl_params *p,
		     const struct shift_lower *va, const char *deva,
		     const struct shift_lower *vb, const char *devb,
		     uint64_t seed)
{
	struct wl *wl;

	if (!p->nconn || p->nconn > WL_MAX_CONN || p->kind >= WL_NKINDS) {
		errno = EINVAL;
		return NULL;
	}
	wl = calloc(1, sizeof(*wl));
	if (!wl)
		return NULL;
	wl->w = w;
	wl->p = *p;
	wl->rng = seed;
	wl->poison_at = p->msgs / 3;
	if (open_side(&wl->side[0], va, deva, p) ||
	    open_side(&wl->side[1], vb, devb, p))
		goto fail;
	for (unsigned c = 0; c < p->nconn; c++)
		for (unsigned s = 0; s < 2; s++)
			if (open_ep(wl, &wl->conn[c].ep[s], c, s))
				goto fail;
	for (unsigned c = 0; c < p->nconn; c++) {
		struct sim_ep x[2];
		struct sim_ep_info info[2];

		for (unsigned s = 0; s < 2; s++) {
			struct wl_ep *e = &wl->conn[c].ep[s];

			memset(&x[s], 0, sizeof(x[s]));
			x[s].v = wl->side[s].v;
			x[s].ctx = wl->side[s].ctx;
			x[s].qp = e->qp;
			sim_ep_info(&x[s], (uint32_t)wl_rand(wl), &info[s]);
			e->raddr = (uintptr_t)wl->conn[c].ep[!s].buf;
			e->rkey = wl->conn[c].ep[!s].mr->rkey;
		}
		for (unsigned s = 0; s < 2; s++)
			if (sim_ep_connect(&x[s], &info[s], &info[!s], NULL))
				goto fail;
		for (unsigned s = 0; s < 2; s++)
			for (unsigned i = 0; i < NRECV; i++)
				post_recv(&wl->conn[c].ep[s]);
	}
	return wl;
fail:
	wl_destroy(wl);
	errno = EIO;
	return NULL;
}

void wl_destroy(struct wl *wl)
{
	if (!wl)
		return;
	for (unsigned c = 0; c < WL_MAX_CONN; c++) {
		for (unsigned s = 0; s < 2; s++) {
			struct wl_ep *e = &wl->conn[c].ep[s];
			const struct shift_lower *v = wl->side[s].v;

			if (e->mr)
				v->dereg_mr(e->mr);
			if (e->qp)
				v->destroy_qp(e->qp);
			free(e->buf);
		}
	}
	for (unsigned s = 0; s < 2; s++) {
		struct wl_side *sd = &wl->side[s];

		if (sd->rmr)
			sd->v->dereg_mr(sd->rmr);
		if (sd->srq)
			sd->v->destroy_srq(sd->srq);
		free(sd->rbuf);
		free(sd->rx_used);
		if (sd->rcq && sd->rcq != sd->cq)
			sd->v->destroy_cq(sd->rcq);
		if (sd->cq)
			sd->v->destroy_cq(sd->cq);
		if (sd->pd)
			sd->v->dealloc_pd(sd->pd);
		if (sd->ctx)
			sd->v->close_device(sd->ctx);
	}
	free(wl);
}
