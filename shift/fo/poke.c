/*
 * The poke read: each process reads the poke keys of its contexts' default
 * GIDs every SHIFT_POKE_MS; a change has the Default-state QPs on that GID
 * read their peers' records, and those whose peer started a failover they
 * never saw follow it. The others that failed over before read their own
 * record too and put it again if the store lost it: the poker may wait on
 * it (fo/work.c). One back on the default QP with its backup not reset
 * (need_rearm) joins nothing: it only puts its record again.
 */
#include "shift/fo/fo_int.h"

/*
 * The peers' records of the Default-state QPs ds[0..n), in one KV read
 * (every QP on a poked GID reads its record): those whose peer started a
 * failover they never saw follow it at a later pass (fo_join_peer()), once a
 * poll already inside the fast path has finished; polls go to the slow
 * path from now.
 */
/* A QP the check reads for, as collected (identified again after the
 * read by QPN and serial: slow_lock is dropped around it). */
struct poke_qp {
	struct shift_dqp *d;
	uint64_t serial;
	uint32_t qpn;
};

/* The KV read of keys[0..n) with slow_lock dropped (the background pass
 * holds it; the slow poll of the application must not wait for the store). */
static int mget_unlocked(struct shift_ctx *s, const char *const *kp, size_t n, void **v,
			 size_t *len)
{
	pthread_mutex_unlock(&s->slow_lock);
	int rc = shift_kv_mget(s->rnic->kv, kp, n, v, len);

	pthread_mutex_lock(&s->slow_lock);
	return rc;
}

/* Is d's record in the store (as read: v, len) not the one it last put?
 * (rk_lock) */
static bool mine_lost(struct shift_dqp *d, const void *v, size_t len)
{
	pthread_mutex_lock(&d->rk_lock);
	bool lost = !v || len != d->ep_pub.len || memcmp(v, d->ep_pub.val, len);

	pthread_mutex_unlock(&d->rk_lock);
	return lost;
}

static void poke_check(struct shift_ctx *s, const struct poke_qp *qs, size_t n)
{
	char keys[2][SHIFT_KV_MGET_MAX][SHIFT_EXCHANGE_KEY_MAX];
	const char *kp[2][SHIFT_KV_MGET_MAX];
	void *v[2][SHIFT_KV_MGET_MAX];
	size_t len[2][SHIFT_KV_MGET_MAX];

	/* the peers' records, and mine (put again if the store lost them) */
	for (size_t k = 0; k < n; k++) {
		struct shift_dqp *d = fo_dqp_again(s, qs[k].d, qs[k].qpn, qs[k].serial);

		/* (gone since it was collected: an earlier check dropped the
		 * lock; its key is then never there) */
		if (!d || shift_exchange_ep_key(&d->shadow->peer_key, keys[0][k], sizeof(keys[0][k])) < 0 ||
		    shift_exchange_ep_key(&d->shadow->my_key, keys[1][k], sizeof(keys[1][k])) < 0)
			keys[0][k][0] = keys[1][k][0] = '\0';
		kp[0][k] = keys[0][k];
		kp[1][k] = keys[1][k];
	}
	int rc = mget_unlocked(s, kp[0], n, v[0], len[0]);
	bool mine = !rc && !mget_unlocked(s, kp[1], n, v[1], len[1]);

	if (!mine)
		memset(v[1], 0, sizeof(v[1][0]) * n); /* (mine unknown: none put) */
	__atomic_fetch_add(&shift_stats.ep_read_commands, 1u + mine, __ATOMIC_RELAXED);
	__atomic_fetch_add(&shift_stats.ep_records_read, n * (1u + mine), __ATOMIC_RELAXED);
	for (size_t k = 0; k < n; k++) {
		struct shift_dqp *d = fo_dqp_again(s, qs[k].d, qs[k].qpn, qs[k].serial);

		if (!rc && d && d->scq) {
			fo_lock_cqs(d);
			if (keys[0][k][0] && !d->need_rearm && fo_ep_take(d, v[0][k], len[0][k]) &&
			    d->peer_started > d->failovers) {
				__atomic_store_n(&d->peer_join, true, __ATOMIC_RELEASE);
				shift_ctx_set_slow(s, true);
			} else if (mine && d->failovers && keys[1][k][0] &&
				   mine_lost(d, v[1][k], len[1][k])) {
				/* (the poker may wait on my record, which the
				 * store lost: put again; fo/work.c) */
				fo_ep_publish(s, d);
			}
			fo_unlock_cqs(d);
		}
		free(v[0][k]); /* (NULL after a failed read) */
		free(v[1][k]);
	}
}

/* The context's poke slot of a default GID, or -1. */
static int poke_slot(const struct shift_ctx *s, const union ibv_gid *gid)
{
	for (int k = 0; k < s->npoke; k++)
		if (!memcmp(&s->poke[k].gid, gid, sizeof(*gid)))
			return k;
	return -1;
}

/*
 * The poke read (see fo_unjoined()): the values under the poke keys of the
 * context's default GIDs; a changed one (or the first read) has the
 * Default-state QPs on that GID read their peers' records, and those whose
 * peer started a failover they never saw follow it (fo_join_peer()).
 */
void fo_poke_read(struct shift_ctx *s, uint64_t now)
{
	struct shift_rnic *r = s->rnic;
	char keys[SHIFT_POKE_GIDS][SHIFT_EXCHANGE_KEY_MAX];
	const char *kp[SHIFT_POKE_GIDS];
	void *v[SHIFT_POKE_GIDS];
	size_t len[SHIFT_POKE_GIDS];
	bool changed[SHIFT_POKE_GIDS] = { false };
	bool any = false;

	if (!r || !r->kv || !shift_config.poke_ms || now < s->poke_at)
		return;
	s->poke_at = now + shift_config.poke_ms;
	/* the GIDs: those of the protected QPs (few per context) */
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *d = shift_dqp_first(s, i); d;
		     d = shift_dqp_next(d)) {
			if (!d->scq || !d->shadow || poke_slot(s, &d->shadow->my_key.gid) >= 0 ||
			    s->npoke == SHIFT_POKE_GIDS)
				continue;
			s->poke[s->npoke].gid = d->shadow->my_key.gid;
			s->poke[s->npoke++].read = false;
		}
	}
	if (!s->npoke)
		return;
	for (int k = 0; k < s->npoke; k++) {
		if (shift_exchange_poke_key(&s->poke[k].gid, keys[k], sizeof(keys[k])) < 0)
			return;
		kp[k] = keys[k];
	}
	if (mget_unlocked(s, kp, (size_t)s->npoke, v, len))
		return;
	for (int k = 0; k < s->npoke; k++) {
		char now_seen[sizeof(s->poke[k].seen)] = "";

		if (v[k])
			snprintf(now_seen, sizeof(now_seen), "%.*s", (int)len[k], (char *)v[k]);
		free(v[k]);
		if (s->poke[k].read && !strcmp(now_seen, s->poke[k].seen))
			continue;
		/* (a first read looks too: a poke may predate this process's
		 * first look, never one before its QPs existed) */
		changed[k] = v[k] != NULL || s->poke[k].read;
		any |= changed[k];
		s->poke[k].read = true;
		memcpy(s->poke[k].seen, now_seen, sizeof(now_seen));
	}
	if (!any)
		return;
	/* (collected first: the checks drop slow_lock) */
	struct poke_qp *qs = NULL;
	size_t n = 0, cap = 0;

	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *d = shift_dqp_first(s, i); d;
		     d = shift_dqp_next(d)) {
			int k;

			if (!d->scq || !d->shadow || shift_dqp_send_state(d) != SHIFT_SEND_DEFAULT ||
			    shift_dqp_recv_state(d) != SHIFT_RECV_DEFAULT || d->peer_join)
				continue;
			k = poke_slot(s, &d->shadow->my_key.gid);
			if (k < 0 || !changed[k])
				continue;
			if (n == cap) {
				size_t c2 = cap ? 2 * cap : 64;
				struct poke_qp *q2 = realloc(qs, c2 * sizeof(*q2));

				if (!q2)
					break; /* (the rest at the next poke) */
				qs = q2;
				cap = c2;
			}
			qs[n++] = (struct poke_qp){ .d = d, .serial = d->serial, .qpn = d->qpn };
		}
	}
	for (size_t at = 0; at < n; at += SHIFT_KV_MGET_MAX)
		poke_check(s, qs + at, n - at < SHIFT_KV_MGET_MAX ? n - at : SHIFT_KV_MGET_MAX);
	free(qs);
}
