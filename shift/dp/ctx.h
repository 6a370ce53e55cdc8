/*
 * The data path's registry: a struct shift_ctx for every provider context
 * SHIFT took over, and the per-QP data-path state (shift/dp/dqp.h) of its
 * protected QPs, found by QP address (post) or QPN (poll).
 *
 * A struct shift_ctx keeps the provider's data-path ops and extended-verb
 * slots that SHIFT replaced on that context, so SHIFT's replacements can
 * call through to them. Applications always hold the provider's own
 * objects; SHIFT never wraps or reallocates them (mlx5dv and friends keep
 * working on them). Some fields belong to the layers above (the shadow
 * RNIC, the port watch and pokes of fo/): the data path only carries them.
 *
 * The data path calls the layers above it only through shift_dp_up (the
 * slow paths: a failed-over QP's posts and polls, a refused post, a CQ
 * armed), which the front fills before any context is attached.
 */
#ifndef SHIFT_DP_CTX_H
#define SHIFT_DP_CTX_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#include "shift/base/log.h"
#include "shift/dp/dqp.h"

/* contexts with a fast poll of their own (dp/poll.c); any number more are
 * protected too, found through shift_ctx_more */
#define SHIFT_FAST_CTX 64
#define SHIFT_DQP_BUCKETS 1024 /* power of two */
#define SHIFT_WATCH_PORTS 4 /* ports per device the port watch covers */
#define SHIFT_POKE_GIDS 4   /* default GIDs per context the poke read covers */

struct shift_rnic;

/*
 * Completions a fast poll took from the provider and hands to the slow path
 * (an error among them, fo/poll.c), which waits for slow_lock: they are
 * older than anything left in their CQ, so whoever polls that CQ in the
 * slow path meanwhile (the background pass draining it for a failover)
 * takes them first. On the handing poll's stack; linked in its context's
 * early list, oldest first, until that poll has the locks.
 */
struct shift_early {
	struct shift_early *next;
	struct ibv_cq *cq;
	const struct ibv_wc *wc;
	unsigned n, taken; /* (taken: under early_lock) */
};

struct shift_ctx {
	struct ibv_context *ibctx; /* the provider's context, as the app sees it */

	/* the provider's data path, saved before SHIFT installed its own */
	int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr,
			 struct ibv_send_wr **bad_wr);
	int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr,
			 struct ibv_recv_wr **bad_wr);
	int (*post_srq_recv)(struct ibv_srq *srq, struct ibv_recv_wr *wr,
			     struct ibv_recv_wr **bad_wr);
	int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
	int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);

	/* the provider's struct verbs_context slots SHIFT routes through itself
	 * (NULL where the provider's context has none) */
	int (*query_port)(struct ibv_context *context, uint8_t port_num,
			  struct ibv_port_attr *port_attr, size_t port_attr_len);
	int (*query_device_ex)(struct ibv_context *context,
			       const struct ibv_query_device_ex_input *input,
			       struct ibv_device_attr_ex *attr, size_t attr_size);
	struct ibv_qp *(*create_qp_ex)(struct ibv_context *context,
				       struct ibv_qp_init_attr_ex *qp_init_attr_ex);
	struct ibv_cq_ex *(*create_cq_ex)(struct ibv_context *context,
					  struct ibv_cq_init_attr_ex *init_attr);
	struct ibv_srq *(*create_srq_ex)(struct ibv_context *context,
					 struct ibv_srq_init_attr_ex *srq_init_attr_ex);
	/* index in shift_ctx_tab, or -1 for a context past the first
	 * SHIFT_FAST_CTX (in shift_ctx_more, with the generic fast poll) */
	int slot;
	/* the QP of the last completion polled, for a context without a slot
	 * (dp/poll.c keeps the slots' own) */
	struct shift_dqp *poll_last;
	/* its fast polls inside, for a context without a slot (dp/poll.h,
	 * shift_dp_poll_busy) */
	int poll_busy;
	/* data-path state of the app's protected QPs, by QPN (chained);
	 * written under the context lock, read lock-free */
	struct shift_dqp *dqp[SHIFT_DQP_BUCKETS];
	/* set once a QP of this context failed over: polls take the slow path
	 * (written through shift_ctx_set_slow(), which swaps ops.poll_cq) */
	bool slow;
	bool detached; /* (under the context lock) */
	/* serializes the slow path (polls of a slow context, the background
	 * pass): it may complete WRs on any CQ of a QP, the one polled or
	 * not; taken before any CQ's dp_lock */
	pthread_mutex_t slow_lock;
	/* the early list (struct shift_early); a spinlock, never held across a
	 * call: a poll hands its batch over before it leaves the fast path
	 * (dp/poll.h), so a failover that judges after it sees the batch */
	pthread_spinlock_t early_lock;
	struct shift_early *early;
	/* a protected QP has different send and receive CQs: the full fast
	 * poll, which keeps its cq (dp/poll.c, cq_of) */
	bool split_cqs;
	/* the failed-over QPs (fo/common.c): fo_cap entries, used up to nfo,
	 * with holes (NULL); read and written under slow_lock only */
	struct shift_dqp **fo;
	int nfo, fo_cap;
	/* a failover was logged as a warning since fo[] was last empty */
	bool fo_warned;
	struct shift_rnic *rnic; /* shadow verbs of this RNIC, NULL if unprotected */
	/* port watch (background thread only): since when each port has not
	 * been ACTIVE (ms, 0 = active), and whether any is down now */
	uint64_t port_down_since[SHIFT_WATCH_PORTS + 1];
	bool ports_down;
	/* pokes (background thread only, fo/poke.c): the values last read
	 * under the poke keys of this context's default GIDs */
	struct shift_poke {
		union ibv_gid gid;
		char seen[48];
		bool read;
	} poke[SHIFT_POKE_GIDS];
	int npoke;
	uint64_t poke_at;
	/* (background thread only, fo/kvq.c) the KV store's last failure seen
	 * by a failover's reads and writes (ms, 0 = none) */
	uint64_t kv_err_ms;
};

/* The contexts SHIFT manages, for the data path's lookup (dp/ctx.c): the
 * first SHIFT_FAST_CTX by slot ... */
extern struct shift_ctx *shift_ctx_tab[SHIFT_FAST_CTX];

/* ... and the rest in an open-addressing table by context address (linear
 * probing; a removed entry leaves shift_ctx_gone, whose ibctx is NULL).
 * Readers are lock-free: a table that grows is replaced as a whole (the
 * old one freed through dp/limbo.h), entries change by single stores. */
struct shift_ctx_more {
	unsigned mask; /* size - 1 (a power of two) */
	unsigned used; /* entries not NULL, removed ones included (writers) */
	struct shift_ctx *e[];
};
extern struct shift_ctx_more *shift_ctx_more;
struct shift_ctx *shift_ctx_of_more(const struct ibv_context *ibctx);

/*
 * Find the shift_ctx of a provider context. Lock-free: entries change under
 * the registry lock, and a closed context's memory outlives any reader
 * (dp/limbo.h). The first contexts (one per device, usually all of them)
 * are found by a short scan; the table of the rest is consulted only once
 * it exists.
 */
static inline struct shift_ctx *shift_ctx_of(const struct ibv_context *ibctx)
{
	for (int i = 0; i < SHIFT_FAST_CTX; i++) {
		struct shift_ctx *s = __atomic_load_n(&shift_ctx_tab[i], __ATOMIC_ACQUIRE);

		if (shift_likely(s && s->ibctx == ibctx))
			return s;
	}
	if (shift_unlikely(__atomic_load_n(&shift_ctx_more, __ATOMIC_RELAXED) != 0))
		return shift_ctx_of_more(ibctx);
	return 0;
}

/*
 * Take over a context the lower open_device returned: save its data-path ops
 * and extended slots, install SHIFT's. On failure the context is left
 * untouched (unprotected) and one line is logged; the app never notices.
 */
struct shift_ctx *shift_ctx_attach(struct ibv_context *ibctx);
/* Give the context back its own ops and forget it; call before closing it.
 * Its memory and its QPs' data-path state are freed once no lock-free
 * reader can hold them (dp/limbo.h). */
void shift_ctx_detach(struct ibv_context *ibctx);
/* The table of the contexts past the fast slots (shift_ctx_lock held;
 * dp/ctx.c). add: 0, or -1 out of memory. */
int shift_ctx_more_add(struct shift_ctx *s);
void shift_ctx_more_remove(struct shift_ctx *s);

/*
 * fork(): the data path's share of the front's handlers (shift/fork.c).
 * prepare takes the registry locks (contexts, deferred frees, extended CQs
 * and QPs: no table is half changed in the child), parent gives them back. child drops every context: the child's contexts are
 * its parent's, whose SHIFT state (threads, backup objects, the KV
 * connection) stays the parent's, so in the child they run as plain
 * contexts: the provider's ops back (before(s) first, for the front's
 * share), out of every table; their memory is kept, never freed.
 */
void shift_dp_fork_prepare(void);
void shift_dp_fork_parent(void);
void shift_dp_fork_child(void (*before)(struct shift_ctx *s));
/* Polls of s's context take the slow path (shift_poll_slow) or the fast
 * one again: sets s->slow and the context's ops.poll_cq. */
void shift_ctx_set_slow(struct shift_ctx *s, bool slow);
/* s's provider gives native work-queue access (dp/nwq.h): its posts take
 * the native paths (each QP without it still the mirror's). */
void shift_ctx_set_native(struct shift_ctx *s);

/*
 * Lock-free walks of the per-context QPN chains: shift_ctx_add_dqp and
 * shift_ctx_remove_dqp publish bucket heads and chain links with release
 * stores under shift_ctx_lock, so every reader that does not hold that lock
 * (the data path, the background thread) loads them with acquire.
 */
static inline struct shift_dqp *shift_dqp_first(struct shift_ctx *s, unsigned i)
{
	return __atomic_load_n(&s->dqp[i], __ATOMIC_ACQUIRE);
}

static inline struct shift_dqp *shift_dqp_next(const struct shift_dqp *d)
{
	return __atomic_load_n(&d->next_in_bucket, __ATOMIC_ACQUIRE);
}

/* The data-path state of an application QP, or NULL (unprotected). */
static inline struct shift_dqp *shift_dqp_by_qpn(struct shift_ctx *s, uint32_t qpn)
{
	struct shift_dqp *d = shift_dqp_first(s, qpn & (SHIFT_DQP_BUCKETS - 1));

	while (shift_unlikely(d && d->qpn != qpn))
		d = shift_dqp_next(d);
	return d;
}

/*
 * Every protected QP, by its address: the post path's lookup.
 * Written under the context lock, read lock-free. Empty buckets and chain
 * ends hold shift_dqp_none (no QP, no QPN) instead of NULL, so the common
 * lookup is one load and one compare.
 */
#define SHIFT_DQP_TAB 4096
extern struct shift_dqp *shift_dqp_tab[SHIFT_DQP_TAB];
extern struct shift_dqp shift_dqp_none;

static inline unsigned shift_dqp_hash(const struct ibv_qp *qp)
{
	/* not by QPN: two devices number their QPs alike. Fibonacci hashing
	 * of the address's low 32 bits (the top 12 bits of the product mix
	 * every bit above the allocator's alignment): one multiply, one shift */
	return ((uint32_t)(uintptr_t)qp * 0x9e3779b1u) >> 20; /* 12 bits */
}

static inline struct shift_dqp *shift_dqp_of_qp(const struct ibv_qp *qp)
{
	struct shift_dqp *d = __atomic_load_n(&shift_dqp_tab[shift_dqp_hash(qp)],
					      __ATOMIC_ACQUIRE);

	while (d != &shift_dqp_none && d->qp != qp)
		d = __atomic_load_n(&d->next_by_qp, __ATOMIC_ACQUIRE);
	return d != &shift_dqp_none ? d : 0;
}

/* Register / forget the data-path state of a QP of this context. */
void shift_ctx_add_dqp(struct shift_ctx *s, struct shift_dqp *d);
struct shift_dqp *shift_ctx_remove_dqp(struct shift_ctx *s, struct ibv_qp *qp);

/* What the data path reaches in the layers above it (fo/, shadow/): set
 * once by the front (shift_dp_set_upcalls()) before a context is attached. */
struct shift_dp_upcalls {
	/* the slow poll of a slow context, or of a poll whose provider
	 * results hold an error (shift/fo/failover.h, shift_poll_slow) */
	int (*poll_slow)(struct shift_ctx *s, struct ibv_cq *cq, int num_entries,
			 struct ibv_wc *wc, int done, int have, int *busy);
	/* the provider refused a post on a protected QP in Default */
	bool (*post_refused)(struct shift_dqp *d, int rc, uint64_t sq_from, uint64_t rq_from);
	/* posts on a QP that is not in the Default state (post_lock held) */
	int (*post_send_fallback)(struct shift_dqp *d, struct ibv_send_wr *wr,
				  struct ibv_send_wr **bad_wr);
	int (*post_recv_fallback)(struct shift_dqp *d, struct ibv_recv_wr *wr,
				  struct ibv_recv_wr **bad_wr);
	/* the application armed cq of a protected context (its provider's
	 * arm succeeded) */
	void (*cq_armed)(struct shift_ctx *s, struct ibv_cq *cq, int solicited_only);
};
extern struct shift_dp_upcalls shift_dp_up;
/* Guards writers of the context table and the QP tables (dp/ctx.c). */
extern pthread_mutex_t shift_ctx_lock;
void shift_dp_set_upcalls(const struct shift_dp_upcalls *up);

/* A protected QP's send and receive CQs differ: its context needs the full
 * fast poll, which keeps its cq (see dp/poll.c). */
void shift_ctx_set_split_cqs(struct shift_ctx *s);

/* Statistics kept cheaply (relaxed atomics) for shiftctl and tests. */
struct shift_stats {
	unsigned long contexts_attached;
	unsigned long contexts_unprotected;
	unsigned long compat_1_0_calls;
	/* peers' failover records read while failed over, and the KV
	 * commands that read them (batched: fewer commands than records) */
	unsigned long ep_records_read, ep_read_commands;
	/* peers' backup rkeys read by the background thread, and lookups
	 * on the failover paths that found theirs not read yet (fo/kvq.c) */
	unsigned long rkeys_read, rkeys_waited, rkeys_earlier, rkeys_outside;
	/* keys a failover used at once (known before it), and those its
	 * confirming read found changed (fo/kvq.c) */
	unsigned long rkeys_at_once, rkeys_changed;
	/* the key mailbox (fo/mbox.c): requests I sent, answers I took, the
	 * peers' requests I answered */
	unsigned long mbox_asked, mbox_taken, mbox_answered;
	/* episode records as datagrams on the service channel (fo/dgram.c):
	 * sent, taken from a peer, refused (unknown sender, not opening) */
	unsigned long dgrams_sent, dgrams_taken, dgrams_refused;
	/* native work-queue access (dp/nwq.h): WRs read back from the
	 * provider's queues, and those whose WQE did not check out */
	unsigned long wqes_read_back, wqes_unreadable;
};
extern struct shift_stats shift_stats;

#endif /* SHIFT_DP_CTX_H */
