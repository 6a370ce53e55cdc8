/*
 * The poke read: each process reads the poke keys of its contexts' default
 * GIDs every SHIFT_POKE_MS; a change has the Default-state QPs on that GID
 * read their peers' records, and those whose peer started a failover they
 * never saw follow it.
 */
#include "shift/fo/fo_int.h"

/*
 * The peers' records of the Default-state QPs ds[0..n), in one KV read
 * (every QP on a poked GID reads its record): those whose peer started a
 * failover they never saw follow it at a later pass (fo_join_peer()), once a
 * poll already inside the fast path has finished; polls go to the slow
 * path from now.
 */
static void poke_check(struct shift_ctx *s, struct shift_dqp **ds, size_t n, uint64_t now)
{
	bool got[SHIFT_KV_MGET_MAX];

	if (fo_ep_mget(s, ds, n, got))
		return;
	for (size_t k = 0; k < n; k++) {
		if (!got[k] || ds[k]->peer_started <= ds[k]->failovers)
			continue;
		ds[k]->peer_join_ms = now;
		__atomic_store_n(&ds[k]->peer_join, true, __ATOMIC_RELEASE);
		shift_ctx_set_slow(s, true);
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
	if (shift_kv_mget(r->kv, kp, (size_t)s->npoke, v, len))
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
	struct shift_dqp *ds[SHIFT_KV_MGET_MAX];
	size_t n = 0;

	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *d = shift_dqp_first(s, i); d;
		     d = shift_dqp_next(d)) {
			int k;

			if (!d->scq || !d->shadow || d->send_state != SHIFT_SEND_DEFAULT ||
			    d->recv_state != SHIFT_RECV_DEFAULT || d->need_rearm || d->peer_join)
				continue;
			k = poke_slot(s, &d->shadow->my_key.gid);
			if (k < 0 || !changed[k])
				continue;
			ds[n++] = d;
			if (n == SHIFT_KV_MGET_MAX) {
				poke_check(s, ds, n, now);
				n = 0;
			}
		}
	}
	if (n)
		poke_check(s, ds, n, now);
}
