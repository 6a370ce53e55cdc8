/*
 * The replay pass (see shadow.h), run by the RNIC's thread (rnic.c) or, in
 * synchronous mode, by the caller of shift_rnic_pass: first the reap (the
 * backup side of the objects the application destroyed is destroyed, their
 * keys deleted), then the layer above's share (the background hook), then
 * PD, CQ, QP (connect.c) and MR creation replayed on the backup NIC, each
 * MR's backup rkey published to the KV store under every default GID in
 * use.
 *
 * Replay is best effort (SHIFT paper, appendix B.1): an object whose
 * dependencies are not there yet (a QP whose peer has not published its
 * backup attributes) is skipped and retried on the next pass, so two
 * processes whose threads wait on each other's QPs in opposite orders
 * still both complete.
 *
 * Nothing here may hurt the application: every failure turns the object
 * unprotected, with one log line, and the application keeps running on its
 * default NIC exactly as without SHIFT. No lock is held across a verb or a
 * KV round trip: only this thread unlinks objects and writes the
 * thread-owned fields; state changes are made under rnic->lock.
 */
#include "shift/shadow/shadow_int.h"
#include "shift/shadow/chan.h"
#include "shift/dp/limbo.h"
#include "shift/base/log.h"
#include "shift/base/lower.h"
#include "kv/kv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The layer above's share of each pass (shift_shadow_set_background). */
static void (*background)(struct shift_ctx *s);

void shift_shadow_set_background(void (*fn)(struct shift_ctx *s))
{
	__atomic_store_n(&background, fn, __ATOMIC_RELAXED);
}

bool shift_shadow_kv_ok(struct shift_rnic *r, int rc, const char *what)
{
	if (rc >= 0 || rc == -ENOENT) {
		/* (the store answers: said once per outage, as its loss) */
		if (r->kv_warned) {
			r->kv_warned = false;
			shift_warn("%s: KV store answers again (%s): protection resumes", r->name,
				   what);
		}
		return true;
	}
	stat_add(&shift_shadow_counters.kv_errors, 1);
	if (!r->kv_warned) {
		r->kv_warned = true;
		shift_warn("%s: KV store %s failed (%s): QPs stay unprotected until it answers",
			   r->name, what, shift_kv_last_error());
	}
	return false;
}

static void replay_pd(struct shift_rnic *r, struct shift_pd *p)
{
	if (p->bk || p->state != SHIFT_SHADOW_PENDING)
		return;
	errno = 0;
	p->bk = shift_lower->alloc_pd(r->bk_ctx);
	int err = errno;
	pthread_mutex_lock(&r->lock);
	p->state = p->bk ? SHIFT_SHADOW_READY : SHIFT_SHADOW_UNPROTECTED;
	pthread_mutex_unlock(&r->lock);
	if (!p->bk)
		shift_warn("%s: backup PD on %s: %s", r->name, r->bk_name,
			   err ? strerror(err) : "the provider gave no reason");
}

/*
 * Entries for the backup of an application CQ of cqe: one more, room for
 * SHIFT's control completions, as far as the backup NIC allows (a CQ made
 * at the device's largest size gets a backup that size); -1 if the backup
 * NIC's largest CQ is smaller than the application's.
 */
static int bk_cqe_for(const struct shift_rnic *r, int cqe)
{
	if (r->bk_max_cqe > 0 && cqe + 1 > r->bk_max_cqe)
		return cqe <= r->bk_max_cqe ? r->bk_max_cqe : -1;
	return cqe + 1;
}

/* c's shadow QPs run unprotected: its backup CQ is too small (r->lock
 * held). */
static void cq_qps_unprotected_locked(struct shift_rnic *r, struct shift_cq *c, const char *why)
{
	for (struct shift_qp *q = r->qps; q; q = q->next) {
		if (q->dead || (q->send_cq != c && q->recv_cq != c))
			continue;
		if (q->state == SHIFT_SHADOW_READY)
			stat_add(&shift_shadow_counters.qps_ready, -1);
		shift_qp_unprotected_locked(q, why);
	}
}

static void replay_cq(struct shift_rnic *r, struct shift_cq *c)
{
	if (c->bk || c->state != SHIFT_SHADOW_PENDING)
		return;
	pthread_mutex_lock(&r->lock);
	int cqe = c->cqe;
	pthread_mutex_unlock(&r->lock);
	int want = bk_cqe_for(r, cqe);
	if (want < 0) {
		pthread_mutex_lock(&r->lock);
		c->state = SHIFT_SHADOW_UNPROTECTED;
		pthread_mutex_unlock(&r->lock);
		shift_warn("%s: a CQ of %d entries runs unprotected: the backup NIC %s holds at "
			   "most %d", r->name, cqe, r->bk_name, r->bk_max_cqe);
		return;
	}
	if (c->app_has_channel && !c->bk_channel)
		c->bk_channel = shift_lower->create_comp_channel(r->bk_ctx);
	errno = 0;
	/* (no channel of the application's: the thread's, portev.c) */
	c->bk = shift_lower->create_cq(r->bk_ctx, want, c, c->bk_channel ? c->bk_channel : r->bk_ev,
				       c->comp_vector % (r->bk_ctx->num_comp_vectors > 0 ?
							 r->bk_ctx->num_comp_vectors : 1));
	int err = errno;
	c->bk_cqe = want;
	pthread_mutex_lock(&r->lock);
	c->state = c->bk ? SHIFT_SHADOW_READY : SHIFT_SHADOW_UNPROTECTED;
	pthread_mutex_unlock(&r->lock);
	if (!c->bk)
		shift_warn("%s: a CQ of %d entries runs unprotected: its backup on %s: %s", r->name,
			   cqe, r->bk_name, err ? strerror(err) : "the provider gave no reason");
	else if (c->bk_channel)
		shift_chan_backup_ready(r, c);
	else
		shift_rnic_arm_backup(r, c->bk); /* (before its QPs exist) */
	shift_cq_fit_backup(r, c); /* (resized meanwhile) */
}

/*
 * Make c's backup CQ hold what the application's now holds, plus SHIFT's
 * entry: after the application's ibv_resize_cq (on its thread, before the
 * resize returns) and after the backup's creation (a resize may have come
 * meanwhile). Under c->dp_lock, which the backup's pollers hold. Backups
 * only grow. If the backup cannot, c's QPs run unprotected (a failover
 * could overflow it).
 */
void shift_cq_fit_backup(struct shift_rnic *r, struct shift_cq *c)
{
	pthread_mutex_lock(&c->dp_lock);
	pthread_mutex_lock(&r->lock);
	struct ibv_cq *bk = c->state == SHIFT_SHADOW_READY && !c->dead ? c->bk : NULL;
	int cqe = c->cqe;
	pthread_mutex_unlock(&r->lock);
	int want = bk ? bk_cqe_for(r, cqe) : 0;
	int rc = 0;

	if (bk && want > c->bk_cqe) {
		rc = shift_lower->resize_cq(bk, want);
		if (!rc)
			c->bk_cqe = want;
	}
	if (bk && (want < 0 || rc)) {
		pthread_mutex_lock(&r->lock);
		c->state = SHIFT_SHADOW_UNPROTECTED;
		cq_qps_unprotected_locked(r, c, "its CQ grew past what the backup NIC's CQ holds");
		pthread_mutex_unlock(&r->lock);
		shift_warn("%s: a CQ resized to %d entries runs unprotected, with its QPs: its backup "
			   "on %s: %s", r->name, cqe, r->bk_name,
			   want < 0 ? "larger than the NIC's largest CQ" : strerror(rc));
	}
	pthread_mutex_unlock(&c->dp_lock);
}

void shift_mr_value_of(const struct shift_mr *m, struct shift_mr_value *mv)
{
	/* (the range the application's remote peers address it by) */
	*mv = (struct shift_mr_value){
		.bk_rkey = m->bk->rkey, .len = m->length,
		.has_range = !(m->access & IBV_ACCESS_ZERO_BASED),
		.addr = m->kind == SHIFT_MR_PLAIN ? (uint64_t)(uintptr_t)m->addr : m->iova,
	};
}

static void publish_mr(struct shift_rnic *r, struct shift_mr *m)
{
	char key[SHIFT_EXCHANGE_KEY_MAX], val[SHIFT_EXCHANGE_VALUE_MAX];

	for (int i = 0; i < r->ngids; i++) {
		if (m->published & (1u << i))
			continue;
		int kl = shift_exchange_mr_key(&r->gids[i], m->app_rkey, key, sizeof(key));
		struct shift_mr_value mv;

		shift_mr_value_of(m, &mv);
		int vl = shift_exchange_mr_encode(&mv, val, sizeof(val));

		if (kl < 0 || vl < 0)
			continue;
		if (!shift_shadow_kv_ok(r, shift_kv_put(r->kv, key, val, (size_t)vl,
							 SHIFT_KV_TTL_MS), "put"))
			return;
		m->published |= 1u << i;
		r->mri_dirty = true;
	}
}

static void replay_mr(struct shift_rnic *r, struct shift_mr *m)
{
	if (m->state == SHIFT_SHADOW_UNPROTECTED)
		return;
	if (!m->bk) {
		if (!m->pd || m->pd->state == SHIFT_SHADOW_UNPROTECTED) {
			pthread_mutex_lock(&r->lock);
			m->state = SHIFT_SHADOW_UNPROTECTED;
			pthread_mutex_unlock(&r->lock);
			return;
		}
		if (!m->pd->bk)
			return; /* next pass */
		int err;

		errno = 0;
		switch (m->kind) {
		case SHIFT_MR_PLAIN:
			m->bk = shift_lower->reg_mr(m->pd->bk, m->addr, m->length, (int)m->access);
			break;
		case SHIFT_MR_IOVA:
			m->bk = shift_lower->reg_mr_iova2(m->pd->bk, m->addr, m->length,
							  m->iova, m->access);
			break;
		case SHIFT_MR_DMABUF:
			m->bk = shift_lower->reg_dmabuf_mr(m->pd->bk, m->dmabuf_offset,
							   m->length, m->iova, m->dmabuf_fd,
							   (int)m->access);
			err = errno; /* (close may change it) */
			close(m->dmabuf_fd);
			errno = err;
			m->dmabuf_fd = -1;
			break;
		}
		err = errno;
		pthread_mutex_lock(&r->lock);
		m->state = m->bk ? SHIFT_SHADOW_READY : SHIFT_SHADOW_UNPROTECTED;
		pthread_mutex_unlock(&r->lock);
		if (!m->bk) {
			shift_warn("%s: backup MR (rkey %u) on %s: %s", r->name, m->app_rkey,
				   r->bk_name, err ? strerror(err) : "the provider gave no reason");
			return;
		}
		stat_add(&shift_shadow_counters.mrs_ready, 1);
	}
	if (r->kv)
		publish_mr(r, m);
}

static void kv_del(struct shift_rnic *r, const char *key)
{
	if (r->kv)
		(void)shift_kv_delete(r->kv, key);
}

/* Move the dead objects of r->list to out (rnic->lock held) / destroy
 * and free those of in. */
#define UNLINK(list, map, type, unmap, out)                                    \
	for (type **pp = &r->list; *pp;) {                                     \
		type *o = *pp;                                                 \
		if (!o->dead) {                                                \
			pp = &o->next;                                         \
			continue;                                              \
		}                                                              \
		*pp = o->next;                                                 \
		shift_pmap_del(&r->map, &o->hn);                               \
		unmap;                                                         \
		o->next = out;                                                 \
		out = o;                                                       \
	}
#define DESTROY(type, in, destroy)                                             \
	while (in) {                                                           \
		type *o = in;                                                  \
		in = o->next;                                                  \
		destroy;                                                       \
		free(o);                                                       \
	}

/* Destroy the backup side of dead objects and unlink them. Every dead
 * object is unlinked in one hold of the lock, so the set reaped is one
 * the application could have left: it destroys children before their
 * parent, each under that lock, so a PD dead here has no QP that dies
 * later (a QP reaped on a later pass would find its PD's mailbox pages
 * freed). Then children before parents: QPs, MRs, CQs, PDs. */
void shift_rnic_reap(struct shift_rnic *r)
{
	char key[SHIFT_EXCHANGE_KEY_MAX];
	struct shift_qp *qps = NULL;
	struct shift_mr *mrs = NULL;
	struct shift_cq *cqs = NULL;
	struct shift_pd *pds = NULL;

	pthread_mutex_lock(&r->lock);
	UNLINK(qps, qp_of, struct shift_qp, (void)0, qps);
	UNLINK(mrs, mr_of, struct shift_mr, shift_pmap_del(&r->mr_by_lkey, &o->hl), mrs);
	UNLINK(cqs, cq_of, struct shift_cq, (void)0, cqs);
	UNLINK(pds, pd_of, struct shift_pd, (void)0, pds);
	pthread_mutex_unlock(&r->lock);

	DESTROY(struct shift_qp, qps, {
		if (o->published && shift_exchange_qp_key(&o->my_key, key, sizeof(key)) >= 0)
			kv_del(r, key);
		/* (and its failover record: a QP that reuses the number is a
		 * new connection) */
		if (o->published && shift_exchange_ep_key(&o->my_key, key, sizeof(key)) >= 0)
			kv_del(r, key);
		if (o->bk)
			shift_lower->destroy_qp(o->bk);
		shift_mbox_detach(o);
		if (o->state == SHIFT_SHADOW_READY)
			stat_add(&shift_shadow_counters.qps_ready, -1);
	});
	DESTROY(struct shift_mr, mrs, {
		r->mri_dirty |= o->published != 0;
		for (int i = 0; i < r->ngids; i++)
			if ((o->published & (1u << i)) &&
			    shift_exchange_mr_key(&r->gids[i], o->app_rkey, key, sizeof(key)) >= 0)
				kv_del(r, key);
		if (o->bk) {
			shift_lower->dereg_mr(o->bk);
			stat_add(&shift_shadow_counters.mrs_ready, -1);
		}
		if (o->dmabuf_fd >= 0)
			close(o->dmabuf_fd);
	});
	DESTROY(struct shift_cq, cqs, {
		/* (its backup QPs are gone, so nothing completes on it any
		 * more: an event of it read later would name a CQ destroyed
		 * meanwhile; only a CQ on the thread's channel has any) */
		if (o->bk && o->bk->channel && o->bk->channel == r->bk_ev)
			shift_bkev_drain(r);
		if (o->bk)
			shift_lower->destroy_cq(o->bk);
		if (o->bk_channel)
			shift_lower->destroy_comp_channel(o->bk_channel);
		free(o->kept);
		pthread_mutex_destroy(&o->dp_lock);
	});
	DESTROY(struct shift_pd, pds, {
		shift_mbox_free_pd(o);
		if (o->bk)
			shift_lower->dealloc_pd(o->bk);
	});
}
#undef DESTROY
#undef UNLINK

/* Is anything still to do on a later pass? */
static int pending(struct shift_rnic *r)
{
	int n = 0;

	pthread_mutex_lock(&r->lock);
	for (struct shift_qp *q = r->qps; q; q = q->next)
		n += q->state == SHIFT_SHADOW_PENDING;
	for (struct shift_mr *m = r->mrs; m; m = m->next)
		n += m->state == SHIFT_SHADOW_PENDING ||
		     (m->state == SHIFT_SHADOW_READY && r->kv &&
		      m->published != (1u << r->ngids) - 1);
	for (struct shift_cq *c = r->cqs; c; c = c->next)
		n += c->state == SHIFT_SHADOW_PENDING;
	for (struct shift_pd *p = r->pds; p; p = p->next)
		n += p->state == SHIFT_SHADOW_PENDING;
	pthread_mutex_unlock(&r->lock);
	return n;
}

/* Walk one list without holding the lock across the work: only this thread
 * unlinks nodes, application threads only push at the head. */
#define EACH(r, list, type, var)                                    \
	for (type *var = (pthread_mutex_lock(&(r)->lock), (r)->list), \
		  *var##_unlocked = (pthread_mutex_unlock(&(r)->lock), var); \
	     (void)var##_unlocked, var; var = var->next)

/* Every key of the RNIC's once per a third of their TTL, a few per pass:
 * their TTL starts anew, and a store restarted empty has them back. A new
 * round at once when the store answers again after failing (it may have
 * restarted empty: the peers' failovers need these records). */
static void refresh_keys(struct shift_rnic *r)
{
	uint64_t now = shift_clock_ms();

	if (!r->kv)
		return;
	uint64_t rec = shift_kv_recoveries(r->kv);

	if (rec != r->kv_recoveries) {
		r->kv_recoveries = rec;
		r->refresh_round = 0;
		r->refresh_at = now;
		shift_info("%s: the KV store answers again after failing: my %zu records written "
			   "again (it may have restarted empty)", r->name, shift_kv_own_count(r->kv));
	}
	if (now < r->refresh_at)
		return;
	size_t n = shift_kv_own_count(r->kv);
	int rc = shift_kv_refresh_own(r->kv, SHIFT_KV_REFRESH_PER_PASS);

	if (rc < 0) {
		(void)shift_shadow_kv_ok(r, rc, "refresh");
		r->refresh_at = now + 1000; /* (again in a second) */
		return;
	}
	r->refresh_round += (size_t)rc;
	if (r->refresh_round < n)
		return; /* (the rest at the next passes) */
	r->refresh_round = 0;
	r->refresh_at = now + SHIFT_KV_TTL_MS / 3;
}

int shift_rnic_pass(struct shift_rnic *r)
{
	shift_limbo_reclaim(); /* (what lock-free readers held long ago) */
	shift_rnic_reap(r); /* (with no backup NIC too: nothing piles up) */
	if (!r->bk_ctx)
		return 0;
	void (*bg)(struct shift_ctx *s) = __atomic_load_n(&background, __ATOMIC_RELAXED);
	if (bg)
		bg(r->sctx);
	refresh_keys(r);
	EACH(r, pds, struct shift_pd, p)
		if (!SHIFT_SHADOW_DEAD(p))
			replay_pd(r, p);
	EACH(r, cqs, struct shift_cq, c)
		if (!SHIFT_SHADOW_DEAD(c))
			replay_cq(r, c);
	EACH(r, qps, struct shift_qp, q)
		if (!SHIFT_SHADOW_DEAD(q))
			shift_replay_qp(r, q);
	EACH(r, mrs, struct shift_mr, m)
		if (!SHIFT_SHADOW_DEAD(m))
			replay_mr(r, m);
	shift_mri_write(r);
	shift_mri_read(r);
	return pending(r);
}
