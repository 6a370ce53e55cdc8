/*
 * What the files of shift/shadow/ share among themselves and nobody else
 * uses (the public verbs are in shadow.h): the counters, marking a QP
 * unprotected (record.c), the steps of a replay pass that
 * replay.c, connect.c and rnic.c call across files.
 */
#ifndef SHIFT_SHADOW_INT_H
#define SHIFT_SHADOW_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "shift/base/clock.h"
#include "shift/base/config.h"
#include "shift/shadow/shadow.h"

/* Published keys live SHIFT_KV_TTL_S unless deleted earlier (object gone,
 * exit), refreshed while their owner lives (shift_rnic_pass): a process
 * that dies leaves nothing behind for longer. */
#define SHIFT_KV_TTL_MS ((uint64_t)shift_config.kv_ttl_s * 1000u)
/* keys refreshed per pass (round robin over the RNIC's own keys) */
#define SHIFT_KV_REFRESH_PER_PASS 64

/* Counters over all RNICs (status.c), relaxed atomics. */
extern struct shift_shadow_stats shift_shadow_counters;

static inline void stat_add(unsigned long *c, long d)
{
	__atomic_fetch_add(c, (unsigned long)d, __ATOMIC_RELAXED);
}

/* record.c: mark q unprotected for why (rnic->lock held; counted once). */
void shift_qp_unprotected_locked(struct shift_qp *q, const char *why);

/* replay.c: was a KV operation's rc acceptable (success or -ENOENT)? A
 * failure is counted and warned about once per RNIC. */
bool shift_shadow_kv_ok(struct shift_rnic *r, int rc, const char *what);
/* Wake r's thread (r->lock held; rnic.c). */
void shift_rnic_signal(struct shift_rnic *r);
/* port events on a context of the thread's own (portev.c) */
void shift_portev_open(struct shift_rnic *r);
void shift_portev_close(struct shift_rnic *r);
int shift_portev_fd(const struct shift_rnic *r);
void shift_portev_drain(struct shift_rnic *r);
/* the backup CQs' completion channel of the thread (portev.c) */
void shift_bkev_open(struct shift_rnic *r);
void shift_bkev_close(struct shift_rnic *r);
void shift_bkev_drain(struct shift_rnic *r);
/* (portev.c) an fd made non-blocking (false: it cannot be); every event of
 * a non-blocking completion channel acknowledged (NULL: none) */
bool shift_fd_nonblocking(int fd);
void shift_comp_drain(struct ibv_comp_channel *ch);
/* replay.c: destroy the backup side of dead objects and unlink them. */
void shift_rnic_reap(struct shift_rnic *r);

/* replay.c: c's backup CQ as large as the application's CQ now is
 * (after a resize); any thread, no lock held. */
void shift_cq_fit_backup(struct shift_rnic *r, struct shift_cq *c);

/* connect.c: one replay step of a QP: create its backup, bring it towards
 * RTS as far as the application's QP and the peer allow (RNIC thread). */
void shift_replay_qp(struct shift_rnic *r, struct shift_qp *q);

/* mrindex.c, on the RNIC's thread: my MR index written again if an MR was
 * published or reaped since; the indexes of my QPs' peers, and the MR
 * records they list, read ahead; all freed (the RNIC's end). */
void shift_mri_write(struct shift_rnic *r);
void shift_mri_read(struct shift_rnic *r);
void shift_mri_free(struct shift_rnic *r);
/* The peer MR records q's peer's index led to read ahead (status.c). */
unsigned shift_mri_peer_keys(struct shift_qp *q);

/* replay.c: m's record (m->bk set): its backup rkey and the range the
 * application's peers address it by */
void shift_mr_value_of(const struct shift_mr *m, struct shift_mr_value *mv);

/* mbox.c, on the RNIC's thread: a key mailbox slot for q on its backup
 * PD (q->mb, q->my_bk.mb_*; false: none, the QP runs without), given back
 * at q's reap; a PD's pages freed before its backup PD. */
bool shift_mbox_attach(struct shift_qp *q);
void shift_mbox_detach(struct shift_qp *q);
void shift_mbox_free_pd(struct shift_pd *p);

#endif /* SHIFT_SHADOW_INT_H */
