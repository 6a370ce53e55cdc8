/*
 * Failover: moving an application QP's traffic to its backup QP when the
 * default path fails, invisibly to the application (SHIFT paper §4.3.2).
 *
 * Detection: an error completion of a protected QP while polling. Before
 * anything moves, the default CQ is drained: completions that succeeded are
 * kept for the application, in order (appendix B.2), and the QP's error and
 * flush completions are dropped.
 *
 * The boundary: if an atomic is among the outstanding send WRs, it may or
 * may not have executed at the peer and retrying could apply it twice, so
 * the error goes to the application and nothing is retransmitted.
 *
 * The two-way handshake on the backup QPs: each side reposts its
 * outstanding receives on its backup QP, then sends one WRITE_WITH_IMM whose
 * immediate is its receive counter (receives consumed so far). That message
 * lands in the control receive SHIFT keeps at the head of the peer's backup
 * receive queue, so it never consumes or reorders an application receive.
 * A side that gets the peer's message first does the same (reposts, answers
 * with its own counter); a side that has both sent and received one
 * retransmits its outstanding sends, skipping those the peer's counter says
 * were executed already (the request arrived, the ACK was lost): those
 * complete to the application without being sent again.
 *
 * Completions: once a context has a failed-over QP its polls take the slow
 * path here: kept completions first, then the default CQ, then the backup
 * CQ, whose completions are translated (the application's wr_id and QP
 * number). SHIFT's own completions never reach the application.
 *
 * The rest of fo/: handshake.c (retransmission after the handshake),
 * episode.c (episode records, backup resets), failback.c (probing and
 * switching back, SHIFT paper §4.3.3), return.c (return episodes), work.c
 * (a failed-over QP's background work), poll.c (the slow poll),
 * background.c (the background pass), poke.c, post.c (posting while failed
 * over, refused posts), common.c (shared helpers). fo_int.h is their
 * internal interface. docs/architecture.md has the path of one failover.
 */
#include "shift/base/backoff.h"
#include "shift/fo/fo_int.h"
#include "shift/dp/nwq.h"

/* ---- failing over --------------------------------------------------------- */

void fo_give_up(struct shift_dqp *d, const char *why)
{
	if (shift_dqp_send_state(d) != SHIFT_SEND_UNPROTECTED)
		shift_warn("%s QP %u: cannot fail over (%s): the error goes to the application",
			   d->dev, d->qpn, why);
	shift_dqp_set_send_state(d, SHIFT_SEND_UNPROTECTED, why);
}

/* Filter n completions taken from o->c's default CQ, in order. */
void fo_from_default_batch(struct shift_ctx *s, struct ibv_wc *wc, size_t n, struct out *o)
{
	o->rest = wc;
	o->nrest = n;
	while (o->nrest) {
		o->nrest--;
		fo_from_default(s, o->rest++, o);
	}
	o->rest = NULL;
}

/* Drain one default CQ after d's QP went to ERR. Everything in it goes
 * through the usual filter into the kept completions, in order: d's
 * successes are retired and kept, its errors dropped; another QP's error
 * may start that QP's own failover. A caller filtering a batch taken from
 * this CQ (the error that started this drain was in it) has not filtered
 * the rest of it: those come first, before the receive counter is read.
 * The number of completions it took. */
size_t fo_drain_default(struct shift_ctx *s, struct shift_cq *c, struct out *up)
{
	struct ibv_wc *all = NULL, tmp[TMP_WC];
	size_t n_all = 0, cap = 0;
	int n;

	for (struct out *p = up; p; p = p->up) {
		if (p->c != c || !p->nrest)
			continue;
		all = malloc(p->nrest * sizeof(*all));
		if (!all)
			break;
		memcpy(all, p->rest, p->nrest * sizeof(*all));
		n_all = cap = p->nrest;
		p->nrest = 0;
		break; /* only the innermost batch of c can have a rest */
	}
	while ((n = fo_poll_default(s, c, TMP_WC, tmp)) > 0) {
		if (n_all + (size_t)n > cap) {
			size_t ncap = cap ? cap * 2 : 64;

			while (ncap < n_all + (size_t)n)
				ncap *= 2;
			struct ibv_wc *na = realloc(all, ncap * sizeof(*na));

			if (!na)
				break;
			all = na;
			cap = ncap;
		}
		memcpy(all + n_all, tmp, sizeof(*tmp) * (size_t)n);
		n_all += (size_t)n;
	}
	struct out o = { .wc = NULL, .n = 0, .max = 0, .c = c, .up = up };
	fo_from_default_batch(s, all, n_all, &o);
	free(all);
	return n_all;
}

/*
 * Stale read-response state (soft-RoCE). rxe's completer remembers the
 * opcode of the last read response packet it accepted (FIRST or MIDDLE
 * while a multi-packet read response is coming in) and a QP reset does not
 * clear it (rxe_qp_reset clears the requester's and responder's opcodes,
 * not the completer's). A QP that went to ERR inside a read response and
 * was reset therefore refuses the ACK of its next WRITE or SEND as out of
 * sequence: it completes that WR with a success status (the WQE's status
 * was never set: the kernel's WARN_ON_ONCE in rxe_completer) and moves the
 * QP to ERR, so the WR after it completes flushed with no error before it.
 * Only a read response packet is accepted in that state, and a
 * RESPONSE_ONLY (an empty READ's) ends it. So after a failover with an
 * RDMA READ outstanding (the only way into that state), the first WR SHIFT
 * posts on the reset QP is an empty RDMA READ: the probe (prober), or one
 * ahead of the notification (the other end), or ahead of the handshake
 * message on a backup QP reset for a new episode. The application's own
 * READs prove the peer grants remote reads and read resources on that QP.
 */
void fo_empty_read(struct ibv_send_wr *wr, uint64_t wr_id, unsigned flags)
{
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = wr_id;
	wr->opcode = IBV_WR_RDMA_READ;
	wr->send_flags = flags;
}

/* Is an RDMA READ among the outstanding send WRs (mirror synced)? */
static bool reads_outstanding(struct shift_dqp *d)
{
	for (uint64_t i = d->sq_tail; i < d->sq_head; i++)
		if (shift_dqp_swqe(d, i)->opcode == IBV_WR_RDMA_READ)
			return true;
	return false;
}

int fo_send_ctrl(struct shift_dqp *d, uint32_t imm)
{
	struct ibv_send_wr rd, wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = SHIFT_WRID_CTRL_SEND;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htobe32(imm);
	if (!d->bk_rd_stale)
		return ibv_post_send(d->bk, &wr, &bad);
	/* (its completions, if any, are CTRL_SEND's: SHIFT's own) */
	fo_empty_read(&rd, SHIFT_WRID_CTRL_SEND, 0);
	rd.next = &wr;
	return ibv_post_send(d->bk, &rd, &bad);
}

/*
 * The application's WRs SHIFT holds, from sq_from and rq_from to the heads
 * (their provider flushes were dropped, or the provider never had them),
 * complete with a flush error, each to the CQ of its queue (o is one of
 * them); err, the error that started it, in its place with its status. The
 * mirror retires them all.
 */
void fo_flush_held(struct shift_dqp *d, struct out *o, const struct ibv_wc *err,
		       uint64_t sq_from, uint64_t rq_from)
{
	struct out so = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };
	struct out ro = { .wc = NULL, .n = 0, .max = 0, .c = d->rcq };
	struct out *os = d->scq == o->c ? o : &so, *orq = d->rcq == o->c ? o : &ro;

	for (uint64_t i = sq_from; i < d->sq_head; i++) {
		struct ibv_wc wc = { .wr_id = shift_dqp_swqe(d, i)->wr_id,
				     .status = IBV_WC_WR_FLUSH_ERR, .qp_num = d->qpn };
		if (err && i == sq_from && err->wr_id == wc.wr_id) {
			wc = *err;
			err = NULL;
		}
		fo_emit_after_srq(d, os, &wc);
	}
	shift_dqp_retire_all_send(d);
	for (uint64_t i = rq_from; i < d->rq_head; i++) {
		struct ibv_wc wc = { .wr_id = shift_dqp_rwqe(d, i)->wr_id,
				     .status = IBV_WC_WR_FLUSH_ERR, .qp_num = d->qpn,
				     .opcode = IBV_WC_RECV };
		if (err && i == rq_from && err->wr_id == wc.wr_id) {
			wc = *err;
			err = NULL;
		}
		fo_emit_after_srq(d, orq, &wc);
	}
	__atomic_store_n(&d->rq_tail, d->rq_head, __ATOMIC_RELAXED);
	shift_dqp_set_recv_state(d, SHIFT_RECV_DEFAULT, "held receives flushed");
	d->post_failed = false;
}

/*
 * A failover that cannot start after all on a QP whose refused posts SHIFT
 * took (shift_failover_post_refused): the provider never had those WRs, so
 * they complete with a flush error (after the ones it flushes itself, which
 * reach the application unfiltered from now on).
 */
static void give_up_taken(struct shift_dqp *d, struct out *o)
{
	if (!d->post_failed)
		return;
	fo_flush_held(d, o, NULL, d->sq_taken, d->rq_taken);
}

/* Did the application bring its QP to RTS (can it ever send)? */
bool fo_app_sends(struct shift_ctx *s, struct shift_dqp *d)
{
	bool yes;

	pthread_mutex_lock(&s->rnic->lock);
	yes = (d->shadow->attr_mask & IBV_QP_SQ_PSN) != 0;
	pthread_mutex_unlock(&s->rnic->lock);
	return yes;
}

/* d cannot fail over (why): before leaving Default the error goes to the
 * application as plain's (-1); after, the connection fails (-2). */
static int cannot_start(struct shift_dqp *d, struct out *o, const char *why)
{
	if (shift_dqp_send_state(d) != SHIFT_SEND_DEFAULT) {
		fo_give_up_late(d, o, why);
		return -2;
	}
	fo_give_up(d, why);
	give_up_taken(d, o);
	return -1;
}

/* Can d fail over at all? Else it gives up (its outstanding WRs flushed). */
static int start_possible(struct shift_ctx *s, struct shift_dqp *d, struct out *o)
{
	if (!d->shadow || !d->scq || !d->rcq ||
	    __atomic_load_n(&d->shadow->state, __ATOMIC_ACQUIRE) != SHIFT_SHADOW_READY)
		return cannot_start(d, o, "its backup QP is not ready");
	if (d->dsrq && !shift_dsrq_moved(d->dsrq) && !fo_srq_can_move(s, d)) {
		if (shift_dqp_send_state(d) != SHIFT_SEND_DEFAULT) {
			fo_srq_fail(s, d, o); /* (failed over already) */
			return -2;
		}
		return cannot_start(d, o, "a QP on its SRQ cannot fail over with it");
	}
	if (fo_add(s, d))
		return cannot_start(d, o, "too many failed-over QPs in this context");
	return 0;
}

/* A start's timing (fo_timing_say()) begins: its phases, its thread's
 * CPU time and waits so far. */
static void timing_start(struct shift_dqp *d)
{
	/* (t_peer_us is the peer's message's,
	 * which may have come first) */
	d->t_start_us = shift_clock_us();
	d->t_sent_us = d->t_held_us = d->t_drained_us = 0;
	d->start_us = d->wait_us = d->retx_us = d->post_us = d->held_us = 0;
	/* (a message of an episode that ended without its retransmission
	 * is not this one's: older than 10 s) */
	d->react_us = d->t_peer_us && d->t_peer_us <= d->t_start_us &&
				      d->t_start_us - d->t_peer_us < 10000000u ?
			      (uint32_t)(d->t_start_us - d->t_peer_us) : 0;
	d->stop_us = d->err_us = d->drain_us = d->rrecv_us = d->cpu_us = d->csw = 0;
	d->yields = d->sleeps = 0;
	d->start_bg = fo_on_background();
	shift_clock_thread(&d->cpu0_us, &d->csw0);
	shift_backoff_counts(&d->yields0, &d->sleeps0);
}

/* Stop the default QP and hold every post (again: the backup served the
 * last failover and was not reset since). For the judge (fo_judge_start):
 * sc->refused also when the provider refused a post SHIFT took between the
 * QP's ERR and the posts held; sc->sq_stop, rq_stop where the held posts
 * begin (the provider has every WR before them). */
static void stop_default(struct shift_ctx *s, struct shift_dqp *d, bool again,
			 struct fo_start_ctx *sc)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

	timing_start(d);
	d->timing_said = false;
	/* what d completed is counted before it is judged: a poll of another
	 * thread that entered the fast path before the context went slow may
	 * hold completions of it not yet counted (dp/poll.h); it leaves
	 * without waiting for anything this thread holds */
	shift_ctx_set_slow(s, true);
	shift_dp_fast_polls_wait(s);
	d->bk = d->shadow->bk;
	/* The default QP to ERR before post_lock is taken: a poster inside the
	 * provider's post_send holds it, and soft-RoCE transmits a post's data
	 * inside that call (up to its window, milliseconds under emulation,
	 * longer when it retransmits); ERR ends that at once. A post that
	 * reaches the provider before the lock is mirrored as any other
	 * (recorded before the provider's call): flushed by the provider, or
	 * refused and taken (shift_failover_post_refused), it is
	 * retransmitted from the mirror. Its WQE stays whole until its
	 * completion is polled, which only the drain below does (native
	 * access reads it back first). */
	uint64_t t_err = shift_clock_us();

	/* (the application's query_qp says its own state meanwhile) */
	__atomic_store_n(&d->stopping, true, __ATOMIC_RELEASE);
	shift_lower->modify_qp(d->qp, &a, IBV_QP_STATE);
	d->err_us = (uint32_t)(shift_clock_us() - t_err);
	/* posters hold everything from here: sends until the handshake,
	 * receives until they are reposted below, in order */
	shift_dqp_lock(d);
	if (d->post_failed)
		sc->refused = true; /* (sq_taken, rq_taken: the judge's) */
	sc->sq_stop = d->sq_head;
	sc->rq_stop = d->rq_head;

	d->handshake_done = false;
	d->recv_hold = true;
	d->post_failed = false; /* (its WRs are in the mirror like the others) */
	d->sq_held = false;     /* (the retransmission posts them) */
	shift_dqp_set_send_state(d, SHIFT_SEND_FALLBACK, "failover");
	shift_dqp_set_recv_state(d, SHIFT_RECV_FALLBACK, "failover");
	/* native access: the outstanding WRs read back from the provider's
	 * queues while they are whole (atomic_in_flight() checks them) */
	shift_dqp_sync_locked(d);
	shift_dqp_native_fill(d, d->sq_tail, SHIFT_LOAD(d->rq_tail));
	__atomic_store_n(&d->stopping, false, __ATOMIC_RELEASE);
	shift_dqp_unlock(d);
	fo_rk_failover(d); /* (the peer's keys read while the handshake runs) */
	d->t_error_us = shift_clock_us();
	d->stop_us = (uint32_t)(d->t_error_us - d->t_start_us);
	d->switch_us = d->fallback_us = 0;
	d->dflt = SHIFT_DFLT_ERR;
	d->probe_fails = 0;
	d->probe_at = shift_clock_ms() + fo_probe_wait(d);
	d->notify_pending = false;
	d->notify_inflight = false; /* (its flush, if any, is SHIFT's) */
	d->notify_sent = false;     /* (the peer resets its default QP again) */
	if (d->ep_wait == SHIFT_EP_WAIT_RETURN || d->ep_wait == SHIFT_EP_WAIT_PEER)
		shift_dqp_set_ep_wait(d, SHIFT_EP_RUNNING, "failover");
	SHIFT_STAT_SET(d->last_switch_s, shift_clock_wall_s());
	/* (the context went slow above) */
	if (again) {
		/* completions of the old backup first: older than the default
		 * QP's in each queue (a direction left it only once drained) */
		shift_info("%s QP %u: the default path failed again before the backup QP was reset: "
			   "both QPs stopped for failover %lu", d->dev, d->qpn, d->failovers + 1);
		fo_flush_backup(s, d, true);
	}
	d->need_rearm = true;
}

/*
 * The boundary, judged only once the default CQs are drained: an atomic
 * whose successful completion was still in the default CQ is done, not in
 * flight. The QP's error and flush completions were dropped by the drain:
 * the application gets its outstanding WRs flushed (fail_connection, held).
 * true if the connection failed.
 */
static bool atomic_in_flight(struct shift_dqp *d, struct out *o,
			     const struct ibv_wc *err)
{
	bool unread;

	shift_dqp_lock(d);
	shift_dqp_sync_locked(d);
	unread = shift_dqp_native_unread(d);
	shift_dqp_unlock(d);
	if (unread) {
		fo_fail_connection(d, o, "an outstanding WR could not be read back from the "
				   "provider's queue", err, FO_TELL_PEER);
		return true;
	}
	for (uint64_t i = d->sq_tail; i < d->sq_head; i++) {
		if (shift_wr_is_atomic(shift_dqp_swqe(d, i)->opcode)) {
			d->atomic_boundary_hit = true;
			fo_fail_connection(d, o, "an atomic was in flight: retrying it could apply "
					   "it twice", err, FO_TELL_PEER);
			return true;
		}
	}
	return false;
}

/* Drain d's default CQs after its QP stopped: its errors and flushes are
 * judged (fo_judge_start): an application's error among them ends the
 * failover (nonzero). */
static int drain_judged(struct shift_ctx *s, struct shift_dqp *d, struct out *o,
			const struct fo_start_ctx *sc)
{
	struct shift_fo_stash st = { .e = NULL };
	uint64_t t0 = shift_clock_us();
	size_t ns, nr = 0;

	d->stash = &st;
	ns = fo_drain_default(s, d->scq, o);
	uint64_t t1 = shift_clock_us();

	if (d->rcq != d->scq)
		nr = fo_drain_default(s, d->rcq, o);
	d->stash = NULL;
	uint64_t t2 = shift_clock_us();
	int rc = fo_judge_start(s, d, o, sc, &st);

	/* (where a drain's time goes, for the testbed's diagnosis) */
	shift_debug("%s QP %u: drained %zu + %zu completions in %llu + %llu us, judged in %llu us",
		    d->dev, d->qpn, ns, nr, (unsigned long long)(t1 - t0),
		    (unsigned long long)(t2 - t1), (unsigned long long)(shift_clock_us() - t2));

	free(st.e);
	return rc;
}

/*
 * My side of the handshake: stop the default QP, account for everything it
 * completed, repost my outstanding receives on the backup, and tell the peer
 * my receive counter. Called with d's CQs locked.
 */
int fo_start(struct shift_ctx *s, struct shift_dqp *d, struct out *o,
	     const struct ibv_wc *err)
{
	/* my backup served the last failover and was not reset since: the
	 * default path failed again before the failback finished at both
	 * ends (or it never did) */
	bool again = d->need_rearm;

	if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED)
		return -1;
	if (shift_dqp_send_state(d) != SHIFT_SEND_DEFAULT && !again)
		return 0;
	int rc = start_possible(s, d, o);

	if (rc)
		return rc < -1 ? rc : -1;
	struct fo_start_ctx sc = {
		.err = err, .again = again, .unsure = d->start_unsure, .refused = d->post_failed,
		.direct = o->n < o->max && o->c->kept_head == o->c->kept_tail,
		.at = o->c->kept_head - o->c->kept_tail,
	};
	stop_default(s, d, again, &sc);
	if (d->dsrq)
		fo_srq_release(d); /* (its reset default QP's, older than the drain's) */
	if (drain_judged(s, d, o, &sc))
		return -2; /* the application's: as it came */
	if (atomic_in_flight(d, o, err))
		return -2;
	d->t_drained_us = shift_clock_us();
	d->drain_us = (uint32_t)(d->t_drained_us - d->t_error_us);
	if (d->dsrq && !shift_dsrq_moved(d->dsrq))
		fo_srq_move(s, d); /* the SRQ's other QPs leave the default SRQ too */
	if (reads_outstanding(d)) {
		/* either QP may have stopped inside a read response */
		d->dflt_rd_stale = true;
		if (again)
			d->bk_rd_stale = true;
	}
	SHIFT_STAT_ADD(d->failovers, 1);
	d->wait_since = shift_clock_ms();
	if (again && !fo_peer_old_dead(d)) {
		/* (what the background pass read last says it has not: it
		 * reads again for this wait, never this thread) */
		/* the peer's old backup may still send: reset mine only once
		 * it has stopped it (it follows my record) */
		shift_dqp_set_ep_wait(d, SHIFT_EP_WAIT_RESET, "the peer's old backup may still send");
		d->kv_at = 0;
		d->t_drained_us = d->cpu0_us = 0; /* (rrecv_us, cpu_us: not the wait's) */
		fo_ep_publish(s, d);
		shift_info("%s QP %u: failover %lu waits for the peer to stop its backup QP", d->dev,
			   d->qpn, d->failovers);
		return 0;
	}
	rc = fo_finish_start(s, d, again);
	d->cpu0_us = 0; /* (a message sent later is not this start's: cpu_us) */
	if (rc) {
		/* the default QP's flushes were dropped above: the
		 * application gets its outstanding WRs back with errors */
		if (d->fail_why)
			fo_fail_connection(d, o, d->fail_why, err, FO_TELL_PEER | FO_PATH_ERROR);
		return -2;
	}
	return 0;
}

/* The rest of fo_start(), once my backup QP may be (re)set: my receives on
 * it, my record, my handshake message (or a wait for the peer's backup).
 * -1: it gives up (fo_fail_mark: the caller fails the connection). */
int fo_finish_start(struct shift_ctx *s, struct shift_dqp *d, bool reset)
{
	if (d->ep_wait == SHIFT_EP_WAIT_RESET)
		shift_dqp_set_ep_wait(d, SHIFT_EP_RUNNING, "the peer stopped its old backup");
	if (reset && fo_reset_backup(s, d, (unsigned)d->failovers - 1)) {
		d->recv_hold = false;
		return d->fail_why || shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED ? -1 : 0;
	}
	d->need_rearm = true; /* this failover uses it */
	shift_dqp_lock(d);
	for (uint64_t i = SHIFT_LOAD(d->rq_tail); i < d->rq_head; i++) {
		if (fo_post_bk_recv(d, i)) {
			d->recv_hold = false;
			shift_dqp_unlock(d);
			fo_fail_mark(d, "cannot repost a receive on the backup QP", FO_BY_STATE,
				     FO_BY_STATE);
			return -1;
		}
	}
	d->recv_hold = false;
	shift_dqp_unlock(d);
	if (d->t_drained_us)
		d->rrecv_us = (uint32_t)(shift_clock_us() - d->t_drained_us);
	if (d->dsrq && fo_srq_post_bounce(d)) {
		fo_fail_mark(d, "cannot post receives on the backup QP", FO_BY_STATE, FO_BY_STATE);
		return -1;
	}
	if (d->failovers > 1) {
		if (!reset) /* (fo_reset_backup() published it) */
			fo_ep_publish(s, d);
		/* (the peer's record as the background pass read it last; if
		 * it is not armed, the wait below reads it again there) */
	}
	/* one warning per context while anything of it is failed over (a
	 * failure of its NIC or path moves all its QPs), the rest at info */
	enum shift_log_level lv = fo_first_failover(s) ? SHIFT_LOG_WARN : SHIFT_LOG_INFO;
	bool armed = fo_peer_armed(d);

	/* (my message first: the peer's answer is what this failover waits
	 * for, and a log line may be a write to a slow file) */
	if (armed)
		fo_send_my_ctrl(s, d);
	shift_log(lv, "%s QP %u: failing over to backup QP %u (receive counter %u, failover %lu)",
		  d->dev, d->qpn, d->bk->qp_num, (uint32_t)SHIFT_LOAD(d->rq_tail), d->failovers);
	if (!armed) {
		/* the peer's backup still serves the last failover: it reads
		 * my record and answers first, or its record says it is ready */
		shift_dqp_set_ep_wait(d, SHIFT_EP_WAIT_PEER, "the peer's backup is not reset yet");
		d->kv_at = 0;
		shift_info("%s QP %u: waiting for the peer to reset its backup QP for failover %lu",
			   d->dev, d->qpn, d->failovers);
	}
	return d->fail_why || shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED ? -1 : 0;
}

/* My handshake message of this failover: my receive counter (if it cannot
 * go out: fo_fail_mark, the caller fails the connection). */
void fo_send_my_ctrl(struct shift_ctx *s, struct shift_dqp *d)
{
	if (d->ep_wait == SHIFT_EP_WAIT_PEER)
		shift_dqp_set_ep_wait(d, SHIFT_EP_RUNNING, "the peer's backup is ready");
	if (fo_send_ctrl(d, CTRL_COUNT((uint32_t)SHIFT_LOAD(d->rq_tail)) |
				    (fo_app_sends(s, d) ? 0 : CTRL_NOSEND))) {
		fo_fail_mark(d, "cannot send the handshake message", FO_BY_STATE, FO_BY_STATE);
		return;
	}
	d->ctrl_sent = true;
	if (!d->t_sent_us) {
		uint64_t cpu;
		uint32_t csw;

		d->t_sent_us = shift_clock_us();
		/* (inside fo_start(), on the thread that started it; not a
		 * message that waited for the peer) */
		shift_clock_thread(&cpu, &csw);
		if (d->cpu0_us && cpu >= d->cpu0_us) {
			unsigned y, z;

			shift_backoff_counts(&y, &z);
			d->cpu_us = (uint32_t)(cpu - d->cpu0_us);
			d->csw = csw - d->csw0;
			d->yields = y - d->yields0;
			d->sleeps = z - d->sleeps0;
		}
	}
}
