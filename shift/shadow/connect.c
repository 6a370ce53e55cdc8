/*
 * Connecting the QPs whose state SHIFT owns (see shadow.h): the backup QP
 * of each application QP, brought up by the replay pass (replay.c) step by
 * step as far as the application's QP and the peer allow, and re-armed
 * after a failback; the RESET -> INIT -> RTR -> RTS steps themselves, which
 * failover also uses on a default QP after a failure.
 *
 * A backup QP goes: created (once its PD and CQs have their backups), INIT
 * (once the application's QP has been through INIT), its attributes
 * published under the application's (GID, QPN) (once the application told
 * its QP who the peer is), the peer's read (best effort, never blocking),
 * RTR, RTS with SHIFT's control receive posted: READY. A step that cannot
 * be taken yet ends the QP's share of the pass; a step that fails makes
 * the QP unprotected. All on the RNIC's thread, which owns the backup
 * fields; the state changes under rnic->lock.
 */
#include "shift/shadow/shadow_int.h"
#include "shift/shadow/svc.h"
#include "shift/base/config.h"
#include "shift/base/log.h"
#include "shift/base/lower.h"
#include "shift/dp/ctx.h"
#include "kv/kv.h"
#include "providers/provider.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
	/* again: the application may have changed them since INIT (librdmacm
	 * moves INIT -> INIT with the remote access the CM negotiated, just
	 * before RTR), after the backup went through INIT */
	a.qp_access_flags = SHIFT_QP_ACCESS(app->qp_access_flags);
	return shift_lower->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER |
				      IBV_QP_ACCESS_FLAGS);
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
	a.qp_access_flags = SHIFT_QP_ACCESS(app->qp_access_flags);
	return shift_lower->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
				      IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				      IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_ACCESS_FLAGS);
}

int shift_qp_reset(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RESET;
	return shift_lower->modify_qp(qp, &a, IBV_QP_STATE);
}

/* The backup QP's port: the one mapped to the app's port (backup.c). */
static uint8_t bk_port(const struct shift_rnic *r, const struct shift_qp *q)
{
	return shift_rnic_bk_port(r, q->attr.port_num ? q->attr.port_num : 1);
}

/* The address of the peer's backup QP, seen from mine. */
static struct ibv_ah_attr bk_ah(const struct shift_rnic *r, struct shift_qp *q,
				 const struct ibv_qp_attr *app)
{
	struct ibv_ah_attr ah = app->ah_attr;

	ah.grh.dgid = q->peer_bk.gid;
	ah.port_num = bk_port(r, q);
	ah.dlid = 0;
	return ah;
}

static enum ibv_mtu bk_mtu(const struct shift_qp *q)
{
	return q->peer_bk.mtu < q->my_bk.mtu ? q->peer_bk.mtu : q->my_bk.mtu;
}

/* ---- replaying a QP (the RNIC's thread) ---------------------------------
 * Each step returns false when the QP's share of this pass ends there (it
 * waits for something, or it just failed), true to go on to the next. */

/* q cannot be shadowed: unprotected from now on, one log line; err is the
 * failed call's error (0: no call failed, nothing to add). */
static void qp_fail(struct shift_rnic *r, struct shift_qp *q, const char *why, int err)
{
	pthread_mutex_lock(&r->lock);
	shift_qp_unprotected_locked(q, why);
	pthread_mutex_unlock(&r->lock);
	if (err)
		shift_warn("%s: QP %u unprotected: %s (%s)", r->name, q->app_qpn, why,
			   strerror(err));
	else
		shift_warn("%s: QP %u unprotected: %s", r->name, q->app_qpn, why);
}

/* The slot of a default GID among those MRs are published under (added if
 * new); -1 if all SHIFT_RNIC_MAX_GIDS slots are taken. */
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

/* The backup QP, once its PD and CQs have their backups. */
static bool replay_qp_create(struct shift_rnic *r, struct shift_qp *q)
{
	if (q->bk)
		return true;
	if (!q->pd->bk || !q->send_cq->bk || !q->recv_cq->bk) {
		if (q->pd->state == SHIFT_SHADOW_UNPROTECTED ||
		    q->send_cq->state == SHIFT_SHADOW_UNPROTECTED ||
		    q->recv_cq->state == SHIFT_SHADOW_UNPROTECTED)
			qp_fail(r, q, "its backup PD or CQ could not be created", 0);
		return false;
	}
	struct ibv_qp_init_attr init = {
		.send_cq = q->send_cq->bk,
		.recv_cq = q->recv_cq->bk,
		.cap = q->cap,
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = q->sq_sig_all,
	};
	init.cap.max_recv_wr += 1; /* SHIFT's control receive */
	/* SHIFT's handshake message and the empty READ that may precede it,
	 * a key mailbox's request and answer (shadow/mbox.h),
	 * share the send queue with every WR the application has outstanding
	 * (a queue of one WR, ibv_rc_pingpong's, would refuse the retransmit);
	 * a device at its limit gets the application's size alone */
	uint32_t room = shift_config.key_mailbox ? 4 : 2;

	init.cap.max_send_wr += room;
	errno = 0;
	q->bk = shift_lower->create_qp(q->pd->bk, &init);
	if (!q->bk) {
		init.cap.max_send_wr -= room;
		errno = 0;
		q->bk = shift_lower->create_qp(q->pd->bk, &init);
	}
	if (!q->bk) {
		qp_fail(r, q, "backup QP creation failed", errno ? errno : EIO);
		return false;
	}
	return true;
}

/* INIT, as soon as the application's QP has been through INIT */
static bool replay_qp_init(struct shift_rnic *r, struct shift_qp *q,
			   const struct ibv_qp_attr *app, int app_mask)
{
	if (q->bk_state == IBV_QPS_RESET &&
	    (app_mask & (IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) ==
		    (IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
		int rc = shift_qp_to_init(q->bk, app, bk_port(r, q));

		if (rc) {
			qp_fail(r, q, "backup QP to INIT failed", rc);
			return false;
		}
		q->bk_state = IBV_QPS_INIT;
	}
	return true;
}

/* What I publish: my default (GID, QPN) as the key, my backup QP's GID,
 * QPN, PSN and MTU as the value; and who the peer is. */
static bool replay_qp_describe(struct shift_rnic *r, struct shift_qp *q,
			       const struct ibv_qp_attr *app, int app_mask)
{
	struct ibv_port_attr pa;

	if (!app->ah_attr.is_global) {
		qp_fail(r, q, "the path has no GRH (InfiniBand LID routing is not supported)", 0);
		return false;
	}
	uint8_t port = app->ah_attr.port_num ? app->ah_attr.port_num :
		       q->attr.port_num ? q->attr.port_num : 1;
	int rc = shift_lower->query_gid(r->sctx->ibctx, port, app->ah_attr.grh.sgid_index,
					&q->my_key.gid);
	if (!rc)
		rc = shift_lower->query_gid(r->bk_ctx, bk_port(r, q), app->ah_attr.grh.sgid_index,
					    &q->my_bk.gid);
	if (rc) {
		qp_fail(r, q, "cannot read the GIDs", rc > 0 ? rc : EIO);
		return false;
	}
	rc = shift_lower->query_port(r->bk_ctx, bk_port(r, q), &pa);
	if (rc) {
		qp_fail(r, q, "cannot query the backup port", rc > 0 ? rc : EIO);
		return false;
	}
	q->my_key.qpn = q->app_qpn;
	q->my_bk.qpn = q->bk->qp_num;
	q->my_bk.psn = (uint32_t)(shift_clock_ms() * 2654435761u + q->bk->qp_num) & 0xffffff;
	q->my_bk.mtu = (app_mask & IBV_QP_PATH_MTU) && app->path_mtu < pa.active_mtu ?
			       app->path_mtu : pa.active_mtu;
	q->peer_key.gid = app->ah_attr.grh.dgid;
	q->peer_key.qpn = app->dest_qp_num;
	q->my_bk.has_peer = true; /* (my record names whom I connect to) */
	q->my_bk.peer = q->peer_key;
	q->my_bk.has_mri = true; /* (where the peer finds my MRs ahead) */
	q->my_bk.mri = r->mri_id;
	/* (where my episode records arrive) */
	q->my_bk.svc = shift_svc_qpn(r, SHIFT_SVC_BACKUP);
	q->my_bk.dsvc = shift_svc_qpn(r, SHIFT_SVC_DEFAULT);
	q->my_bk.has_svc = q->my_bk.svc || q->my_bk.dsvc;
	/* (where the peer asks me for a key the store cannot give: only on a
	 * backup that grants remote writes, as the application's QP does) */
	if (shift_config.key_mailbox && (app_mask & IBV_QP_ACCESS_FLAGS) &&
	    (app->qp_access_flags & IBV_ACCESS_REMOTE_WRITE))
		shift_mbox_attach(q);
	return true;
}

/* publish mine once the app told us who the peer is (RTR) */
static bool replay_qp_publish(struct shift_rnic *r, struct shift_qp *q,
			      const struct ibv_qp_attr *app, int app_mask)
{
	char key[SHIFT_EXCHANGE_KEY_MAX], val[SHIFT_EXCHANGE_VALUE_MAX];

	if (q->published || q->bk_state != IBV_QPS_INIT ||
	    (app_mask & (IBV_QP_AV | IBV_QP_DEST_QPN)) != (IBV_QP_AV | IBV_QP_DEST_QPN))
		return true;
	if (!replay_qp_describe(r, q, app, app_mask))
		return false;
	if (!r->kv)
		return false;
	int kl = shift_exchange_qp_key(&q->my_key, key, sizeof(key));
	int vl = shift_exchange_qp_encode(&q->my_bk, val, sizeof(val));
	if (kl < 0 || vl < 0) {
		qp_fail(r, q, "cannot encode the backup attributes", 0);
		return false;
	}
	if (!shift_shadow_kv_ok(r, shift_kv_put(r->kv, key, val, (size_t)vl, SHIFT_KV_TTL_MS),
				"put"))
		return false;
	q->published = true;
	q->waiting_since_ms = shift_clock_ms();
	/* MRs become findable under this GID too */
	if (gid_slot(r, &q->my_key.gid) < 0)
		shift_warn("%s: more than %d GIDs in use: MRs published under the first ones",
			   r->name, SHIFT_RNIC_MAX_GIDS);
	return true;
}

/* the peer's backup attributes: best effort, never blocking */
static bool replay_qp_peer(struct shift_rnic *r, struct shift_qp *q)
{
	char key[SHIFT_EXCHANGE_KEY_MAX];
	void *v = NULL;
	size_t vl = 0;

	if (!q->published || q->peer_known)
		return true;
	if (shift_exchange_qp_key(&q->peer_key, key, sizeof(key)) < 0)
		return false;
	int rc = shift_kv_get(r->kv, key, &v, &vl);
	if (!shift_shadow_kv_ok(r, rc, "get"))
		return false;
	if (rc == -ENOENT) {
		if (!q->warned_peer && shift_clock_ms() - q->waiting_since_ms > shift_config.peer_warn_ms) {
			q->warned_peer = true;
			shift_warn("%s: QP %u: the peer (QPN %u) has published no backup "
				   "after %d s (peer without SHIFT?): unprotected until it does",
				   r->name, q->app_qpn, q->peer_key.qpn,
				   shift_config.peer_warn_ms / 1000);
		}
		return false;
	}
	rc = shift_exchange_qp_decode(v, vl, &q->peer_bk);
	free(v);
	if (rc) {
		qp_fail(r, q, "the peer's backup attributes are malformed or of another version", EPROTO);
		return false;
	}
	if (q->peer_bk.has_peer && (q->peer_bk.peer.qpn != q->my_key.qpn ||
				    memcmp(&q->peer_bk.peer.gid, &q->my_key.gid, sizeof(union ibv_gid)))) {
		/* (a record of another connection under this key: an earlier
		 * job's, left in the namespace, or a forged one; the peer's own
		 * replaces it) */
		if (!q->warned_other) {
			q->warned_other = true;
			shift_warn("%s: QP %u: the peer's record (QPN %u) is for a connection to QPN "
				   "%u, not to this QP (an earlier job's?): ignored, waiting for the "
				   "peer's own", r->name, q->app_qpn, q->peer_key.qpn,
				   q->peer_bk.peer.qpn);
		}
		stat_add(&shift_shadow_counters.records_other, 1);
		return false;
	}
	q->peer_known = true;
	return true;
}

static bool replay_qp_rtr(struct shift_rnic *r, struct shift_qp *q,
			  const struct ibv_qp_attr *app, int app_mask)
{
	if (q->peer_known && q->bk_state == IBV_QPS_INIT) {
		struct ibv_ah_attr ah = bk_ah(r, q, app);

		int rc = shift_qp_to_rtr(q->bk, app, app_mask, &ah, bk_mtu(q), q->peer_bk.qpn,
					 q->peer_bk.psn);

		if (rc) {
			qp_fail(r, q, "backup QP to RTR failed", rc);
			return false;
		}
		q->bk_state = IBV_QPS_RTR;
		/* the peer's service channels, at the backup path and at the
		 * application's (its address handle as the application's QP) */
		q->svc_ah[SHIFT_SVC_BACKUP] = ah;
		q->svc_ah[SHIFT_SVC_DEFAULT] = app->ah_attr;
		q->svc_ok[SHIFT_SVC_BACKUP] = q->peer_bk.svc &&
					      shift_svc_peer(r, SHIFT_SVC_BACKUP, &ah);
		q->svc_ok[SHIFT_SVC_DEFAULT] = q->peer_bk.dsvc &&
					       shift_svc_peer(r, SHIFT_SVC_DEFAULT, &app->ah_attr);
	}
	return true;
}

/* RTS even if the application leaves its QP at RTR (a receive-only
 * perftest server): SHIFT sends its handshake from the backup QP */
static void replay_qp_rts(struct shift_rnic *r, struct shift_qp *q,
			  const struct ibv_qp_attr *app, int app_mask)
{
	if (q->bk_state != IBV_QPS_RTR)
		return;
	int rc = shift_qp_to_rts(q->bk, app, app_mask, q->my_bk.psn);

	if (rc) {
		qp_fail(r, q, "backup QP to RTS failed", rc);
		return;
	}
	q->bk_state = IBV_QPS_RTS;
	q->bk_access = SHIFT_QP_ACCESS(app->qp_access_flags);
	/* SHIFT's control receive heads the backup receive queue: the
	 * peer's one handshake message per failover consumes it */
	struct ibv_recv_wr rwr = { .wr_id = SHIFT_WRID_CTRL_RECV }, *bad;
	rc = ibv_post_recv(q->bk, &rwr, &bad);
	if (rc) {
		qp_fail(r, q, "cannot post the control receive", rc);
		return;
	}
	q->ctrl_posted = true;
	pthread_mutex_lock(&r->lock);
	/* (atomically: shift_shadow_state_of reads it unlocked) */
	__atomic_store_n(&q->state, SHIFT_SHADOW_READY, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&r->lock);
	stat_add(&shift_shadow_counters.qps_ready, 1);
	shift_info("%s: QP %u shadowed by %s QP %u (RTS; peer backup QP %u)", r->name,
		   q->app_qpn, r->bk_name, q->bk->qp_num, q->peer_bk.qpn);
}

/* The application changed its QP's remote access after the backup was
 * connected (RTS -> RTS): the backup grants the same, so a peer's READ or
 * atomic on it is refused or allowed as on the default QP. */
static void follow_access(struct shift_qp *q, const struct ibv_qp_attr *app)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS };

	a.qp_access_flags = SHIFT_QP_ACCESS(app->qp_access_flags);
	if (q->bk_state != IBV_QPS_RTS || (unsigned)a.qp_access_flags == q->bk_access)
		return;
	if (!shift_lower->modify_qp(q->bk, &a, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS))
		q->bk_access = a.qp_access_flags;
}

void shift_replay_qp(struct shift_rnic *r, struct shift_qp *q)
{
	pthread_mutex_lock(&r->lock);
	struct ibv_qp_attr app = q->attr;
	int app_mask = q->attr_mask;
	enum shift_shadow_state st = q->state;
	pthread_mutex_unlock(&r->lock);
	if (st == SHIFT_SHADOW_READY)
		follow_access(q, &app);
	if (st != SHIFT_SHADOW_PENDING)
		return;

	/* on a snapshot of what the application set: its own modify_qp
	 * may change the record meanwhile */
	if (!replay_qp_create(r, q) || !replay_qp_init(r, q, &app, app_mask) ||
	    !replay_qp_publish(r, q, &app, app_mask) || !replay_qp_peer(r, q) ||
	    !replay_qp_rtr(r, q, &app, app_mask))
		return;
	replay_qp_rts(r, q, &app, app_mask);
}

/*
 * Re-arm a backup QP after a failback (shift/fo/): its receive queue
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
	struct ibv_ah_attr ah = bk_ah(r, q, &app);

	if (shift_qp_reset(q->bk))
		return -1;
	q->bk_state = IBV_QPS_RESET;
	if (shift_qp_to_init(q->bk, &app, bk_port(r, q)))
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
	q->bk_access = SHIFT_QP_ACCESS(app.qp_access_flags);
	return 0;
}
