/*
 * The background pass's work on one failed-over QP: reading the peer's
 * record, resetting and probing the default QP, restarting or giving up a
 * failover whose backup failed, re-arming the backup once both directions
 * are back.
 */
#include "shift/fo/fo_int.h"

/* Completions on the default CQs: a passive application may never poll
 * them (the probe's, the peer's notification). */
static void poll_default_cqs(struct shift_ctx *s, struct shift_dqp *d)
{
	struct ibv_wc tmp[TMP_WC];
	int n;
	struct shift_cq *cs[2] = { d->scq, d->rcq != d->scq ? d->rcq : NULL };
	for (int k = 0; k < 2; k++) {
		if (!cs[k])
			continue;
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = cs[k] };
		/* as a batch: an error in it that starts a failover drains
		 * the rest of it first (from_default_batch) */
		while ((n = fo_poll_default(s, cs[k], TMP_WC, tmp)) > 0)
			fo_from_default_batch(s, tmp, (size_t)n, &o);
	}
}

/* The peer's record says its application ended the connection: mine
 * ends as the peer's QP in ERR would make it fail (true). Whenever the
 * record was taken, not only at a pass that read it: a datagram's record
 * taken in the Default state (fo/dgram.c) before a failover whose reads
 * then found the store without it (lost, garbled) was never followed, and
 * the application's error never reached it. */
static bool peer_ended(struct shift_ctx *s, struct shift_dqp *d)
{
	struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

	if (!d->peer_closed)
		return false;
	shift_info("%s QP %u: the peer's application ended the connection", d->dev, d->qpn);
	fo_end(s, d, &o, true, "the peer's application ended the connection");
	return true;
}

/* What the peer's record says, read at the probe period while my backup
 * is used, at every pass while waiting for the peer. */
static void follow_peer_record(struct shift_ctx *s, struct shift_dqp *d, uint64_t now)
{
	/* Episodes: while my backup is used (the peer's message cannot reach
	 * it), read the peer's record at the probe period; waiting for the
	 * peer, or after a backup failure, at every pass. */
	if (fo_ep_due(d, now) || d->kv_pref) {
		bool urgent = d->ep_wait == SHIFT_EP_WAIT_PEER || d->ep_wait == SHIFT_EP_WAIT_RESET ||
			      d->bk_error;

		d->kv_at = now + (urgent ? 1 : fo_probe_wait(d));
		bool lost = d->kv_pref == -2; /* (the store answered without it) */
		/* Waiting on the peer's record, where the peer may wait on
		 * mine: mine is put again at the probe period. The store may
		 * have lost it (restarted empty, the key deleted, the value
		 * garbled) with no failed command to have it written again
		 * (the refresh after a recovery, shadow/replay.c); each end
		 * then waited for the other's until the episode expired (the
		 * campaign's --kv-faults: 25 connections in 1000 schedules of
		 * nccl). A put is queued for the pass's KV share (fo/kvq.c).
		 * (published_at may be later than now: an application
		 * thread's failover after this pass read the clock.) */
		if ((d->ep_wait != SHIFT_EP_RUNNING || d->bk_error) &&
		    now >= d->published_at + (shift_config.probe_ms ? shift_config.probe_ms : 250)) {
			fo_ep_publish(s, d);
			/* (a peer back in the Default state, done with its part
			 * (its backup reset, or its return), whose record the
			 * store lost: it reads mine and puts its own again only
			 * when poked, fo/poke.c) */
			if (lost && (d->ep_wait == SHIFT_EP_WAIT_PEER ||
				     d->ep_wait == SHIFT_EP_WAIT_RETURN))
				fo_poke_peer(s, d, "the peer's record does not show its part of");
		}
		if (fo_ep_read_pass(d) == 0) {
			struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

			if (peer_ended(s, d))
				return; /* (nothing else of that record is followed) */
			if (d->peer_started > d->failovers && d->peer_ret &&
			    d->peer_started == d->failovers + 1) {
				/* (my default QP must be reset first: not while
				 * its port is down) */
				bool can = d->dflt != SHIFT_DFLT_ERR || fo_port_active(s, d);

				if (d->followed_ep != d->peer_started)
					shift_info("%s QP %u: the peer goes back to the default QP (failover "
						   "%u): following it%s", d->dev, d->qpn, d->peer_started,
						   can ? "" : " once my default port is up");
				d->followed_ep = d->peer_started;
				if (can && fo_ret_start(s, d, &o) == 0 && d->peer_started == d->failovers)
					fo_ret_finish(s, d, &o);
			} else if (d->ep_wait == SHIFT_EP_WAIT_RETURN && d->peer_ret &&
				   d->peer_started == d->failovers) {
				fo_ret_finish(s, d, &o);
			} else if (d->peer_started > d->failovers) {
				shift_info("%s QP %u: the peer started failover %u: following it", d->dev,
					   d->qpn, d->peer_started);
				if (shift_dqp_send_state(d) != SHIFT_SEND_DEFAULT)
					d->need_rearm = true; /* a new failover from any state */
				if (d->ep_wait == SHIFT_EP_WAIT_RETURN)
					shift_dqp_set_ep_wait(d, SHIFT_EP_RUNNING, "the peer started a new failover");
				fo_start(s, d, &o, NULL);
			} else if (d->ep_wait == SHIFT_EP_WAIT_RESET && fo_peer_old_dead(d)) {
				if (fo_finish_start(s, d, true))
					fo_fail_pending(d, &o);
				if (d->ctrl_pending && shift_dqp_send_state(d) != SHIFT_SEND_UNPROTECTED)
					fo_on_ctrl(s, d, &o);
			} else if (d->ep_wait == SHIFT_EP_WAIT_PEER && fo_peer_armed(d)) {
				fo_send_my_ctrl(s, d);
				if (fo_fail_pending(d, &o))
					return;
				if (d->ctrl_pending)
					fo_on_ctrl(s, d, &o);
			}
		}
	}
}

/* (My record and the peer's: a failed backup published, my presence in
 * the peer's episode shown, a poke; then both back to the default QPs.) */
static void backup_failure_news(struct shift_ctx *s, struct shift_dqp *d)
{
	/* my backup failed: the peer reads it in my record (the prober
	 * decides; it may not have seen its own backup fail) */
	if (d->bk_error && !d->bkfail_published)
		fo_ep_publish(s, d);
	/* the peer's backup failed in my episode: my record shows I am in it
	 * (the peer does not go on before it knows, see fo_unjoined()) */
	if (d->peer_bkfail && d->peer_started == d->failovers && d->published_ep != d->failovers)
		fo_ep_publish(s, d);
	if (fo_unjoined(d) && d->poked_ep != d->failovers &&
	    fo_poke_peer(s, d, "my backup path failed before the peer answered"))
		d->poked_ep = d->failovers;
	/* either end's backup failed in this episode and my default path
	 * answered since it started: both back to the default QPs */
	if ((d->bk_error || (d->peer_bkfail && d->peer_started == d->failovers)) &&
	    d->dflt == SHIFT_DFLT_OK && d->need_rearm && d->ep_wait != SHIFT_EP_WAIT_RETURN &&
	    d->peer_started <= d->failovers) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

		if (!d->bk_error)
			shift_info("%s QP %u: the peer's backup path failed", d->dev, d->qpn);
		fo_ret_start(s, d, &o);
	}
}

/* My backup failed and the peer started no new failover: it may be
 * waiting for one of mine just as well (a failure only one end saw
 * the cause of: rxe's stale read state after a lost first packet, a
 * backup link flap). It starts one after a grace, the other end
 * follows its record (two ends that both start one meet in it, as
 * when both see the default path fail); a few times in a row at most
 * without a backup completion in between, then the limit below ends
 * it.
 */
static void restart_after_backup_failure(struct shift_ctx *s, struct shift_dqp *d, uint64_t now)
{
	/* (never onto a backup whose port is down: its reset would fail) */
	uint64_t grace = shift_config.bk_restart_ms;
	/* With the default port up, the default path may be back: the prober
	 * waits for its probe (answered: back to the default QP, ret_start;
	 * failed: a new failover), the other end gives it the time to decide
	 * (its return record comes first) */
	bool maybe_back = d->dflt != SHIFT_DFLT_OK && shift_config.probe_ms && fo_port_active(s, d);
	if (maybe_back && (fo_prober(d) ? d->probe_fails == d->bk_probe_fails : true))
		grace = fo_prober(d) ? UINT64_MAX / 2 : 4 * grace;
	if (d->bk_error && d->bk_restarts < SHIFT_BK_RESTARTS && now > d->bk_error_at &&
	    now - d->bk_error_at >= grace && d->peer_started <= d->failovers && !fo_unjoined(d) &&
	    fo_bk_port_active(s, d)) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

		d->bk_restarts++;
		shift_info("%s QP %u: backup QP failed and the peer started no new failover: starting "
			   "failover %lu (restart %u)", d->dev, d->qpn, d->failovers + 1, d->bk_restarts);
		fo_start(s, d, &o, NULL);
	}
}

/* The peer never followed: the episode ends, the connection fails for the
 * application (true). */
static bool episode_expired(struct shift_ctx *s, struct shift_dqp *d, uint64_t now)
{
	uint64_t limit = shift_config.episode_wait_ms;
	/* (the marks may be set by an application thread after this pass
	 * read the clock: later than now) */
	bool waited = now > d->wait_since && now - d->wait_since >= limit;
	/* (the handshake: the peer's message never came, though mine went
	 * through: its SHIFT is gone or stuck) */
	bool unanswered = now > d->wait_since &&
			  now - d->wait_since >= shift_config.handshake_wait_ms &&
			  !d->handshake_done && shift_dqp_send_state(d) == SHIFT_SEND_FALLBACK;

	if ((d->bk_error && now > d->bk_error_at && now - d->bk_error_at >= limit) ||
	    (d->ep_wait != SHIFT_EP_RUNNING && waited) || unanswered) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };
		struct ibv_qp_attr e = { .qp_state = IBV_QPS_ERR };

		/* the default QP's successes are kept, then every WR still
		 * outstanding (on either QP) is flushed to the application */
		shift_lower->modify_qp(d->bk, &e, IBV_QP_STATE);
		shift_lower->modify_qp(d->qp, &e, IBV_QP_STATE);
		shift_dqp_lock(d);
		shift_dqp_set_send_state(d, SHIFT_SEND_FALLBACK, "the episode ends: the connection fails");
		shift_dqp_unlock(d);
		fo_drain_default(s, d->scq, NULL);
		if (d->rcq != d->scq)
			fo_drain_default(s, d->rcq, NULL);
		fo_fail_connection(d, &o, d->bk_error ? "the backup path failed and the peer started "
				   "no new failover" : unanswered ? "the peer did not answer the handshake "
				   "within SHIFT_FAILOVER_MS" : "the peer did not join the new failover",
				   NULL, 0);
		return true;
	}
	return false;
}

/* Keep the default QP reset (receptive to the peer's probe) whenever its
 * port is up; probe from it at the probe period, backing off. */
static void probe_default(struct shift_ctx *s, struct shift_dqp *d, uint64_t now)
{
	/* (a QP on an SRQ waits until its default SRQ holds no receive whose
	 * buffer the backup path filled: fo_srq_work()) */
	if (d->dsrq && shift_dsrq_moved(d->dsrq))
		return;
	if (d->ret_rd_wait)
		return; /* (a return's empty READ is out: fo/return.c) */
	/* (also while a handshake cannot finish because a backup failed: the
	 * default path may be the way back, ret_start) */
	if (shift_dqp_send_state(d) == SHIFT_SEND_FALLBACK &&
	    (d->handshake_done || d->bk_error || (d->peer_bkfail && d->peer_started == d->failovers)) &&
	    shift_config.probe_ms) {
		if (d->dflt == SHIFT_DFLT_ERR && fo_port_active(s, d)) {
			int rc = fo_reset_default(s, d);

			shift_debug("%s QP %u: default QP reset: %d", d->dev, d->qpn, rc);
			if (rc == 1) {
				/* receive-only: nothing to probe or send; receptive again */
				d->dflt = SHIFT_DFLT_OK;
				shift_dqp_lock(d);
				shift_dqp_sync_locked(d);
				if (d->sq_tail == d->sq_head) {
					shift_dqp_set_send_state(d, SHIFT_SEND_DEFAULT, "receive-only QP back on the default QP");
					SHIFT_STAT_ADD(d->failbacks, 1);
				}
				shift_dqp_unlock(d);
				shift_info("%s QP %u: default QP reset to RTR (the application never sends on it)",
					   d->dev, d->qpn);
			} else if (rc == 0) {
				d->dflt = SHIFT_DFLT_READY;
			} else {
				d->probe_fails++;
				d->probe_at = now + fo_probe_wait(d);
			}
		}
		if (d->dflt == SHIFT_DFLT_READY && now >= d->probe_at && fo_prober(d) && !fo_unjoined(d)) {
			shift_dqp_lock(d);
			int rc = fo_post_probe(d);
			shift_dqp_unlock(d);
			d->dflt = rc ? SHIFT_DFLT_ERR : SHIFT_DFLT_PROBING;
			if (rc)
				d->probe_at = now + fo_probe_wait(d);
		}
	}
}

/* The background thread's failback work for one failed-over QP (its CQs
 * locked). */
void fo_failback_work(struct shift_ctx *s, struct shift_dqp *d, uint64_t now)
{
	if (fo_fail_pending(d, NULL))
		return; /* (a give-up under post_lock not finished yet) */
	if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED)
		return; /* its completions are the application's, as they come */
	poll_default_cqs(s, d);
	if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED)
		return;
	/* (its provider refused the application's WRs: fo_bk_refused) */
	if (__atomic_load_n(&d->bk_refused, __ATOMIC_ACQUIRE) && !d->bk_error)
		fo_backup_failed(d, -1);
	if (peer_ended(s, d))
		return;
	follow_peer_record(s, d, now);
	if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED)
		return;
	backup_failure_news(s, d);
	if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED)
		return;
	restart_after_backup_failure(s, d, now);
	if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED)
		return;
	if (episode_expired(s, d, now))
		return;
	probe_default(s, d, now);
	/* (after a return episode the peer's marker is still to consume my
	 * control receive: its completion must not reach the fast path) */
	/* (and only with the backup's port up: a backup NIC that is down now
	 * protects the QP again once it is back) */
	if (d->need_rearm && shift_dqp_send_state(d) == SHIFT_SEND_DEFAULT &&
	    shift_dqp_recv_state(d) == SHIFT_RECV_DEFAULT && !d->notify_inflight &&
	    !(d->ctrl_recv_out && !d->peer_nosend) && fo_bk_port_active(s, d) &&
	    fo_rearm_backup(s, d) == 0)
		shift_info("%s QP %u: back on the default QP in both directions, backup QP %u re-armed "
			   "(failovers %lu, failbacks %lu)", d->dev, d->qpn, d->bk->qp_num, d->failovers,
			   d->failbacks);
}
