/*
 * The simulated network: worlds, hosts and devices, the seeded scheduler
 * that owns network time, fault injection and the trace hash.
 *
 * Time is a tick counter. Each sim_world_step() gathers the events enabled
 * now (a QP can transmit its next WQE; a QP's wire queue has a packet at its
 * head; a retransmit or RNR timer has expired), picks one with the world's
 * xorshift PRNG and runs it, then advances time by one tick. When nothing is
 * enabled, time jumps to the next timer deadline or scheduled fault. Every
 * event is mixed into an FNV-1a hash, so two runs agree on the hash exactly
 * when they agree on the trace.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "sim_int.h"

/* --- process-wide lower tables, one per host slot ----------------------- */

static struct sim_host *g_slot_host[SIM_MAX_HOSTS];
static struct shift_lower g_slot_table[SIM_MAX_HOSTS];

static struct ibv_device **sim_host_device_list(struct sim_host *h, int *num)
{
	struct ibv_device **list = calloc(h->ndev + 1, sizeof(*list));

	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	for (unsigned i = 0; i < h->ndev; i++)
		list[i] = &h->dev[i]->ibdev;
	if (num)
		*num = (int)h->ndev;
	return list;
}

#define SIM_SLOT_FN(n)                                                   \
	static struct ibv_device **sim_devlist_##n(int *num)             \
	{                                                                \
		if (!g_slot_host[n]) {                                   \
			errno = ENODEV;                                  \
			return NULL;                                     \
		}                                                        \
		return sim_host_device_list(g_slot_host[n], num);        \
	}
SIM_SLOT_FN(0) SIM_SLOT_FN(1) SIM_SLOT_FN(2) SIM_SLOT_FN(3)
SIM_SLOT_FN(4) SIM_SLOT_FN(5) SIM_SLOT_FN(6) SIM_SLOT_FN(7)
SIM_SLOT_FN(8) SIM_SLOT_FN(9) SIM_SLOT_FN(10) SIM_SLOT_FN(11)
SIM_SLOT_FN(12) SIM_SLOT_FN(13) SIM_SLOT_FN(14) SIM_SLOT_FN(15)

static struct ibv_device **(*const g_slot_fn[SIM_MAX_HOSTS])(int *) = {
	sim_devlist_0, sim_devlist_1, sim_devlist_2, sim_devlist_3,
	sim_devlist_4, sim_devlist_5, sim_devlist_6, sim_devlist_7,
	sim_devlist_8, sim_devlist_9, sim_devlist_10, sim_devlist_11,
	sim_devlist_12, sim_devlist_13, sim_devlist_14, sim_devlist_15,
};

/* The world-wide table: lists every device of the world it was last asked
 * for (one world at a time per process). */
static struct sim_world *g_world_listed;
static struct shift_lower g_world_table;

static struct ibv_device **sim_world_device_list(int *num)
{
	struct sim_world *w = g_world_listed;
	struct ibv_device **list;

	if (!w) {
		errno = ENODEV;
		return NULL;
	}
	list = calloc(w->ndevs + 1, sizeof(*list));
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	for (unsigned i = 0; i < w->ndevs; i++)
		list[i] = &w->devs[i]->ibdev;
	if (num)
		*num = (int)w->ndevs;
	return list;
}

const struct shift_lower *sim_lower_world(struct sim_world *w)
{
	g_world_listed = w;
	g_world_table = sim_lower_proto;
	g_world_table.get_device_list = sim_world_device_list;
	return &g_world_table;
}

const struct shift_lower *sim_lower(struct sim_host *h)
{
	return h->slot >= 0 ? &g_slot_table[h->slot] : NULL;
}

/* --- PRNG and trace ------------------------------------------------------ */

uint64_t sim_rand(struct sim_world *w)
{
	/* xorshift64* */
	uint64_t x = w->rng;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	w->rng = x;
	return x * 0x2545F4914F6CDD1DULL;
}

uint64_t sim_world_rand(struct sim_world *w)
{
	return sim_rand(w);
}

static void fnv_mix(uint64_t *h, uint64_t v)
{
	for (int i = 0; i < 8; i++) {
		*h ^= (uint8_t)(v >> (8 * i));
		*h *= 0x100000001b3ULL;
	}
}

void sim_trace(struct sim_world *w, uint32_t tag, uint64_t a, uint64_t b)
{
	fnv_mix(&w->hash, w->now);
	fnv_mix(&w->hash, tag);
	fnv_mix(&w->hash, a);
	fnv_mix(&w->hash, b);
	if (w->trace)
		fprintf(w->trace, "%8" PRIu64 " %-4.4s %#" PRIx64 " %#" PRIx64 "\n",
			w->now, (const char *)&tag, a, b);
}

void sim_trace_print(const struct sim_world *w, uint32_t tag, uint64_t a, uint64_t b)
{
	if (w->trace)
		fprintf(w->trace, "%8" PRIu64 " %-4.4s %#" PRIx64 " %#" PRIx64 "\n",
			w->now, (const char *)&tag, a, b);
}

void sim_world_note(struct sim_world *w, uint32_t tag, uint64_t a, uint64_t b)
{
	sim_trace(w, tag, a, b);
}

uint64_t sim_world_hash(const struct sim_world *w) { return w->hash; }
const struct sim_stats *sim_world_stats(const struct sim_world *w)
{
	return &w->stats;
}
void sim_world_set_trace(struct sim_world *w, FILE *f) { w->trace = f; }
uint64_t sim_world_now(const struct sim_world *w) { return w->now; }

/* Four-character trace tags, read as a little-endian word. */
#define TAG(s) ((uint32_t)(s)[0] | (uint32_t)(s)[1] << 8 | \
		(uint32_t)(s)[2] << 16 | (uint32_t)(s)[3] << 24)

/* --- world, hosts, devices ----------------------------------------------- */

void sim_world_set_rxe_stale_read(struct sim_world *w, int on)
{
	w->opts.rxe_stale_read = on;
}

void sim_world_set_refuse_posts_in_err(struct sim_world *w, int on)
{
	w->opts.refuse_posts_in_err = on;
}

void sim_world_set_mlx5(struct sim_world *w, int on)
{
	w->opts.mlx5 = on;
}

void sim_world_set_vendor(struct sim_world *w, uint32_t id, uint32_t part)
{
	w->opts.vendor_id = id;
	w->opts.vendor_part_id = part;
}

struct sim_world *sim_world_create(const struct sim_world_opts *opts)
{
	struct sim_world *w = calloc(1, sizeof(*w));

	if (!w)
		return NULL;
	if (opts)
		w->opts = *opts;
	if (!w->opts.timeout_ticks)
		w->opts.timeout_ticks = 4;
	if (!w->opts.rnr_ticks)
		w->opts.rnr_ticks = 2;
	w->rng = w->opts.seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
	if (!w->rng)
		w->rng = 1;
	w->hash = 0xcbf29ce484222325ULL;
	fnv_mix(&w->hash, w->opts.seed);
	return w;
}

struct sim_host *sim_host_create(struct sim_world *w, unsigned ndev)
{
	struct sim_host *h;

	if (w->nhosts >= SIM_MAX_HOSTS || ndev == 0 ||
	    ndev > SIM_MAX_DEVS_PER_HOST || w->ndevs + ndev > SIM_MAX_DEVS) {
		errno = EINVAL;
		return NULL;
	}
	h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	h->w = w;
	h->idx = w->nhosts;
	h->slot = -1;
	for (int s = 0; s < SIM_MAX_HOSTS; s++) {
		if (!g_slot_host[s]) {
			g_slot_host[s] = h;
			h->slot = s;
			g_slot_table[s] = sim_lower_proto;
			g_slot_table[s].get_device_list = g_slot_fn[s];
			break;
		}
	}
	if (h->slot < 0) {
		free(h);
		errno = ENOSPC;
		return NULL;
	}
	for (unsigned i = 0; i < ndev; i++) {
		struct sim_dev *d = calloc(1, sizeof(*d));

		if (!d)
			abort();
		d->w = w;
		d->host = h;
		d->gidx = w->ndevs;
		d->lidx = i;
		d->port_state = IBV_PORT_ACTIVE;
		d->die_after_exec = -1;
		d->lid = (uint16_t)(1 + d->gidx);
		d->guid = htobe64(0x5348494654000000ULL | (uint64_t)h->idx << 8 | i);
		d->ibdev.node_type = IBV_NODE_CA;
		d->ibdev.transport_type = IBV_TRANSPORT_IB;
		snprintf(d->ibdev.name, sizeof(d->ibdev.name), "sim%u_%u",
			 h->idx, i);
		snprintf(d->ibdev.dev_name, sizeof(d->ibdev.dev_name),
			 "uverbs%u", d->gidx);
		snprintf(d->ibdev.dev_path, sizeof(d->ibdev.dev_path),
			 "/sim/uverbs%u", d->gidx);
		snprintf(d->ibdev.ibdev_path, sizeof(d->ibdev.ibdev_path),
			 "/sim/%s", d->ibdev.name);
		/* index 0: fe80::<guid>; index 1: ::ffff:10.h.d.1 */
		d->gid[0].global.subnet_prefix = htobe64(0xfe80000000000000ULL);
		d->gid[0].global.interface_id = d->guid;
		d->gid[1].raw[10] = 0xff;
		d->gid[1].raw[11] = 0xff;
		d->gid[1].raw[12] = 10;
		d->gid[1].raw[13] = (uint8_t)h->idx;
		d->gid[1].raw[14] = (uint8_t)i;
		d->gid[1].raw[15] = 1;
		h->dev[i] = d;
		w->devs[w->ndevs++] = d;
	}
	h->ndev = ndev;
	w->hosts[w->nhosts++] = h;
	return h;
}

struct sim_dev *sim_host_dev(struct sim_host *h, unsigned i)
{
	return i < h->ndev ? h->dev[i] : NULL;
}
unsigned sim_host_index(const struct sim_host *h) { return h->idx; }
struct sim_world *sim_host_world(const struct sim_host *h) { return h->w; }
struct ibv_device *sim_dev_ibv(struct sim_dev *d) { return &d->ibdev; }
struct sim_host *sim_dev_host(const struct sim_dev *d) { return d->host; }
unsigned sim_dev_index(const struct sim_dev *d) { return d->lidx; }
const char *sim_dev_name(const struct sim_dev *d) { return d->ibdev.name; }

struct sim_dev *sim_dev_by_gid(struct sim_world *w, const union ibv_gid *g)
{
	for (unsigned i = 0; i < w->ndevs; i++)
		for (int k = 0; k < 2; k++)
			if (!memcmp(&w->devs[i]->gid[k], g, sizeof(*g)))
				return w->devs[i];
	return NULL;
}

struct sim_dev *sim_dev_by_lid(struct sim_world *w, uint16_t lid)
{
	return lid >= 1 && lid <= w->ndevs ? w->devs[lid - 1] : NULL;
}

void sim_world_destroy(struct sim_world *w)
{
	if (!w)
		return;
	for (unsigned i = 0; i < w->ndevs; i++) {
		struct sim_dev *d = w->devs[i];

		sim_ctx_free_all(d);
		free(d->mrs);
		free(d->qps);
		free(d);
	}
	for (unsigned i = 0; i < w->nhosts; i++) {
		if (w->hosts[i]->slot >= 0)
			g_slot_host[w->hosts[i]->slot] = NULL;
		free(w->hosts[i]);
	}
	if (g_world_listed == w)
		g_world_listed = NULL;
	free(w->evs);
	free(w);
}

void sim_world_add_qp(struct sim_world *w, struct sim_qp *qp)
{
	qp->wnext = NULL;
	qp->wprev = w->qps_tail;
	if (w->qps_tail)
		w->qps_tail->wnext = qp;
	else
		w->qps = qp;
	w->qps_tail = qp;
}

void sim_world_del_qp(struct sim_world *w, struct sim_qp *qp)
{
	if (qp->wprev)
		qp->wprev->wnext = qp->wnext;
	else
		w->qps = qp->wnext;
	if (qp->wnext)
		qp->wnext->wprev = qp->wprev;
	else
		w->qps_tail = qp->wprev;
}

/* --- faults -------------------------------------------------------------- */

bool sim_path_ok(struct sim_world *w, struct sim_dev *a, struct sim_dev *b)
{
	if (!a || !b)
		return false;
	if (a->port_state != IBV_PORT_ACTIVE || b->port_state != IBV_PORT_ACTIVE)
		return false;
	if (a->fatal || b->fatal)
		return false;
	return !w->cut[a->gidx][b->gidx];
}

int sim_dev_alive(const struct sim_dev *d)
{
	return d->port_state == IBV_PORT_ACTIVE && !d->fatal;
}

void sim_dev_kill(struct sim_dev *d, int fatal)
{
	struct sim_world *w = d->w;

	w->stats.faults++;
	sim_trace(w, TAG("KILL"), d->gidx, (uint64_t)fatal);
	d->die_after_exec = -1;
	if (d->port_state == IBV_PORT_ACTIVE) {
		d->port_state = IBV_PORT_DOWN;
		sim_dev_async(d, IBV_EVENT_PORT_ERR);
	}
	if (fatal && !d->fatal) {
		d->fatal = true;
		sim_dev_async(d, IBV_EVENT_DEVICE_FATAL);
		for (struct sim_qp *q = w->qps; q; q = q->wnext)
			if (q->dev == d && q->qp.state != IBV_QPS_RESET)
				sim_qp_to_err(q);
		for (unsigned k = 0; k < SIM_UD_QPS; k++)
			if (d->ud_qps[k] && d->ud_qps[k]->qp.state != IBV_QPS_RESET)
				sim_qp_to_err(d->ud_qps[k]);
	}
}

void sim_dev_revive(struct sim_dev *d)
{
	sim_trace(d->w, TAG("RVIV"), d->gidx, 0);
	d->fatal = false;
	d->die_after_exec = -1;
	if (d->port_state != IBV_PORT_ACTIVE) {
		d->port_state = IBV_PORT_ACTIVE;
		sim_dev_async(d, IBV_EVENT_PORT_ACTIVE);
	}
}

void sim_dev_kill_after_exec(struct sim_dev *d, unsigned n)
{
	sim_trace(d->w, TAG("KAEX"), d->gidx, n);
	d->die_after_exec = n ? (int)n : -1;
	if (!n)
		sim_dev_kill(d, 0);
}

void sim_link_cut(struct sim_dev *a, struct sim_dev *b)
{
	a->w->stats.faults++;
	sim_trace(a->w, TAG("CUT "), a->gidx, b->gidx);
	a->w->cut[a->gidx][b->gidx] = a->w->cut[b->gidx][a->gidx] = 1;
}

void sim_link_restore(struct sim_dev *a, struct sim_dev *b)
{
	sim_trace(a->w, TAG("REST"), a->gidx, b->gidx);
	a->w->cut[a->gidx][b->gidx] = a->w->cut[b->gidx][a->gidx] = 0;
}

void sim_qp_drop_next(struct ibv_qp *qp, int resp, unsigned n)
{
	struct sim_qp *q = (struct sim_qp *)qp;

	if (resp)
		q->drop_resp += n;
	else
		q->drop_req += n;
}

void sim_qp_inject_fatal(struct ibv_qp *qp)
{
	struct sim_qp *q = (struct sim_qp *)qp;

	q->dev->w->stats.faults++;
	sim_trace(q->dev->w, TAG("QPFT"), q->dev->gidx, qp->qp_num);
	sim_qp_to_err(q);
	sim_async(q->ctx, IBV_EVENT_QP_FATAL, qp, 0);
}

int sim_world_schedule_fault(struct sim_world *w, uint64_t at,
			     enum sim_fault_kind kind, struct sim_dev *a,
			     struct sim_dev *b, unsigned arg)
{
	unsigned i;

	if (w->ntimed >= SIM_MAX_TIMED || !a)
		return ENOSPC;
	/* keep sorted by time, insertion order among equals */
	for (i = w->ntimed; i > 0 && w->timed[i - 1].at > at; i--)
		w->timed[i] = w->timed[i - 1];
	w->timed[i] = (struct sim_timed){ at, kind, a, b, arg };
	w->ntimed++;
	return 0;
}

static void sim_apply_fault(struct sim_world *w)
{
	struct sim_timed t = w->timed[0];

	memmove(&w->timed[0], &w->timed[1], (w->ntimed - 1) * sizeof(t));
	w->ntimed--;
	switch (t.kind) {
	case SIM_FAULT_KILL: sim_dev_kill(t.a, (int)t.arg); break;
	case SIM_FAULT_REVIVE: sim_dev_revive(t.a); break;
	case SIM_FAULT_CUT: if (t.b) sim_link_cut(t.a, t.b); break;
	case SIM_FAULT_RESTORE: if (t.b) sim_link_restore(t.a, t.b); break;
	case SIM_FAULT_KILL_AFTER_EXEC: sim_dev_kill_after_exec(t.a, t.arg); break;
	}
}

/* --- scheduler ----------------------------------------------------------- */

enum { EV_TX, EV_DELIVER, EV_TIMEOUT, EV_RNR };

static void sim_ev_add(struct sim_world *w, unsigned *n, int type,
		       struct sim_qp *q)
{
	if (*n == w->evs_cap) {
		unsigned cap = w->evs_cap ? 2 * w->evs_cap : 64;
		void *p = realloc(w->evs, cap * sizeof(*w->evs));

		if (!p)
			abort();
		w->evs = p;
		w->evs_cap = cap;
	}
	w->evs[(*n)++] = (struct sim_ev){ (uint8_t)type, q };
}

int sim_world_step(struct sim_world *w)
{
	for (;;) {
		uint64_t next = UINT64_MAX;
		unsigned n = 0;

		if (w->ntimed && w->timed[0].at <= w->now) {
			sim_apply_fault(w);
			w->stats.steps++;
			return 1;
		}
		if (w->ntimed)
			next = w->timed[0].at;
		for (struct sim_qp *q = w->qps; q; q = q->wnext) {
			uint64_t dl;
			int t;

			if (q->out_count)
				sim_ev_add(w, &n, EV_DELIVER, q);
			if (sim_qp_can_tx(q))
				sim_ev_add(w, &n, EV_TX, q);
			t = sim_qp_timer_armed(q, &dl);
			if (!t)
				continue;
			if (dl <= w->now)
				sim_ev_add(w, &n, t == 1 ? EV_TIMEOUT : EV_RNR, q);
			else if (dl < next)
				next = dl;
		}
		if (!n) {
			if (next == UINT64_MAX)
				return 0;
			w->now = next;	/* idle: jump to the next deadline */
			continue;
		}
		struct sim_ev ev = w->evs[sim_rand(w) % n];

		switch (ev.type) {
		case EV_TX: sim_qp_tx(ev.qp); break;
		case EV_DELIVER: sim_qp_deliver(ev.qp); break;
		case EV_TIMEOUT: sim_qp_timeout(ev.qp); break;
		case EV_RNR: sim_qp_rnr_fire(ev.qp); break;
		}
		w->now++;
		w->stats.steps++;
		return 1;
	}
}

uint64_t sim_world_run(struct sim_world *w, uint64_t max_steps)
{
	uint64_t n = 0;

	while (n < max_steps && sim_world_step(w))
		n++;
	return n;
}
