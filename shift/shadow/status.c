/*
 * What shadowing shows of itself (see shadow.h): the counters over all
 * RNICs (relaxed atomics, added to by record.c, replay.c and connect.c)
 * and the per-RNIC status files shiftctl reads, one line per QP with the
 * shadow's state and the data path's view of it.
 */
#include "shift/shadow/shadow_int.h"
#include "shift/base/config.h"
#include "shift/dp/ctx.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

struct shift_shadow_stats shift_shadow_counters;

void shift_shadow_stats_get(struct shift_shadow_stats *out)
{
	struct shift_shadow_stats *c = &shift_shadow_counters;

	out->qps_ready = __atomic_load_n(&c->qps_ready, __ATOMIC_RELAXED);
	out->qps_unprotected = __atomic_load_n(&c->qps_unprotected, __ATOMIC_RELAXED);
	out->mrs_ready = __atomic_load_n(&c->mrs_ready, __ATOMIC_RELAXED);
	out->kv_errors = __atomic_load_n(&c->kv_errors, __ATOMIC_RELAXED);
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
