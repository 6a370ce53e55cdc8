/*
 * shift-campaign: runs N random fault schedules of a workload over the
 * simulated RNIC and checks the failover invariants.
 *
 * Schedule i uses seed S+i: the seed fixes the world (scheduler and packet
 * loss), the workload shape (connections, messages) and the fault plan, so
 * `--schedules 1 --seed S+i` replays schedule i exactly. Each schedule is
 * two hosts with two devices each; the workload runs between the default
 * devices sim0_0 and sim1_0, and faults hit only those (the second device
 * of each host is the backup SHIFT fails over to): NIC death (port down,
 * sometimes fatal), link cut, flaps, the receiver NIC dying right after
 * executing, and random request / ACK loss.
 *
 * Output: one summary line. App-visible errors (expected without SHIFT)
 * are counted apart from integrity violations (always a bug); any
 * violation exits 1 after printing the seed that reproduces it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "front.h"
#include "kv/kv.h"
#include "sim.h"
#include "workload.h"

struct opts {
	uint64_t schedules, seed;
	int kind;		/* -1: rotate over all workloads */
	bool shift, verbose, trace, check_determinism, expect_errors;
	bool no_faults, reexec, rxe_stale_read, refuse_err, split_cq, backup_faults, srq;
	bool ex_verbs, threads, mlx5, split_sge;
	bool app_errors, compare_plain, kv_faults, kv_spoil;
	double min_rate;
};

struct totals {
	uint64_t faults, app_errors, conns_failed, violations, unfinished;
	uint64_t poison_seen, poison_lost, kv_lost, kv_events;
	uint64_t msgs, bytes, atomics_ok, atomics_err, steps;
	uint64_t hash;
};

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

static void usage(void)
{
	fprintf(stderr,
		"usage: shift-campaign [--schedules N] [--seed S] [--workload "
		"nccl|sendrecv|read|mix|all]\n"
		"                      [--shift] [--no-faults] [--verbose] [--trace]\n"
		"                      [--selftest-reexecute] [--rxe-stale-read]\n"
		"                      [--refuse-err-posts] [--split-cq] [--backup-faults] [--srq]\n"
		"                      [--ex-verbs] [--threads] [--mlx5] [--split-sge]\n"
		"                      [--check-determinism] [--expect-app-errors]"
		" [--min-rate SCHED_PER_MIN]\n"
		"                      [--app-errors] [--compare-plain] [--kv-faults|--kv-spoil]\n");
}

/* Fault durations relative to the retry budget of a QP with the default
 * attributes (timeout 14, retry_cnt 7): short ones are ridden out by RC
 * retransmission, long and permanent ones are not. */
static uint64_t duration(uint64_t *rs, uint64_t budget, bool *forever)
{
	uint64_t r = splitmix(rs) % 8;

	*forever = r == 7;
	if (r < 3)
		return budget / 8 + splitmix(rs) % (budget / 2);
	return 2 * budget + splitmix(rs) % (2 * budget);
}

static void plan_faults(struct sim_world *w, struct sim_dev *d[2],
			uint64_t *rs, uint64_t budget)
{
	unsigned n = (unsigned)(splitmix(rs) % 4);

	for (unsigned i = 0; i < n; i++) {
		uint64_t t = splitmix(rs) % (4 * budget), dur;
		struct sim_dev *x = d[splitmix(rs) & 1];
		bool forever;

		switch (splitmix(rs) % 4) {
		case 0:	/* NIC death */
			dur = duration(rs, budget, &forever);
			sim_world_schedule_fault(w, t, SIM_FAULT_KILL, x, NULL,
						 splitmix(rs) % 4 == 0);
			if (!forever)
				sim_world_schedule_fault(w, t + dur, SIM_FAULT_REVIVE,
							 x, NULL, 0);
			break;
		case 1:	/* link cut */
			dur = duration(rs, budget, &forever);
			sim_world_schedule_fault(w, t, SIM_FAULT_CUT, d[0], d[1], 0);
			if (!forever)
				sim_world_schedule_fault(w, t + dur,
							 SIM_FAULT_RESTORE, d[0],
							 d[1], 0);
			break;
		case 2:	/* receiver dies right after executing */
			dur = duration(rs, budget, &forever);
			sim_world_schedule_fault(w, t, SIM_FAULT_KILL_AFTER_EXEC, x,
						 NULL, 1 + splitmix(rs) % 20);
			if (!forever)
				sim_world_schedule_fault(w, t + dur + 4 * budget,
							 SIM_FAULT_REVIVE, x, NULL, 0);
			break;
		default: { /* flapping */
			unsigned k = 2 + (unsigned)(splitmix(rs) % 3);

			for (unsigned j = 0; j < k; j++) {
				uint64_t down = budget / 8 + splitmix(rs) % budget;
				uint64_t up = budget / 8 + splitmix(rs) % budget;

				sim_world_schedule_fault(w, t, SIM_FAULT_KILL, x, NULL, 0);
				sim_world_schedule_fault(w, t + down, SIM_FAULT_REVIVE,
							 x, NULL, 0);
				t += down + up;
			}
			break;
		}
		}
	}
}

/*
 * --backup-faults: a default NIC dies and comes back, and then a backup NIC
 * (of either host) dies for good, while the failback runs or after it:
 * SHIFT must hide all of it.
 */
static void plan_backup_faults(struct sim_world *w, struct sim_dev *d[2], struct sim_dev *bk[2],
			       uint64_t *rs, uint64_t budget)
{
	uint64_t t = splitmix(rs) % (2 * budget);
	uint64_t dur = budget + splitmix(rs) % (2 * budget);
	unsigned x = (unsigned)(splitmix(rs) & 1), y = (unsigned)(splitmix(rs) & 1);
	/* the backup's death: from the default's revival to well after it
	 * (the failback takes a few probe periods); never both paths down at
	 * once, which no failover can hide */
	uint64_t tb = t + dur + splitmix(rs) % (6 * budget);

	sim_world_schedule_fault(w, t, SIM_FAULT_KILL, d[x], NULL, 0);
	sim_world_schedule_fault(w, t + dur, SIM_FAULT_REVIVE, d[x], NULL, 0);
	sim_world_schedule_fault(w, tb, SIM_FAULT_KILL, bk[y], NULL, 0);
}

/*
 * --kv-faults: while the path faults run, the KV store fails too, one to
 * three times at random network times: down for a while (every command
 * fails, as an unreachable Redis), restarted empty, one record deleted,
 * one record garbled. A failover that cannot get what it needs may then
 * fail the connection as plain's would (wl_params.kv_faults); it must
 * never stall or corrupt. --kv-spoil: records lost or garbled only, the
 * store answering throughout (SHIFT puts its records again). The record
 * spoiled is picked in the order the records were made (kv_mem.c), so a
 * schedule replays exactly.
 */
enum kv_ev { KV_DOWN, KV_UP, KV_CLEAR, KV_DELETE, KV_GARBLE };

struct kv_plan {
	unsigned n, next;
	struct {
		uint64_t t, pick;
		enum kv_ev ev;
	} e[6];
};

static void kv_plan_add(struct kv_plan *k, uint64_t t, enum kv_ev ev, uint64_t pick)
{
	unsigned i = k->n++;

	/* (kept in time order: insertion) */
	for (; i > 0 && k->e[i - 1].t > t; i--)
		k->e[i] = k->e[i - 1];
	k->e[i].t = t;
	k->e[i].ev = ev;
	k->e[i].pick = pick;
}

static void plan_kv_faults(struct kv_plan *k, uint64_t *rs, uint64_t budget, bool spoil_only)
{
	static const enum kv_ev any[] = { KV_DOWN, KV_GARBLE, KV_CLEAR, KV_DELETE };
	static const enum kv_ev spoil[] = { KV_CLEAR, KV_DELETE, KV_GARBLE };
	unsigned n = 1 + (unsigned)(splitmix(rs) % 3);

	memset(k, 0, sizeof(*k));
	for (unsigned j = 0; j < n; j++) {
		uint64_t t = splitmix(rs) % (6 * budget);
		enum kv_ev ev = spoil_only ? spoil[splitmix(rs) % 3] : any[splitmix(rs) % 4];

		kv_plan_add(k, t, ev, splitmix(rs));
		if (ev == KV_DOWN)
			kv_plan_add(k, t + budget / 2 + splitmix(rs) % (4 * budget), KV_UP, 0);
	}
}

/* The KV events due by network time now. */
static void kv_faults_due(struct kv_plan *k, uint64_t now, struct totals *t)
{
	for (; k->next < k->n && k->e[k->next].t <= now; k->next++) {
		enum kv_ev ev = k->e[k->next].ev;

		switch (ev) {
		case KV_DOWN:
		case KV_UP:
			shift_kv_mem_set_down("campaign", ev == KV_DOWN);
			break;
		case KV_CLEAR:
			shift_kv_mem_clear("campaign");
			break;
		case KV_DELETE:
		case KV_GARBLE:
			shift_kv_mem_spoil("campaign", k->e[k->next].pick, ev == KV_GARBLE);
			break;
		}
		t->kv_events++;
	}
}

/* The campaign's own calls into the world (in threads mode SHIFT's threads
 * call into it too: campaign_front_enter/leave). */
static bool world_step(struct sim_world *w)
{
	campaign_front_enter();
	bool moved = sim_world_step(w) != 0;
	campaign_front_leave();
	return moved;
}

static uint64_t world_faults(struct sim_world *w)
{
	campaign_front_enter();
	uint64_t n = sim_world_stats(w)->faults;
	campaign_front_leave();
	return n;
}

/* Runs one schedule; returns 0, or -1 on a setup failure. */
static int run_schedule(const struct opts *o, uint64_t seed,
			struct totals *t, struct wl_report *rep,
			enum wl_kind *kind_out, uint64_t *hash_out)
{
	uint64_t rs = seed;
	struct sim_world_opts wo = { .seed = seed };
	struct sim_world *w;
	struct sim_host *h[2];
	const struct shift_lower *v[2];
	struct sim_dev *d[2], *bk[2];
	struct wl_params p;
	struct wl *wl;
	const char *why = NULL;
	struct kv_plan kvp = { 0 };

	splitmix(&rs);
	wo.reexecute_duplicates = o->reexec;
	wo.rxe_stale_read = o->rxe_stale_read;
	wo.refuse_posts_in_err = o->refuse_err;
	wo.mlx5 = o->mlx5;
	if (!o->no_faults && splitmix(&rs) % 3 == 0) {
		wo.drop_req_ppm = (uint32_t)(splitmix(&rs) % 5000);
		wo.drop_resp_ppm = (uint32_t)(splitmix(&rs) % 5000);
	}
	p.kind = o->kind >= 0 ? (enum wl_kind)o->kind :
				(enum wl_kind)(seed % WL_NKINDS);
	p.nconn = 1 + (unsigned)(splitmix(&rs) % 3);
	p.msgs = 16 + (unsigned)(splitmix(&rs) % 48);
	p.strict = o->shift;
	p.split_cq = o->split_cq;
	p.srq = o->srq;
	p.ex_verbs = o->ex_verbs;
	p.split_sge = o->split_sge;
	p.kv_faults = o->kv_faults || o->kv_spoil;
	p.poison = o->app_errors;
	p.enter = campaign_front_enter;
	p.leave = campaign_front_leave;
	*kind_out = p.kind;

	w = sim_world_create(&wo);
	if (!w)
		return -1;
	if (o->trace)
		sim_world_set_trace(w, stderr);
	for (int i = 0; i < 2; i++) {
		h[i] = sim_host_create(w, 2);
		d[i] = h[i] ? sim_host_dev(h[i], 0) : NULL;
		bk[i] = h[i] ? sim_host_dev(h[i], 1) : NULL;
		v[i] = h[i] ? campaign_front(h[i], o->shift, &why) : NULL;
		if (!v[i]) {
			fprintf(stderr, "shift-campaign: %s\n",
				why ? why : "cannot create the simulated hosts");
			sim_world_destroy(w);
			exit(2);
		}
	}
	wl = wl_create(w, &p, v[0], "sim0_0", v[1], "sim1_0", splitmix(&rs));
	if (!wl) {
		sim_world_destroy(w);
		return -1;
	}
	/* SHIFT's background threads shadow new QPs within milliseconds of
	 * their connection; network time here is much shorter, so let them
	 * finish before the first fault (a failure during that window leaves
	 * the QP unprotected by design, which the unit tests cover). */
	campaign_front_settle(o->shift, 2 * p.nconn);
	if (!o->no_faults) {
		/* the retry budget of the workload's QPs: (retry_cnt + 1)
		 * timeouts of timeout 14 */
		uint64_t budget = 8 * ((uint64_t)4 << 4);

		if (o->backup_faults)
			plan_backup_faults(w, d, bk, &rs, budget);
		else
			plan_faults(w, d, &rs, budget);
		if (o->kv_faults || o->kv_spoil)
			plan_kv_faults(&kvp, &rs, budget, o->kv_spoil);
	}
	/* Interleave application actions and network events at random until
	 * neither can move. With SHIFT, "cannot move" must outlast its
	 * background timers too: a failover waiting for its peer's part
	 * (KV reads at the probe period) gets more (campaign_front_at_rest). */
	for (uint64_t it = 0; it < 20000000; it++) {
		bool app_first = splitmix(&rs) % 4 == 0;

		uint64_t faults = world_faults(w);

		if (o->shift && it % 16 == 0)
			campaign_front_progress(true, false);
		bool app = app_first && wl_step(wl);
		bool ev = app || (!app_first && world_step(w));

		if (!ev)
			ev = app_first ? world_step(w) : (app = wl_step(wl));
		/* SHIFT's thread watches the ports every 100 ms at most; a
		 * device down for longer (every fault here: 64 ticks of about
		 * 1 ms at least) is seen down before it comes back. Network
		 * time jumps over idle periods, so make it so. */
		if (o->shift && world_faults(w) != faults)
			campaign_front_fault(true);
		if (kvp.next < kvp.n) {
			campaign_front_enter();
			uint64_t now = sim_world_now(w);

			campaign_front_leave();
			kv_faults_due(&kvp, now, t);
		}
		if (!ev && o->shift) {
			/* SHIFT's background thread runs when all else is quiet too */
			campaign_front_progress(true, true);
			ev = (app = wl_step(wl)) || world_step(w);
		}
		if (campaign_front_at_rest(o->shift, ev, app, wl_done(wl)))
			break;
	}
	wl_finish(wl, rep);
	wl_destroy(wl);
	for (int i = 0; i < 2; i++)
		campaign_front_done(h[i], o->shift);

	const struct sim_stats *st = sim_world_stats(w);
	uint64_t hw = sim_world_hash(w);

	*hash_out = hw;
	t->faults += st->faults;
	t->steps += st->steps;
	for (int i = 0; i < 8; i++) {
		t->hash ^= (uint8_t)(hw >> (8 * i));
		t->hash *= 0x100000001b3ULL;
	}
	if (o->verbose)
		printf("schedule seed=%" PRIu64 " workload=%s conns=%u msgs=%u "
		       "faults=%" PRIu64 " steps=%" PRIu64 " timeouts=%" PRIu64
		       " dropped=%" PRIu64 " app_errors=%" PRIu64
		       " violations=%" PRIu64 " hash=%016" PRIx64 "\n",
		       seed, wl_kind_name(p.kind), p.nconn, p.msgs, st->faults,
		       st->steps, st->timeouts, st->dropped, rep->app_errors,
		       rep->violations, hw);
	sim_world_destroy(w);
	t->app_errors += rep->app_errors;
	t->conns_failed += rep->conns_failed;
	t->violations += rep->violations;
	t->unfinished += rep->unfinished;
	t->poison_seen += rep->poison_seen;
	t->poison_lost += rep->poison_lost;
	t->kv_lost += rep->kv_lost;
	t->msgs += rep->msgs;
	t->bytes += rep->bytes;
	t->atomics_ok += rep->atomics_ok;
	t->atomics_err += rep->atomics_err;
	return 0;
}

/*
 * --compare-plain: the same schedule without SHIFT must give the same trace
 * (every packet, every completion the application polls, in order) as the
 * run through SHIFT. Without faults SHIFT is then invisible, the
 * application's own errors (--app-errors) included; a difference counts as
 * a violation of the schedule.
 */
static int compare_plain(const struct opts *o, uint64_t seed, uint64_t hw, struct totals *t,
			 struct wl_report *rep)
{
	struct opts p = *o;
	struct totals scratch;
	struct wl_report prep;
	enum wl_kind k;
	uint64_t hp;

	memset(&scratch, 0, sizeof(scratch));
	memset(&prep, 0, sizeof(prep));
	p.shift = false;
	p.verbose = false;
	if (run_schedule(&p, seed, &scratch, &prep, &k, &hp)) {
		fprintf(stderr, "shift-campaign: plain setup failed for seed %" PRIu64 "\n", seed);
		return 2;
	}
	if (hp == hw && prep.app_errors == rep->app_errors)
		return 0;
	t->violations++;
	if (!rep->violations++)
		snprintf(rep->first, sizeof(rep->first),
			 "through SHIFT trace %016" PRIx64 " with %" PRIu64 " app errors, without "
			 "SHIFT %016" PRIx64 " with %" PRIu64, hw, rep->app_errors, hp, prep.app_errors);
	return 0;
}

static int run_all(const struct opts *o, struct totals *t, double *secs)
{
	struct timespec a, b;

	memset(t, 0, sizeof(*t));
	t->hash = 0xcbf29ce484222325ULL;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (uint64_t i = 0; i < o->schedules; i++) {
		uint64_t seed = o->seed + i;
		struct wl_report rep;
		enum wl_kind k;

		uint64_t hw;

		memset(&rep, 0, sizeof(rep));
		if (run_schedule(o, seed, t, &rep, &k, &hw)) {
			fprintf(stderr, "shift-campaign: setup failed for seed %"
				PRIu64 ": %s\n", seed, strerror(errno));
			return 2;
		}
		if (o->compare_plain && compare_plain(o, seed, hw, t, &rep))
			return 2;
		if (rep.violations) {
			printf("VIOLATION seed=%" PRIu64 " workload=%s: %s\n", seed,
			       wl_kind_name(k), rep.first);
			printf("reproduce: tests/sim/campaign --schedules 1 --seed %"
			       PRIu64 " --workload %s%s%s%s%s%s%s%s%s%s%s%s%s%s%s --verbose --trace\n", seed,
			       wl_kind_name(k), o->shift ? " --shift" :
			       o->reexec ? " --selftest-reexecute" : "",
			       o->rxe_stale_read ? " --rxe-stale-read" : "",
			       o->refuse_err ? " --refuse-err-posts" : "",
			       o->split_cq ? " --split-cq" : "",
			       o->backup_faults ? " --backup-faults" : "",
			       o->srq ? " --srq" : "",
			       o->ex_verbs ? " --ex-verbs" : "",
			       o->mlx5 ? " --mlx5" : "",
			       o->split_sge ? " --split-sge" : "",
			       o->app_errors ? " --app-errors" : "",
			       o->kv_faults ? " --kv-faults" : o->kv_spoil ? " --kv-spoil" : "",
			       o->no_faults ? " --no-faults" : "",
			       o->compare_plain ? " --compare-plain" : "",
			       o->threads ? " --threads (not deterministic: run it a few times)" : "");
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	*secs = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o = { .schedules = 100, .seed = 1, .kind = -1 };
	struct totals t;
	double secs, rate;
	int rc;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *val = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--schedules") && val) {
			o.schedules = strtoull(val, NULL, 0);
			i++;
		} else if (!strcmp(a, "--seed") && val) {
			o.seed = strtoull(val, NULL, 0);
			i++;
		} else if (!strcmp(a, "--workload") && val) {
			enum wl_kind k;

			if (!strcmp(val, "all")) {
				o.kind = -1;
			} else if (wl_kind_parse(val, &k)) {
				usage();
				return 2;
			} else {
				o.kind = (int)k;
			}
			i++;
		} else if (!strcmp(a, "--min-rate") && val) {
			o.min_rate = strtod(val, NULL);
			i++;
		} else if (!strcmp(a, "--shift")) {
			o.shift = true;
		} else if (!strcmp(a, "--backup-faults")) {
			o.backup_faults = true; /* plan_backup_faults() */
		} else if (!strcmp(a, "--srq")) {
			o.srq = true; /* each side's QPs share one SRQ */
		} else if (!strcmp(a, "--ex-verbs")) {
			o.ex_verbs = true; /* ibv_create_cq_ex/start_poll, ibv_create_qp_ex/ibv_wr_* */
		} else if (!strcmp(a, "--split-sge")) {
			o.split_sge = true; /* WRs of 3 SGEs, receives of 2 (workload.h) */
		} else if (!strcmp(a, "--mlx5")) {
			o.mlx5 = true; /* the sim as mlx5: native WQE access (rnic/mlx5img.c) */
		} else if (!strcmp(a, "--threads")) {
			o.threads = true; /* SHIFT's real threads: front.h */
		} else if (!strcmp(a, "--split-cq")) {
			o.split_cq = true; /* receives on CQs of their own */
		} else if (!strcmp(a, "--refuse-err-posts")) {
			o.refuse_err = true; /* providers that refuse posts in ERR, sim.h */
		} else if (!strcmp(a, "--rxe-stale-read")) {
			o.rxe_stale_read = true; /* soft-RoCE's quirk, sim.h */
		} else if (!strcmp(a, "--selftest-reexecute")) {
			o.reexec = true;
		} else if (!strcmp(a, "--no-faults")) {
			o.no_faults = true;
		} else if (!strcmp(a, "--verbose")) {
			o.verbose = true;
		} else if (!strcmp(a, "--trace")) {
			o.trace = true;
		} else if (!strcmp(a, "--check-determinism")) {
			o.check_determinism = true;
		} else if (!strcmp(a, "--app-errors")) {
			o.app_errors = true; /* wl_params.poison */
		} else if (!strcmp(a, "--kv-faults")) {
			o.kv_faults = true; /* plan_kv_faults() */
		} else if (!strcmp(a, "--kv-spoil")) {
			o.kv_spoil = true; /* ... records lost or garbled only, no outage */
		} else if (!strcmp(a, "--compare-plain")) {
			o.compare_plain = true;
		} else if (!strcmp(a, "--expect-app-errors")) {
			o.expect_errors = true;
		} else {
			usage();
			return 2;
		}
	}
	if (o.threads && (!o.shift || o.srq || o.ex_verbs || o.check_determinism)) {
		/* (the thread-safe simulator wraps the classic verbs only; a
		 * run with threads is not deterministic) */
		fprintf(stderr, "shift-campaign: --threads needs --shift, and takes no --srq, "
			"--ex-verbs or --check-determinism\n");
		return 2;
	}
	if ((o.kv_faults || o.kv_spoil) && !o.shift) {
		fprintf(stderr, "shift-campaign: --kv-faults and --kv-spoil need --shift\n");
		return 2;
	}
	campaign_front_threads(o.threads);
	rc = run_all(&o, &t, &secs);
	if (rc)
		return rc;
	rate = secs > 0 ? (double)o.schedules * 60.0 / secs : 0;
	printf("campaign: mode=%s workload=%s schedules=%" PRIu64 " seed=%" PRIu64
	       " faults=%" PRIu64 " app_errors=%" PRIu64 " conns_failed=%" PRIu64
	       " violations=%" PRIu64 " unfinished=%" PRIu64 " msgs=%" PRIu64
	       " atomics=%" PRIu64 "/%" PRIu64 " steps=%" PRIu64
	       " trace_hash=%016" PRIx64 " schedules/min=%.0f\n",
	       o.shift ? "shift" : "pass-through",
	       o.kind < 0 ? "all" : wl_kind_name((enum wl_kind)o.kind),
	       o.schedules, o.seed, t.faults, t.app_errors, t.conns_failed,
	       t.violations, t.unfinished, t.msgs, t.atomics_ok,
	       t.atomics_ok + t.atomics_err, t.steps, t.hash, rate);
	if (o.mlx5 && o.shift) {
		unsigned long bad, good = campaign_front_read_back(&bad);

		printf("native: %lu WRs read back from the mlx5 queues, %lu not readable\n", good,
		       bad);
	}
	if (o.kv_faults || o.kv_spoil)
		printf("kv faults: %" PRIu64 " store events; connections that failed for the "
		       "application: %" PRIu64 "\n", t.kv_events, t.kv_lost);
	if (o.app_errors)
		printf("application errors: the remote access error seen %" PRIu64 " times, lost "
		       "to a path failure %" PRIu64 " times\n", t.poison_seen, t.poison_lost);
	if (o.check_determinism) {
		struct totals t2;
		double s2;
		bool v = o.verbose;

		o.verbose = false;
		rc = run_all(&o, &t2, &s2);
		o.verbose = v;
		if (rc)
			return rc;
		printf("determinism: first=%016" PRIx64 " second=%016" PRIx64 " %s\n",
		       t.hash, t2.hash, t.hash == t2.hash ? "same" : "DIFFERENT");
		if (t.hash != t2.hash)
			return 1;
	}
	if (campaign_front_illegal_transitions(o.shift)) {
		printf("illegal state transitions: %lu (shift/dp/state.h)\n",
		       campaign_front_illegal_transitions(o.shift));
		return 1;
	}
	if (t.violations)
		return 1;
	if (o.expect_errors && !t.app_errors) {
		printf("expected app-visible errors without SHIFT, saw none\n");
		return 1;
	}
	if (o.min_rate > 0 && rate < o.min_rate) {
		printf("too slow: %.0f schedules/min < %.0f\n", rate, o.min_rate);
		return 1;
	}
	return 0;
}
