/*
 * What shadowing shows of itself (see shadow.h): the counters over all
 * RNICs (relaxed atomics, added to by record.c, replay.c and connect.c)
 * and the per-RNIC status files shiftctl reads, one line per QP with the
 * shadow's state and the data path's view of it.
 */
#include "shift/shadow/shadow_int.h"
#include "shift/shadow/svc.h"
#include "shift/base/config.h"
#include "shift/dp/ctx.h"

#include <errno.h>
#include <fcntl.h>
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
	out->peer_mrs_read = __atomic_load_n(&c->peer_mrs_read, __ATOMIC_RELAXED);
	out->peer_mri_bad = __atomic_load_n(&c->peer_mri_bad, __ATOMIC_RELAXED);
	out->kv_errors = __atomic_load_n(&c->kv_errors, __ATOMIC_RELAXED);
	out->records_other = __atomic_load_n(&c->records_other, __ATOMIC_RELAXED);
}

/* ---- status for shiftctl -------------------------------------------------- */

static const char *state_name(enum ibv_qp_state s)
{
	static const char *const n[] = { "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR" };

	return (unsigned)s < sizeof(n) / sizeof(n[0]) ? n[s] : "?";
}

/*
 * The status directory as a descriptor, created 0700 if missing; refused
 * (logged once) unless it is a real directory owned by this user and not
 * writable by group or others: a directory another user planted could
 * hold links to files this process may write, or fake status files.
 */
static int status_dir_open(const char *dir)
{
	static int warned;
	struct stat st;
	int fd;

	if (mkdir(dir, 0700) && errno != EEXIST)
		return -1;
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st))
		goto refuse;
	if (st.st_uid != geteuid() || (st.st_mode & 022))
		goto refuse;
	return fd;
refuse:
	if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
		shift_warn("status directory %s refused (not a directory owned by uid %u, "
			   "mode 0700): no status for shiftctl", dir, (unsigned)geteuid());
	if (fd >= 0)
		close(fd);
	return -1;
}

/* A new file name in dfd, never following a link: O_EXCL|O_NOFOLLOW (a
 * leftover of a killed writer is removed once, not written through). */
static FILE *status_tmp_open(int dfd, const char *name)
{
	int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);

	if (fd < 0 && errno == EEXIST && !unlinkat(dfd, name, 0))
		fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return NULL;
	FILE *f = fdopen(fd, "w");
	if (!f)
		close(fd);
	return f;
}

/*
 * The process's counters, on one line of every status file it writes
 * ("#stats name=value ...": a line an older shiftctl skips). shiftctl
 * stats shows them once per process; each file's copy is as of its
 * writer's last pass.
 */
#define DP_STAT(n) { #n, &shift_stats.n }
#define SH_STAT(n) { #n, &shift_shadow_counters.n }
static const struct {
	const char *name;
	const unsigned long *v;
} stats_shown[] = {
	DP_STAT(contexts_attached), DP_STAT(contexts_unprotected), SH_STAT(qps_ready),
	SH_STAT(qps_unprotected), SH_STAT(mrs_ready), SH_STAT(kv_errors),
	SH_STAT(records_other), SH_STAT(peer_mrs_read), SH_STAT(peer_mri_bad),
	DP_STAT(ep_records_read), DP_STAT(ep_read_commands), DP_STAT(rkeys_read),
	DP_STAT(rkeys_waited), DP_STAT(rkeys_earlier), DP_STAT(rkeys_outside),
	DP_STAT(rkeys_at_once), DP_STAT(rkeys_changed),
	DP_STAT(mbox_asked), DP_STAT(mbox_taken), DP_STAT(mbox_answered),
	DP_STAT(dgrams_sent), DP_STAT(dgrams_taken), DP_STAT(dgrams_refused),
	DP_STAT(wqes_read_back), DP_STAT(wqes_unreadable), DP_STAT(compat_1_0_calls),
};
#undef DP_STAT
#undef SH_STAT

static void stats_line(FILE *f)
{
	fputs("#stats", f);
	for (size_t i = 0; i < sizeof(stats_shown) / sizeof(stats_shown[0]); i++)
		fprintf(f, " %s=%lu", stats_shown[i].name,
			__atomic_load_n(stats_shown[i].v, __ATOMIC_RELAXED));
	fputc('\n', f);
}

void shift_status_write(struct shift_rnic *r)
{
	char path[128], tmp[140];
	const char *dir = shift_config.status_dir;
	int dfd;

	if (!dir[0])
		return;
	snprintf(path, sizeof(path), "shift-%d-%s.status", (int)getpid(), r->name);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	dfd = status_dir_open(dir);
	if (dfd < 0)
		return;
	FILE *f = status_tmp_open(dfd, tmp);
	if (!f) {
		close(dfd);
		return;
	}
	static const char *const send_names[] = { "default", "fallback", "waitsig", "waitdrain",
						  "unprot" };
	stats_line(f);
	pthread_mutex_lock(&r->lock);
	for (struct shift_qp *q = r->qps; q; q = q->next) {
		if (q->dead)
			continue;
		/* the data path's view (a racy snapshot, for people): q->app
		 * is only compared, never read (between the provider's
		 * destroy and the shadow marked dead the data-path state is
		 * already forgotten, or a new QP's at that address shows) */
		const struct shift_dqp *d = shift_dqp_of_qp(q->app);
		unsigned ss = d ? (unsigned)__atomic_load_n(&d->send_state, __ATOMIC_RELAXED) : 0;

		fprintf(f, "%d %s %u %s %s %s %u %s %u %s %s %lu %lu %lu %u %llu %s mrs=%u mbox=%s "
			"dgram=%s %s\n",
			(int)getpid(),
			r->name, q->app_qpn, state_name(q->app_state),
			q->state == SHIFT_SHADOW_READY ? "ready" :
			q->state == SHIFT_SHADOW_PENDING ? "pending" : "unprotected",
			r->bk_name[0] ? r->bk_name : "-", q->bk ? q->bk->qp_num : 0,
			q->bk ? state_name(q->bk_state) : "-",
			q->peer_known ? q->peer_bk.qpn : 0,
			d && ss < 5 ? send_names[ss] : "-",
			!d ? "-" : __atomic_load_n(&d->recv_state, __ATOMIC_RELAXED) ? "fallback" : "default",
			d ? SHIFT_STAT(d->failovers) : 0, d ? SHIFT_STAT(d->failbacks) : 0,
			d ? SHIFT_STAT(d->retransmitted) : 0,
			d ? SHIFT_STAT(d->bk_gen) : 0,
			d ? (unsigned long long)SHIFT_STAT(d->last_switch_s) : 0ull,
			/* where a failover reads its WRs from (shift/dp/nwq.h) */
			!d ? "-" : d->nwq ? "native" : "mirror",
			/* the peer's MRs whose backup keys are read ahead */
			shift_mri_peer_keys(q),
			/* key mailboxes (mbox.h): on both ends, mine or the
			 * peer's only, none */
			q->mb && q->peer_bk.has_mb ? "both" : q->mb ? "mine" :
			q->peer_bk.has_mb ? "peer" : "none",
			/* the paths its episode records take to the peer as
			 * datagrams (svc.h) */
			q->svc_ok[SHIFT_SVC_BACKUP] && q->svc_ok[SHIFT_SVC_DEFAULT] ? "both" :
			q->svc_ok[SHIFT_SVC_BACKUP] ? "backup" :
			q->svc_ok[SHIFT_SVC_DEFAULT] ? "default" : "none",
			q->why ? q->why : "-");
	}
	pthread_mutex_unlock(&r->lock);
	if (fclose(f) || renameat(dfd, tmp, dfd, path))
		unlinkat(dfd, tmp, 0);
	close(dfd);
}

void shift_status_remove(struct shift_rnic *r)
{
	char path[128];
	int dfd;

	if (!shift_config.status_dir[0])
		return;
	dfd = open(shift_config.status_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return;
	snprintf(path, sizeof(path), "shift-%d-%s.status", (int)getpid(), r->name);
	unlinkat(dfd, path, 0); /* removes a link itself, never its target */
	close(dfd);
}
