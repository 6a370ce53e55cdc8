/* report.c - the verdict and the JSON report of shift-nccl-check: which exit
 * status a run earns, and every counter, error and per-second sample written
 * as one JSON object (field meanings in docs/checker.md). */
#include "nccl_check.h"

#include <stdio.h>
#include <string.h>

uint64_t nc_violations(const struct nc_ctx *c)
{
	uint64_t v = c->corrupt_bytes;
	for (unsigned i = 0; c->ch && i < c->o->qps; i++)
		v += check_seq_violations(&c->ch[i].rx_acc) +
		     check_seq_violations(&c->ch[i].tx_acc);
	if (c->peer.received)
		v += c->peer.corrupt_bytes + c->peer.missing + c->peer.duplicate +
		     c->peer.out_of_order + c->peer.unexpected;
	return v;
}

int nc_exit_status(const struct nc_ctx *c)
{
	if (c->app_errors || (c->peer.received && c->peer.fatal))
		return 2;
	return nc_violations(c) ? 1 : 0;
}

static void jstr(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

static unsigned long long u(uint64_t v) { return (unsigned long long)v; }

static const char *event_name(char k)
{
	switch (k) {
	case 'd': return "duplicate";
	case 'o': return "out_of_order";
	case 'm': return "missing";
	case 'u': return "unexpected";
	}
	return "?";
}

static void write_events(FILE *f, const struct nc_ctx *c)
{
	int first = 1;
	fputs("  \"events\": [", f);
	for (unsigned i = 0; c->ch && i < c->o->qps; i++) {
		const struct check_seq *a[2] = {&c->ch[i].rx_acc, &c->ch[i].tx_acc};
		for (int k = 0; k < 2; k++)
			for (unsigned e = 0; e < a[k]->nevents; e++) {
				fprintf(f, "%s{\"qp\": %u, \"side\": \"%s\", \"kind\": \"%s\", "
				        "\"seq\": %llu}", first ? "" : ", ", i,
				        k ? "send_completion" : "notification",
				        event_name(a[k]->events[e].kind),
				        u(a[k]->events[e].seq));
				first = 0;
			}
	}
	fputs("],\n", f);
}

static void write_json(FILE *f, const struct nc_ctx *c)
{
	const struct nc_opts *o = c->o;
	uint64_t miss = 0, dup = 0, ooo = 0, unx = 0, tmiss = 0, tdup = 0, tooo = 0;
	for (unsigned i = 0; c->ch && i < o->qps; i++) {
		const struct check_seq *r = &c->ch[i].rx_acc, *t = &c->ch[i].tx_acc;
		miss += r->missing, dup += r->duplicate, ooo += r->out_of_order;
		unx += r->unexpected + t->unexpected;
		tmiss += t->missing, tdup += t->duplicate, tooo += t->out_of_order;
	}
	int st = nc_exit_status(c);
	double dur = c->t_end > c->t0 && c->t0 > 0 ? c->t_end - c->t0 : 0;

	fprintf(f, "{\n  \"tool\": \"shift-nccl-check\",\n  \"version\": 1,\n");
	fprintf(f, "  \"role\": \"%s\",\n  \"device\": ", c->is_server ? "server" : "client");
	jstr(f, c->dev_name);
	fprintf(f, ",\n  \"mode\": \"%s\",\n  \"qps\": %u,\n  \"bidir\": %s,\n",
	        nc_mode_name(o->mode), o->qps, o->bidir ? "true" : "false");
	fprintf(f, "  \"msg_size\": %llu,\n  \"chunk_size\": %llu,\n  \"slots\": %u,\n",
	        u(o->msg_size), u(o->chunk_size), o->slots);
	fprintf(f, "  \"iters\": %llu,\n  \"duration_target\": %.3f,\n", u(o->iters),
	        o->duration);
	fprintf(f, "  \"inject\": \"%s\",\n  \"inject_at\": %llu,\n  \"injected\": %s,\n",
	        nc_inject_name(c->inject), u(c->inject_at),
	        c->injected ? "true" : "false");
	fprintf(f, "  \"messages\": %llu,\n  \"messages_sent\": %llu,\n", u(c->msgs_rx),
	        u(c->msgs_tx));
	fprintf(f, "  \"bytes_verified\": %llu,\n  \"bytes_sent\": %llu,\n",
	        u(c->bytes_verified), u(c->bytes_tx));
	fprintf(f, "  \"corrupt_bytes\": %llu,\n  \"missing\": %llu,\n  \"duplicate\": %llu,\n"
	        "  \"out_of_order\": %llu,\n  \"unexpected\": %llu,\n",
	        u(c->corrupt_bytes), u(miss), u(dup), u(ooo), u(unx));
	fprintf(f, "  \"send_completions\": {\"missing\": %llu, \"duplicate\": %llu, "
	        "\"out_of_order\": %llu},\n", u(tmiss), u(tdup), u(tooo));
	if (c->have_first_bad)
		fprintf(f, "  \"first_corruption\": {\"qp\": %u, \"seq\": %llu, \"offset\": %zu, "
		        "\"expected\": %u, \"got\": %u},\n", c->first_bad.qp,
		        u(c->first_bad.seq), c->first_bad.mm.first_off,
		        c->first_bad.mm.expected, c->first_bad.mm.got);
	else
		fputs("  \"first_corruption\": null,\n", f);
	write_events(f, c);
	fprintf(f, "  \"app_errors\": %llu,\n  \"errors\": [", u(c->app_errors));
	for (unsigned i = 0; i < c->nerrs; i++) {
		const struct nc_err *e = &c->errs[i];
		fprintf(f, "%s\n    {\"t\": %.3f, \"qp\": %d, \"op\": ", i ? "," : "",
		        e->t, e->qp);
		jstr(f, e->op);
		fputs(", \"status\": ", f);
		jstr(f, e->status);
		fprintf(f, ", \"code\": %d, \"vendor_err\": %u}", e->code, e->vendor_err);
	}
	fprintf(f, "%s],\n  \"per_second\": [", c->nerrs ? "\n  " : "");
	for (size_t i = 0; i < c->nsamples; i++) {
		const struct nc_sample *s = &c->samples[i];
		fprintf(f, "%s\n    {\"t\": %.3f, \"MBps\": %.3f, \"msgs\": %llu, "
		        "\"tx_MBps\": %.3f, \"rx_MBps\": %.3f, \"tx_msgs\": %llu, "
		        "\"rx_msgs\": %llu}", i ? "," : "", s->t, s->mbps, u(s->msgs),
		        s->tx_mbps, s->rx_mbps, u(s->tx_msgs), u(s->rx_msgs));
	}
	fprintf(f, "%s],\n  \"duration\": %.3f,\n", c->nsamples ? "\n  " : "", dur);
	const struct nc_peer_summary *p = &c->peer;
	fprintf(f, "  \"peer\": {\"reported\": %s, \"fatal\": %s, \"app_errors\": %llu, "
	        "\"corrupt_bytes\": %llu, \"missing\": %llu, \"duplicate\": %llu, "
	        "\"out_of_order\": %llu, \"unexpected\": %llu, \"messages\": %llu, "
	        "\"bytes_verified\": %llu},\n", p->received ? "true" : "false",
	        p->fatal ? "true" : "false", u(p->app_errors), u(p->corrupt_bytes),
	        u(p->missing), u(p->duplicate), u(p->out_of_order), u(p->unexpected),
	        u(p->messages), u(p->bytes_verified));
	fprintf(f, "  \"violations\": %llu,\n  \"status\": \"%s\",\n  \"exit_status\": %d\n}\n",
	        u(nc_violations(c)), st == 0 ? "ok" : st == 1 ? "integrity" : "error", st);
}

int nc_report_json(const struct nc_ctx *c, const char *path)
{
	FILE *f = path ? fopen(path, "w") : stdout;
	if (!f) {
		nc_log("cannot write %s", path);
		return -1;
	}
	write_json(f, c);
	if (path)
		return fclose(f) ? -1 : 0;
	return fflush(f) ? -1 : 0;
}
