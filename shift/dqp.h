/*
 * The data path of one application RC QP: its work-queue mirror and its
 * send/receive states.
 *
 * The mirror keeps what is needed to rebuild every outstanding send and
 * receive WR on the backup QP: opcode, flags, SGEs, remote address and key,
 * immediate, atomic operands and a copy of inline data (the application may
 * reuse that buffer as soon as post_send returns). It is preallocated at QP
 * creation, indexed like the work queues (head = posted, tail = retired) and
 * retired as completions are polled: a send completion retires every WR up
 * to the signaled one it reports (RC completes in order), a receive
 * completion retires the oldest receive.
 *
 * Concurrency: the application may post and poll one QP from different
 * threads. head is written only by posters (serialized by post_lock, as the
 * provider itself serializes posts), tail only by pollers of the QP's CQ
 * (SHIFT serializes a CQ's pollers in the slow path; in the Default state a
 * CQ is polled by whoever the application lets, as with the provider).
 */
#ifndef SHIFT_DQP_H
#define SHIFT_DQP_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#include "shift/log.h"

enum shift_send_state {
	SHIFT_SEND_DEFAULT,
	SHIFT_SEND_FALLBACK,
	SHIFT_SEND_WAIT_SIGNALED,
	SHIFT_SEND_WAIT_DRAINED,
	SHIFT_SEND_UNPROTECTED, /* mirror overflowed or the QP failed for good */
};

enum shift_recv_state {
	SHIFT_RECV_DEFAULT,
	SHIFT_RECV_FALLBACK,
};

/* wr_ids of what SHIFT posts on a backup QP (it posts nothing else there) */
/*
 * Access flags for the QPs SHIFT connects (the backup QP, the default QP
 * after a reset): the application's plus remote write, which SHIFT's own
 * messages need (handshake and notification WRITE_WITH_IMM, the empty
 * probe WRITE) even when the application only reads or sends. Memory stays
 * protected by each MR's own flags.
 */
#define SHIFT_QP_ACCESS(app) ((app) | IBV_ACCESS_REMOTE_WRITE)

#define SHIFT_WRID_CTRL_RECV 0x7ff0000000000001ull
#define SHIFT_WRID_CTRL_SEND 0x7ff0000000000002ull
/* ... and on a default QP while it is failed over: the recovery probe and
 * the failback notification (and CTRL_RECV, the notification's receive) */
#define SHIFT_WRID_PROBE 0x7ff0000000000003ull
#define SHIFT_WRID_NOTIFY 0x7ff0000000000004ull
#define SHIFT_WRID_DATA (1ull << 63)      /* | RECV | mirror index */
#define SHIFT_WRID_RECV (1ull << 62)
#define SHIFT_WRID_INDEX(w) ((w) & ((1ull << 48) - 1))

/* One mirrored send WR; its SGEs and inline bytes follow it in the ring. */
struct shift_swqe {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint64_t compare_add;
	uint64_t swap;
	uint32_t rkey;
	uint32_t imm;
	uint16_t opcode;   /* enum ibv_wr_opcode */
	uint16_t num_sge;
	uint32_t send_flags;
	uint32_t inline_len; /* bytes copied after the SGEs (IBV_SEND_INLINE) */
	uint32_t pad;
	struct ibv_sge sge[];
};

struct shift_rwqe {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t pad;
	struct ibv_sge sge[];
};

struct shift_dqp {
	struct shift_dqp *next_in_bucket; /* per-context lookup chain (by QPN) */
	struct shift_dqp *next_by_qp;     /* global lookup chain (by QP pointer) */
	struct ibv_qp *qp;                /* the application's QP */
	/* the provider's post verbs of this QP's context (hot path) */
	int (*prov_post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr,
			      struct ibv_send_wr **bad_wr);
	int (*prov_post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr,
			      struct ibv_recv_wr **bad_wr);
	uint32_t qpn;
	char dev[24];                     /* device name, for logs */
	int sq_sig_all;

	enum shift_send_state send_state;
	enum shift_recv_state recv_state;

	/* send mirror */
	int post_lock; /* posters' lock: shift_dqp_lock() */
	uint8_t *sq;          /* sq_size entries of sq_stride bytes */
	uint32_t sq_size;     /* power of two >= the QP's max_send_wr */
	uint32_t sq_stride;
	uint32_t max_send_sge;
	uint32_t max_inline;
	uint64_t *sig;        /* sq indices of signaled WRs, sq_size of them */
	uint64_t sq_head, sq_tail;   /* posted, retired */
	uint64_t sig_head, sig_tail;
	uint64_t recv_consumers_posted; /* SEND*, WRITE_WITH_IMM posted (total) */

	/* receive mirror */
	uint8_t *rq;
	uint32_t rq_size;
	uint32_t rq_stride;
	uint32_t max_recv_sge;
	uint64_t rq_head, rq_tail;   /* posted, consumed (= receive counter) */

	/* failover (shift/failover.c), under the CQs' dp_lock */
	struct shift_qp *shadow;      /* its shadow (backup QP, peer attributes) */
	struct shift_cq *scq, *rcq;   /* shadows of its send and receive CQs */
	struct ibv_qp *bk;            /* the backup QP, once failed over */
	bool ctrl_sent;               /* my handshake message of this epoch */
	bool handshake_done;          /* both messages seen: post on the backup */
	bool ctrl_pending;            /* the peer's arrived, not yet acted on */
	uint32_t peer_recv_count;     /* ... and the receive counter it carried */
	uint64_t ctrl_seen_ms;        /* when the background thread saw it */
	struct { uint32_t app, bk; } rkeys[16]; /* remote key translations */
	unsigned nrkeys;

	/* failback (shift/failover.c), under the CQs' dp_lock */
	uint8_t dflt;                 /* SHIFT_DFLT_*: the default QP's condition */
	uint64_t probe_at;            /* next reset + probe (ms; passes in sync mode) */
	unsigned probe_fails;         /* consecutive failed probes (backoff) */
	uint64_t fence;               /* WaitDrained: the sq index that drains the backup */
	bool notify_pending;          /* the peer's notification arrived: move my
				       * receives once notify_count are consumed */
	uint32_t notify_count;
	bool need_rearm;              /* the backup QP must be reset before reuse */
	bool peer_nosend;             /* the peer's application never sends (RTR only) */

	/* statistics (shiftctl, logs) */
	unsigned long failovers, failbacks, retransmitted;
	bool atomic_boundary_hit;
	uint64_t t_error_us;          /* the error that started the last failover */
	uint64_t switch_us, fallback_us; /* of the last failover; 0 = not yet */
	uint64_t last_switch_s;       /* wall clock of the last transition */
};

/* the default QP while failed over: ERR (needs a reset), READY (reset,
 * receptive to the peer's probe, mine not sent yet), PROBING, OK (answered) */
enum { SHIFT_DFLT_OK, SHIFT_DFLT_ERR, SHIFT_DFLT_READY, SHIFT_DFLT_PROBING };

static inline struct shift_swqe *shift_dqp_swqe(struct shift_dqp *d, uint64_t i)
{
	return (struct shift_swqe *)(d->sq + (size_t)(i & (d->sq_size - 1)) * d->sq_stride);
}

static inline struct shift_rwqe *shift_dqp_rwqe(struct shift_dqp *d, uint64_t i)
{
	return (struct shift_rwqe *)(d->rq + (size_t)(i & (d->rq_size - 1)) * d->rq_stride);
}

static inline bool shift_wr_is_atomic(unsigned opcode)
{
	/* the masked atomics are only reachable through ibv_qp_ex */
	return opcode == IBV_WR_ATOMIC_CMP_AND_SWP || opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

/* Does this send WR consume a receive WQE at the peer? */
static inline bool shift_wr_consumes_recv(unsigned opcode)
{
	return opcode == IBV_WR_SEND || opcode == IBV_WR_SEND_WITH_IMM ||
	       opcode == IBV_WR_SEND_WITH_INV || opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
}

/* Create the data-path state of an RC QP from its actual capabilities
 * (as create_qp returned them). NULL on allocation failure: the QP then
 * runs unprotected. */
struct shift_dqp *shift_dqp_create(struct ibv_qp *qp, const struct ibv_qp_cap *cap,
				   int sq_sig_all);
void shift_dqp_destroy(struct shift_dqp *d);

/*
 * Mirror the WR chain about to be posted. Returns 0, or -1 if the mirror
 * cannot hold it (the QP then becomes unprotected; the post still goes to
 * the provider). Called with post_lock held.
 */
int shift_dqp_record_send(struct shift_dqp *d, const struct ibv_send_wr *wr);
/* Forget the WRs from bad onwards (the provider refused them). */
void shift_dqp_unrecord_send(struct shift_dqp *d, const struct ibv_send_wr *wr,
			     const struct ibv_send_wr *bad, uint64_t head_before);
int shift_dqp_record_recv(struct shift_dqp *d, const struct ibv_recv_wr *wr);
void shift_dqp_unrecord_recv(struct shift_dqp *d, const struct ibv_recv_wr *wr,
			     const struct ibv_recv_wr *bad, uint64_t head_before);

/* post_lock, inline: an uncontended lock is an exchange and a store */
static inline void shift_dqp_lock(struct shift_dqp *d)
{
	while (shift_unlikely(__atomic_exchange_n(&d->post_lock, 1, __ATOMIC_ACQUIRE)))
		while (__atomic_load_n(&d->post_lock, __ATOMIC_RELAXED))
			__builtin_ia32_pause();
}

static inline void shift_dqp_unlock(struct shift_dqp *d)
{
	__atomic_store_n(&d->post_lock, 0, __ATOMIC_RELEASE);
}

/*
 * The common WR, mirrored inline: alone in its chain, one SGE, not inline,
 * not atomic (opcodes WRITE, WRITE_WITH_IMM, SEND, SEND_WITH_IMM, READ).
 * Returns false if this WR needs shift_dqp_record_send().
 */
static inline bool shift_dqp_record_one(struct shift_dqp *d, const struct ibv_send_wr *wr)
{
	if (shift_unlikely(wr->next || wr->num_sge != 1 ||
			   (wr->send_flags & IBV_SEND_INLINE) ||
			   (unsigned)wr->opcode > IBV_WR_RDMA_READ))
		return false;
	uint64_t h = d->sq_head;
	struct shift_swqe *e = shift_dqp_swqe(d, h);

	e->wr_id = wr->wr_id;
	e->sge[0] = wr->sg_list[0];
	e->remote_addr = wr->wr.rdma.remote_addr;
	e->rkey = wr->wr.rdma.rkey;
	e->imm = wr->imm_data;
	e->opcode = (uint16_t)wr->opcode;
	e->num_sge = 1;
	e->send_flags = wr->send_flags;
	e->inline_len = 0;
	if ((wr->send_flags & IBV_SEND_SIGNALED) || d->sq_sig_all)
		d->sig[d->sig_head++ & (d->sq_size - 1)] = h;
	/* WRITE_WITH_IMM, SEND, SEND_WITH_IMM consume a receive at the peer */
	d->recv_consumers_posted += (unsigned)wr->opcode - IBV_WR_RDMA_WRITE_WITH_IMM < 3u;
	d->sq_head = h + 1;
	return true;
}

/* Retire on a successful completion of this QP. */
static inline void shift_dqp_retire(struct shift_dqp *d, const struct ibv_wc *wc)
{
	if (wc->opcode & IBV_WC_RECV) {
		d->rq_tail++;
	} else if (d->sig_tail != d->sig_head) {
		d->sq_tail = d->sig[d->sig_tail & (d->sq_size - 1)] + 1;
		d->sig_tail++;
	}
}

#endif /* SHIFT_DQP_H */
