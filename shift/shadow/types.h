/*
 * The shadow objects (see shadow.h): SHIFT's record of each PD, MR, CQ and
 * QP the application created on a NIC, with the backup object replayed on
 * the backup NIC, and the per-RNIC record (struct shift_rnic) that owns the
 * lists and the background thread. Types only: the completion channels
 * (chan.c) and failover (shift/fo/) walk these objects, the verbs on them
 * are in shadow.h.
 *
 * Locking: rnic->lock guards the object lists and every field marked (L).
 * Fields marked thread-owned are written only by the RNIC's thread (or the
 * caller of a synchronous pass). The background thread never holds the lock
 * across a verb or a KV round trip, so the application's control verbs
 * never wait on either. `dead` is set under the lock and read without it
 * by the thread's walks (SHIFT_SHADOW_DEAD): an atomic flag.
 */
#ifndef SHIFT_SHADOW_TYPES_H
#define SHIFT_SHADOW_TYPES_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#include "shift/base/pmap.h"
#include "shift/shadow/backup.h"
#include "shift/shadow/exchange.h"

struct shift_ctx;
struct shift_kv;
struct shift_peer_mrs;
struct shift_mbox_page;
struct shift_mbox_slot;

/* The application destroyed o (rnic->lock held) / has it? (any thread) */
#define SHIFT_SHADOW_KILL(o) __atomic_store_n(&(o)->dead, true, __ATOMIC_RELEASE)
#define SHIFT_SHADOW_DEAD(o) __atomic_load_n(&(o)->dead, __ATOMIC_ACQUIRE)

enum shift_shadow_state {
	SHIFT_SHADOW_PENDING,     /* recorded, not yet replayed */
	SHIFT_SHADOW_READY,       /* backup object exists (QP: RTS) */
	SHIFT_SHADOW_UNPROTECTED, /* could not be shadowed: runs as plain */
};

struct shift_pd {
	struct shift_pd *next;       /* (L) */
	struct shift_pmap_node hn;   /* (L) in rnic->pd_of, by app */
	struct ibv_pd *app;
	struct ibv_pd *bk;           /* thread-owned */
	enum shift_shadow_state state; /* (L) */
	bool dead;                   /* (L) the app deallocated it */
	struct shift_mbox_page *mbox; /* thread-owned: key mailboxes (mbox.c) */
};

enum shift_mr_kind { SHIFT_MR_PLAIN, SHIFT_MR_IOVA, SHIFT_MR_DMABUF };

struct shift_mr {
	struct shift_mr *next;       /* (L) */
	struct shift_pmap_node hn;   /* (L) in rnic->mr_of, by app */
	struct shift_pmap_node hl;   /* (L) in rnic->mr_by_lkey, by app_lkey */
	struct ibv_mr *app;
	struct shift_pd *pd;
	enum shift_mr_kind kind;
	void *addr;
	size_t length;
	uint64_t iova;
	uint64_t dmabuf_offset;
	int dmabuf_fd;               /* our dup of the app's fd, or -1 */
	unsigned int access;
	uint32_t app_lkey, app_rkey;
	struct ibv_mr *bk;           /* thread-owned */
	unsigned int published;      /* thread-owned: bitmap over rnic->gids */
	enum shift_shadow_state state; /* (L) */
	bool dead;                   /* (L) */
};

struct shift_cq {
	struct shift_cq *next;       /* (L) */
	struct shift_pmap_node hn;   /* (L) in rnic->cq_of, by app */
	struct ibv_cq *app;
	int cqe;                     /* (L) the application CQ's, resizes included */
	int comp_vector;
	bool app_has_channel;
	struct ibv_comp_channel *app_channel; /* (L) NULL once being destroyed */
	struct ibv_cq *bk;           /* thread-owned */
	int bk_cqe;                  /* entries asked of bk (thread-owned until READY,
				      * then under dp_lock: shift_cq_fit_backup) */
	struct ibv_comp_channel *bk_channel;
	unsigned synth_events;       /* backup events reported as the app CQ's,
				      * not acked yet (atomic; shadow/chan.c) */
	enum shift_shadow_state state; /* (L) */
	bool dead;                   /* (L) */

	/* data path after a failover (shift/fo/), under dp_lock:
	 * completions kept for the application, in order */
	pthread_mutex_t dp_lock;
	struct ibv_wc *kept;
	unsigned kept_cap;
	uint64_t kept_head, kept_tail;
};

struct shift_qp {
	struct shift_qp *next;       /* (L) */
	struct shift_pmap_node hn;   /* (L) in rnic->qp_of, by app */
	struct ibv_qp *app;
	uint32_t app_qpn;
	struct shift_pd *pd;
	struct shift_cq *send_cq, *recv_cq;
	struct ibv_qp_cap cap;
	int sq_sig_all;

	/* what the application passed to modify_qp, merged (L): the recipe
	 * to reset the default QP later, and the source of the backup's */
	struct ibv_qp_attr attr;
	int attr_mask;
	enum ibv_qp_state app_state;

	/* backup side, thread-owned */
	struct ibv_qp *bk;
	enum ibv_qp_state bk_state;
	unsigned bk_access;          /* remote access the backup grants (at RTS) */
	uint32_t bk_psn;
	struct shift_qp_key my_key;     /* my default (GID, QPN) */
	struct shift_qp_key peer_key;   /* the peer's default (GID, QPN) */
	struct shift_qp_value my_bk;    /* what I publish */
	struct shift_qp_value peer_bk;  /* what the peer published */
	bool published;
	bool peer_known;
	uint64_t waiting_since_ms;
	bool warned_peer;
	bool warned_other;           /* (thread) a record of another connection seen */

	enum shift_shadow_state state; /* (L) */
	const char *why;               /* (L) reason when UNPROTECTED */
	bool dead;                     /* (L) */
	bool ctrl_posted;              /* thread-owned: control receive posted */
	/* its peer's MR index, read ahead (mrindex.c); written by the thread
	 * under the index lock, read under it by a failover */
	struct shift_peer_mrs *pm;
	/* its key mailbox (mbox.h), if its backup grants remote writes:
	 * set by the thread before the QP is READY, read by fo/mbox.c */
	struct shift_mbox_slot *mb;
	struct shift_mbox_page *mb_page;
	uint32_t mb_lkey;
	/* (thread) the peer's service channels (svc.h) at its backup path and
	 * its default path: set when the backup QP connects, if it has them */
	struct ibv_ah_attr svc_ah[2];
	bool svc_ok[2];
	/* (thread, fo/mbox.c) my request in flight: its nonce (0: none), the
	 * rkey asked, since when; the peer's last request answered */
	uint64_t mb_nonce, mb_at, mb_answered;
	uint32_t mb_rkey;
};

#define SHIFT_RNIC_MAX_GIDS 4

struct shift_rnic {
	struct shift_rnic *next_rnic; /* (rnics_lock, rnic.c) */
	struct shift_ctx *sctx;
	char name[64];            /* default device name */
	char bk_name[64];         /* backup device name, "" if none */
	struct ibv_context *bk_ctx;
	int bk_max_cqe;           /* the backup NIC's largest CQ (0: unknown) */
	uint8_t bk_port[SHIFT_BACKUP_MAX_PORTS + 1]; /* default port -> backup port
				   (backup.c; set once before bk_ctx is used) */

	pthread_t thread;
	bool thread_started;
	/* held by the thread whenever it is not asleep (a pass, opening the
	 * backup NIC): fork() waits for it, so a child never inherits a lock
	 * the thread held, of SHIFT's or of the libraries below (rnic.c) */
	pthread_mutex_t busy;
	pthread_mutex_t lock;
	pthread_cond_t kick;
	bool stop;                /* (L) */
	bool dirty;               /* (L) something to replay */
	bool idle;                /* (L) the thread waits for a kick */
	bool woken;               /* (L) the layer above has work: a pass now */
	uint64_t refresh_at;      /* (thread) next round of KV key refreshes */
	uint64_t kv_recoveries;   /* (thread) the store's recoveries seen (replay.c) */
	int kick_fd;              /* eventfd the thread waits on (-1: r->kick) */
	struct ibv_context *ev_ctx; /* (thread) its own context: port events */
	bool port_err[5];         /* (relaxed atomic) port left ACTIVE (event) */
	/* (thread) the completion channel of the backup CQs whose application
	 * CQ has none: a peer's handshake message wakes the thread (portev.c) */
	struct ibv_comp_channel *bk_ev;
	uint64_t due_ms;          /* (L) the pass asked to run again at (0: no) */
	size_t refresh_round;     /* (thread) keys refreshed in this round */

	struct shift_pd *pds;     /* (L) */
	struct shift_mr *mrs;     /* (L) */
	struct shift_cq *cqs;     /* (L) */
	struct shift_qp *qps;     /* (L) */
	/* (L) the same objects by the application's object (and MRs by their
	 * lkey), dead ones too until reaped: every lookup of a verb is O(1) */
	struct shift_pmap pd_of, mr_of, mr_by_lkey, cq_of, qp_of;

	/* default GIDs the app's QPs use; MRs are published under each */
	union ibv_gid gids[SHIFT_RNIC_MAX_GIDS]; /* thread-owned */
	int ngids;

	/* my MR index under each of gids[] (mrindex.c; thread-owned but id) */
	uint64_t mri_id;          /* nonzero, set at start; in my QP records */
	uint64_t mri_ver;         /* rewrites so far */
	bool mri_dirty;           /* an MR published or reaped since */
	bool mri_warned;          /* (more MRs than an index holds: said) */
	unsigned mri_chunks[SHIFT_RNIC_MAX_GIDS]; /* chunks last written */
	/* the MR indexes of the peers my QPs connect to (mrindex.c) */
	struct shift_peer_mrs **peers; /* (thread; entries' keys under the index lock) */
	unsigned npeers;
	uint64_t peers_io_at;     /* (thread) no index I/O before (after a failure) */

	struct shift_kv *kv;      /* thread-owned */
	/* (thread) the service channels (svc.h): on the backup NIC, on the
	 * default NIC; NULL: none */
	struct shift_svc *svc[2];
	bool kv_warned;
	bool unprotected;         /* (L) whole RNIC runs unprotected */
	const char *why;          /* (L) */
};

/* The backup NIC's port for the default's port p (shift_backup_port). */
static inline uint8_t shift_rnic_bk_port(const struct shift_rnic *r, uint8_t p)
{
	return p >= 1 && p <= SHIFT_BACKUP_MAX_PORTS && r->bk_port[p] ? r->bk_port[p] : p;
}

#endif /* SHIFT_SHADOW_TYPES_H */
