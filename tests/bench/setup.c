/*
 * Control-path cost of SHIFT on the simulated RNIC: N RC QP pairs created
 * and connected (INIT, RTR, RTS on both sides) on one device per host, as
 * an application sees it (its own thread), then, through SHIFT, the
 * background work that shadows them on the backup NIC (the replay, the
 * exchange through the in-memory KV store), which runs on SHIFT's threads.
 *
 * Prints one line:
 *   mode=plain|shift n=N create_us=.. connect_us=.. app_us_per_qp=..
 *   shadow_us=.. rss_kb=.. rss_kb_per_qp=..
 * rss is the growth of the resident set over the whole run (both sides,
 * the simulator's queues included, so plain's figure is the simulated
 * provider's own). Under callgrind only the application's part is
 * collected (CALLGRIND_TOGGLE_COLLECT): Ir / (2 N) is the instructions one
 * QP's create and connect take. tests/bench/setup.sh runs both modes for
 * several N and prints the ratios.
 * Usage: shift-bench-setup --plain|--shift N
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <valgrind/callgrind.h>

#include "shift/shadow/shadow.h"
#include "shift/shift.h"
#include "shift_inline.h"
#include "sim.h"
#include "ep.h"

/* verbs.h's inline fallbacks name this; the simulator never takes it. */
int (ibv_query_port)(struct ibv_context *c, uint8_t p, struct _compat_ibv_port_attr *a)
{
	(void)c; (void)p; (void)a;
	abort();
}

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static long rss_kb(void)
{
	long pages = 0, res = 0;
	FILE *f = fopen("/proc/self/statm", "r");

	if (f) {
		if (fscanf(f, "%ld %ld", &pages, &res) != 2)
			res = 0;
		fclose(f);
	}
	return res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Connect QP q of ep towards remote (sim_ep_connect on ep with q). */
static int connect_one(struct sim_ep *ep, struct ibv_qp *q, const struct sim_ep_info *remote,
		       struct sim_ep_info *local)
{
	ep->qp = q;
	sim_ep_info(ep, 1, local);
	return sim_ep_connect(ep, local, remote, NULL);
}

int main(int argc, char **argv)
{
	if (argc < 3 || (strcmp(argv[1], "--plain") && strcmp(argv[1], "--shift"))) {
		fprintf(stderr, "usage: %s --plain|--shift N\n", argv[0]);
		return 2;
	}
	bool shift = !strcmp(argv[1], "--shift");
	int n = atoi(argv[2]);
	long rss0 = rss_kb();
	struct sim_world *w = sim_world_create(NULL);
	struct sim_host *h0 = sim_host_create(w, 2), *h1 = sim_host_create(w, 2);
	const struct shift_lower *va = sim_lower(h0), *vb = sim_lower(h1);
	struct ibv_qp_cap cap = { .max_send_wr = 64, .max_recv_wr = 64,
				  .max_send_sge = 1, .max_recv_sge = 1 };
	struct sim_ep a, b;

	if (n < 1 || n > 65536)
		return 2;
	if (shift) {
		shift_lower_set(sim_lower_world(w));
		setenv("SHIFT_KV_URL", "mem://bench-setup", 1);
		setenv("SHIFT_STATUS_DIR", "", 1);
		shift_inline_load();
		va = vb = &shift_verbs;
	}
	if (sim_ep_open(&a, va, "sim0_0", 4096, ACCESS, &cap, 4096, 0) ||
	    sim_ep_open(&b, vb, "sim1_0", 4096, ACCESS, &cap, 4096, 0)) {
		fprintf(stderr, "setup failed\n");
		return 1;
	}
	struct ibv_qp **qa = calloc((size_t)n, sizeof(*qa)), **qb = calloc((size_t)n, sizeof(*qb));
	struct ibv_qp_init_attr ia = { .send_cq = a.cq, .recv_cq = a.cq, .cap = cap,
				       .qp_type = IBV_QPT_RC };
	struct ibv_qp_init_attr ib = ia;
	struct sim_ep_info la, lb;

	ib.send_cq = ib.recv_cq = b.cq;
	if (!qa || !qb)
		return 1;
	double t0 = now_us();

	CALLGRIND_TOGGLE_COLLECT;
	for (int i = 0; i < n; i++) {
		qa[i] = va->create_qp(a.pd, &ia);
		qb[i] = vb->create_qp(b.pd, &ib);
		if (!qa[i] || !qb[i]) {
			fprintf(stderr, "create_qp %d failed\n", i);
			return 1;
		}
	}
	CALLGRIND_TOGGLE_COLLECT;
	double t1 = now_us();

	CALLGRIND_TOGGLE_COLLECT;
	for (int i = 0; i < n; i++) {
		a.qp = qa[i];
		b.qp = qb[i];
		sim_ep_info(&a, 1, &la);
		sim_ep_info(&b, 2, &lb);
		if (connect_one(&a, qa[i], &lb, &la) || connect_one(&b, qb[i], &la, &lb)) {
			fprintf(stderr, "connect %d failed\n", i);
			return 1;
		}
	}
	CALLGRIND_TOGGLE_COLLECT;
	double t2 = now_us();
	int ready = 0;

	/* SHIFT's background work: passes until every QP of A is shadowed */
	for (int pass = 0; shift && pass < 64 && ready < n; pass++) {
		shift_rnic_pass_all();
		ready = 0;
		for (int i = 0; i < n; i++) {
			struct shift_qp_info qi;

			ready += !shift_shadow_qp_info(qa[i], &qi) && qi.state == SHIFT_SHADOW_READY;
		}
	}
	double t3 = now_us();
	long rss = rss_kb() - rss0;

	if (shift && ready < n) {
		fprintf(stderr, "only %d of %d QPs shadowed\n", ready, n);
		return 1;
	}
	printf("mode=%s n=%d create_us=%.0f connect_us=%.0f app_us_per_qp=%.2f shadow_us=%.0f "
	       "rss_kb=%ld rss_kb_per_qp=%.1f\n",
	       shift ? "shift" : "plain", n, t1 - t0, t2 - t1, (t2 - t0) / (2.0 * n), t3 - t2, rss,
	       (double)rss / (2.0 * n));
	return 0;
}
