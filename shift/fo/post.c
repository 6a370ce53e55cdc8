/*
 * Posting on a QP that is not in the Default state, and the provider
 * refusing a post on a failed QP (the WRs are kept and the QP fails over).
 */
#include "shift/fo/fo_int.h"

/* ---- failed posts ----------------------------------------------------------
 *
 * A provider may refuse WRs on a QP that failed: some refuse every post in
 * ERR, and a device that is gone fails the system call of the doorbell. To
 * the application that is the same failure as an error completion, and
 * SHIFT hides it the same way: the refused WRs stay in the mirror behind
 * those the provider took (and flushes), the post succeeds, and the QP
 * fails over, in the application's next poll if an error completion comes
 * first, else in the next background pass (after the grace that lets a poll
 * inside the fast path finish, as for a port gone down). The QP's own state
 * tells the two apart: a refusal while the QP is not in ERR (a bad WR, a
 * full queue) is the application's, as without SHIFT, and so is every
 * refusal on a QP SHIFT could not fail over anyway. If the failover cannot
 * start after all, the taken WRs complete with a flush error.
 */
/* The default QP refused WRs (post_lock held): has it failed? Then the
 * WRs from sq_from and rq_from on are SHIFT's (see above). */
bool fo_take_refused(struct shift_dqp *d, int rc, uint64_t sq_from, uint64_t rq_from)
{
	struct shift_ctx *s = shift_ctx_of(d->qp->context);
	int q;

	if (!s || !s->rnic || !d->shadow || !d->scq || !d->rcq ||
	    __atomic_load_n(&d->shadow->state, __ATOMIC_ACQUIRE) != SHIFT_SHADOW_READY)
		return false;
	q = fo_qp_failed(d->qp);
	if (!q)
		return false;
	if (!d->post_failed) {
		d->sq_taken = sq_from;
		d->rq_taken = rq_from;
		/* (not a failure of its own: SHIFT's failover stopped it) */
		if (!__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE))
			shift_info("%s QP %u: the provider refused a post (%s) on a failed QP "
				   "(%s): SHIFT keeps the WRs for its backup QP", d->dev, d->qpn,
				   strerror(rc), q < 0 ? "cannot query it" : "ERR");
		__atomic_store_n(&d->post_failed, true, __ATOMIC_RELEASE);
	}
	shift_ctx_set_slow(s, true);
	return true;
}

bool shift_failover_post_refused(struct shift_dqp *d, int rc, uint64_t sq_from, uint64_t rq_from)
{
	/* (receives back on the default QP while the sends still are on the
	 * backup: the failover starts again, as for an error completion) */
	return (shift_dqp_send_state(d) == SHIFT_SEND_DEFAULT ||
		(d->need_rearm && shift_dqp_send_state(d) != SHIFT_SEND_UNPROTECTED)) &&
	       fo_take_refused(d, rc, sq_from, rq_from);
}

/* ---- posting while failed over --------------------------------------------- */

/* Post mirrored sends from `from` to sq_head on the backup (post_lock
 * held): in WaitSignaled the first signaled one is the fence, and what
 * follows it is held for the default QP; a WR whose peer key is not read
 * yet holds it and the rest (fo_post_bk_send). 0, or fo_post_bk_send's
 * error with *failed the first WR that could not be posted. */
int fo_post_bk_sends(struct shift_dqp *d, uint64_t from, uint64_t *failed)
{
	for (uint64_t i = from; i < d->sq_head && !d->sq_held; i++) {
		struct shift_swqe *e = shift_dqp_swqe(d, i);
		bool fence = shift_dqp_send_state(d) == SHIFT_SEND_WAIT_SIGNALED &&
			     ((e->send_flags & IBV_SEND_SIGNALED) || d->sq_sig_all);

		/* the fence: set before it can complete; what follows it is held */
		if (fence) {
			d->fence = i;
			shift_dqp_set_send_state(d, SHIFT_SEND_WAIT_DRAINED, "fence posted");
		}
		int rc = fo_post_bk_send(d, i);

		if (rc) {
			if (fence)
				shift_dqp_set_send_state(d, SHIFT_SEND_WAIT_SIGNALED, "the fence could not be posted");
			*failed = i;
			return rc;
		}
		if (fence && d->sq_held) /* (not posted after all) */
			shift_dqp_set_send_state(d, SHIFT_SEND_WAIT_SIGNALED, "the fence waits for a key");
		if (fence)
			break;
	}
	return 0;
}

/* A chain posted while failed over that held a WR beyond the QP's
 * capacities (stop, not mirrored; the WRs before it are): the post fails
 * there with EINVAL, as the verbs say of an invalid WR (the backup's
 * provider, asked, would refuse it too; its errno may differ, mlx5 says
 * ENOMEM for too much inline data). 0 without one. */
#define REFUSE_AT(stop, bad_wr) \
	((stop) ? (*(bad_wr) = (void *)(uintptr_t)(stop), EINVAL) : 0)

int shift_post_send_fallback(struct shift_dqp *d, struct ibv_send_wr *wr,
			     struct ibv_send_wr **bad_wr)
{
	uint64_t head = d->sq_head, i;
	const struct ibv_send_wr *stop = NULL;
	int r = shift_dqp_record_send(d, wr, &stop);

	if (r < 0) {
		*bad_wr = wr;
		return ENOMEM;
	}
	if (!d->handshake_done || shift_dqp_send_state(d) == SHIFT_SEND_WAIT_DRAINED || d->sq_held ||
	    __atomic_load_n(&d->bk_refused, __ATOMIC_RELAXED))
		return REFUSE_AT(stop, bad_wr); /* held: fo_retransmit(),
							      fo_switch_back() or
							      fo_held_release() posts them,
							      or the episode after a
							      refusal (fo_bk_refused) */

	int rc = fo_post_bk_sends(d, head, &i);

	if (rc == FO_BK_REFUSED) {
		/* the WRs from i on stay in the mirror (the ones before it are
		 * on the backup): the post succeeds */
		fo_bk_refused(d);
		return REFUSE_AT(stop, bad_wr);
	}
	if (rc) {
		/* report the first WR that did not go out */
		struct ibv_send_wr *w = wr;

		for (uint64_t k = head; k < i; k++)
			w = w->next;
		shift_dqp_unrecord_send(d, wr, w, head);
		*bad_wr = w;
		return EIO;
	}
	return REFUSE_AT(stop, bad_wr);
}

int shift_post_recv_fallback(struct shift_dqp *d, struct ibv_recv_wr *wr,
			     struct ibv_recv_wr **bad_wr)
{
	uint64_t head = d->rq_head;
	const struct ibv_recv_wr *stop = NULL;
	int r = shift_dqp_record_recv(d, wr, &stop);

	if (r < 0) {
		*bad_wr = wr;
		return ENOMEM;
	}
	if (d->notify_pending || d->recv_hold || __atomic_load_n(&d->bk_refused, __ATOMIC_RELAXED))
		return REFUSE_AT(stop, bad_wr); /* fo_try_notify() or fo_start()
							      posts them, or the episode
							      after a refusal */
	for (uint64_t i = head; i < d->rq_head; i++) {
		int rc = fo_post_bk_recv(d, i);

		if (rc == FO_BK_REFUSED) {
			fo_bk_refused(d); /* (as for sends, above) */
			break;
		}
		if (rc) {
			struct ibv_recv_wr *w = wr;

			for (uint64_t k = head; k < i; k++)
				w = w->next;
			shift_dqp_unrecord_recv(d, wr, w, head);
			*bad_wr = w;
			return EIO;
		}
	}
	return REFUSE_AT(stop, bad_wr);
}

/*
 * The backup's provider refused the application's WRs while failed over
 * (post_lock held). A provider that refuses posts on a QP in ERR (the
 * backup failed, its error completions maybe not polled yet) must not make
 * the application's post fail where one that takes and flushes them lets
 * it succeed: the WRs stay in the mirror, the later ones are held, and the
 * background pass takes the backup as failed (fo_failback_work), so the
 * next episode (a new failover, or a return to the default QPs) posts
 * them, or the connection fails as plain's would.
 */
void fo_bk_refused(struct shift_dqp *d)
{
	if (__atomic_load_n(&d->bk_refused, __ATOMIC_RELAXED))
		return;
	__atomic_store_n(&d->bk_refused, true, __ATOMIC_RELEASE);
	shift_rnic_wake(shift_rnic_of(d->qp->context));
}

/* ---- sends held for a key ---------------------------------------------------- */

/* Post held sends from d->sq_held_from on, as far as their keys are read
 * (or given up on). Background pass; takes its CQs and post_lock. */
void fo_held_release(struct shift_dqp *d)
{
	fo_lock_cqs(d);
	shift_dqp_lock(d);
	if (!d->sq_held || shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED) {
		shift_dqp_unlock(d);
		fo_unlock_cqs(d);
		return;
	}
	uint64_t i = d->sq_held_from;

	__atomic_store_n(&d->sq_held, false, __ATOMIC_RELEASE);
	int rc = 0;

	/* (below sq_held_exec: a failover's retransmission, fo_retransmit) */
	for (; !rc && !d->sq_held && i < d->sq_held_exec && i < d->sq_head; i++)
		rc = shift_dqp_swqe(d, i)->opcode == IBV_WR_RDMA_READ ?
			     fo_post_bk_send(d, i) : fo_post_bk_placeholder(d, i);
	uint64_t failed;

	if (!rc && !d->sq_held && i < d->sq_head)
		rc = fo_post_bk_sends(d, i, &failed);
	if (rc == FO_BK_REFUSED)
		fo_bk_refused(d); /* (the rest held for the next episode) */
	else if (rc)
		fo_fail_mark(d, "cannot post a WR on the backup QP", FO_BY_STATE, FO_BY_STATE);
	bool released = !rc && !d->sq_held && d->t_held_us;

	if (released) {
		/* (a failover's retransmission held for keys: all out now) */
		uint64_t now = shift_clock_us();

		d->held_us += (uint32_t)(now - d->t_held_us);
		d->t_held_us = 0;
		if (!d->switch_us && d->handshake_done && d->t_start_us)
			d->switch_us = now > d->t_start_us ? now - d->t_start_us : 1;
	}
	shift_dqp_unlock(d);
	if (released)
		fo_timing_say(d); /* (its log line: not under post_lock) */
	struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

	fo_fail_pending(d, &o);
	fo_unlock_cqs(d);
}
