/*
 * Extended CQs (ibv_create_cq_ex): the data path SHIFT puts into the
 * provider's struct ibv_cq_ex (dp/cqex.c).
 *
 * The application keeps polling the provider's own ibv_cq_ex with
 * ibv_start_poll / ibv_next_poll / ibv_end_poll and the ibv_wc_read_*
 * accessors; SHIFT replaces its start/next/end_poll pointers (and, while it
 * hands out completions of its own, the read_* pointers) in place:
 *
 *  - Default (the context is not slow): the provider's session, each
 *    completion of a protected QP retired in the mirror as ibv_poll_cq's
 *    fast path does; the read_* pointers are the provider's own.
 *  - An error completion of a protected QP, or a context with a
 *    failed-over QP (slow): SHIFT ends the provider's session and hands out
 *    what the failover layer's slow poll returns (shift_dp_up.poll_slow:
 *    kept completions, the default CQ's, the backup CQ's translated back),
 *    with its own read_* answering from those ibv_wc.
 *
 * SHIFT can answer every read_* of IBV_WC_STANDARD_FLAGS from an ibv_wc.
 * A CQ created with other wc_flags (timestamps, cvlan, flow tag, TM info)
 * is left as the provider made it, and the QPs that use it run unprotected
 * (shift_cqx_blocks()).
 */
#ifndef SHIFT_DP_CQEX_H
#define SHIFT_DP_CQEX_H

#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

struct shift_ctx;

/* The wc_flags SHIFT can answer for a completion it synthesizes. */
#define SHIFT_CQX_WC_FLAGS ((uint64_t)IBV_WC_STANDARD_FLAGS)

/*
 * Take over an extended CQ of context s, created with app_flags plus
 * IBV_WC_EX_WITH_QP_NUM: install SHIFT's poll functions. -1 (nothing
 * changed, out of memory) or 0.
 */
int shift_cqx_attach(struct shift_ctx *s, struct ibv_cq_ex *cq, uint64_t app_flags);
/* Remember an extended CQ SHIFT leaves alone: its QPs run unprotected. */
void shift_cqx_unwrapped(struct shift_ctx *s, struct ibv_cq_ex *cq);
/* Is cq an extended CQ SHIFT left alone (a QP on it cannot be protected)? */
bool shift_cqx_blocks(const struct ibv_cq *cq);
/*
 * Forget an extended CQ about to be destroyed (its provider pointers back);
 * returns a handle for shift_cqx_restore() if the destroy fails, else to
 * shift_cqx_free(). NULL if SHIFT does not know cq.
 */
struct shift_cqx *shift_cqx_forget(struct ibv_cq *cq);
void shift_cqx_restore(struct shift_cqx *x);
void shift_cqx_free(struct shift_cqx *x);
/* Context s is being closed: every extended CQ of it gets its provider
 * pointers back and is forgotten. */
void shift_cqx_detach_ctx(struct shift_ctx *s);
/* fork() (through shift_dp_fork_*): the registry stays whole across it
 * (done: in the parent and in the child alike). */
void shift_cqx_fork_prepare(void);
void shift_cqx_fork_done(void);

#endif /* SHIFT_DP_CQEX_H */
