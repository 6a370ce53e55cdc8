/*
 * The failover layer's internal interface: what the files of shift/fo/
 * share. Nothing outside fo/ includes it (shift/fo/failover.h is the
 * layer's interface).
 */
#ifndef SHIFT_FO_INT_H
#define SHIFT_FO_INT_H

#include "shift/fo/failover.h"
#include "shift/shadow/exchange.h"
#include "shift/shadow/shadow.h"
#include "shift/base/clock.h"
#include "shift/base/config.h"
#include "shift/base/lower.h"
#include "shift/dp/ctx.h"
#include "shift/dp/dsrq.h"
#include "shift/dp/poll.h"
#include "shift/dp/errclass.h"
#include "shift/dp/state.h"
#include "kv/kv.h"
#include "providers/provider.h"

#include <endian.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define TMP_WC 16
/* after a backup failure the peer did not follow up: my own new failover,
 * after shift_config.bk_restart_ms, at most this many times in a row (how
 * long a failover after the first waits for the peer's part, its record in
 * the KV store or its handshake message, is shift_config.episode_wait_ms) */
#define SHIFT_BK_RESTARTS 3
/* The handshake message's immediate: the sender's receive counter (31 bits,
 * compared modulo 2^31), or ABORT: the sender cannot fail over (an atomic
 * was in flight), so the connection fails for the application at both ends. */
#define CTRL_ABORT 0x80000000u
/* ... and NOSEND: the sender's application never brought its QP to RTS (a
 * receive-only peer): it will never send, nor notify a failback */
#define CTRL_NOSEND 0x40000000u
#define CTRL_COUNT(x) ((x) & 0x3fffffffu)
struct out {
	struct ibv_wc *wc;
	int n, max;
	struct shift_cq *c;
	/* completions already taken from c's default CQ and not filtered yet
	 * (the rest of the batch being filtered): older than anything still
	 * in the CQ, so a drain of c must filter them first */
	struct ibv_wc *rest;
	size_t nrest;
	struct out *up; /* the caller's, when filtering inside a drain */
};

/*
 * A failover's drain keeps its QP's errors and flushes here, each with the
 * CQ it came from and its place among the completions kept there: if the
 * failure turns out to be the application's (an error of its own among
 * them, fo_judge_start), they reach it where they were (fo/apperr.c).
 */
struct shift_fo_stash {
	struct fo_stashed {
		struct ibv_wc wc;
		struct shift_cq *c;
		uint64_t at; /* kept_head - kept_tail of c when it came */
	} *e;
	size_t n, cap;
	bool app, path; /* an error of that class is among them */
	bool lost;      /* (one could not be kept: out of memory) */
};

uint64_t fo_probe_wait(const struct shift_dqp *d);
int fo_add(struct shift_ctx *s, struct shift_dqp *d);
bool fo_remove(struct shift_ctx *s, struct shift_dqp *d); /* (was d there?) */
/* Is this the context's first failover to log since none was failed over
 * (the one logged as a warning)? */
bool fo_first_failover(struct shift_ctx *s);
void fo_emit(struct out *o, const struct ibv_wc *wc);
void fo_kept_insert(struct shift_cq *c, uint64_t at, const struct ibv_wc *wc);
struct shift_dqp *fo_dqp_of_bk(struct shift_ctx *s, uint32_t bk_qpn);
int fo_post_mirrored(struct shift_dqp *d, uint64_t idx, bool dflt);
enum ibv_wc_opcode fo_send_wc_opcode(unsigned opcode);
int fo_post_bk_placeholder(struct shift_dqp *d, uint64_t idx);
bool fo_bk_carries(struct shift_dqp *d, uint64_t from, uint64_t to, bool reads);
/* fo_post_bk_send, fo_post_bk_sends and fo_post_bk_recv: 0, -1 (the WR
 * cannot be built for the backup, or the backup's provider refused it on
 * a QP that works: the application's), or FO_BK_REFUSED (the backup's
 * provider refused it on a backup QP in ERR: the backup failed) */
#define FO_BK_REFUSED (-2)
/* Has the provider's qp failed after it refused a post: 1 (in ERR or
 * SQE), -1 (it cannot be queried: taken as failed too), 0 (it works). */
int fo_qp_failed(struct ibv_qp *qp);
int fo_post_bk_send(struct shift_dqp *d, uint64_t idx);
int fo_post_bk_sends(struct shift_dqp *d, uint64_t from, uint64_t *failed);
/* The backup's provider refused the application's WRs while failed over
 * (post_lock held): they stay in the mirror, later ones are held, and the
 * background pass takes the backup as failed (fo_failback_work). */
void fo_bk_refused(struct shift_dqp *d);
/* My backup QP failed (d's CQs locked): a peer's new episode, a return,
 * or the end decide (fo_failback_work). */
void fo_backup_failed(struct shift_dqp *d, int status);
/* Mirrored send WRs posted again as chains, one post (one doorbell: a
 * system call on rxe) per FO_CHAIN_WR WRs (post_lock held). On the backup
 * QP (a failover's retransmission): fo_chain_send and fo_chain_placeholder
 * as fo_post_bk_send and fo_post_bk_placeholder. On the default QP (the
 * held WRs of a failback): fo_chain_default. fo_chain_flush at the end.
 * Each -1 if a WR could not be built or the provider refused a post: then
 * failed is that WR's index (those before it are posted), rc the
 * provider's error (0: not posted for another reason). */
#define FO_CHAIN_WR 64
#define FO_CHAIN_SGE 128
struct fo_chain {
	struct ibv_send_wr wr[FO_CHAIN_WR];
	struct ibv_sge sge[FO_CHAIN_SGE];
	uint64_t idx[FO_CHAIN_WR];
	bool retx[FO_CHAIN_WR]; /* a retransmission (not a placeholder) */
	unsigned n, nsge;
	bool dflt;
	uint64_t failed;
	int rc;
};
void fo_chain_init(struct fo_chain *ch, bool dflt);
int fo_chain_send(struct shift_dqp *d, struct fo_chain *ch, uint64_t idx);
int fo_chain_placeholder(struct shift_dqp *d, struct fo_chain *ch, uint64_t idx);
int fo_chain_default(struct shift_dqp *d, struct fo_chain *ch, uint64_t idx);
int fo_chain_flush(struct shift_dqp *d, struct fo_chain *ch);
/* the KV store off the application's threads (fo/kvq.c): the peer's
 * backup key for app, for len bytes at remote addr (len 0: no check) */
int fo_rk_lookup(struct shift_dqp *d, uint32_t app, uint64_t addr, uint64_t len, uint32_t *bk);
bool fo_rk_any(struct shift_dqp *d, uint32_t *bk);
void fo_rk_failover(struct shift_dqp *d);
/* the cache's part of a read (fo/rkeys.c, for fo/kvq.c): a record's key;
 * the store cannot give e's (the one read before, if any); its log line;
 * the read-ahead of d's newest send WRs' keys */
struct shift_rkey_val fo_rk_val(const struct shift_mr_value *mv);
bool fo_rk_earlier(struct shift_dqp *d, struct shift_rkey *e, uint64_t now, bool *say);
void fo_rk_earlier_say(const struct shift_dqp *d, uint32_t app, bool known);
void fo_rk_read_ahead(struct shift_dqp *d, uint64_t now);
void fo_kvq_publish(struct shift_ctx *s, struct shift_dqp *d, const char *key,
		    const char *val, unsigned len);
void fo_kvq_poke(struct shift_ctx *s, struct shift_dqp *d, const char *key, const char *val,
		 unsigned len);
void fo_kvq_run(struct shift_ctx *s, bool reads);
/* d's entry for the peer's app rkey, or NULL (rk_lock held) */
static inline struct shift_rkey *fo_rk_find(struct shift_dqp *d, uint32_t app)
{
	for (unsigned i = 0; i < d->rk_n; i++)
		if (d->rk[i].app == app)
			return &d->rk[i];
	return NULL;
}
/* e's key read (from the store or the peer's mailbox) at `at`: known, and
 * the fallback of later reads (rk_lock held) */
static inline void fo_rk_known(struct shift_rkey *e, struct shift_rkey_val v, uint64_t at)
{
	e->st = SHIFT_RK_KNOWN;
	e->v = v;
	e->prev = v;
	e->has_prev = true;
	e->at_ms = at;
	e->ahead = false;
}
/* what the key mailbox (fo/mbox.c) settles of the keys fo/kvq.c wants */
void fo_rk_told(struct shift_dqp *d, uint32_t app, bool known, const struct shift_rkey_val *v,
		uint64_t now);
bool fo_rk_to_ask(struct shift_dqp *d, uint32_t prefer, uint32_t *app);
/* the key mailbox (fo/mbox.c): usable by d (both ends have one); the
 * pass's work (slow_lock held) */
bool fo_mbox_possible(const struct shift_dqp *d);
void fo_mbox_run(struct shift_ctx *s);
void fo_mbox_reset(struct shift_dqp *d); /* its backup QP reset: exchanges anew */
/* The QP of s numbered qpn, if it is still d (the same serial): what a
 * pass that dropped slow_lock collected (slow_lock held). */
static inline struct shift_dqp *fo_dqp_again(struct shift_ctx *s, const struct shift_dqp *d,
					     uint32_t qpn, uint64_t serial)
{
	struct shift_dqp *x = shift_dqp_by_qpn(s, qpn);

	return x == d && x->serial == serial ? x : NULL;
}
void fo_held_release(struct shift_dqp *d);
/*
 * The failover's timing line, once its switch time (every outstanding WR
 * reposted on the backup) and its first success on the backup are known:
 * switch_us and fallback_us from the error, and its phases: start_us (its
 * start to my handshake message), wait_us (to the peer's, if it came
 * after mine), retx_us (reposting, after both), post_us (of that, in the
 * provider's post_send: soft-RoCE transmits inside it), held_us (WRs held
 * for the peer's backup keys). scripts/testbed collects the lines.
 */
void fo_timing_say(struct shift_dqp *d);
/* Is this thread inside a background pass (shift_failover_background)? */
bool fo_on_background(void);
int fo_post_bk_recv(struct shift_dqp *d, uint64_t idx);
void fo_give_up(struct shift_dqp *d, const char *why);
void fo_from_default_batch(struct shift_ctx *s, struct ibv_wc *wc, size_t n, struct out *o);
size_t fo_drain_default(struct shift_ctx *s, struct shift_cq *c, struct out *up);
/* Poll c's application CQ in the slow path (dp_lock held): the completions
 * fast polls handed over first (struct shift_early), then the provider's. */
int fo_poll_default(struct shift_ctx *s, struct shift_cq *c, int max, struct ibv_wc *wc);
void fo_empty_read(struct ibv_send_wr *wr, uint64_t wr_id, unsigned flags);
int fo_send_ctrl(struct shift_dqp *d, uint32_t imm);
void fo_flush_held(struct shift_dqp *d, struct out *o, const struct ibv_wc *err,
		       uint64_t sq_from, uint64_t rq_from);
/* the connection fails for the application after leaving Default (fo/fail.c) */
#define FO_TELL_PEER 1u  /* ABORT to the peer */
#define FO_PATH_ERROR 2u /* the first send completes with the path's error */
#define FO_BY_STATE UINT64_MAX
void fo_fail_connection(struct shift_dqp *d, struct out *o, const char *why,
			const struct ibv_wc *err, unsigned how);
void fo_fail_mark(struct shift_dqp *d, const char *why, uint64_t sq, uint64_t rq);
bool fo_fail_pending(struct shift_dqp *d, struct out *o);
void fo_give_up_late(struct shift_dqp *d, struct out *o, const char *why);
bool fo_tell_abort(struct shift_dqp *d);
void fo_ep_publish(struct shift_ctx *s, struct shift_dqp *d);
bool fo_ep_take(struct shift_dqp *d, const void *v, size_t len);
bool fo_ep_due(const struct shift_dqp *d, uint64_t now);
int fo_ep_read_pass(struct shift_dqp *d);
bool fo_peer_armed(const struct shift_dqp *d);
bool fo_peer_old_dead(const struct shift_dqp *d);
bool fo_unjoined(const struct shift_dqp *d);
bool fo_poke_peer(struct shift_ctx *s, struct shift_dqp *d, const char *why);
void fo_flush_backup(struct shift_ctx *s, struct shift_dqp *d, bool keep);
int fo_reset_backup(struct shift_ctx *s, struct shift_dqp *d, unsigned gen);
int fo_rearm_backup(struct shift_ctx *s, struct shift_dqp *d);
bool fo_app_sends(struct shift_ctx *s, struct shift_dqp *d);
int fo_start(struct shift_ctx *s, struct shift_dqp *d, struct out *o,
		 const struct ibv_wc *err);
int fo_finish_start(struct shift_ctx *s, struct shift_dqp *d, bool reset);
void fo_send_my_ctrl(struct shift_ctx *s, struct shift_dqp *d);
uint64_t fo_executed_end(struct shift_dqp *d, uint32_t peer_count, uint32_t mask,
			     uint64_t *rd, uint32_t *done_out);
void fo_complete_executed(struct shift_dqp *d, struct out *os, uint64_t i);
void fo_retransmit(struct shift_dqp *d, struct out *o);
void fo_on_ctrl(struct shift_ctx *s, struct shift_dqp *d, struct out *o);
int fo_port_state(struct shift_ctx *s, unsigned port);
bool fo_port_active(struct shift_ctx *s, struct shift_dqp *d);
enum shift_wc_class fo_wc_class(struct shift_dqp *d, enum ibv_wc_status status);
bool fo_bk_port_active(struct shift_ctx *s, struct shift_dqp *d);
int fo_reset_default(struct shift_ctx *s, struct shift_dqp *d);
bool fo_prober(struct shift_dqp *d);
int fo_post_probe(struct shift_dqp *d);
int fo_receives_back(struct shift_dqp *d);
void fo_switch_back(struct shift_dqp *d);
void fo_try_notify(struct shift_dqp *d);
void fo_on_default_ctrl(struct shift_ctx *s, struct shift_dqp *d, struct ibv_wc *wc,
			    struct out *o);
int fo_ret_start(struct shift_ctx *s, struct shift_dqp *d, struct out *o);
void fo_ret_finish(struct shift_ctx *s, struct shift_dqp *d, struct out *o);
void fo_failback_work(struct shift_ctx *s, struct shift_dqp *d, uint64_t now);
void fo_from_default(struct shift_ctx *s, struct ibv_wc *wc, struct out *o);
void fo_poll_backup(struct shift_ctx *s, struct shift_cq *c, struct out *o, bool app);
/* episode records as datagrams (fo/dgram.c): d's new record noted for
 * this pass (rk_lock held); the pass's sent, the peers' taken */
void fo_dgram_collect(struct shift_dqp *d);
void fo_dgram_run(struct shift_ctx *s);
bool fo_dgram_starting(struct shift_ctx *s, struct shift_dqp *d);
void fo_lock_cqs(struct shift_dqp *d);
void fo_unlock_cqs(struct shift_dqp *d);
void fo_poke_read(struct shift_ctx *s, uint64_t now);
void fo_join_peer(struct shift_ctx *s, struct shift_dqp *d, uint64_t now);
bool fo_take_refused(struct shift_dqp *d, int rc, uint64_t sq_from, uint64_t rq_from);
struct shift_dsrq;
bool fo_srq_can_move(struct shift_ctx *s, struct shift_dqp *d);
void fo_srq_move(struct shift_ctx *s, struct shift_dqp *d);
int fo_srq_post_bounce(struct shift_dqp *d);
void fo_srq_deliver(struct shift_dsrq *q, struct out *o);
void fo_srq_bounced(struct shift_dqp *d, struct ibv_wc *wc, struct out *o);
void fo_srq_deliver_all(struct shift_ctx *s, struct out *o);
void fo_srq_forget(struct shift_dqp *d);
bool fo_srq_defer(struct shift_dqp *d, const struct ibv_wc *wc);
bool fo_srq_waits(const struct shift_dqp *d);
void fo_srq_expect_notify(struct shift_dqp *d);
bool fo_srq_take_notify(struct shift_dqp *d, struct ibv_wc *wc);
void fo_srq_work(struct shift_ctx *s);
void fo_srq_fail(struct shift_ctx *s, struct shift_dqp *d, struct out *o);
void fo_srq_release(struct shift_dqp *d);
void fo_emit_after_srq(struct shift_dqp *d, struct out *o, const struct ibv_wc *wc);
uint32_t fo_srq_counted(const struct shift_dqp *d);
void fo_srq_burner_destroy(struct shift_dsrq *q);
unsigned fo_srq_burn(struct shift_ctx *s, struct shift_dsrq *q, struct shift_dqp *d, unsigned n);
unsigned fo_srq_burning(const struct shift_dsrq *q);
void fo_srq_burn_poll(struct shift_dsrq *q);
/* the application's errors and its own ERR/RESET (fo/apperr.c) */
void fo_on_error(struct shift_ctx *s, struct shift_dqp *d, struct ibv_wc *wc, struct out *o);
void fo_stash_add(struct shift_dqp *d, struct shift_cq *c, const struct ibv_wc *wc);
struct fo_start_ctx {
	const struct ibv_wc *err; /* the completion that started it, if any */
	bool again, unsure, refused;
	bool direct;              /* err could go straight to the caller's array */
	uint64_t at;              /* else its place in the caller's CQ's kept */
	uint64_t sq_stop, rq_stop; /* the first WRs posts held (stop_default) */
};
int fo_judge_start(struct shift_ctx *s, struct shift_dqp *d, struct out *o,
		   const struct fo_start_ctx *sc, struct shift_fo_stash *st);
int fo_start_unsure(struct shift_ctx *s, struct shift_dqp *d, struct out *o,
		    const struct ibv_wc *err);
void fo_end(struct shift_ctx *s, struct shift_dqp *d, struct out *o, bool flush, const char *why);
void fo_end_from(struct shift_ctx *s, struct shift_dqp *d, struct out *o, const struct ibv_wc *err,
		 const char *why, uint64_t sq_min, uint64_t rq_min);
void fo_backup_app_error(struct shift_ctx *s, struct shift_dqp *d, struct ibv_wc *wc,
			 struct out *o);
void fo_app_translate(struct shift_dqp *d, struct ibv_wc *wc);

#endif /* SHIFT_FO_INT_H */
