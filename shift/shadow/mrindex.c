/*
 * MR indexes: every peer MR's backup key read ahead, before any failover
 * needs it (issue #19, item 1).
 *
 * A failover's WR names a peer rkey; its backup key is the peer's
 * mr:{GID}:<rkey> record, read by the background pass when the failover
 * wants it (fo/kvq.c). Keys the QP used before are read ahead there too;
 * a key of memory the application never addressed before the failure had
 * to come from the store at that moment, so with the store gone (killed,
 * restarted empty, dripping) such a WR failed after SHIFT_KV_WAIT_MS.
 *
 * Here each process publishes, under each of its default GIDs, the list of
 * the application rkeys it published MR records for (its MR index, in
 * chunks: shift_exchange_mri_*; the index's id is in its QP records), and
 * reads the indexes of the peers its QPs connect to, then the MR records
 * they list, on its RNIC's thread, every PM_PERIOD_MS. A failover finds a
 * key it has no record of in the cache of its peer
 * (shift_shadow_peer_mr()), as a key read before: used when the store
 * cannot give one now (fo/kvq.c). Everything read is bounded and
 * validated; the records are sealed like every other (kv_auth.c); what is
 * read is a backup key of the same peer process, checked against the
 * range of its MR as any other.
 *
 * Locks: the RNIC's lock only to walk its lists; pm_lock (a leaf, never
 * held across I/O or another lock's acquisition) guards a peer's entries
 * and every QP's pm, which failovers read from any thread.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "shift/base/log.h"
#include "shift/shadow/shadow_int.h"
#include "shift/shadow/types.h"
#include "kv/kv.h"

/* An index is read again PM_PERIOD_MS after it changed, then at twice
 * the last period while it does not, up to PM_PERIOD_MAX_MS (its chunk 0
 * only: one GET per peer; MRs are mostly registered as a job starts) */
#define PM_PERIOD_MS 5000
#define PM_PERIOD_MAX_MS 60000
#define PM_RETRY_MS 1000  /* after a failure, or an index not written yet */
#define PM_PEERS_MAX 4096 /* peer indexes one RNIC follows */
#define PM_MR_READS 4     /* MGETs of MR records per peer and pass */
#define PM_KEYS_MAX (SHIFT_MRI_CHUNK_KEYS * SHIFT_MRI_CHUNKS)

struct shift_peer_mr {
	uint32_t app;
	struct shift_mr_value v;
};

struct shift_peer_mrs {
	union ibv_gid gid;   /* the peer's default GID ... */
	uint64_t id;         /* ... and its index there */
	uint64_t ver;        /* (thread) the version taken, if have */
	bool have, warned;   /* (thread) */
	bool used;           /* (thread) a QP of this pass connects to it */
	uint64_t next_ms;    /* (thread) next index read */
	uint64_t period_ms;  /* (thread) the last wait between two reads */
	uint32_t *todo;      /* (thread) listed, not read yet */
	unsigned ntodo;
	struct shift_peer_mr *e; /* (pm_lock) sorted by app */
	unsigned n;
};

static pthread_mutex_t pm_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- my index ---------------------------------------------------------------- */

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* The rkeys published under gid slot i (r->lock taken here), sorted. */
static uint32_t *my_keys(struct shift_rnic *r, int i, unsigned *n)
{
	unsigned cap = 0;
	uint32_t *k = NULL;

	*n = 0;
	pthread_mutex_lock(&r->lock);
	for (struct shift_mr *m = r->mrs; m; m = m->next) {
		if (m->dead || !(m->published & (1u << i)))
			continue;
		if (*n == cap) {
			uint32_t *nk = realloc(k, (cap = cap ? 2 * cap : 64) * sizeof(*k));

			if (!nk)
				break;
			k = nk;
		}
		k[(*n)++] = m->app_rkey;
	}
	pthread_mutex_unlock(&r->lock);
	if (*n)
		qsort(k, *n, sizeof(*k), cmp_u32);
	return k;
}

/* Write slot i's index at version ver: chunk 0 last, then the chunks the
 * previous one had beyond the new count removed. False on a KV failure. */
static bool write_index(struct shift_rnic *r, int i, uint64_t ver)
{
	char key[SHIFT_EXCHANGE_KEY_MAX], val[SHIFT_MRI_VALUE_MAX];
	struct shift_mri_chunk c = { .ver = ver };
	unsigned n;
	uint32_t *k = my_keys(r, i, &n);

	if (n > PM_KEYS_MAX) {
		if (!r->mri_warned)
			shift_warn("%s: %u MRs: peers read ahead the backup keys of the first "
				   "%u only (the others are read when a failover needs them)",
				   r->name, n, PM_KEYS_MAX);
		r->mri_warned = true;
		n = PM_KEYS_MAX;
	}
	c.chunks = n ? (n + SHIFT_MRI_CHUNK_KEYS - 1) / SHIFT_MRI_CHUNK_KEYS : 1;
	bool ok = true;

	for (unsigned ch = c.chunks; ok && ch-- > 0;) {
		c.n = n - ch * SHIFT_MRI_CHUNK_KEYS;
		if (c.n > SHIFT_MRI_CHUNK_KEYS)
			c.n = SHIFT_MRI_CHUNK_KEYS;
		if (c.n) /* (k is NULL when there are none) */
			memcpy(c.keys, k + ch * SHIFT_MRI_CHUNK_KEYS, c.n * sizeof(*k));
		int kl = shift_exchange_mri_key(&r->gids[i], r->mri_id, ch, key, sizeof(key));
		int vl = shift_exchange_mri_encode(&c, val, sizeof(val));

		ok = kl < 0 || vl < 0 ||
		     shift_shadow_kv_ok(r, shift_kv_put(r->kv, key, val, (size_t)vl,
							SHIFT_KV_TTL_MS), "put");
	}
	free(k);
	for (unsigned ch = c.chunks; ok && ch < r->mri_chunks[i]; ch++)
		if (shift_exchange_mri_key(&r->gids[i], r->mri_id, ch, key, sizeof(key)) >= 0)
			ok = shift_shadow_kv_ok(r, shift_kv_delete(r->kv, key), "delete");
	if (ok)
		r->mri_chunks[i] = c.chunks;
	shift_debug("%s: my MR index %016llx, version %llu: %u keys in %u chunks%s", r->name,
		    (unsigned long long)r->mri_id, (unsigned long long)ver, n, c.chunks,
		    ok ? "" : " (not written)");
	return ok;
}

void shift_mri_write(struct shift_rnic *r)
{
	if (!r->kv || !r->mri_dirty)
		return;
	uint64_t ver = r->mri_ver + 1;

	for (int i = 0; i < r->ngids; i++)
		if (!write_index(r, i, ver))
			return; /* (all again at the next pass) */
	r->mri_ver = ver;
	r->mri_dirty = false;
}

/* ---- the peers' indexes ---------------------------------------------------- */

static struct shift_peer_mrs *peer_get(struct shift_rnic *r, const union ibv_gid *gid,
				       uint64_t id)
{
	for (unsigned i = 0; i < r->npeers; i++)
		if (r->peers[i]->id == id && !memcmp(&r->peers[i]->gid, gid, sizeof(*gid)))
			return r->peers[i];
	if (r->npeers == PM_PEERS_MAX || (r->npeers & (r->npeers - 1)) == 0) {
		size_t cap = r->npeers ? 2u * r->npeers : 1;
		struct shift_peer_mrs **np;

		if (r->npeers == PM_PEERS_MAX || !(np = realloc(r->peers, cap * sizeof(*np))))
			return NULL;
		r->peers = np;
	}
	struct shift_peer_mrs *p = calloc(1, sizeof(*p));

	if (p) {
		p->gid = *gid;
		p->id = id;
		r->peers[r->npeers++] = p;
	}
	return p;
}

/* Which peers this RNIC's QPs connect to (their pm set), marked used. */
static void peers_of_qps(struct shift_rnic *r)
{
	for (unsigned i = 0; i < r->npeers; i++)
		r->peers[i]->used = false;
	pthread_mutex_lock(&r->lock);
	for (struct shift_qp *q = r->qps; q; q = q->next) {
		if (q->dead || !q->peer_known || !q->peer_bk.has_mri)
			continue;
		struct shift_peer_mrs *p = q->pm;

		if (!p || p->id != q->peer_bk.mri ||
		    memcmp(&p->gid, &q->peer_key.gid, sizeof(p->gid))) {
			p = peer_get(r, &q->peer_key.gid, q->peer_bk.mri);
			pthread_mutex_lock(&pm_lock);
			q->pm = p;
			pthread_mutex_unlock(&pm_lock);
		}
		if (p)
			p->used = true;
	}
	pthread_mutex_unlock(&r->lock);
}

/* One MGET of keys[0..n) into chunks[0..n); -errno of the command, or
 * -EINVAL if a chunk is absent, malformed or of another version than ver
 * (an index being rewritten: read again later). */
static int read_chunks(struct shift_rnic *r, char (*keys)[SHIFT_EXCHANGE_KEY_MAX], size_t n,
		       struct shift_mri_chunk *chunks, uint64_t ver, unsigned total)
{
	const char *kp[SHIFT_KV_MGET_MAX];
	void *v[SHIFT_KV_MGET_MAX];
	size_t len[SHIFT_KV_MGET_MAX];
	int bad = 0;

	for (size_t i = 0; i < n; i++)
		kp[i] = keys[i];
	int rc = shift_kv_mget(r->kv, kp, n, v, len);

	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++) {
		if (!v[i] || shift_exchange_mri_decode(v[i], len[i], &chunks[i]) ||
		    chunks[i].ver != ver || chunks[i].chunks != total)
			bad = -EINVAL;
		free(v[i]);
	}
	return bad;
}

/* Take the listed keys (sorted, unique) as p's: entries no longer listed
 * dropped, those not read yet to do. */
static void take_list(struct shift_peer_mrs *p, const uint32_t *k, unsigned n)
{
	struct shift_peer_mr *keep = malloc((n ? n : 1) * sizeof(*keep));
	uint32_t *todo = malloc((n ? n : 1) * sizeof(*todo));
	unsigned nk = 0, nt = 0, j = 0;

	if (!keep || !todo) {
		free(keep);
		free(todo);
		return;
	}
	pthread_mutex_lock(&pm_lock);
	for (unsigned i = 0; i < n; i++) {
		while (j < p->n && p->e[j].app < k[i])
			j++;
		if (j < p->n && p->e[j].app == k[i])
			keep[nk++] = p->e[j];
		else
			todo[nt++] = k[i];
	}
	struct shift_peer_mr *old = p->e;

	p->e = keep;
	p->n = nk;
	pthread_mutex_unlock(&pm_lock);
	free(old);
	free(p->todo);
	p->todo = todo;
	p->ntodo = nt;
}

/* An index's chunks being read (malloc'd: RNIC threads run at once). */
struct index_buf {
	char keys[SHIFT_MRI_CHUNKS][SHIFT_EXCHANGE_KEY_MAX];
	struct shift_mri_chunk chunks[SHIFT_MRI_CHUNKS];
	uint32_t all[PM_KEYS_MAX];
};

/* The rest of an index whose chunk 0 is b->chunks[0]; then its keys taken. */
static int read_rest(struct shift_rnic *r, struct shift_peer_mrs *p, struct index_buf *b)
{
	unsigned total = b->chunks[0].chunks, n = 0, u = 0;
	int rc;

	for (unsigned ch = 1; ch < total; ch++)
		if (shift_exchange_mri_key(&p->gid, p->id, ch, b->keys[ch], sizeof(b->keys[ch])) < 0)
			return -EINVAL;
	if (total > 1 && (rc = read_chunks(r, b->keys + 1, total - 1, b->chunks + 1,
					   b->chunks[0].ver, total)))
		return rc;
	for (unsigned ch = 0; ch < total; ch++) {
		memcpy(b->all + n, b->chunks[ch].keys, b->chunks[ch].n * sizeof(*b->all));
		n += b->chunks[ch].n;
	}
	qsort(b->all, n, sizeof(*b->all), cmp_u32);
	for (unsigned i = 0; i < n; i++)
		if (!u || b->all[i] != b->all[u - 1])
			b->all[u++] = b->all[i];
	take_list(p, b->all, u);
	shift_debug("%s: the peer's MR index %016llx, version %llu: %u keys, %u to read",
		    r->name, (unsigned long long)p->id, (unsigned long long)b->chunks[0].ver, u,
		    p->ntodo);
	p->ver = b->chunks[0].ver;
	p->have = true;
	return 0;
}

/* The peer's index, if its version changed: 0 (read), 1 (unchanged),
 * -ENOENT (none yet), -EINVAL (malformed), or the store's error. */
static int read_index(struct shift_rnic *r, struct shift_peer_mrs *p)
{
	char key[SHIFT_EXCHANGE_KEY_MAX];
	struct shift_mri_chunk c0;
	void *v = NULL;
	size_t len = 0;

	if (shift_exchange_mri_key(&p->gid, p->id, 0, key, sizeof(key)) < 0)
		return -EINVAL;
	int rc = shift_kv_get(r->kv, key, &v, &len);

	if (rc)
		return rc;
	rc = shift_exchange_mri_decode(v, len, &c0);
	free(v);
	if (rc || (p->have && c0.ver == p->ver))
		return rc ? rc : 1;
	struct index_buf *b = malloc(sizeof(*b));

	if (!b)
		return -ENOMEM;
	b->chunks[0] = c0;
	rc = read_rest(r, p, b);
	free(b);
	return rc;
}

static int cmp_entry(const void *a, const void *b)
{
	return cmp_u32(&((const struct shift_peer_mr *)a)->app,
		       &((const struct shift_peer_mr *)b)->app);
}

/* Merge the n entries read (any order) into p's. */
static void merge(struct shift_peer_mrs *p, struct shift_peer_mr *add, unsigned n)
{
	qsort(add, n, sizeof(*add), cmp_entry);
	struct shift_peer_mr *m;

	pthread_mutex_lock(&pm_lock);
	m = malloc(((size_t)p->n + n) * sizeof(*m));
	if (m) {
		unsigned i = 0, j = 0, k = 0;

		while (i < p->n || j < n)
			m[k++] = j == n || (i < p->n && p->e[i].app < add[j].app) ? p->e[i++] :
										     add[j++];
		free(p->e);
		p->e = m;
		p->n = k;
	}
	pthread_mutex_unlock(&pm_lock);
}

/* Up to one MGET of the MR records p lists and has not read. */
static int read_records(struct shift_rnic *r, struct shift_peer_mrs *p)
{
	struct {
		char keys[SHIFT_KV_MGET_MAX][SHIFT_EXCHANGE_KEY_MAX];
		const char *kp[SHIFT_KV_MGET_MAX];
		void *v[SHIFT_KV_MGET_MAX];
		size_t len[SHIFT_KV_MGET_MAX];
		struct shift_peer_mr add[SHIFT_KV_MGET_MAX];
	} *b = malloc(sizeof(*b));
	size_t n = p->ntodo < SHIFT_KV_MGET_MAX ? p->ntodo : SHIFT_KV_MGET_MAX;
	const uint32_t *k = p->todo + p->ntodo - n;
	unsigned na = 0;
	int rc = b ? 0 : -ENOMEM;

	for (size_t i = 0; !rc && i < n; i++) {
		rc = shift_exchange_mr_key(&p->gid, k[i], b->keys[i], sizeof(b->keys[i])) < 0 ?
			     -EINVAL : 0;
		b->kp[i] = b->keys[i];
	}
	if (!rc)
		rc = shift_kv_mget(r->kv, b->kp, n, b->v, b->len);
	for (size_t i = 0; !rc && i < n; i++) {
		/* (absent: expired or deleted since; not read again until
		 * listed anew) */
		if (b->v[i] && !shift_exchange_mr_decode(b->v[i], b->len[i], &b->add[na].v))
			b->add[na++].app = k[i];
		free(b->v[i]);
	}
	if (!rc) {
		p->ntodo -= (unsigned)n;
		merge(p, b->add, na);
		stat_add(&shift_shadow_counters.peer_mrs_read, na);
	}
	free(b);
	return rc;
}

/* One peer's share of a pass: its index if due, then records. 1 if it
 * had nothing to read. */
static int read_peer(struct shift_rnic *r, struct shift_peer_mrs *p, uint64_t now)
{
	int rc = 1;

	if (now >= p->next_ms) {
		rc = read_index(r, p);
		p->period_ms = rc < 0 ? PM_RETRY_MS :
			       rc == 0 || p->period_ms < PM_PERIOD_MS ? PM_PERIOD_MS :
			       p->period_ms * 2 < PM_PERIOD_MAX_MS ? p->period_ms * 2 : PM_PERIOD_MAX_MS;
		p->next_ms = now + p->period_ms;
		if (rc == -EINVAL)
			stat_add(&shift_shadow_counters.peer_mri_bad, 1);
		if (rc == -EINVAL && !p->warned) {
			p->warned = true;
			shift_warn("%s: a peer's MR index (%016llx) is malformed or incomplete: "
				   "read again later, its keys read when a failover needs them",
				   r->name, (unsigned long long)p->id);
		}
		if (rc == -ENOENT || rc == -EINVAL || rc == 1)
			rc = 0; /* (the store answered) */
	}
	for (int k = 0; rc >= 0 && p->ntodo && k < PM_MR_READS; k++)
		rc = read_records(r, p);
	return rc;
}

void shift_mri_read(struct shift_rnic *r)
{
	uint64_t now = shift_clock_ms();

	if (!r->kv || now < r->peers_io_at)
		return;
	peers_of_qps(r);
	for (unsigned i = 0; i < r->npeers; i++) {
		struct shift_peer_mrs *p = r->peers[i];

		int rc = p->used ? read_peer(r, p, now) : 1;

		/* (the store's answer, when it was asked) */
		if (rc <= 0 && !shift_shadow_kv_ok(r, rc, "get")) {
			/* (one deadline per pass at most: the rest later) */
			r->peers_io_at = now + PM_RETRY_MS;
			return;
		}
	}
}

void shift_mri_free(struct shift_rnic *r)
{
	for (unsigned i = 0; i < r->npeers; i++) {
		free(r->peers[i]->e);
		free(r->peers[i]->todo);
		free(r->peers[i]);
	}
	free(r->peers);
	r->peers = NULL;
	r->npeers = 0;
}

unsigned shift_mri_peer_keys(struct shift_qp *q)
{
	pthread_mutex_lock(&pm_lock);
	unsigned n = q->pm ? q->pm->n : 0;

	pthread_mutex_unlock(&pm_lock);
	return n;
}

bool shift_shadow_peer_mr(struct shift_qp *q, uint32_t app_rkey, struct shift_mr_value *out)
{
	const struct shift_peer_mr key = { .app = app_rkey }, *e = NULL;

	pthread_mutex_lock(&pm_lock);
	if (q->pm && q->pm->n)
		e = bsearch(&key, q->pm->e, q->pm->n, sizeof(*e), cmp_entry);
	if (e)
		*out = e->v;
	pthread_mutex_unlock(&pm_lock);
	return e != NULL;
}
