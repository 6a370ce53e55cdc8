/*
 * The slow poll: a context with a failed-over QP, or a poll whose provider
 * results hold an error. Kept completions first, then the default CQ (its
 * successes kept in order, SHIFT's own and the failed QP's errors dropped),
 * then the backup CQ, whose completions are translated back to the
 * application's wr_ids and QP numbers.
 */
#include "shift/fo/fo_int.h"

/* ---- polling ---------------------------------------------------------------- */

/* A completion from a default CQ, in the slow path. */
void fo_from_default(struct shift_ctx *s, struct ibv_wc *wc, struct out *o)
{
	struct shift_dqp *d = shift_dqp_by_qpn(s, wc->qp_num);

	/* (on an SRQ the peer's failback notification consumed an
	 * application receive: it is SHIFT's control receive all the same) */
	if (d && d->dsrq && d->failovers && (wc->opcode & IBV_WC_RECV))
		(void)fo_srq_take_notify(d, wc);
	if (d && d->failovers && shift_dqp_own_kind(d, wc->wr_id)) {
		/* SHIFT's own (probe, notification) never reach the application */
		if (fo_wc_class(d, wc->status) == SHIFT_WC_PATH)
			d->dflt_path_err = true; /* (the cause of later flushes) */
		if (shift_dqp_send_state(d) != SHIFT_SEND_UNPROTECTED)
			fo_on_default_ctrl(s, d, wc, o);
		return;
	}
	if (!d || shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED) {
		if (!d) {
			fo_emit(o, wc);
			return;
		}
		shift_dqp_retire_app(d, wc); /* (an SRQ's receive is consumed) */
		fo_emit_after_srq(d, o, wc); /* (its error may wait there) */
		return;
	}
	if (wc->status == IBV_WC_SUCCESS) {
		shift_dqp_retire_slow(d, wc);
		/* (behind messages of the backup path still waiting) */
		if (d->dsrq && (wc->opcode & IBV_WC_RECV) && fo_srq_defer(d, wc))
			return;
		fo_emit(o, wc);
		return;
	}
	if (d->stash) {
		/* a failover of d is draining its CQs: judged after the drain */
		fo_stash_add(d, o->c, wc);
		return;
	}
	/* a flush of a QP already on its backup; unless a direction came
	 * back to the default QP (my receives) and it failed again */
	if (shift_dqp_send_state(d) != SHIFT_SEND_DEFAULT &&
	    !(d->need_rearm && shift_dqp_recv_state(d) == SHIFT_RECV_DEFAULT)) {
		/* (an SRQ receive it had taken: out of the SRQ, still the
		 * application's, where the provider says so) */
		if (d->dsrq && (wc->opcode & IBV_WC_RECV))
			shift_dsrq_burned(d->dsrq, wc->wr_id);
		return;
	}
	fo_on_error(s, d, wc, o);
}

/* A completion from a backup CQ: SHIFT's own, or one to translate. */
/* The peer's handshake message landed in my backup QP's control receive. */
static void ctrl_received(struct shift_ctx *s, struct shift_dqp *d, struct ibv_wc *wc,
			  struct out *o, bool app)
{
	if (!d) {
		/* the peer failed over first: find my QP by its backup */
		for (int i = 0; i < SHIFT_DQP_BUCKETS && !d; i++)
			for (struct shift_dqp *x = shift_dqp_first(s, i); x; x = shift_dqp_next(x))
				if (x->shadow && x->shadow->bk && x->shadow->bk->qp_num == wc->qp_num)
					d = x;
	}
	shift_debug("control message on backup QP %u: status %d, QP %u, app %d", wc->qp_num,
		    (int)wc->status, d ? d->qpn : 0, app);
	if (!d || wc->status != IBV_WC_SUCCESS)
		return;
	d->t_peer_us = shift_clock_us();
	d->peer_recv_count = be32toh(wc->imm_data);
	d->peer_nosend = !!(d->peer_recv_count & CTRL_NOSEND);
	d->peer_recv_count &= ~CTRL_NOSEND;
	d->ctrl_pending = true;
	shift_ctx_set_slow(s, true);
	if (app || shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED)
		fo_on_ctrl(s, d, o); /* the latter only answers ABORT */
}

/* A WR on my backup QP failed (d not unprotected): a failure of the backup
 * path, unless the completion is SHIFT's own. */
static void backup_failed(struct shift_dqp *d, struct ibv_wc *wc)
{
	/* flushes of a reset, late ones of an earlier generation, and what
	 * follows a failure already seen are SHIFT's */
	if (d->bk_flushing || d->bk_error ||
	    (wc->wr_id != SHIFT_WRID_CTRL_SEND && SHIFT_WRID_GEN_OF(wc->wr_id) != d->bk_gen))
		return;
	/* The WR stays outstanding. */
	fo_backup_failed(d, (int)wc->status);
}

void fo_backup_failed(struct shift_dqp *d, int status)
{
	/* The backup failed: the peer may have reset its own for a new
	 * failover (its default path failed again), which its record in the
	 * KV store shows; fo_failback_work() decides. */
	if (status < 0)
		shift_info("%s QP %u: backup QP %u refused a post: checking for a new failover at "
			   "the peer", d->dev, d->qpn, d->bk ? d->bk->qp_num : 0);
	else
		shift_info("%s QP %u: backup QP %u failed (%d): checking for a new failover at the "
			   "peer", d->dev, d->qpn, d->bk ? d->bk->qp_num : 0, status);
	if (!d->bk_error)
		d->bk_probe_fails = d->probe_fails;
	d->bk_error = true;
	d->bk_error_at = shift_clock_ms();
	d->kv_at = 0;
}

/* One of SHIFT's receives on the backup QP of a QP on an SRQ (fo/srq.c)? */
static inline bool fo_wrid_bounce(uint64_t wr_id)
{
	return (wr_id & SHIFT_WRID_RECV) && (SHIFT_WRID_INDEX(wr_id) & SHIFT_WRID_BOUNCE);
}

/* A success on the backup QP: the backup path works (restarts reset, the
 * failover's timing logged once). */
static void backup_works(struct shift_dqp *d)
{
	d->bk_restarts = 0;
	if (!d->fallback_us && d->t_error_us) {
		/* (from the failover's start, as the switch time) */
		d->fallback_us = shift_clock_us() - d->t_start_us;
		if (!d->fallback_us)
			d->fallback_us = 1;
		fo_timing_say(d);
	}
}

void fo_timing_say(struct shift_dqp *d)
{
	if (d->timing_said || !d->switch_us || !d->fallback_us)
		return;
	d->timing_said = true;
	shift_info("%s QP %u: failover-timing dev=%s qp=%u switch_us=%llu fallback_us=%llu "
		   "start_us=%u wait_us=%u retx_us=%u post_us=%u held_us=%u react_us=%u stop_us=%u "
		   "err_us=%u drain_us=%u rrecv_us=%u cpu_us=%u preempted=%u yields=%u sleeps=%u by=%s",
		   d->dev, d->qpn, d->dev, d->qpn, (unsigned long long)d->switch_us,
		   (unsigned long long)d->fallback_us, d->start_us, d->wait_us, d->retx_us,
		   d->post_us, d->held_us, d->react_us, d->stop_us, d->err_us, d->drain_us,
		   d->rrecv_us, d->cpu_us, d->csw, d->yields, d->sleeps, d->start_bg ? "pass" : "poll");
}

/* A backup completion of the application's WR: its wr_id and QP number. */
void fo_app_translate(struct shift_dqp *d, struct ibv_wc *wc)
{
	uint64_t idx = SHIFT_WRID_INDEX(wc->wr_id);

	/* (under post_lock, which the post that mirrored the entry held: the
	 * NIC ordered that write before this completion, through the
	 * provider's own barriers, which no race detector can see) */
	shift_dqp_lock(d);
	if (wc->wr_id & SHIFT_WRID_RECV) {
		wc->wr_id = shift_dqp_rwqe(d, idx)->wr_id;
	} else {
		struct shift_swqe *e = shift_dqp_swqe(d, idx);

		wc->wr_id = e->wr_id;
		/* (a placeholder's completion is its WR's) */
		if (wc->status == IBV_WC_SUCCESS)
			wc->opcode = fo_send_wc_opcode(e->opcode);
	}
	shift_dqp_unlock(d);
	wc->qp_num = d->qpn;
}

/* An application WR completed on the backup QP: its wr_id and QP number
 * back, retired, handed out; the fence's completion switches back. */
static void app_completion(struct shift_dqp *d, struct ibv_wc *wc, struct out *o)
{
	if (fo_wrid_bounce(wc->wr_id)) {
		/* a QP on an SRQ: into the application's receives (fo/srq.c) */
		if (wc->status == IBV_WC_SUCCESS)
			backup_works(d);
		fo_srq_bounced(d, wc, o);
		return;
	}
	fo_app_translate(d, wc);
	if (wc->status == IBV_WC_SUCCESS) {
		shift_dqp_retire(d, wc);
		backup_works(d);
	}
	fo_emit(o, wc);
	if (d->app_ended)
		return; /* (the application ended it: no failback) */
	if (shift_dqp_send_state(d) == SHIFT_SEND_WAIT_DRAINED) {
		shift_dqp_lock(d);
		shift_dqp_sync_locked(d);
		/* the fence completed: everything before it has executed */
		if (shift_dqp_send_state(d) == SHIFT_SEND_WAIT_DRAINED && !d->notify_inflight &&
		    d->sq_tail > d->fence)
			fo_switch_back(d);
		shift_dqp_unlock(d);
		if (fo_fail_pending(d, o))
			return;
	}
	if (d->notify_pending)
		fo_try_notify(d);
}

static void from_backup(struct shift_ctx *s, struct ibv_wc *wc, struct out *o, bool app)
{
	struct shift_dqp *d = fo_dqp_of_bk(s, wc->qp_num);

	if (d && d->app_ended && !d->bk_flushing)
		return; /* (the application ended it: fo_end() took what was there) */
	if (wc->wr_id == SHIFT_WRID_CTRL_RECV) {
		ctrl_received(s, d, wc, o, app);
		return;
	}
	if (wc->wr_id == SHIFT_WRID_CTRL_SEND || !d) {
		if (d && wc->wr_id == SHIFT_WRID_CTRL_SEND && wc->status == IBV_WC_SUCCESS)
			d->bk_rd_stale = false; /* its empty READ, if any, went first */
		if (wc->status != IBV_WC_SUCCESS)
			shift_debug("backup QP %u: SHIFT's WR %llx failed: %d", wc->qp_num,
				    (unsigned long long)wc->wr_id, (int)wc->status);
		/* my handshake message failed: the backup failed as surely as
		 * with a WR of the application on it (which there may be none
		 * of: an end that only sends, before the handshake) */
		if (!d || wc->status == IBV_WC_SUCCESS || d->bk_flushing || d->bk_error ||
		    shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED || !d->need_rearm)
			return;
	} else if (!(wc->wr_id & SHIFT_WRID_DATA) ||
		   (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED &&
		    SHIFT_WRID_GEN_OF(wc->wr_id) != d->bk_gen)) {
		return; /* (the latter: a backup QP abandoned, its WRs flushed) */
	}
	if (d->doomed && !(wc->wr_id & SHIFT_WRID_RECV) && (wc->wr_id & SHIFT_WRID_DATA) &&
	    SHIFT_WRID_INDEX(wc->wr_id) + 1 == d->doomed && wc->status == IBV_WC_SUCCESS &&
	    shift_dqp_send_state(d) != SHIFT_SEND_UNPROTECTED) {
		/* the stand-in of a WR whose key the peer never had: refused */
		wc->status = IBV_WC_REM_ACCESS_ERR;
		fo_backup_app_error(s, d, wc, o);
		return;
	}
	if (wc->status != IBV_WC_SUCCESS && shift_dqp_send_state(d) != SHIFT_SEND_UNPROTECTED) {
		/* the application's error on a WR of its own, this episode */
		/* (not one of SHIFT's receives for a QP on an SRQ: its failure
		 * is the backup's, as before) */
		if (shift_wc_class(wc->status) == SHIFT_WC_APP && (wc->wr_id & SHIFT_WRID_DATA) &&
		    !fo_wrid_bounce(wc->wr_id) &&
		    SHIFT_WRID_GEN_OF(wc->wr_id) == d->bk_gen && !d->bk_flushing && !d->bk_error) {
			fo_backup_app_error(s, d, wc, o);
			return;
		}
		backup_failed(d, wc);
		return;
	}
	app_completion(d, wc, o);
}

/*
 * The batches of backup completions being handed out on this thread,
 * innermost first. A drain of the same backup CQ from inside one (the
 * connection ending, fo_flush_backup) takes the rest of that batch first:
 * its completions are older than anything still in the CQ.
 */
struct bk_batch {
	struct shift_cq *c;
	struct ibv_wc *wc;
	int i, n;
	struct bk_batch *up;
};
static _Thread_local struct bk_batch *bk_batches;

void fo_poll_backup(struct shift_ctx *s, struct shift_cq *c, struct out *o, bool app)
{
	struct ibv_wc tmp[TMP_WC];
	struct bk_batch b = { .c = c, .wc = tmp, .up = bk_batches };

	if (!c->bk)
		return;
	for (struct bk_batch *p = b.up; p; p = p->up) {
		if (p->c != c)
			continue;
		while (p->i < p->n) {
			int i = p->i++;

			from_backup(s, &p->wc[i], o, app);
		}
	}
	bk_batches = &b;
	while ((!app || o->n < o->max) && (b.n = ibv_poll_cq(c->bk, TMP_WC, tmp)) > 0) {
		for (b.i = 0; b.i < b.n;) {
			int i = b.i++;

			from_backup(s, &tmp[i], o, app);
		}
	}
	bk_batches = b.up;
}

/* ---- completions a fast poll hands over (struct shift_early) ------------- */

static void early_link(struct shift_ctx *s, struct shift_early *e)
{
	struct shift_early **p;

	pthread_spin_lock(&s->early_lock);
	for (p = &s->early; *p; p = &(*p)->next)
		;
	__atomic_store_n(p, e, __ATOMIC_RELEASE); /* (early_take's unlocked look) */
	pthread_spin_unlock(&s->early_lock);
}

static void early_unlink(struct shift_ctx *s, struct shift_early *e)
{
	pthread_spin_lock(&s->early_lock);
	for (struct shift_early **p = &s->early; *p; p = &(*p)->next) {
		if (*p == e) {
			__atomic_store_n(p, e->next, __ATOMIC_RELEASE);
			break;
		}
	}
	pthread_spin_unlock(&s->early_lock);
}

/* Up to max handed-over completions of c's application CQ, oldest first. */
static int early_take(struct shift_ctx *s, struct shift_cq *c, int max, struct ibv_wc *wc)
{
	int n = 0;

	if (!__atomic_load_n(&s->early, __ATOMIC_ACQUIRE))
		return 0;
	pthread_spin_lock(&s->early_lock);
	for (struct shift_early *e = s->early; e && n < max; e = e->next) {
		while (e->cq == c->app && e->taken < e->n && n < max)
			wc[n++] = e->wc[e->taken++];
	}
	pthread_spin_unlock(&s->early_lock);
	return n;
}

/* The handing poll takes its batch back out of the list (what others took
 * of it is theirs now) and frees its copy if it was not on its stack. */
static void early_done(struct shift_ctx *s, struct shift_early *e, const struct ibv_wc *stack)
{
	early_unlink(s, e);
	if (e->wc != stack)
		free((void *)e->wc);
}

int fo_poll_default(struct shift_ctx *s, struct shift_cq *c, int max, struct ibv_wc *wc)
{
	int n = early_take(s, c, max, wc);

	return n ? n : s->poll_cq(c->app, max, wc);
}

/*
 * The slow poll. A fast poll that found an error among its completions
 * comes here with them (wc[done..have)) and hands them over before it
 * waits for any lock: the background pass may be about to drain this CQ for
 * a failover, and must see them first, ahead of what the provider still
 * holds (else it would retransmit WRs these completed, or pass the
 * provider's flushes of a connection it failed on to the application).
 */
static int slow_poll(struct shift_ctx *s, struct ibv_cq *cq, int num_entries,
		     struct ibv_wc *wc, int done, int have, int *busy)
{
	struct ibv_wc held[TMP_WC], tmp[TMP_WC];
	struct shift_early mine = { .next = NULL, .cq = cq, .wc = held, .n = 0, .taken = 0 };
	int n;

	if (have > done) {
		unsigned m = (unsigned)(have - done);
		struct ibv_wc *b = m <= TMP_WC ? held : malloc(sizeof(*wc) * m);

		if (!b) {
			shift_dp_poll_release(busy);
			return have; /* cannot look: the application gets them as they are */
		}
		memcpy(b, wc + done, sizeof(*wc) * m);
		mine.wc = b;
		mine.n = m;
		early_link(s, &mine);
	}
	/* out of the fast path: what it took from the provider is in view */
	shift_dp_poll_release(busy);

	struct shift_cq *c = s->rnic ? shift_shadow_cq_of(s->rnic, cq) : NULL;
	struct out o = { .wc = wc, .n = done, .max = num_entries, .c = c };

	if (!c) {
		/* not shadowed: nothing can be failed over on it (and nobody
		 * took what this poll handed over) */
		if (mine.n)
			early_done(s, &mine, held);
		if (have)
			return have;
		return s->poll_cq(cq, num_entries, wc);
	}
	pthread_mutex_lock(&s->slow_lock);
	pthread_mutex_lock(&c->dp_lock);
	if (mine.n) {
		/* mine and any handed over before (whatever a drain left of
		 * them: what it took is in the kept completions, in order) */
		while ((n = early_take(s, c, TMP_WC, tmp)) > 0)
			fo_from_default_batch(s, tmp, (size_t)n, &o);
		early_done(s, &mine, held);
	}
	while (o.n < o.max && c->kept_tail != c->kept_head)
		o.wc[o.n++] = c->kept[c->kept_tail++ % c->kept_cap];
	/* messages on SRQ QPs' backups waiting for receives posted since */
	fo_srq_deliver_all(s, &o);
	/* peers' handshake messages noticed by the background thread */
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++)
		for (struct shift_dqp *d = shift_dqp_first(s, i); d; d = shift_dqp_next(d))
			if (d->ctrl_pending && (d->scq == c || d->rcq == c))
				fo_on_ctrl(s, d, &o);
	while (o.n < o.max && c->kept_tail != c->kept_head)
		o.wc[o.n++] = c->kept[c->kept_tail++ % c->kept_cap];
	while (o.n < o.max &&
	       (n = fo_poll_default(s, c, TMP_WC < o.max - o.n ? TMP_WC : o.max - o.n, tmp)) > 0)
		fo_from_default_batch(s, tmp, (size_t)n, &o);
	fo_poll_backup(s, c, &o, true);
	pthread_mutex_unlock(&c->dp_lock);
	pthread_mutex_unlock(&s->slow_lock);
	return o.n;
}

int shift_poll_slow(struct shift_ctx *s, struct ibv_cq *cq, int num_entries,
		    struct ibv_wc *wc, int done, int have, int *busy)
{
	return slow_poll(s, cq, num_entries, wc, done, have, busy);
}
