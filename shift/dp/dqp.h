/*
 * The data path of one application RC QP: its work-queue mirror and its
 * send/receive states.
 *
 * The mirror keeps what is needed to rebuild every outstanding send and
 * receive WR on the backup QP: opcode, flags, SGEs, remote address and key,
 * immediate, atomic operands and a copy of inline data (the application may
 * reuse that buffer as soon as post_send returns). It is preallocated at QP
 * creation and indexed like the work queues (head = posted, tail = retired);
 * sig is the ring of the sq indices of signaled WRs, in order.
 *
 * Retirement is counted on the poll path, applied later: a successful
 * receive completion adds one to rq_tail (it retires the oldest receive), a
 * successful send completion adds one to sig_tail, the number of signaled
 * WRs completed. RC completes in order, so the sig_tail-th signaled WR and
 * every WR before it are retired. The poster only counts the signaled WRs
 * it mirrors (sig_head); shift_dqp_sync_locked() finds the sig_tail-th one
 * by walking back from sq_head over the (sig_head - sig_tail) signaled WRs
 * still outstanding, and sets sq_tail past it. The send mirror holds twice
 * the QP's capacity, so a sync from the post path comes at most once per
 * sq_size / 2 posts and walks at most max_send_wr entries: at most one
 * entry per post, usually none. sq_tail is therefore exact only right after
 * a sync: the poster syncs when the mirror looks full, failover code calls
 * shift_dqp_sync() before reading it.
 *
 * The fast paths test one bound each: sq_limit (rq_limit) is above sq_head
 * (rq_head) only while the mirror has room and the QP is in the Default
 * state. Leaving Default zeroes both (shift_dqp_set_send_state(), under
 * post_lock), so the next post takes the slow path; a sync computes them
 * again for the state it finds. Entries have power-of-two strides: entry
 * i sits at byte (i * stride) & (size * stride - 1), a multiply and a mask.
 *
 * Concurrency: the application may post and poll one QP from different
 * threads. Posters own everything under "posters" below (post_lock, as the
 * provider itself serializes posts); pollers only add to sig_tail and
 * rq_tail, atomically, so a CQ may be polled by several threads in the
 * Default state as the provider allows.
 */
#ifndef SHIFT_DQP_H
#define SHIFT_DQP_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#include "shift/base/cpu.h"
#include "shift/base/log.h"
#include "shift/dp/state.h"
#include "shift/dp/wrid.h"

/* Access flags for the QPs SHIFT connects (backup, default after a reset):
 * the application's plus remote write, which SHIFT's own messages need
 * (handshake and notification WRITE_WITH_IMM, the empty probe WRITE); each
 * MR's own flags still protect memory. */
#define SHIFT_QP_ACCESS(app) ((app) | IBV_ACCESS_REMOTE_WRITE)

/*
 * One mirrored send WR; its SGEs and inline bytes follow it in the ring.
 * num_sge .. rkey are laid out as in struct ibv_send_wr (RDMA variant), so
 * the common WR is mirrored with one 32-byte block copy (see dqp.c's
 * static assertions).
 */
struct shift_swqe {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t opcode;     /* enum ibv_wr_opcode */
	uint32_t send_flags;
	uint32_t imm;
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t inline_len; /* bytes copied after the SGEs (IBV_SEND_INLINE) */
	uint64_t compare_add;
	uint64_t swap;
	struct ibv_sge sge[];
};

struct shift_rwqe {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t pad;
	struct ibv_sge sge[];
};

/* A key and value (an episode record at most) of mine the background
 * thread writes (fo/kvq.c): as encoded at seq; done, the seq written.
 * Under rk_lock. */
#define SHIFT_KV_SLOT_VAL 112
struct shift_kv_slot { char key[80], val[SHIFT_KV_SLOT_VAL]; unsigned len; uint64_t seq, done; };
struct shift_fo_stash; /* (shift/fo/fo_int.h) */
struct shift_nwq;      /* (shift/dp/nwq.h) */

/* A backup key as read: the key, and the range of remote addresses the
 * peer's MR answers to ([addr, addr + len); ranged false: any) */
struct shift_rkey_val {
	uint32_t bk;
	bool ranged;
	uint64_t addr, len;
};
/* A peer's backup rkey for one of its application rkeys (fo/kvq.c). */
struct shift_rkey {
	uint32_t app;
	uint8_t st;        /* SHIFT_RK_* */
	bool has_prev;     /* prev: the fallback when the store cannot tell */
	/* wanted by the read-ahead, not by a failover; the store cannot give it:
	 * asked of the peer (fo/mbox.c); known before this failover: read again */
	bool ahead, ask, confirm;
	struct shift_rkey_val v;    /* SHIFT_RK_KNOWN: the one in use */
	struct shift_rkey_val prev; /* the one an earlier read gave (has_prev) */
	uint64_t at_ms, want_ms; /* its read issued (known, absent); wanted since */
};
enum { SHIFT_RK_WANT, SHIFT_RK_KNOWN, SHIFT_RK_ABSENT };

struct shift_dqp {
	/*
	 * Hot: what post and poll touch in the Default state, in four cache
	 * lines (the static assertions in dqp.c hold it there): posting a
	 * send reads and writes the first, counts its opcode in the second
	 * and reads its ring geometry from the third; posting a receive
	 * takes post_lock and looks the QP up in the first and works in the
	 * third; a poll touches only the fourth, the pollers' own line, so a
	 * poller on another thread never shares a line a poster writes. The
	 * rest of the structure (failover and failback, cold) follows on
	 * lines of its own.
	 */
	struct {
		int post_lock; /* posters' lock: shift_dqp_lock(); first, for the fast path */
		int sq_sig_all;
		struct ibv_qp *qp;            /* the application's QP */
		struct shift_dqp *next_by_qp; /* global lookup chain (post path), ends at shift_dqp_none */
		/* the provider's post_send of this QP's context */
		int (*prov_post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr,
				      struct ibv_send_wr **bad_wr);
		/* send mirror (posters) */
		uint8_t *sq;          /* sq_size entries of sq_stride bytes */
		uint64_t sq_head;     /* posted */
		uint64_t sq_limit;    /* sq_tail + sq_size in Default, else 0 (see above) */
		uint64_t sig_head;    /* signaled WRs mirrored */
	} __attribute__((aligned(64)));
	struct {
		/* send WRs posted, by opcode (shift_dqp_opslot()): the receive
		 * consumers among them are shift_dqp_consumers_posted(), used
		 * modulo 2^32 */
		uint32_t posted_by_op[12];
		/* native access (dp/nwq.h): the provider's send and receive
		 * producer counters (big-endian doorbell records), NULL on
		 * the mirror path */
		const volatile uint32_t *sq_dbrec, *rq_dbrec;
	} __attribute__((aligned(64)));
	struct {
		union {
			struct {
				enum shift_send_state send_state;
				enum shift_recv_state recv_state;
			};
			uint64_t states; /* both at once: 0 = both Default (post_recv's test) */
		};
		/* the provider's post_recv of this QP's context */
		int (*prov_post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr,
				      struct ibv_recv_wr **bad_wr);
		/* receive mirror (posters) */
		uint8_t *rq;
		uint64_t rq_head;     /* posted */
		uint64_t rq_limit;    /* a recent rq_tail + rq_size in Default (states 0), else 0 */
		uint32_t rq_stride;   /* bytes, a multiple of 8 */
		uint32_t rq_mask;     /* rq_size - 1 (a power of two) */
		uint32_t rq_size;
		/* the send mirror's geometry */
		uint32_t sq_stride;   /* bytes, a multiple of 8 (rings < 4 GB: 32-bit offsets) */
		uint32_t sq_mask;     /* sq_size - 1 (a power of two) */
		/* a single inline WR's fast path (post.c): where an entry's
		 * inline bytes start (after max_send_sge SGEs), and the most
		 * it copies (max_inline, at most 64: shift_copy64()) */
		uint16_t inl_off, inl_max;
	} __attribute__((aligned(64)));
	struct {
		/* pollers: atomic adds only (shift_dqp_retire) */
		uint64_t sig_tail;    /* signaled send WRs completed */
		uint64_t rq_tail;     /* receives consumed (= receive counter) */
		uint32_t qpn;
		struct shift_dqp *next_in_bucket; /* per-context lookup chain (by QPN) */
	} __attribute__((aligned(64)));

	/* ---- cold: on lines of their own (the alignment below) ---- */
	char dev[24] __attribute__((aligned(64))); /* device name, for logs */
	uint32_t sq_size;     /* power of two >= 2 x the QP's max_send_wr */
	uint64_t sq_tail;     /* retired, as of the last sync */
	uint64_t sig_synced;  /* sig_tail as of the last sync */
	uint32_t max_send_sge, max_inline, max_recv_sge;

	struct shift_nwq *nwq;        /* native access (dp/nwq.h), NULL: mirror */

	/* failover (shift/fo/), under the CQs' dp_lock */
	struct shift_qp *shadow;      /* its shadow (backup QP, peer attributes) */
	struct shift_cq *scq, *rcq;   /* shadows of its send and receive CQs */
	struct ibv_cq *scq_app, *rcq_app; /* ... and the application's CQs they shadow */
	struct ibv_qp *bk;            /* the backup QP, once failed over */
	/* my handshake message of this epoch sent; both seen (post on the
	 * backup); the peer's arrived, not yet acted on */
	bool ctrl_sent, handshake_done, ctrl_pending;
	uint32_t peer_recv_count;     /* ... and the receive counter it carried */
	/* the peer's backup rkeys, read ahead by the background thread
	 * (fo/kvq.c): under rk_lock, which nobody holds across I/O */
	pthread_mutex_t rk_lock;
	struct shift_rkey *rk;        /* rk_n of rk_cap entries */
	unsigned rk_n, rk_cap;
	uint64_t rk_since_ms;         /* read before this (the failover's start): stale */
	bool rk_want;                 /* an entry waits for its read */
	uint64_t rk_scan_at;          /* (background) next read-ahead of the mirror's keys */
	uint64_t rk_scan_head;        /* (background) sq_head at the last read-ahead */
	bool rk_earlier_said;         /* an earlier key used in this failover: logged */
	struct shift_kv_slot ep_pub, poke_pub; /* my episode record, my poke (fo/kvq.c) */
	/* sends held behind one whose peer key is not read yet (fo/kvq.c),
	 * post_lock: from sq_held_from on; below sq_held_exec only READs are
	 * sent again, the others replaced (fo_retransmit) */
	bool sq_held;
	uint64_t sq_held_from, sq_held_exec;
	/* sq_head when the last failover's retransmission began: a WR below
	 * it was outstanding when the default path failed (post_lock) */
	uint64_t sq_retx_end;
	uint64_t serial;              /* unique among all QPs of the process */

	/* failback (shift/fo/failback.c), under the CQs' dp_lock */
	uint8_t dflt;                 /* SHIFT_DFLT_*: the default QP's condition */
	uint64_t probe_at;            /* next reset + probe (ms; passes in sync mode) */
	unsigned probe_fails;         /* consecutive failed probes (backoff) */
	unsigned failback_fails;      /* consecutive switch backs whose notification failed */
	uint64_t fence;               /* WaitDrained: the sq index that drains the backup */
	bool notify_pending;          /* the peer's notification arrived: move my */
	uint32_t notify_count;        /* receives once notify_count are consumed */
	bool need_rearm;              /* the backup QP must be reset before reuse */
	bool notify_inflight;         /* my failback notification has not completed */
	bool ret_rd_wait;             /* a return waits for its empty READ (fo/return.c) */
	/* the default (backup) QP went to ERR with an RDMA READ outstanding,
	 * maybe inside its response: soft-RoCE keeps its completer's
	 * read-response state across a reset, so the first ACK of any other
	 * WR fails the QP silently (see fo/failback.c, stale_read_state). The
	 * QP's next WR is then an empty RDMA READ, whose response clears it. */
	bool dflt_rd_stale, bk_rd_stale;
	/* failover episodes: failover number k runs on backup QPs reset at
	 * both ends for it (generation k - 1, the replay being 0); the KV
	 * store carries each end's generation and latest episode */
	unsigned bk_gen;              /* my backup QP's generation */
	unsigned peer_gen, peer_started; /* the peer's, as last read */
	/* what the episode waits for (shift/dp/state.h; shift_dqp_set_ep_wait()) */
	enum shift_ep_wait ep_wait;
	uint64_t wait_since;          /* the failover started (fb clock) */
	bool bk_flushing;             /* its CQs drained after a reset: errors are SHIFT's */
	bool recv_hold;               /* receives recorded only: start() reposts them */
	bool bk_error;                /* my backup QP failed: a peer's new episode, or the end */
	bool bk_refused;              /* its provider refused my WRs: held (fo_bk_refused) */
	unsigned bk_restarts;         /* failovers I started on a backup failure, in a row */
	uint64_t bk_error_at;
	unsigned bk_probe_fails;      /* probe_fails when the backup failed */
	uint64_t kv_at;               /* next read of the peer's record (fb clock) */
	int8_t kv_pref; /* this pass's batched read: 1 read, -1 failed, -2 none or garbled, 0 not made */
	/* return episodes (fo/return.c): the backup failed, the default path
	 * works; both ends go back to the default QPs (handshake: the store) */
	unsigned long ret_ep;         /* the failover number of my last return ... */
	uint32_t ret_count;           /* ... and my receive counter then (its record
				       * keeps them for the rest of that episode) */
	bool peer_ret;                /* the peer's record is a return episode's ... */
	uint32_t peer_ret_count;      /* ... with its receive counter */
	bool peer_bkfail;             /* the peer's backup failed in its episode */
	bool bkfail_published;        /* my record says my backup failed */
	bool ctrl_recv_out;           /* my control receive on the default QP is posted
				       * and not completed yet */
	bool notify_sent;             /* my failback notification went out since the
				       * peer's last default reset (consumed its
				       * control receive) */
	/* the provider refused a post because the QP failed (failed-post
	 * detection, shift_failover_post_refused): the WRs from sq_taken
	 * (rq_taken) on are SHIFT's to deliver; the background pass starts
	 * the failover unless an error completion started it first */
	bool post_failed;
	uint64_t sq_taken, rq_taken;
	bool peer_nosend;             /* the peer's application never sends (RTR only) */
	/* a failover the peer started and this end never saw (its handshake
	 * message lost with the peer's backup NIC): the poke read found the
	 * peer's record; the background pass follows it (failover.c, poke) */
	bool peer_join;
	unsigned long poked_ep;       /* my episode I poked the peer for */
	unsigned long published_ep;   /* my episode my record last said */
	uint64_t published_at;        /* when it was last put (ms) */
	uint32_t ep_seq, peer_ep_seq; /* my records' count (their seq), the peer's latest taken */
	uint64_t dg_sent;             /* the ep_pub.seq last sent as a datagram (fo/dgram.c) */
	unsigned followed_ep;         /* the peer's return episode I logged following */
	/* errors of the application (fo/apperr.c, shift/dp/errclass.h) */
	struct shift_fo_stash *stash; /* a failover's drain: my errors, judged after it */
	bool start_unsure;            /* the next failover's trigger may be no path failure */
	bool cause_probe;             /* looking for the cause of a flush in the other CQ */
	bool app_ended;               /* the application ended it: its ERR or RESET, or its
				       * error while failed over */
	bool peer_closed;             /* the peer's record says its application did */
	/* a give-up found under post_lock, to finish once it is released
	 * (fo/fail.c): the send (receive) WRs from fail_sq (fail_rq) on are
	 * SHIFT's, those before on the default QP (UINT64_MAX: by the states) */
	const char *fail_why;
	uint64_t fail_sq, fail_rq;
	/* the application's error unprotected it in Default (fo/apperr.c):
	 * my record says the connection ended (the background publishes it) */
	bool app_error_end, app_error_published;
	uint64_t doomed; /* 1 + the sq index of the application's WR whose remote key the
			  * peer never had (it completes as refused, fo/common.c), or 0 */
	bool dflt_path_err; /* a WR of SHIFT's on the default QP failed as paths do, since reset */
	bool port_was_down;           /* the port watch saw its port down, and the QP
				       * may have failed with the device since */
	bool retry_cnt_changed; /* SHIFT gave the QP another retry_cnt than ... */
	uint8_t app_retry_cnt;  /* ... the application's */

	/* on an SRQ (dp/dsrq.h): its receives are the SRQ's, rq_tail counts
	 * those this QP consumed (the handshake's receive counter) */
	struct shift_dsrq *dsrq;
	void *fo_bounce;              /* the failover layer's (fo/srq.c) */

	unsigned long failovers, failbacks, retransmitted; /* statistics (shiftctl, logs) */
	bool atomic_boundary_hit, timing_said;
	uint64_t t_error_us, switch_us, fallback_us; /* the last failover's ERR; 0 = not yet */
	/* its phases (fo_timing_say): started, my message out, the peer's in, held for
	 * keys since; us start to my message, to the peer's, reposting, in posts, held */
	uint64_t t_start_us, t_sent_us, t_peer_us, t_held_us;
	uint32_t start_us, wait_us, retx_us, post_us, held_us;
	/* the start's own: the peer's message (come first) to my start, to ERR, drained,
	 * receives reposted; by a pass? its thread's CPU and preemptions to my message */
	uint64_t t_drained_us, cpu0_us;
	uint32_t react_us, stop_us, err_us, drain_us, rrecv_us; /* (err: in modify_qp) */
	uint32_t csw0, cpu_us, csw, yields0, sleeps0, yields, sleeps;
	bool start_bg, stopping; /* (stopping: in ERR by SHIFT, posts not held yet) */
	uint64_t last_switch_s;       /* wall clock of the last transition */
	uint64_t own_tag;             /* the wr_ids of SHIFT's WRs on this QP (above) */
};

/* The wr_id of SHIFT's own WR of kind k (SHIFT_OWN_*) on d's default QP. */
static inline uint64_t shift_dqp_own_wrid(const struct shift_dqp *d, unsigned k)
{
	return d->own_tag | k;
}

/* The kind of SHIFT's own WR a default QP's completion with wr_id is, or 0
 * (the application's). */
static inline unsigned shift_dqp_own_kind(const struct shift_dqp *d, uint64_t wr_id)
{
	unsigned k = (unsigned)(wr_id & 0xf);

	if ((wr_id & ~0xfull) != d->own_tag)
		return 0;
	return k == SHIFT_OWN_CTRL_RECV || k == SHIFT_OWN_PROBE || k == SHIFT_OWN_NOTIFY ||
		       k == SHIFT_OWN_NOTIFY_READ ? k : 0;
}

/* the default QP while failed over: ERR (needs a reset), READY (reset,
 * receptive to the peer's probe, mine not sent yet), PROBING, OK (answered) */
enum { SHIFT_DFLT_OK, SHIFT_DFLT_ERR, SHIFT_DFLT_READY, SHIFT_DFLT_PROBING };

static inline struct shift_swqe *shift_dqp_swqe(struct shift_dqp *d, uint64_t i)
{
	return (struct shift_swqe *)(d->sq + (((uint32_t)i & d->sq_mask) * d->sq_stride));
}

static inline struct shift_rwqe *shift_dqp_rwqe(struct shift_dqp *d, uint64_t i)
{
	return (struct shift_rwqe *)(d->rq + (((uint32_t)i & d->rq_mask) * d->rq_stride));
}

/* (the masked atomics are only reachable through ibv_qp_ex) */
static inline bool shift_wr_is_atomic(unsigned opcode)
{
	return opcode == IBV_WR_ATOMIC_CMP_AND_SWP || opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

/* Does this send WR consume a receive WQE at the peer? */
static inline bool shift_wr_consumes_recv(unsigned opcode)
{
	return opcode == IBV_WR_SEND || opcode == IBV_WR_SEND_WITH_IMM ||
	       opcode == IBV_WR_SEND_WITH_INV || opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
}

/* posted_by_op's slot of an opcode (an unknown one shares the last) */
static inline unsigned shift_dqp_opslot(unsigned opcode)
{
	return opcode < 12 ? opcode : 11;
}

/* Create the data-path state of an RC QP from its actual capabilities
 * (as create_qp returned them). NULL on allocation failure: the QP then
 * runs unprotected. */
struct shift_dqp *shift_dqp_create(struct ibv_qp *qp, const struct ibv_qp_cap *cap,
				   int sq_sig_all);
void shift_dqp_destroy(struct shift_dqp *d);
/* The same once no lock-free reader (a poll's last-QP cache, a lookup
 * chain) can still hold d (dp/limbo.h): for a QP the application
 * destroyed while its CQs may still be polled. */
void shift_dqp_destroy_later(struct shift_dqp *d);

/* The QP can no longer be protected (what: why, said at warn level). */
void shift_dqp_unprotect(struct shift_dqp *d, const char *what);

/*
 * Mirror the WR chain about to be posted (post_lock held). Returns 0 when
 * every WR is mirrored; 1 when it stopped at *stop, a WR beyond the QP's
 * capacities (more SGEs or inline bytes than the provider reported at
 * create), which the provider refuses as it would without SHIFT: the WRs
 * before it are mirrored, and the QP stays protected (post.c decides once
 * the provider has answered); -1 if the mirror cannot hold the chain (the
 * QP then becomes unprotected, said; the post still goes to the provider).
 */
int shift_dqp_record_send(struct shift_dqp *d, const struct ibv_send_wr *wr,
			  const struct ibv_send_wr **stop);
/* Forget the WRs from bad onwards (the provider refused them). */
void shift_dqp_unrecord_send(struct shift_dqp *d, const struct ibv_send_wr *wr,
			     const struct ibv_send_wr *bad, uint64_t head_before);
/* The same for receives (more SGEs than the QP's max_recv_sge). */
int shift_dqp_record_recv(struct shift_dqp *d, const struct ibv_recv_wr *wr,
			  const struct ibv_recv_wr **stop);
void shift_dqp_unrecord_recv(struct shift_dqp *d, const struct ibv_recv_wr *wr,
			     const struct ibv_recv_wr *bad, uint64_t head_before);

/* Send WRs posted so far that consume a receive at the peer
 * (shift_wr_consumes_recv()). post_lock held; off the data path. */
uint32_t shift_dqp_consumers_posted(const struct shift_dqp *d);

/*
 * The only writers of the send and receive states (shift/dp/state.h has
 * the state machine): each checks the change against the transition table,
 * counts it and logs it at debug level. A send state change also shuts the
 * fast paths' bounds: they are computed again, for the new state, at the
 * next post. Send changes happen with post_lock held, or, when the
 * failover layer gives a QP up, under its CQs' dp_lock.
 */
void shift_dqp_set_send_state(struct shift_dqp *d, enum shift_send_state to, const char *why);
void shift_dqp_set_recv_state(struct shift_dqp *d, enum shift_recv_state to, const char *why);
/* The episode's wait (the failover layer's, under the CQs' dp_lock). */
void shift_dqp_set_ep_wait(struct shift_dqp *d, enum shift_ep_wait to, const char *why);

/* The send (receive) state as any thread reads it: its setters store it
 * atomically, a reader holding none of their locks loads it so (x86: a mov) */
static inline enum shift_send_state shift_dqp_send_state(const struct shift_dqp *d)
{
	return __atomic_load_n(&d->send_state, __ATOMIC_RELAXED);
}
static inline enum shift_recv_state shift_dqp_recv_state(const struct shift_dqp *d)
{
	return __atomic_load_n(&d->recv_state, __ATOMIC_RELAXED);
}

/* Was mirrored send WR i signaled? */
static inline bool shift_dqp_signaled(const struct shift_dqp *d, uint64_t i)
{
	return d->sq_sig_all || (shift_dqp_swqe((struct shift_dqp *)d, i)->send_flags & IBV_SEND_SIGNALED);
}

/* Apply the counted send completions: move sq_tail past the sig_tail-th
 * signaled WR (found walking back from sq_head, see above), and sq_limit
 * with it. Called with post_lock held; out of line (the post path calls
 * it only when the mirror looks full). */
void shift_dqp_sync_locked(struct shift_dqp *d);
/* The same, taking post_lock: before reading sq_tail outside the post path. */
void shift_dqp_sync(struct shift_dqp *d);
/* Retire every outstanding send WR (they were completed some other way). */
void shift_dqp_retire_all_send(struct shift_dqp *d);
/* Forget the last send WR recorded (the provider refused it). */
void shift_dqp_unrecord_last_send(struct shift_dqp *d);

/* One attempt at post_lock (uncontended: a locked bit-test-and-set, and a
 * store to unlock): true if taken, an acquire barrier. ThreadSanitizer
 * sees only the builtin (the asm hid the lock from it). */
static inline bool shift_dqp_trylock(struct shift_dqp *d)
{
#if defined(__x86_64__) && defined(__GCC_ASM_FLAG_OUTPUTS__) && !defined(__SANITIZE_THREAD__)
	bool held;

	/* what __atomic_fetch_or(.., 1) & 1 compiles to, minus the copy of
	 * the address GCC makes for it */
	__asm__ volatile("lock btsl $0, %0" : "+m"(d->post_lock), "=@ccc"(held) : : "memory");
	return !held;
#else
	return !(__atomic_fetch_or(&d->post_lock, 1, __ATOMIC_ACQUIRE) & 1);
#endif
}

/* post_lock, waited for out of line (dqp.c: spins, then sleeps, backoff.h);
 * the fast posts only try it (post.c, FAST_LOCK_OR). */
void shift_dqp_lock_wait(struct shift_dqp *d) __attribute__((noinline, cold));

static inline void shift_dqp_lock(struct shift_dqp *d)
{
	if (shift_unlikely(!shift_dqp_trylock(d)))
		shift_dqp_lock_wait(d);
}

static inline void shift_dqp_unlock(struct shift_dqp *d)
{
	__atomic_store_n(&d->post_lock, 0, __ATOMIC_RELEASE);
}

/* Alone in its chain, one SGE, WRITE/SEND/READ (with or without
 * immediate): the common WR, or with IBV_SEND_INLINE the single inline one
 * (post.c). */
static inline bool shift_dqp_send_is_one(const struct ibv_send_wr *wr)
{
	return !wr->next && wr->num_sge == 1 && (unsigned)wr->opcode <= IBV_WR_RDMA_READ;
}

/*
 * The common send WR, which the post path mirrors inline: one of the above,
 * not inline (so not atomic either). The others go through
 * shift_dqp_record_send() or a path of their own (post.c).
 */
static inline bool shift_dqp_send_is_common(const struct ibv_send_wr *wr)
{
	return shift_dqp_send_is_one(wr) && !(wr->send_flags & IBV_SEND_INLINE);
}

/* Room for one more send WR, in the Default state? (post_lock held) */
static inline bool shift_dqp_sq_room(struct shift_dqp *d)
{
	if (shift_likely(d->sq_head < d->sq_limit))
		return true;
	shift_dqp_sync_locked(d);
	return d->sq_head < d->sq_limit;
}

/* Room for one more send WR, in any state? (post_lock held) */
static inline bool shift_dqp_sq_free(struct shift_dqp *d)
{
	if (shift_likely(d->sq_head < d->sq_limit))
		return true;
	shift_dqp_sync_locked(d);
	return d->sq_head < d->sq_tail + d->sq_size;
}

/* Mirror a common send WR at sq_head (post_lock held, shift_dqp_sq_room()). */
static inline void shift_dqp_record_one(struct shift_dqp *d, const struct ibv_send_wr *wr)
{
	uint64_t h = d->sq_head;
	struct shift_swqe *e = shift_dqp_swqe(d, h);

	e->wr_id = wr->wr_id;
	/* num_sge, opcode, send_flags, imm, remote_addr, rkey (and 4 bytes
	 * over inline_len, which is read only for IBV_SEND_INLINE) */
	__builtin_memcpy(&e->num_sge, &wr->num_sge, 32);
	e->sge[0] = wr->sg_list[0];
	if ((wr->send_flags & IBV_SEND_SIGNALED) || d->sq_sig_all)
		d->sig_head++;
	d->posted_by_op[wr->opcode]++; /* opcode <= IBV_WR_RDMA_READ here */
	d->sq_head = h + 1;
}

/* Room for one more receive WR, both states Default? (post_lock held) */
static inline bool shift_dqp_rq_room(struct shift_dqp *d)
{
	if (shift_likely(d->rq_head < d->rq_limit))
		return true;
	d->rq_limit = d->states == 0 ? __atomic_load_n(&d->rq_tail, __ATOMIC_RELAXED) + d->rq_size : 0;
	return d->rq_head < d->rq_limit;
}

/* Room for one more receive WR, in any state? (post_lock held) */
static inline bool shift_dqp_rq_free(struct shift_dqp *d)
{
	return d->rq_head < __atomic_load_n(&d->rq_tail, __ATOMIC_RELAXED) + d->rq_size;
}

/* Mirror a receive WR of n (0 or 1, a constant at the call) SGEs at
 * rq_head (post_lock held, shift_dqp_rq_room()). */
static inline __attribute__((always_inline)) void
shift_dqp_record_recv_one(struct shift_dqp *d, const struct ibv_recv_wr *wr, unsigned n)
{
	uint64_t h = d->rq_head;
	struct shift_rwqe *e = shift_dqp_rwqe(d, h);

	e->wr_id = wr->wr_id;
	e->num_sge = n;
	if (n)
		e->sge[0] = wr->sg_list[0];
	d->rq_head = h + 1;
}

struct shift_dsrq;
/* Retire on a successful completion of this QP outside the fast poll: a
 * receive of a QP on an SRQ also retires the SRQ's entry (dp/dsrq.h). */
void shift_dqp_retire_slow(struct shift_dqp *d, const struct ibv_wc *wc);

/* A completion of this QP goes to the application as it is (the QP is
 * unprotected, or the error is the application's): a success retires as
 * shift_dqp_retire_slow(); a receive of an SRQ that completed in error is
 * consumed too (the application has it back; providers that do not set
 * the opcode of an error completion leave it in the mirror). */
void shift_dqp_retire_app(struct shift_dqp *d, const struct ibv_wc *wc);

/* Retire on a successful completion of this QP: count it (see above). */
static inline void shift_dqp_retire(struct shift_dqp *d, const struct ibv_wc *wc)
{
	if (wc->opcode & IBV_WC_RECV)
		__atomic_fetch_add(&d->rq_tail, 1, __ATOMIC_RELAXED);
	else
		__atomic_fetch_add(&d->sig_tail, 1, __ATOMIC_RELAXED);
}

#endif /* SHIFT_DQP_H */
