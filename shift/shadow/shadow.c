/*
 * Shadow control verbs (see shadow.h): the recording side, called on the
 * application's threads, and the replay side, one background thread per
 * RNIC that opens the backup device, replays PD, CQ, MR and QP creation on
 * it, brings each backup QP to RTS with the peer's backup attributes from
 * the KV store, and mirrors destruction.
 *
 * Replay is best effort (SHIFT paper, appendix B.1): a QP whose peer has not
 * published its backup attributes yet is skipped and retried on the next
 * pass, so two processes whose threads wait on each other's QPs in opposite
 * orders still both complete.
 *
 * Nothing here may hurt the application: every failure turns the object
 * (or the whole RNIC) "unprotected", with one log line, and the application
 * keeps running on its default NIC exactly as without SHIFT.
 */
#include "shift/shadow/shadow.h"
#include "shift/shadow/backup.h"
#include "shift/shadow/chan.h"
#include "shift/base/clock.h"
#include "shift/base/config.h"
#include "shift/base/log.h"
#include "shift/base/lower.h"
#include "shift/dp/ctx.h"
#include "shift/fo/failover.h"
#include "kv/kv.h"
#include "providers/provider.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* How long a QP waits for its peer's backup attributes before SHIFT says
 * (once) that the peer may not run SHIFT. It keeps waiting afterwards. */
#define SHIFT_PASS_PERIOD_MS 50
#define SHIFT_FO_PERIOD_MS 10
#define SHIFT_IDLE_PERIOD_MS 100
/* replay waits for SHIFT_COALESCE_MS without new control verbs (at most
 * SHIFT_COALESCE_ROUNDS times) before it runs */
#define SHIFT_COALESCE_MS 10
#define SHIFT_COALESCE_ROUNDS 20
#define SHIFT_KV_TTL_MS (24ull * 3600 * 1000)


static struct shift_shadow_stats stats;
static pthread_mutex_t rnics_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shift_rnic *rnics[SHIFT_MAX_CTX];

static uint64_t now_ms(void)
{
	return shift_clock_ms();
}

static void stat_add(unsigned long *c, long d)
{
	__atomic_fetch_add(c, (unsigned long)d, __ATOMIC_RELAXED);
}

void shift_shadow_stats_get(struct shift_shadow_stats *out)
{
	out->qps_ready = __atomic_load_n(&stats.qps_ready, __ATOMIC_RELAXED);
	out->qps_unprotected = __atomic_load_n(&stats.qps_unprotected, __ATOMIC_RELAXED);
	out->mrs_ready = __atomic_load_n(&stats.mrs_ready, __ATOMIC_RELAXED);
	out->kv_errors = __atomic_load_n(&stats.kv_errors, __ATOMIC_RELAXED);
}

/* Something to replay (rnic->lock held). Only an idle thread is woken:
 * one that is already collecting a burst notices by itself, so a burst of
 * control verbs costs the application one wake-up, not one each. */
static void kick(struct shift_rnic *r)
{
	bool was = r->dirty;

	r->dirty = true;
	if (!was && r->idle)
		pthread_cond_signal(&r->kick);
}

/* ---- recording (application threads) ------------------------------------ */

#define PUSH(r, list, obj)                       \
	do {                                     \
		pthread_mutex_lock(&(r)->lock);  \
		(obj)->next = (r)->list;         \
		(r)->list = (obj);               \
		kick(r);                         \
		pthread_mutex_unlock(&(r)->lock); \
	} while (0)

/* The application destroyed o (may be NULL): the replay thread reaps its
 * backup. rnic->lock held. */
#define MARK_DEAD(r, o)                         \
	do {                                    \
		__typeof__(o) o_ = (o);         \
		if (o_) {                       \
			o_->dead = true;        \
			kick(r);                \
		}                               \
	} while (0)

static struct shift_pd *find_pd(struct shift_rnic *r, struct ibv_pd *pd)
{
	for (struct shift_pd *p = r->pds; p; p = p->next)
		if (p->app == pd && !p->dead)
			return p;
	return NULL;
}

static struct shift_cq *find_cq(struct shift_rnic *r, struct ibv_cq *cq)
{
	for (struct shift_cq *c = r->cqs; c; c = c->next)
		if (c->app == cq && !c->dead)
			return c;
	return NULL;
}

void shift_shadow_pd(struct shift_rnic *r, struct ibv_pd *pd)
{
	struct shift_pd *p = calloc(1, sizeof(*p));

	if (!p)
		return; /* the objects on it will run unprotected */
	p->app = pd;
	PUSH(r, pds, p);
}

void shift_shadow_pd_gone(struct shift_rnic *r, struct ibv_pd *pd)
{
	pthread_mutex_lock(&r->lock);
	MARK_DEAD(r, find_pd(r, pd));
	pthread_mutex_unlock(&r->lock);
}

void shift_shadow_mr(struct shift_rnic *r, struct ibv_mr *mr,
		     enum shift_mr_kind kind, void *addr, size_t length,
		     uint64_t iova, uint64_t dmabuf_offset, int dmabuf_fd,
		     unsigned int access)
{
	struct shift_mr *m = calloc(1, sizeof(*m));

	if (!m)
		return;
	m->app = mr;
	m->kind = kind;
	m->addr = addr;
	m->length = length;
	m->iova = iova;
	m->dmabuf_offset = dmabuf_offset;
	m->access = access;
	m->app_lkey = mr->lkey;
	m->app_rkey = mr->rkey;
	m->dmabuf_fd = -1;
	if (kind == SHIFT_MR_DMABUF) {
		/* NCCL closes the fd right after registering: keep our own */
		m->dmabuf_fd = fcntl(dmabuf_fd, F_DUPFD_CLOEXEC, 0);
		if (m->dmabuf_fd < 0) {
			m->state = SHIFT_SHADOW_UNPROTECTED;
			shift_warn("%s: dmabuf MR: cannot keep the fd (%s): MR unprotected",
				   r->name, strerror(errno));
		}
	}
	pthread_mutex_lock(&r->lock);
	m->pd = find_pd(r, mr->pd);
	m->next = r->mrs;
	r->mrs = m;
	kick(r);
	pthread_mutex_unlock(&r->lock);
}

void shift_shadow_mr_gone(struct shift_rnic *r, struct ibv_mr *mr)
{
	pthread_mutex_lock(&r->lock);
	for (struct shift_mr *m = r->mrs; m; m = m->next) {
		if (m->app == mr && !m->dead) {
			m->dead = true;
			kick(r);
			break;
		}
	}
	pthread_mutex_unlock(&r->lock);
}

void shift_shadow_mr_rereg(struct shift_rnic *r, struct ibv_mr *mr, int flags,
			   int access)
{
	unsigned int old_access = 0;
	enum shift_mr_kind kind = SHIFT_MR_PLAIN;
	uint64_t iova = 0;

	pthread_mutex_lock(&r->lock);
	for (struct shift_mr *m = r->mrs; m; m = m->next) {
		if (m->app == mr && !m->dead) {
			old_access = m->access;
			kind = m->kind == SHIFT_MR_DMABUF ? SHIFT_MR_PLAIN : m->kind;
			iova = m->iova;
			m->dead = true;
			break;
		}
	}
	pthread_mutex_unlock(&r->lock);
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION)
		kind = SHIFT_MR_PLAIN;
	shift_shadow_mr(r, mr, kind, mr->addr, mr->length, iova, 0, -1,
			(flags & IBV_REREG_MR_CHANGE_ACCESS) ? (unsigned int)access : old_access);
}

void shift_shadow_cq(struct shift_rnic *r, struct ibv_cq *cq, int cqe,
		     struct ibv_comp_channel *channel, int comp_vector)
{
	struct shift_cq *c = calloc(1, sizeof(*c));

	if (!c)
		return;
	c->app = cq;
	c->cqe = cqe;
	pthread_mutex_init(&c->dp_lock, NULL);
	c->app_has_channel = channel != NULL;
	c->app_channel = channel;
	c->comp_vector = comp_vector;
	PUSH(r, cqs, c);
}

void shift_shadow_cq_gone(struct shift_rnic *r, struct ibv_cq *cq)
{
	pthread_mutex_lock(&r->lock);
	MARK_DEAD(r, find_cq(r, cq));
	pthread_mutex_unlock(&r->lock);
}

static struct shift_qp *find_qp(struct shift_rnic *r, struct ibv_qp *qp)
{
	for (struct shift_qp *q = r->qps; q; q = q->next)
		if (q->app == qp && !q->dead)
			return q;
	return NULL;
}

static void qp_unprotected_locked(struct shift_qp *q, const char *why)
{
	if (q->state != SHIFT_SHADOW_UNPROTECTED) {
		q->state = SHIFT_SHADOW_UNPROTECTED;
		q->why = why;
		stat_add(&stats.qps_unprotected, 1);
	}
}

void shift_shadow_qp(struct shift_rnic *r, struct ibv_qp *qp,
		     enum ibv_qp_type type, struct ibv_cq *send_cq,
		     struct ibv_cq *recv_cq, const struct ibv_qp_cap *cap,
		     int sq_sig_all, bool has_srq)
{
	struct shift_qp *q = calloc(1, sizeof(*q));

	if (!q)
		return;
	q->app = qp;
	q->app_qpn = qp->qp_num;
	q->cap = *cap;
	q->sq_sig_all = sq_sig_all;
	q->app_state = IBV_QPS_RESET;
	q->bk_state = IBV_QPS_RESET;
	pthread_mutex_lock(&r->lock);
	q->pd = find_pd(r, qp->pd);
	q->send_cq = find_cq(r, send_cq);
	q->recv_cq = find_cq(r, recv_cq);
	if (type != IBV_QPT_RC)
		qp_unprotected_locked(q, "not an RC QP");
	else if (has_srq)
		qp_unprotected_locked(q, "uses an SRQ (not shadowed yet)");
	else if (!q->pd || !q->send_cq || !q->recv_cq)
		qp_unprotected_locked(q, "its PD or CQ is not shadowed");
	else if (r->unprotected)
		qp_unprotected_locked(q, r->why);
	q->next = r->qps;
	r->qps = q;
	kick(r);
	pthread_mutex_unlock(&r->lock);
	if (q->state == SHIFT_SHADOW_UNPROTECTED)
		shift_info("%s: QP %u unprotected: %s", r->name, q->app_qpn, q->why);
}

/*
 * Merge what the application set into the recorded attributes: the mask
 * bits say which fields are meaningful. A copy of a fixed-size struct and
 * an OR, under a lock nobody holds for long: no query_qp, no allocation.
 */
void shift_shadow_qp_modified(struct shift_rnic *r, struct ibv_qp *qp,
			      const struct ibv_qp_attr *attr, int mask)
{
	pthread_mutex_lock(&r->lock);
	struct shift_qp *q = find_qp(r, qp);
	if (q) {
		struct ibv_qp_attr *a = &q->attr;

		if (mask & IBV_QP_STATE) {
			q->app_state = attr->qp_state;
			a->qp_state = attr->qp_state;
		}
		if (mask & IBV_QP_PKEY_INDEX)
			a->pkey_index = attr->pkey_index;
		if (mask & IBV_QP_PORT)
			a->port_num = attr->port_num;
		if (mask & IBV_QP_ACCESS_FLAGS)
			a->qp_access_flags = attr->qp_access_flags;
		if (mask & IBV_QP_AV)
			a->ah_attr = attr->ah_attr;
		if (mask & IBV_QP_PATH_MTU)
			a->path_mtu = attr->path_mtu;
		if (mask & IBV_QP_DEST_QPN)
			a->dest_qp_num = attr->dest_qp_num;
		if (mask & IBV_QP_RQ_PSN)
			a->rq_psn = attr->rq_psn;
		if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
			a->max_dest_rd_atomic = attr->max_dest_rd_atomic;
		if (mask & IBV_QP_MIN_RNR_TIMER)
			a->min_rnr_timer = attr->min_rnr_timer;
		if (mask & IBV_QP_TIMEOUT)
			a->timeout = attr->timeout;
		if (mask & IBV_QP_RETRY_CNT)
			a->retry_cnt = attr->retry_cnt;
		if (mask & IBV_QP_RNR_RETRY)
			a->rnr_retry = attr->rnr_retry;
		if (mask & IBV_QP_SQ_PSN)
			a->sq_psn = attr->sq_psn;
		if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
			a->max_rd_atomic = attr->max_rd_atomic;
		q->attr_mask |= mask;
		kick(r);
	}
	pthread_mutex_unlock(&r->lock);
}

void shift_shadow_qp_gone(struct shift_rnic *r, struct ibv_qp *qp)
{
	pthread_mutex_lock(&r->lock);
	MARK_DEAD(r, find_qp(r, qp));
	pthread_mutex_unlock(&r->lock);
}

/* ---- replay (the RNIC's thread) ------------------------------------------ */

static bool kv_ok(struct shift_rnic *r, int rc, const char *what)
{
	if (rc >= 0 || rc == -ENOENT)
		return true;
	stat_add(&stats.kv_errors, 1);
	if (!r->kv_warned) {
		r->kv_warned = true;
		shift_warn("%s: KV store %s failed (%s): QPs stay unprotected until it answers",
			   r->name, what, shift_kv_last_error());
	}
	return false;
}

static int gid_slot(struct shift_rnic *r, const union ibv_gid *gid)
{
	for (int i = 0; i < r->ngids; i++)
		if (!memcmp(&r->gids[i], gid, sizeof(*gid)))
			return i;
	if (r->ngids == SHIFT_RNIC_MAX_GIDS)
		return -1;
	r->gids[r->ngids] = *gid;
	return r->ngids++;
}

static void replay_pd(struct shift_rnic *r, struct shift_pd *p)
{
	if (p->bk || p->state != SHIFT_SHADOW_PENDING)
		return;
	p->bk = shift_lower->alloc_pd(r->bk_ctx);
	pthread_mutex_lock(&r->lock);
	p->state = p->bk ? SHIFT_SHADOW_READY : SHIFT_SHADOW_UNPROTECTED;
	pthread_mutex_unlock(&r->lock);
	if (!p->bk)
		shift_warn("%s: backup PD on %s: %s", r->name, r->bk_name, strerror(errno));
}

static void replay_cq(struct shift_rnic *r, struct shift_cq *c)
{
	if (c->bk || c->state != SHIFT_SHADOW_PENDING)
		return;
	if (c->app_has_channel && !c->bk_channel)
		c->bk_channel = shift_lower->create_comp_channel(r->bk_ctx);
	/* one more entry than the app's: room for SHIFT's control completions */
	c->bk = shift_lower->create_cq(r->bk_ctx, c->cqe + 1, c, c->bk_channel,
				       c->comp_vector % (r->bk_ctx->num_comp_vectors > 0 ?
							 r->bk_ctx->num_comp_vectors : 1));
	pthread_mutex_lock(&r->lock);
	c->state = c->bk ? SHIFT_SHADOW_READY : SHIFT_SHADOW_UNPROTECTED;
	pthread_mutex_unlock(&r->lock);
	if (!c->bk)
		shift_warn("%s: backup CQ on %s: %s", r->name, r->bk_name, strerror(errno));
	else
		shift_chan_backup_ready(r, c);
}

static void publish_mr(struct shift_rnic *r, struct shift_mr *m)
{
	char key[SHIFT_EXCHANGE_KEY_MAX], val[SHIFT_EXCHANGE_VALUE_MAX];

	for (int i = 0; i < r->ngids; i++) {
		if (m->published & (1u << i))
			continue;
		int kl = shift_exchange_mr_key(&r->gids[i], m->app_rkey, key, sizeof(key));
		int vl = shift_exchange_mr_encode(m->bk->rkey, val, sizeof(val));

		if (kl < 0 || vl < 0)
			continue;
		if (!kv_ok(r, shift_kv_put(r->kv, key, val, (size_t)vl, SHIFT_KV_TTL_MS), "put"))
			return;
		m->published |= 1u << i;
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
			close(m->dmabuf_fd);
			m->dmabuf_fd = -1;
			break;
		}
		pthread_mutex_lock(&r->lock);
		m->state = m->bk ? SHIFT_SHADOW_READY : SHIFT_SHADOW_UNPROTECTED;
		pthread_mutex_unlock(&r->lock);
		if (!m->bk) {
			shift_warn("%s: backup MR (rkey %u) on %s: %s", r->name, m->app_rkey,
				   r->bk_name, strerror(errno));
			return;
		}
		stat_add(&stats.mrs_ready, 1);
	}
	if (r->kv)
		publish_mr(r, m);
}

/* The backup QP's port: the app's port if the backup device has it. */
static uint8_t bk_port(struct shift_qp *q)
{
	return q->attr.port_num ? q->attr.port_num : 1;
}

/* ---- connecting a QP SHIFT owns the state of ---------------------------
 * The backup QP (replay, re-arm) and the default QP after a failure
 * (failback) go through RESET -> INIT -> RTR -> RTS with what the
 * application set on its QP, defaults where it set nothing, and SHIFT's
 * access flags. */

int shift_qp_to_init(struct ibv_qp *qp, const struct ibv_qp_attr *app, uint8_t port)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = app->pkey_index;
	a.port_num = port;
	a.qp_access_flags = SHIFT_QP_ACCESS(app->qp_access_flags);
	return shift_lower->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				      IBV_QP_ACCESS_FLAGS);
}

int shift_qp_to_rtr(struct ibv_qp *qp, const struct ibv_qp_attr *app, int app_mask,
		    const struct ibv_ah_attr *ah, enum ibv_mtu mtu, uint32_t dest_qpn,
		    uint32_t rq_psn)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.ah_attr = *ah;
	a.path_mtu = mtu;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = rq_psn & 0xffffff;
	a.max_dest_rd_atomic = (app_mask & IBV_QP_MAX_DEST_RD_ATOMIC) ? app->max_dest_rd_atomic : 1;
	a.min_rnr_timer = (app_mask & IBV_QP_MIN_RNR_TIMER) ? app->min_rnr_timer : 12;
	return shift_lower->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int shift_qp_to_rts(struct ibv_qp *qp, const struct ibv_qp_attr *app, int app_mask,
		    uint32_t sq_psn)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = sq_psn & 0xffffff;
	a.timeout = (app_mask & IBV_QP_TIMEOUT) ? app->timeout : 14;
	a.retry_cnt = shift_provider_retry_cnt(qp->context,
					       (app_mask & IBV_QP_RETRY_CNT) ? app->retry_cnt : 7);
	a.rnr_retry = (app_mask & IBV_QP_RNR_RETRY) ? app->rnr_retry : 7;
	a.max_rd_atomic = (app_mask & IBV_QP_MAX_QP_RD_ATOMIC) ? app->max_rd_atomic : 1;
	return shift_lower->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
				      IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				      IBV_QP_MAX_QP_RD_ATOMIC);
}

int shift_qp_reset(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RESET;
	return shift_lower->modify_qp(qp, &a, IBV_QP_STATE);
}

/* The address of the peer's backup QP, seen from mine. */
static struct ibv_ah_attr bk_ah(struct shift_qp *q, const struct ibv_qp_attr *app)
{
	struct ibv_ah_attr ah = app->ah_attr;

	ah.grh.dgid = q->peer_bk.gid;
	ah.port_num = bk_port(q);
	ah.dlid = 0;
	return ah;
}

static enum ibv_mtu bk_mtu(const struct shift_qp *q)
{
	return q->peer_bk.mtu < q->my_bk.mtu ? q->peer_bk.mtu : q->my_bk.mtu;
}


static void qp_fail(struct shift_rnic *r, struct shift_qp *q, const char *why)
{
	pthread_mutex_lock(&r->lock);
	qp_unprotected_locked(q, why);
	pthread_mutex_unlock(&r->lock);
	shift_warn("%s: QP %u unprotected: %s (%s)", r->name, q->app_qpn, why,
		   strerror(errno));
}

static void replay_qp(struct shift_rnic *r, struct shift_qp *q)
{
	char key[SHIFT_EXCHANGE_KEY_MAX], val[SHIFT_EXCHANGE_VALUE_MAX];

	pthread_mutex_lock(&r->lock);
	struct ibv_qp_attr app = q->attr;
	int app_mask = q->attr_mask;
	enum shift_shadow_state st = q->state;
	pthread_mutex_unlock(&r->lock);
	if (st != SHIFT_SHADOW_PENDING)
		return;

	if (!q->bk) {
		if (!q->pd->bk || !q->send_cq->bk || !q->recv_cq->bk) {
			if (q->pd->state == SHIFT_SHADOW_UNPROTECTED ||
			    q->send_cq->state == SHIFT_SHADOW_UNPROTECTED ||
			    q->recv_cq->state == SHIFT_SHADOW_UNPROTECTED)
				qp_fail(r, q, "its backup PD or CQ could not be created");
			return;
		}
		struct ibv_qp_init_attr init = {
			.send_cq = q->send_cq->bk,
			.recv_cq = q->recv_cq->bk,
			.cap = q->cap,
			.qp_type = IBV_QPT_RC,
			.sq_sig_all = q->sq_sig_all,
		};
		init.cap.max_recv_wr += 1; /* SHIFT's control receive */
		q->bk = shift_lower->create_qp(q->pd->bk, &init);
		if (!q->bk) {
			qp_fail(r, q, "backup QP creation failed");
			return;
		}
	}

	/* INIT, as soon as the application's QP has been through INIT */
	if (q->bk_state == IBV_QPS_RESET &&
	    (app_mask & (IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) ==
		    (IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
		if (shift_qp_to_init(q->bk, &app, bk_port(q))) {
			qp_fail(r, q, "backup QP to INIT failed");
			return;
		}
		q->bk_state = IBV_QPS_INIT;
	}

	/* publish mine once the app told us who the peer is (RTR) */
	if (!q->published && q->bk_state == IBV_QPS_INIT &&
	    (app_mask & (IBV_QP_AV | IBV_QP_DEST_QPN)) == (IBV_QP_AV | IBV_QP_DEST_QPN)) {
		struct ibv_port_attr pa;

		if (!app.ah_attr.is_global) {
			qp_fail(r, q, "the path has no GRH (InfiniBand LID routing is not supported)");
			return;
		}
		uint8_t port = app.ah_attr.port_num ? app.ah_attr.port_num : bk_port(q);
		if (shift_lower->query_gid(r->sctx->ibctx, port, app.ah_attr.grh.sgid_index,
					   &q->my_key.gid) ||
		    shift_lower->query_gid(r->bk_ctx, bk_port(q), app.ah_attr.grh.sgid_index,
					   &q->my_bk.gid)) {
			qp_fail(r, q, "cannot read the GIDs");
			return;
		}
		if (shift_lower->query_port(r->bk_ctx, bk_port(q), &pa)) {
			qp_fail(r, q, "cannot query the backup port");
			return;
		}
		q->my_key.qpn = q->app_qpn;
		q->my_bk.qpn = q->bk->qp_num;
		q->my_bk.psn = (uint32_t)(now_ms() * 2654435761u + q->bk->qp_num) & 0xffffff;
		q->my_bk.mtu = (app_mask & IBV_QP_PATH_MTU) && app.path_mtu < pa.active_mtu ?
				       app.path_mtu : pa.active_mtu;
		q->peer_key.gid = app.ah_attr.grh.dgid;
		q->peer_key.qpn = app.dest_qp_num;
		if (!r->kv)
			return;
		int kl = shift_exchange_qp_key(&q->my_key, key, sizeof(key));
		int vl = shift_exchange_qp_encode(&q->my_bk, val, sizeof(val));
		if (kl < 0 || vl < 0) {
			qp_fail(r, q, "cannot encode the backup attributes");
			return;
		}
		if (!kv_ok(r, shift_kv_put(r->kv, key, val, (size_t)vl, SHIFT_KV_TTL_MS), "put"))
			return;
		q->published = true;
		q->waiting_since_ms = now_ms();
		/* MRs become findable under this GID too */
		if (gid_slot(r, &q->my_key.gid) < 0)
			shift_warn("%s: more than %d GIDs in use: MRs published under the first ones",
				   r->name, SHIFT_RNIC_MAX_GIDS);
	}

	/* the peer's backup attributes: best effort, never blocking */
	if (q->published && !q->peer_known) {
		void *v = NULL;
		size_t vl = 0;

		if (shift_exchange_qp_key(&q->peer_key, key, sizeof(key)) < 0)
			return;
		int rc = shift_kv_get(r->kv, key, &v, &vl);
		if (!kv_ok(r, rc, "get"))
			return;
		if (rc == -ENOENT) {
			if (!q->warned_peer && now_ms() - q->waiting_since_ms > shift_config.peer_warn_ms) {
				q->warned_peer = true;
				shift_warn("%s: QP %u: the peer (QPN %u) has published no backup "
					   "after %d s (peer without SHIFT?): unprotected until it does",
					   r->name, q->app_qpn, q->peer_key.qpn,
					   shift_config.peer_warn_ms / 1000);
			}
			return;
		}
		rc = shift_exchange_qp_decode(v, vl, &q->peer_bk);
		free(v);
		if (rc) {
			errno = EPROTO;
			qp_fail(r, q, "the peer's backup attributes are malformed or of another version");
			return;
		}
		q->peer_known = true;
	}

	if (q->peer_known && q->bk_state == IBV_QPS_INIT) {
		struct ibv_ah_attr ah = bk_ah(q, &app);

		if (shift_qp_to_rtr(q->bk, &app, app_mask, &ah, bk_mtu(q), q->peer_bk.qpn,
				    q->peer_bk.psn)) {
			qp_fail(r, q, "backup QP to RTR failed");
			return;
		}
		q->bk_state = IBV_QPS_RTR;
	}

	/* RTS even if the application leaves its QP at RTR (a receive-only
	 * perftest server): SHIFT sends its handshake from the backup QP */
	if (q->bk_state == IBV_QPS_RTR) {
		if (shift_qp_to_rts(q->bk, &app, app_mask, q->my_bk.psn)) {
			qp_fail(r, q, "backup QP to RTS failed");
			return;
		}
		q->bk_state = IBV_QPS_RTS;
		/* SHIFT's control receive heads the backup receive queue: the
		 * peer's one handshake message per failover consumes it */
		struct ibv_recv_wr rwr = { .wr_id = SHIFT_WRID_CTRL_RECV }, *bad;
		if (ibv_post_recv(q->bk, &rwr, &bad)) {
			qp_fail(r, q, "cannot post the control receive");
			return;
		}
		q->ctrl_posted = true;
		pthread_mutex_lock(&r->lock);
		q->state = SHIFT_SHADOW_READY;
		pthread_mutex_unlock(&r->lock);
		stat_add(&stats.qps_ready, 1);
		shift_info("%s: QP %u shadowed by %s QP %u (RTS; peer backup QP %u)", r->name,
			   q->app_qpn, r->bk_name, q->bk->qp_num, q->peer_bk.qpn);
	}
}

/*
 * Re-arm a backup QP after a failback (shift/failover.c): its receive queue
 * still holds receives the application has since reposted on the default
 * QP, and its control receive was consumed by the handshake. Reset it and
 * connect it again, with PSNs advanced by gen (both ends use the same gen:
 * the connection's failover count), and post a fresh control receive.
 * Called on the RNIC's thread (it owns the backup fields). 0 or -1.
 */
int shift_shadow_rearm(struct shift_rnic *r, struct shift_qp *q, unsigned gen)
{
	uint32_t off = gen * 0x3b9ac9u;
	struct ibv_recv_wr rwr = { .wr_id = SHIFT_WRID_CTRL_RECV }, *bad;

	pthread_mutex_lock(&r->lock);
	struct ibv_qp_attr app = q->attr;
	int app_mask = q->attr_mask;
	pthread_mutex_unlock(&r->lock);
	if (!q->bk || q->bk_state != IBV_QPS_RTS)
		return -1;
	struct ibv_ah_attr ah = bk_ah(q, &app);

	if (shift_qp_reset(q->bk))
		return -1;
	q->bk_state = IBV_QPS_RESET;
	if (shift_qp_to_init(q->bk, &app, bk_port(q)))
		return -1;
	q->bk_state = IBV_QPS_INIT;
	if (ibv_post_recv(q->bk, &rwr, &bad))
		return -1;
	if (shift_qp_to_rtr(q->bk, &app, app_mask, &ah, bk_mtu(q), q->peer_bk.qpn,
			    q->peer_bk.psn + off))
		return -1;
	q->bk_state = IBV_QPS_RTR;
	if (shift_qp_to_rts(q->bk, &app, app_mask, q->my_bk.psn + off))
		return -1;
	q->bk_state = IBV_QPS_RTS;
	return 0;
}

static void kv_del(struct shift_rnic *r, const char *key)
{
	if (r->kv)
		(void)shift_kv_delete(r->kv, key);
}

/* Destroy the backup side of dead objects and unlink them. Children
 * before parents: QPs, MRs, CQs, PDs. */
static void reap(struct shift_rnic *r)
{
	char key[SHIFT_EXCHANGE_KEY_MAX];

#define REAP(list, type, destroy)                                              \
	do {                                                                   \
		pthread_mutex_lock(&r->lock);                                  \
		for (type **pp = &r->list; *pp;) {                             \
			type *o = *pp;                                         \
			if (!o->dead) {                                        \
				pp = &o->next;                                 \
				continue;                                      \
			}                                                      \
			*pp = o->next;                                         \
			pthread_mutex_unlock(&r->lock);                        \
			destroy;                                               \
			free(o);                                               \
			pthread_mutex_lock(&r->lock);                          \
		}                                                              \
		pthread_mutex_unlock(&r->lock);                                \
	} while (0)

	REAP(qps, struct shift_qp, {
		if (o->published && shift_exchange_qp_key(&o->my_key, key, sizeof(key)) >= 0)
			kv_del(r, key);
		if (o->bk)
			shift_lower->destroy_qp(o->bk);
		if (o->state == SHIFT_SHADOW_READY)
			stat_add(&stats.qps_ready, -1);
	});
	REAP(mrs, struct shift_mr, {
		for (int i = 0; i < r->ngids; i++)
			if ((o->published & (1u << i)) &&
			    shift_exchange_mr_key(&r->gids[i], o->app_rkey, key, sizeof(key)) >= 0)
				kv_del(r, key);
		if (o->bk) {
			shift_lower->dereg_mr(o->bk);
			stat_add(&stats.mrs_ready, -1);
		}
		if (o->dmabuf_fd >= 0)
			close(o->dmabuf_fd);
	});
	REAP(cqs, struct shift_cq, {
		if (o->bk)
			shift_lower->destroy_cq(o->bk);
		if (o->bk_channel)
			shift_lower->destroy_comp_channel(o->bk_channel);
		free(o->kept);
		pthread_mutex_destroy(&o->dp_lock);
	});
	REAP(pds, struct shift_pd, {
		if (o->bk)
			shift_lower->dealloc_pd(o->bk);
	});
#undef REAP
}

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

int shift_rnic_pass(struct shift_rnic *r)
{
	if (!r->bk_ctx)
		return 0;
	reap(r);
	shift_failover_background(r->sctx);
	EACH(r, pds, struct shift_pd, p)
		if (!p->dead)
			replay_pd(r, p);
	EACH(r, cqs, struct shift_cq, c)
		if (!c->dead)
			replay_cq(r, c);
	EACH(r, qps, struct shift_qp, q)
		if (!q->dead)
			replay_qp(r, q);
	EACH(r, mrs, struct shift_mr, m)
		if (!m->dead)
			replay_mr(r, m);
	return pending(r);
}

void shift_rnic_pass_all(void)
{
	for (int i = 0; i < SHIFT_MAX_CTX; i++) {
		pthread_mutex_lock(&rnics_lock);
		struct shift_rnic *r = rnics[i];
		pthread_mutex_unlock(&rnics_lock);
		if (r)
			shift_rnic_pass(r);
	}
}

/* ---- the RNIC's thread ------------------------------------------------- */

static void rnic_unprotected(struct shift_rnic *r, const char *why)
{
	pthread_mutex_lock(&r->lock);
	r->unprotected = true;
	r->why = why;
	for (struct shift_qp *q = r->qps; q; q = q->next)
		qp_unprotected_locked(q, why);
	pthread_mutex_unlock(&r->lock);
	shift_warn("%s: running unprotected: %s", r->name, why);
}

static void backup_open(struct shift_rnic *r)
{
	struct ibv_device **list;
	struct shift_backup_cand *c;
	int n = 0, rc;

	list = shift_lower->get_device_list(&n);
	if (!list || n <= 0) {
		rnic_unprotected(r, "no RDMA device list");
		if (list)
			shift_lower->free_device_list(list);
		return;
	}
	c = calloc((size_t)n, sizeof(*c));
	if (!c) {
		shift_lower->free_device_list(list);
		rnic_unprotected(r, "out of memory");
		return;
	}
	for (int i = 0; i < n; i++) {
		const char *name = shift_lower->get_device_name(list[i]);
		struct ibv_port_attr pa;

		snprintf(c[i].name, sizeof(c[i].name), "%s", name ? name : "");
		if (!strcmp(c[i].name, r->name)) {
			if (!shift_lower->query_port(r->sctx->ibctx, 1, &pa))
				c[i].link_layer = pa.link_layer;
			c[i].active = true;
			continue;
		}
		if (shift_config.backup[0])
			continue; /* explicit map: no need to probe every device */
		struct ibv_context *ctx = shift_lower->open_device(list[i]);
		if (!ctx)
			continue;
		if (!shift_lower->query_port(ctx, 1, &pa)) {
			c[i].link_layer = pa.link_layer;
			c[i].active = pa.state == IBV_PORT_ACTIVE;
		}
		shift_lower->close_device(ctx);
	}
	rc = shift_backup_pick(c, n, r->name, shift_config.backup, r->bk_name,
			       sizeof(r->bk_name));
	free(c);
	if (rc) {
		r->bk_name[0] = '\0';
		shift_lower->free_device_list(list);
		rnic_unprotected(r, rc == -EINVAL ? "SHIFT_BACKUP is malformed" :
				    rc == -ENOENT ? "SHIFT_BACKUP does not map this device" :
						    "no backup NIC (no other active device with the same link layer)");
		return;
	}
	for (int i = 0; i < n; i++) {
		const char *name = shift_lower->get_device_name(list[i]);

		if (name && !strcmp(name, r->bk_name)) {
			r->bk_ctx = shift_lower->open_device(list[i]);
			break;
		}
	}
	shift_lower->free_device_list(list);
	if (!r->bk_ctx) {
		rnic_unprotected(r, "cannot open the backup NIC");
		return;
	}
	shift_info("%s: backup NIC %s", r->name, r->bk_name);
}

static void kv_connect(struct shift_rnic *r)
{
	struct shift_kv_options o = { .lazy_connect = true };
	int rc = shift_kv_open(shift_config.kv_url, shift_config.kv_namespace, &o, &r->kv);

	if (rc) {
		r->kv = NULL;
		rnic_unprotected(r, "the KV store URL or namespace is invalid");
		shift_warn("%s: %s", r->name, shift_kv_last_error());
	}
}

static void *rnic_main(void *arg)
{
	struct shift_rnic *r = arg;
	uint64_t last_status = 0;

	backup_open(r);
	if (r->bk_ctx)
		kv_connect(r);
	pthread_mutex_lock(&r->lock);
	while (!r->stop) {
		bool work = r->dirty;

		/* Let a burst of control verbs (an application connecting many
		 * QPs) finish before replaying: on a busy or single CPU the
		 * replay would otherwise steal time from each of them. */
		for (int quiet = 0; work && quiet < SHIFT_COALESCE_ROUNDS && !r->stop; quiet++) {
			struct timespec ts;

			r->dirty = false;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += SHIFT_COALESCE_MS * 1000000L;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&r->kick, &r->lock, &ts);
			if (!r->dirty)
				break;
		}
		r->dirty = false;
		pthread_mutex_unlock(&r->lock);
		int left = work || r->bk_ctx ? shift_rnic_pass(r) : 0;
		if (now_ms() - last_status > 1000 || work) {
			shift_status_write(r);
			last_status = now_ms();
		}
		pthread_mutex_lock(&r->lock);
		if (r->stop || r->dirty)
			continue;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		/* replay pending: soon; a QP failed over (probes, failback): often;
		 * else the idle period, which also bounds how long a passive
		 * peer's handshake message waits for its answer */
		uint64_t period = left ? SHIFT_PASS_PERIOD_MS :
				  __atomic_load_n(&r->sctx->slow, __ATOMIC_ACQUIRE) ? SHIFT_FO_PERIOD_MS :
										       SHIFT_IDLE_PERIOD_MS;
		uint64_t ns = (uint64_t)ts.tv_nsec + period * 1000000ull;
		ts.tv_sec += (time_t)(ns / 1000000000ull);
		ts.tv_nsec = (long)(ns % 1000000000ull);
		r->idle = true;
		pthread_cond_timedwait(&r->kick, &r->lock, &ts);
		r->idle = false;
	}
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

static void shadow_atexit(void)
{
	for (int i = 0; i < SHIFT_MAX_CTX; i++) {
		pthread_mutex_lock(&rnics_lock);
		struct shift_rnic *r = rnics[i];
		pthread_mutex_unlock(&rnics_lock);
		if (!r)
			continue;
		pthread_mutex_lock(&r->lock);
		r->stop = true;
		pthread_cond_signal(&r->kick);
		pthread_mutex_unlock(&r->lock);
		if (r->thread_started)
			pthread_join(r->thread, NULL);
		r->thread_started = false;
		if (r->kv)
			shift_kv_delete_own(r->kv);
		shift_status_remove(r);
	}
}

struct shift_rnic *shift_rnic_start(struct shift_ctx *sctx)
{
	struct shift_rnic *r = calloc(1, sizeof(*r));

	if (!r) {
		shift_warn("out of memory: context unprotected");
		return NULL;
	}
	r->sctx = sctx;
	snprintf(r->name, sizeof(r->name), "%s",
		 sctx->ibctx->device ? sctx->ibctx->device->name : "?");
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->kick, NULL);
	pthread_mutex_lock(&rnics_lock);
	rnics[sctx->slot] = r;
	pthread_mutex_unlock(&rnics_lock);
	if (shift_config.inline_passes) {
		backup_open(r);
		if (r->bk_ctx)
			kv_connect(r);
		return r;
	}
	static bool registered;
	if (!__atomic_exchange_n(&registered, true, __ATOMIC_ACQ_REL))
		atexit(shadow_atexit);
	if (pthread_create(&r->thread, NULL, rnic_main, r)) {
		rnic_unprotected(r, "cannot start its thread");
		return r;
	}
	r->thread_started = true;
	return r;
}

void shift_rnic_stop(struct shift_rnic *r)
{
	if (!r)
		return;
	pthread_mutex_lock(&r->lock);
	r->stop = true;
	pthread_cond_signal(&r->kick);
	pthread_mutex_unlock(&r->lock);
	if (r->thread_started)
		pthread_join(r->thread, NULL);
	shift_status_remove(r);
	pthread_mutex_lock(&rnics_lock);
	rnics[r->sctx->slot] = NULL;
	pthread_mutex_unlock(&rnics_lock);

	/* everything the app left behind dies with its context */
	pthread_mutex_lock(&r->lock);
	for (struct shift_qp *q = r->qps; q; q = q->next)
		q->dead = true;
	for (struct shift_mr *m = r->mrs; m; m = m->next)
		m->dead = true;
	for (struct shift_cq *c = r->cqs; c; c = c->next)
		c->dead = true;
	for (struct shift_pd *p = r->pds; p; p = p->next)
		p->dead = true;
	pthread_mutex_unlock(&r->lock);
	reap(r);
	if (r->kv) {
		shift_kv_delete_own(r->kv);
		shift_kv_close(r->kv);
	}
	if (r->bk_ctx)
		shift_lower->close_device(r->bk_ctx);
	pthread_cond_destroy(&r->kick);
	pthread_mutex_destroy(&r->lock);
	free(r);
}

/* ---- status for shiftctl -------------------------------------------------- */

static const char *state_name(enum ibv_qp_state s)
{
	static const char *const n[] = { "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR" };

	return (unsigned)s < sizeof(n) / sizeof(n[0]) ? n[s] : "?";
}

void shift_status_write(struct shift_rnic *r)
{
	char path[700], tmp[720];
	const char *dir = shift_config.status_dir;

	if (!dir[0])
		return;
	mkdir(dir, 01777);
	snprintf(path, sizeof(path), "%s/shift-%d-%s.status", dir, (int)getpid(), r->name);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return;
	static const char *const send_names[] = { "default", "fallback", "waitsig", "waitdrain",
						  "unprot" };
	pthread_mutex_lock(&r->lock);
	for (struct shift_qp *q = r->qps; q; q = q->next) {
		if (q->dead)
			continue;
		/* the data path's view (a racy snapshot, for people): a QP
		 * found here cannot be freed while r->lock is held, its
		 * destroy marks the shadow dead under it first */
		const struct shift_dqp *d = shift_dqp_of_qp(q->app);
		unsigned ss = d ? (unsigned)__atomic_load_n(&d->send_state, __ATOMIC_RELAXED) : 0;

		fprintf(f, "%d %s %u %s %s %s %u %s %u %s %s %lu %lu %lu %u %llu %s\n", (int)getpid(),
			r->name, q->app_qpn, state_name(q->app_state),
			q->state == SHIFT_SHADOW_READY ? "ready" :
			q->state == SHIFT_SHADOW_PENDING ? "pending" : "unprotected",
			r->bk_name[0] ? r->bk_name : "-", q->bk ? q->bk->qp_num : 0,
			q->bk ? state_name(q->bk_state) : "-",
			q->peer_known ? q->peer_bk.qpn : 0,
			d && ss < 5 ? send_names[ss] : "-",
			!d ? "-" : __atomic_load_n(&d->recv_state, __ATOMIC_RELAXED) ? "fallback" : "default",
			d ? d->failovers : 0, d ? d->failbacks : 0, d ? d->retransmitted : 0,
			d ? d->bk_gen : 0, d ? (unsigned long long)d->last_switch_s : 0ull,
			q->why ? q->why : "-");
	}
	pthread_mutex_unlock(&r->lock);
	fclose(f);
	rename(tmp, path);
}

void shift_status_remove(struct shift_rnic *r)
{
	char path[700];

	if (!shift_config.status_dir[0])
		return;
	snprintf(path, sizeof(path), "%s/shift-%d-%s.status", shift_config.status_dir,
		 (int)getpid(), r->name);
	unlink(path);
}

/* ---- introspection ------------------------------------------------------ */

struct shift_rnic *shift_rnic_of(struct ibv_context *ctx)
{
	struct shift_ctx *s = ctx ? shift_ctx_of(ctx) : NULL;

	return s ? s->rnic : NULL;
}

int shift_shadow_qp_info(struct ibv_qp *qp, struct shift_qp_info *out)
{
	struct shift_rnic *r = shift_rnic_of(qp->context);
	int rc = -ENOENT;

	if (!r)
		return rc;
	pthread_mutex_lock(&r->lock);
	struct shift_qp *q = find_qp(r, qp);
	if (q) {
		out->state = q->state;
		out->why = q->why;
		out->bk = q->bk;
		out->bk_state = q->bk_state;
		out->peer_bk_qpn = q->peer_known ? q->peer_bk.qpn : 0;
		out->published = q->published;
		out->bk_dev = r->bk_name;
		rc = 0;
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}

struct shift_cq *shift_shadow_cq_of(struct shift_rnic *r, struct ibv_cq *cq)
{
	pthread_mutex_lock(&r->lock);
	struct shift_cq *c = find_cq(r, cq);
	pthread_mutex_unlock(&r->lock);
	return c;
}

struct shift_qp *shift_shadow_qp_of(struct shift_rnic *r, struct ibv_qp *qp)
{
	pthread_mutex_lock(&r->lock);
	struct shift_qp *q = find_qp(r, qp);
	pthread_mutex_unlock(&r->lock);
	return q;
}

int shift_shadow_bk_lkey(struct shift_rnic *r, uint32_t app_lkey, uint32_t *bk_lkey)
{
	int rc = -ENOENT;

	pthread_mutex_lock(&r->lock);
	for (struct shift_mr *m = r->mrs; m; m = m->next) {
		if (!m->dead && m->app_lkey == app_lkey && m->state == SHIFT_SHADOW_READY) {
			*bk_lkey = m->bk->lkey;
			rc = 0;
			break;
		}
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}

struct ibv_mr *shift_shadow_mr_backup(struct ibv_mr *mr)
{
	struct shift_rnic *r = shift_rnic_of(mr->context);
	struct ibv_mr *bk = NULL;

	if (!r)
		return NULL;
	pthread_mutex_lock(&r->lock);
	for (struct shift_mr *m = r->mrs; m; m = m->next)
		if (m->app == mr && !m->dead)
			bk = m->bk;
	pthread_mutex_unlock(&r->lock);
	return bk;
}
