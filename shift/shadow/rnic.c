/*
 * The per-RNIC side of shadowing (see shadow.h): shift_rnic_start when the
 * application opens a device, shift_rnic_stop when it closes it, and in
 * between one background thread per RNIC that opens the backup NIC and the
 * KV store, then runs the replay pass (replay.c) whenever the application's
 * control verbs kicked it (a burst of them coalesced into one pass), and
 * periodically: soon while replay is pending, often while a QP is failed
 * over, else at SHIFT_IDLE_MS, and at once on port events and backup
 * completions (portev.c). In synchronous mode
 * (shift_config.inline_passes: tests, the campaign) there is no thread:
 * the caller runs the passes (shift_rnic_pass, shift_rnic_pass_all).
 *
 * Exit and fork. At exit() (shadow_atexit, registered with the first
 * thread) every thread is stopped and joined before the RNICs' KV keys are
 * deleted; whatever runs later (a destructor closing a device) finds no
 * thread. fork() waits until no thread is inside a pass (r->busy), so the
 * child inherits no lock a thread held, SHIFT's or the libraries' below;
 * the child has none of the threads, and its RNICs are its parent's: the
 * child drops them (shift_shadow_fork_child) and never joins, reaps,
 * deletes keys or writes status for them. What the child opens itself is
 * shadowed as in any process.
 *
 * Nothing here may hurt the application: no backup NIC, an invalid KV URL,
 * a thread that cannot start turn the whole RNIC unprotected, with one log
 * line, and the application keeps running on its default NIC.
 */
#include "shift/shadow/shadow_int.h"
#include "shift/shadow/backup.h"
#include "shift/shadow/svc.h"
#include "shift/base/config.h"
#include "shift/base/log.h"
#include "shift/base/lower.h"
#include "shift/base/prefault.h"
#include "shift/dp/ctx.h"
#include "kv/kv.h"
#include "providers/provider.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

/* How soon the thread runs its next pass unkicked (rnic_main): replay
 * pending, a QP failed over; with nothing to do, SHIFT_IDLE_MS. */
#define SHIFT_PASS_PERIOD_MS 50
#define SHIFT_FO_PERIOD_MS 10
#define SHIFT_IDLE_MIN_MS 10 /* (SHIFT_IDLE_MS's least) */
/* replay waits for SHIFT_COALESCE_MS without new control verbs (at most
 * SHIFT_COALESCE_ROUNDS times) before it runs */
#define SHIFT_COALESCE_MS 10
#define SHIFT_COALESCE_ROUNDS 20

/* The live RNICs, for pass_all, the exit handler and fork; the ones a
 * forked child inherited are kept apart (never freed: they are its
 * parent's). */
static pthread_mutex_t rnics_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shift_rnic *rnics, *inherited;

/* (synchronous mode: the caller's own thread runs every pass, so no RNIC
 * is stopped meanwhile) */
void shift_rnic_pass_all(void)
{
	pthread_mutex_lock(&rnics_lock);
	struct shift_rnic *r = rnics;
	pthread_mutex_unlock(&rnics_lock);
	for (; r; r = r->next_rnic)
		shift_rnic_pass(r);
}

/* ---- the RNIC's thread ------------------------------------------------- */

static void rnic_unprotected(struct shift_rnic *r, const char *why)
{
	pthread_mutex_lock(&r->lock);
	r->unprotected = true;
	r->why = why;
	for (struct shift_qp *q = r->qps; q; q = q->next)
		shift_qp_unprotected_locked(q, why);
	pthread_mutex_unlock(&r->lock);
	shift_warn("%s: running unprotected: %s", r->name, why);
}

/* Every port of ctx (link layer, ACTIVE) into c. */
static void backup_describe(struct ibv_context *ctx, struct shift_backup_cand *c)
{
	struct ibv_device_attr da;
	int n = 1;

	if (!shift_lower->query_device(ctx, &da) && da.phys_port_cnt > 0)
		n = da.phys_port_cnt;
	if (n > SHIFT_BACKUP_MAX_PORTS)
		n = SHIFT_BACKUP_MAX_PORTS;
	for (int p = 0; p < n; p++) {
		struct ibv_port_attr pa;

		if (shift_lower->query_port(ctx, (uint8_t)(p + 1), &pa))
			continue;
		c->port[p].link_layer = pa.link_layer;
		c->port[p].active = pa.state == IBV_PORT_ACTIVE;
	}
	c->nports = n;
}

/* The candidates for backup_pick: name, NUMA node and ports of each
 * device (with an explicit map, only the default and its mapped backup are
 * opened). */
static void backup_cands(struct shift_rnic *r, struct ibv_device **list, int n,
			 struct shift_backup_cand *c)
{
	char want[64] = "";

	if (shift_config.backup[0] &&
	    shift_backup_parse_map(shift_config.backup, r->name, want, sizeof(want)))
		want[0] = '\0';
	for (int i = 0; i < n; i++) {
		const char *name = shift_lower->get_device_name(list[i]);
		struct ibv_context *ctx;

		snprintf(c[i].name, sizeof(c[i].name), "%s", name ? name : "");
		c[i].numa = shift_backup_numa(list[i]->ibdev_path);
		if (!strcmp(c[i].name, r->name)) {
			backup_describe(r->sctx->ibctx, &c[i]);
			continue;
		}
		if (shift_config.backup[0] && strcmp(c[i].name, want))
			continue; /* explicit map: no need to probe every device */
		ctx = shift_lower->open_device(list[i]);
		if (!ctx)
			continue;
		backup_describe(ctx, &c[i]);
		shift_lower->close_device(ctx);
	}
}

/* r->bk_port[p]: the backup's port for the default's port p. */
static void backup_ports(struct shift_rnic *r, const struct shift_backup_cand *c, int n)
{
	const struct shift_backup_cand *me = NULL, *bk = NULL;

	for (int i = 0; i < n; i++) {
		if (!strcmp(c[i].name, r->name))
			me = &c[i];
		else if (!strcmp(c[i].name, r->bk_name))
			bk = &c[i];
	}
	for (int p = 1; p <= SHIFT_BACKUP_MAX_PORTS; p++) {
		r->bk_port[p] = me && bk ? shift_backup_port(me, bk, (uint8_t)p) : (uint8_t)p;
		if (me && bk && p <= me->nports && r->bk_port[p] != p)
			shift_info("%s: port %d backs up to %s port %u", r->name, p, r->bk_name,
				   r->bk_port[p]);
	}
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
	backup_cands(r, list, n, c);
	rc = shift_backup_pick(c, n, r->name, shift_config.backup, r->bk_name,
			       sizeof(r->bk_name));
	if (!rc)
		backup_ports(r, c, n);
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
	struct ibv_device_attr da;
	if (!shift_lower->query_device(r->bk_ctx, &da))
		r->bk_max_cqe = da.max_cqe;
	shift_info("%s: backup NIC %s", r->name, r->bk_name);
}

static void kv_connect(struct shift_rnic *r)
{
	struct shift_kv_options o = { .lazy_connect = true };
	int rc = shift_kv_open(shift_config.kv_url, shift_config.kv_namespace, &o, &r->kv);

	if (rc) {
		r->kv = NULL;
		rnic_unprotected(r, "the KV store URL, namespace or secret file is unusable");
		shift_warn("%s: %s", r->name, shift_kv_last_error());
		return;
	}
	/* said once per process: without a secret, whoever can write the
	 * job's keys steers where a failover sends data (docs/security.md) */
	static bool said;
	if (__atomic_exchange_n(&said, true, __ATOMIC_RELAXED))
		return;
	if (!shift_kv_authenticated(r->kv))
		shift_info("KV records are not authenticated (no SHIFT_KV_SECRET_FILE): SHIFT "
			   "trusts every writer of namespace '%s'", shift_config.kv_namespace);
	if (shift_config.job_id[0])
		shift_info("KV records of job run '%s' (%s)", shift_config.job_id,
			   shift_config.job_id_from);
	else
		shift_info("no job id (SHIFT_JOB_ID, SLURM_JOB_ID, TORCHELASTIC_RUN_ID): records "
			   "an earlier run left in namespace '%s' are told apart only by the "
			   "connection and memory they name", shift_config.kv_namespace);
}

/* Wake r's thread (r->lock held). */
void shift_rnic_signal(struct shift_rnic *r)
{
	uint64_t one = 1;

	if (r->kick_fd < 0)
		pthread_cond_signal(&r->kick);
	else if (write(r->kick_fd, &one, sizeof(one)) < 0)
		(void)0; /* (EAGAIN: the counter is full, the thread wakes anyway) */
}

/* Wait on r's kick, its device's port events and its backup CQs'
 * completions, for ms (r->lock held, dropped while waiting). */
static void wait_kick(struct shift_rnic *r, uint64_t ms)
{
	struct timespec ts;

	if (r->kick_fd >= 0) {
		struct pollfd p[4] = { { .fd = r->kick_fd, .events = POLLIN },
				       { .fd = shift_portev_fd(r), .events = POLLIN },
				       { .fd = r->bk_ev ? r->bk_ev->fd : -1, .events = POLLIN },
				       { .fd = shift_svc_fd(r), .events = POLLIN } };
		uint64_t x;

		pthread_mutex_unlock(&r->lock);
		/* (poll() skips a negative fd) */
		int n = poll(p, 4, (int)ms);

		if (n > 0 && p[0].revents && read(r->kick_fd, &x, sizeof(x)) < 0)
			(void)0; /* (raced with another read: nothing to drain) */
		if (n > 0 && p[1].revents)
			shift_portev_drain(r);
		if (n > 0 && p[2].revents)
			shift_bkev_drain(r);
		if (n > 0 && p[3].revents)
			shift_svc_drain(r);
		pthread_mutex_lock(&r->lock);
		return;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t ns = (uint64_t)ts.tv_nsec + ms * 1000000ull;
	ts.tv_sec += (time_t)(ns / 1000000000ull);
	ts.tv_nsec = (long)(ns % 1000000000ull);
	pthread_cond_timedwait(&r->kick, &r->lock, &ts);
}

/* SHIFT's pages in before a failover needs them (base/prefault.h): once
 * per process, by the first RNIC thread with no replay pending, off the
 * application's threads. */
static void prefault_once(void)
{
	static bool done;

	if (__atomic_load_n(&done, __ATOMIC_ACQUIRE) ||
	    __atomic_exchange_n(&done, true, __ATOMIC_ACQ_REL))
		return;
	uint64_t t0 = shift_clock_us();
	size_t n = shift_prefault_self();

	shift_debug("SHIFT's %zu pages faulted in ahead of any failover in %llu us", n,
		    (unsigned long long)(shift_clock_us() - t0));
}

static void *rnic_main(void *arg)
{
	struct shift_rnic *r = arg;
	uint64_t last_status = 0;

	pthread_mutex_lock(&r->busy);
	backup_open(r);
	if (r->bk_ctx)
		kv_connect(r);
	if (r->bk_ctx && r->kick_fd >= 0) {
		shift_portev_open(r);
		shift_bkev_open(r);
	}
	if (r->bk_ctx && r->kv)
		shift_svc_open(r);
	pthread_mutex_unlock(&r->busy);
	pthread_mutex_lock(&r->lock);
	while (!r->stop) {
		bool work = r->dirty;

		/* Let a burst of control verbs (an application connecting many
		 * QPs) finish before replaying: on a busy or single CPU the
		 * replay would otherwise steal time from each of them. */
		for (int quiet = 0; work && quiet < SHIFT_COALESCE_ROUNDS && !r->stop; quiet++) {
			r->dirty = false;
			wait_kick(r, SHIFT_COALESCE_MS);
			if (!r->dirty)
				break;
		}
		r->dirty = false;
		r->woken = false;
		r->due_ms = 0;
		pthread_mutex_unlock(&r->lock);
		pthread_mutex_lock(&r->busy);
		int left = work || r->bk_ctx ? shift_rnic_pass(r) : 0;
		if (shift_clock_ms() - last_status > 1000 || work) {
			shift_status_write(r);
			last_status = shift_clock_ms();
		}
		pthread_mutex_unlock(&r->busy);
		if (!left)
			prefault_once(); /* (once no replay waits for it) */
		pthread_mutex_lock(&r->lock);
		if (r->stop || r->dirty || r->woken)
			continue;
		/* replay pending: soon; a QP failed over (probes, failback): often;
		 * else SHIFT_IDLE_MS: what fails wakes the thread itself (port
		 * events, a peer's handshake on a backup CQ, portev.c) */
		uint64_t period = left ? SHIFT_PASS_PERIOD_MS :
				  __atomic_load_n(&r->sctx->slow, __ATOMIC_ACQUIRE) ? SHIFT_FO_PERIOD_MS :
										       shift_config.idle_ms;
		if (period < SHIFT_IDLE_MIN_MS) /* (a configuration never loaded) */
			period = SHIFT_IDLE_MIN_MS;
		uint64_t now = shift_clock_ms();

		/* (work the pass put off for a grace: when that ends) */
		if (r->due_ms)
			period = r->due_ms <= now ? 0 : r->due_ms - now < period ? r->due_ms - now :
										     period;
		if (!period)
			continue;
		r->idle = true;
		wait_kick(r, period);
		r->idle = false;
	}
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

void shift_rnic_wake(struct shift_rnic *r)
{
	if (!r)
		return;
	pthread_mutex_lock(&r->lock);
	r->woken = true;
	if (r->idle)
		shift_rnic_signal(r);
	pthread_mutex_unlock(&r->lock);
}

void shift_rnic_due(struct shift_rnic *r, uint64_t at_ms)
{
	if (!r || r->kick_fd < 0)
		return;
	pthread_mutex_lock(&r->lock);
	if (!r->due_ms || at_ms < r->due_ms)
		r->due_ms = at_ms ? at_ms : 1;
	pthread_mutex_unlock(&r->lock);
}

/* Stop r's thread, if it runs, and wait for it. */
static void stop_thread(struct shift_rnic *r)
{
	pthread_mutex_lock(&r->lock);
	r->stop = true;
	shift_rnic_signal(r);
	pthread_mutex_unlock(&r->lock);
	if (r->thread_started)
		pthread_join(r->thread, NULL);
	r->thread_started = false;
}

/* exit(): every thread stops before anything of SHIFT's is released, and
 * the KV keys go while the process still can. The RNICs stay (a later
 * close_device frees them); rnics_lock is held throughout, so a close on
 * another thread waits instead of freeing an RNIC under the loop. */
static void shadow_atexit(void)
{
	pthread_mutex_lock(&rnics_lock);
	for (struct shift_rnic *r = rnics; r; r = r->next_rnic)
		stop_thread(r);
	for (struct shift_rnic *r = rnics; r; r = r->next_rnic) {
		if (r->kv)
			shift_kv_delete_own(r->kv);
		shift_status_remove(r);
	}
	pthread_mutex_unlock(&rnics_lock);
}

/* ---- fork() (the front's handlers, shift/fork.c) ------------------------ */

void shift_shadow_fork_prepare(void)
{
	pthread_mutex_lock(&rnics_lock);
	for (struct shift_rnic *r = rnics; r; r = r->next_rnic)
		pthread_mutex_lock(&r->busy);
}

void shift_shadow_fork_parent(void)
{
	for (struct shift_rnic *r = rnics; r; r = r->next_rnic)
		pthread_mutex_unlock(&r->busy);
	pthread_mutex_unlock(&rnics_lock);
}

void shift_shadow_fork_child(void)
{
	while (rnics) {
		struct shift_rnic *r = rnics;

		rnics = r->next_rnic;
		pthread_mutex_unlock(&r->busy); /* (prepare's: this thread's) */
		r->thread_started = false; /* (the parent's) */
		if (r->kv) {
			/* the child's copy of the connection: closed without a
			 * word on it (the parent's stays), its keys kept */
			shift_kv_close(r->kv);
			r->kv = NULL;
		}
		r->stop = true;
		r->next_rnic = inherited;
		inherited = r;
	}
	pthread_mutex_unlock(&rnics_lock);
}

/* My MR index's id (mrindex.c): another in every process and context, so
 * that a peer never takes another's, or an earlier job's, index for mine. */
static uint64_t mri_id(void)
{
	uint64_t id = 0;

	if (getrandom(&id, sizeof(id), GRND_NONBLOCK) != (ssize_t)sizeof(id)) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		id = ((uint64_t)ts.tv_sec << 32 ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 20) *
		     0x9e3779b97f4a7c15ull;
	}
	return id ? id : 1;
}

struct shift_rnic *shift_rnic_start(struct shift_ctx *sctx)
{
	struct shift_rnic *r = calloc(1, sizeof(*r));

	if (!r) {
		shift_warn("out of memory: context unprotected");
		return NULL;
	}
	r->sctx = sctx;
	r->mri_id = mri_id();
	sctx->rnic = r; /* (before the thread starts: it reads it) */
	snprintf(r->name, sizeof(r->name), "%s",
		 sctx->ibctx->device ? sctx->ibctx->device->name : "?");
	pthread_mutex_init(&r->busy, NULL);
	pthread_mutex_init(&r->lock, NULL);
	shift_pmap_init(&r->pd_of);
	shift_pmap_init(&r->mr_of);
	shift_pmap_init(&r->mr_by_lkey);
	shift_pmap_init(&r->cq_of);
	shift_pmap_init(&r->qp_of);
	pthread_cond_init(&r->kick, NULL);
	/* (the thread waits on it and its port events; else on r->kick) */
	r->kick_fd = shift_config.inline_passes ? -1 : eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	pthread_mutex_lock(&rnics_lock);
	struct shift_rnic **pp = &rnics;
	while (*pp)
		pp = &(*pp)->next_rnic;
	*pp = r; /* (passes run in the order the contexts were opened) */
	pthread_mutex_unlock(&rnics_lock);
	if (shift_config.inline_passes) {
		backup_open(r);
		if (r->bk_ctx)
			kv_connect(r);
		if (r->bk_ctx && r->kv)
			shift_svc_open(r);
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
	pthread_mutex_lock(&rnics_lock);
	for (struct shift_rnic **pp = &rnics; *pp; pp = &(*pp)->next_rnic) {
		if (*pp == r) {
			*pp = r->next_rnic;
			break;
		}
	}
	pthread_mutex_unlock(&rnics_lock);
	stop_thread(r);
	shift_status_remove(r);

	/* everything the app left behind dies with its context */
	pthread_mutex_lock(&r->lock);
	for (struct shift_qp *q = r->qps; q; q = q->next)
		SHIFT_SHADOW_KILL(q);
	for (struct shift_mr *m = r->mrs; m; m = m->next)
		SHIFT_SHADOW_KILL(m);
	for (struct shift_cq *c = r->cqs; c; c = c->next)
		SHIFT_SHADOW_KILL(c);
	for (struct shift_pd *p = r->pds; p; p = p->next)
		SHIFT_SHADOW_KILL(p);
	pthread_mutex_unlock(&r->lock);
	shift_rnic_reap(r);
	shift_svc_close(r);
	shift_bkev_close(r); /* (its CQs are gone) */
	if (r->kv) {
		shift_kv_delete_own(r->kv);
		shift_kv_close(r->kv);
	}
	if (r->bk_ctx) {
		/* (a context opened later at this address is another device) */
		shift_provider_forget(r->bk_ctx);
		shift_lower->close_device(r->bk_ctx);
	}
	shift_portev_close(r); /* (its thread is gone) */
	if (r->kick_fd >= 0)
		close(r->kick_fd);
	pthread_cond_destroy(&r->kick);
	pthread_mutex_destroy(&r->lock);
	pthread_mutex_destroy(&r->busy);
	shift_pmap_fini(&r->pd_of);
	shift_pmap_fini(&r->mr_of);
	shift_pmap_fini(&r->mr_by_lkey);
	shift_pmap_fini(&r->cq_of);
	shift_pmap_fini(&r->qp_of);
	shift_mri_free(r);
	free(r);
}
