/*
 * The failover layer's interface (shift/fo/: start.c and the files it
 * names; docs/architecture.md).
 */
#ifndef SHIFT_FAILOVER_H
#define SHIFT_FAILOVER_H

#include <stdbool.h>
#include <infiniband/verbs.h>

struct shift_ctx;
struct shift_dqp;

/*
 * The slow poll of a context with a failed-over QP, or of a poll whose
 * provider results hold an error. wc[0..done) are final already; wc[done..
 * have) came from the provider and still need SHIFT's look. busy: the
 * fast-path count the calling poll holds (dp/poll.h; NULL: none), released
 * once wc[done..have) are handed over, before any lock is waited for.
 * Returns the number of completions for the application.
 */
int shift_poll_slow(struct shift_ctx *s, struct ibv_cq *cq, int num_entries,
		    struct ibv_wc *wc, int done, int have, int *busy);
/* The background thread's share: notice peers' handshake messages. */
void shift_failover_background(struct shift_ctx *s);
/* Did a background pass since the last call leave a failover waiting for
 * its peer's part (a KV record, a handshake message)? For a synchronous
 * driver (the fault campaign) deciding whether the world is quiet. */
bool shift_failover_waiting(void);
/*
 * Take a QP's data-path state out of s (its buckets and its failed-over
 * list) so no background pass can reach it any more; the caller frees it
 * once the provider destroyed the QP. NULL if qp has none; *driven: d was
 * in the failed-over list.
 */
struct shift_dqp *shift_failover_forget(struct shift_ctx *s, struct ibv_qp *qp, bool *driven);
/* The provider refused to destroy the QP: d goes back into s, and into its
 * failed-over list if it was there (driven, from the forget), protected as
 * before; but SHIFT's receive buffers of a failed-over QP on an SRQ are
 * gone: such a QP goes back unprotected. */
void shift_failover_unforget(struct shift_ctx *s, struct shift_dqp *d, bool driven);
/*
 * The provider refused a post on d's QP in the Default state (post_lock
 * held; the refused WRs, from sq index sq_from or rq index rq_from on, are
 * still in the mirror). true: the QP failed, SHIFT keeps those WRs for the
 * backup QP and the post succeeds; false: the refusal is the application's.
 */
bool shift_failover_post_refused(struct shift_dqp *d, int rc, uint64_t sq_from, uint64_t rq_from);
/*
 * The application moved d's QP to ERR (flush) or RESET itself: SHIFT stops
 * protecting it, in any state; the WRs SHIFT holds or has on the backup
 * flush (ERR) or vanish (RESET), as the provider's own do (fo/apperr.c).
 */
void shift_failover_app_ended(struct shift_dqp *d, bool flush);
/* ibv_query_qp's answer as plain libibverbs would give it (attr filled by
 * the provider): the application's QP state while SHIFT runs the default
 * QP, the application's retry_cnt if SHIFT gave the QP another. */
void shift_failover_query_qp(struct shift_dqp *d, struct ibv_qp_attr *attr, int mask);
/* Does SHIFT keep an async error event of d's QP from the application
 * (it fails the QP over: its device failed, or the QP is failed over
 * already)? Never for the responder errors a peer's request causes. */
bool shift_failover_hides_event(struct shift_dqp *d, enum ibv_event_type t);
/* Posting on a QP that is not in the Default state (post_lock held). */
int shift_post_send_fallback(struct shift_dqp *d, struct ibv_send_wr *wr,
			     struct ibv_send_wr **bad_wr);
int shift_post_recv_fallback(struct shift_dqp *d, struct ibv_recv_wr *wr,
			     struct ibv_recv_wr **bad_wr);

/* The application destroys an SRQ (struct shift_dsrq of shift/dp/dsrq.h):
 * SHIFT's own QP on it goes first (fo/srq_burn.c). */
struct shift_dsrq;
void shift_failover_srq_gone(struct shift_ctx *s, struct shift_dsrq *q);

#endif /* SHIFT_FAILOVER_H */
