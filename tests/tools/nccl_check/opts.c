/* opts.c - command-line parsing for shift-nccl-check (see opts.h). Uses
 * getopt_long, which it resets so it can be called more than once. */
#include "opts.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char nc_usage[] =
	"usage: shift-nccl-check [options] [SERVER]\n"
	"  without SERVER: wait for a client; with it: connect and run\n"
	"  -d, --dev NAME        RDMA device (default: the first)\n"
	"  -i, --ib-port N       device port (1)\n"
	"  -g, --gid-index N     GID index (0; soft-RoCE IPv4 GIDs are at 1)\n"
	"  -p, --port N          TCP bootstrap port (18600)\n"
	"      --mode M          write | send | read (write)\n"
	"  -q, --qps N           queue pairs (1)\n"
	"  -s, --size BYTES      message size, K/M/G suffixes (65536)\n"
	"  -c, --chunk BYTES     RDMA write/read chunk size (8192)\n"
	"  -S, --slots N         ring slots = messages in flight per QP (8)\n"
	"  -n, --iters N         messages per QP per direction (1000 if no -D)\n"
	"  -D, --duration SECS   run for SECS seconds instead of a count\n"
	"      --bidir           traffic in both directions at once\n"
	"      --json FILE       write the JSON report to FILE (default stdout)\n"
	"      --watchdog SECS   fail after SECS without progress (60)\n"
	"      --mr2-at SECS     each QP's buffer is registered twice; from SECS into\n"
	"                        the run on, RDMA goes to the peer's second MR (memory\n"
	"                        the connection never addressed before)\n"
	"      --mr2-reg-at SECS the second MR is registered SECS into the run (not at\n"
	"                        setup) and its key sent to the peer over TCP then;\n"
	"                        needs --mr2-at later than SECS\n"
	"      --mtu BYTES       path MTU 256..4096 (1024)\n"
	"      --timeout N       QP ack timeout exponent (14)\n"
	"      --inject KIND     corrupt-byte | dup-notify (self-test)\n"
	"      --inject-at SEQ   message to tamper with (10, or n/2 if smaller)\n"
	"      --quiet           no per-second lines on stderr\n"
	"  traffic parameters (mode, qps, sizes, slots, -n, -D, --bidir) are\n"
	"  taken from the client; the server adopts them.\n"
	"exit: 0 clean, 1 integrity violation, 2 error, 3 bad usage\n";

const char *nc_mode_name(enum nc_mode m)
{
	switch (m) {
	case NC_WRITE: return "write";
	case NC_SEND: return "send";
	case NC_READ: return "read";
	}
	return "?";
}

const char *nc_inject_name(enum nc_inject i)
{
	switch (i) {
	case NC_INJ_NONE: return "none";
	case NC_INJ_CORRUPT: return "corrupt-byte";
	case NC_INJ_DUP: return "dup-notify";
	}
	return "?";
}

int nc_parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || s[0] == '-')
		return -1;
	unsigned shift = 0;
	switch (*end) {
	case '\0': break;
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	default: return -1;
	}
	if (*end != '\0' || (shift && v > (UINT64_MAX >> shift)))
		return -1;
	*out = (uint64_t)v << shift;
	return 0;
}

static int parse_uint(const char *s, unsigned long max, unsigned long *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || v > max)
		return -1;
	*out = v;
	return 0;
}

static int parse_secs(const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= 0) || v > 1e7)
		return -1;
	*out = v;
	return 0;
}

int nc_opts_validate(const struct nc_opts *o, char *err, size_t errlen)
{
	if (o->qps < 1 || o->qps > NC_MAX_QPS)
		return snprintf(err, errlen, "-q must be 1..%u", NC_MAX_QPS), -1;
	if (o->slots < 1 || o->slots > NC_MAX_SLOTS)
		return snprintf(err, errlen, "-S must be 1..%u", NC_MAX_SLOTS), -1;
	if (o->msg_size < 1 || o->msg_size > (1ull << 30))
		return snprintf(err, errlen, "-s must be 1..1G"), -1;
	if (o->chunk_size < 1 || o->chunk_size > (1ull << 30))
		return snprintf(err, errlen, "-c must be 1..1G"), -1;
	if (o->msg_size * o->slots > (4ull << 30))
		return snprintf(err, errlen, "-s x -S exceeds 4G per ring"), -1;
	if ((o->msg_size + o->chunk_size - 1) / o->chunk_size > 4096)
		return snprintf(err, errlen, "more than 4096 chunks per message: raise -c"), -1;
	if (o->iters == 0 && o->duration <= 0)
		return snprintf(err, errlen, "give -n or -D"), -1;
	if (o->iters && o->duration > 0)
		return snprintf(err, errlen, "-n and -D are exclusive"), -1;
	if (o->watchdog < 1)
		return snprintf(err, errlen, "--watchdog must be >= 1 s"), -1;
	if (o->timeout > 31)
		return snprintf(err, errlen, "--timeout must be 0..31"), -1;
	if (o->mr2_reg_at > 0 && !(o->mr2_at > o->mr2_reg_at))
		return snprintf(err, errlen, "--mr2-reg-at needs a later --mr2-at"), -1;
	return 0;
}

int nc_opts_parse(struct nc_opts *o, int argc, char **argv, char *err,
                  size_t errlen)
{
	enum { O_MODE = 256, O_BIDIR, O_JSON, O_WATCHDOG, O_MTU, O_TIMEOUT,
	       O_INJECT, O_INJECT_AT, O_QUIET, O_MR2_AT, O_MR2_REG_AT };
	static const struct option lopts[] = {
		{"dev", required_argument, NULL, 'd'},
		{"ib-port", required_argument, NULL, 'i'},
		{"gid-index", required_argument, NULL, 'g'},
		{"port", required_argument, NULL, 'p'},
		{"qps", required_argument, NULL, 'q'},
		{"size", required_argument, NULL, 's'},
		{"chunk", required_argument, NULL, 'c'},
		{"slots", required_argument, NULL, 'S'},
		{"iters", required_argument, NULL, 'n'},
		{"duration", required_argument, NULL, 'D'},
		{"help", no_argument, NULL, 'h'},
		{"mode", required_argument, NULL, O_MODE},
		{"bidir", no_argument, NULL, O_BIDIR},
		{"json", required_argument, NULL, O_JSON},
		{"watchdog", required_argument, NULL, O_WATCHDOG},
		{"mtu", required_argument, NULL, O_MTU},
		{"timeout", required_argument, NULL, O_TIMEOUT},
		{"inject", required_argument, NULL, O_INJECT},
		{"inject-at", required_argument, NULL, O_INJECT_AT},
		{"quiet", no_argument, NULL, O_QUIET},
		{"mr2-at", required_argument, NULL, O_MR2_AT},
		{"mr2-reg-at", required_argument, NULL, O_MR2_REG_AT},
		{NULL, 0, NULL, 0},
	};
	*o = (struct nc_opts){
		.ib_port = 1, .gid_idx = 0, .tcp_port = NC_DEFAULT_TCP_PORT,
		.mode = NC_WRITE, .qps = 1, .msg_size = 65536,
		.chunk_size = 8192, .slots = 8, .watchdog = 60, .mtu = 1024,
		.timeout = 14, .inject_at = UINT64_MAX,
	};
	int inject_at_set = 0;
	unsigned long v = 0;
	int c, li;

	optind = 0; /* full reset of getopt state */
	opterr = 0;
	err[0] = '\0';
	while ((li = -1, c = getopt_long(argc, argv, ":d:i:g:p:q:s:c:S:n:D:h",
	                                 lopts, &li)) != -1) {
		int bad = 0;
		switch (c) {
		case 'd': o->dev = optarg; break;
		case 'i': bad = parse_uint(optarg, 255, &v); o->ib_port = (unsigned)v; break;
		case 'g': bad = parse_uint(optarg, 65535, &v); o->gid_idx = (int)v; break;
		case 'p': bad = parse_uint(optarg, 65535, &v) || v == 0; o->tcp_port = (unsigned)v; break;
		case 'q': bad = parse_uint(optarg, NC_MAX_QPS, &v); o->qps = (unsigned)v; break;
		case 's': bad = nc_parse_size(optarg, &o->msg_size); break;
		case 'c': bad = nc_parse_size(optarg, &o->chunk_size); break;
		case 'S': bad = parse_uint(optarg, NC_MAX_SLOTS, &v); o->slots = (unsigned)v; break;
		case 'n': bad = nc_parse_size(optarg, &o->iters) || o->iters == 0; break;
		case 'D': bad = parse_secs(optarg, &o->duration) || o->duration <= 0; break;
		case 'h': snprintf(err, errlen, "%s", nc_usage); return 1;
		case O_MODE:
			if (!strcmp(optarg, "write")) o->mode = NC_WRITE;
			else if (!strcmp(optarg, "send")) o->mode = NC_SEND;
			else if (!strcmp(optarg, "read")) o->mode = NC_READ;
			else bad = 1;
			break;
		case O_BIDIR: o->bidir = 1; break;
		case O_JSON: o->json_path = optarg; break;
		case O_WATCHDOG: bad = parse_secs(optarg, &o->watchdog); break;
		case O_MTU:
			bad = parse_uint(optarg, 4096, &v) ||
			      (v != 256 && v != 512 && v != 1024 && v != 2048 && v != 4096);
			o->mtu = (unsigned)v;
			break;
		case O_TIMEOUT: bad = parse_uint(optarg, 31, &v); o->timeout = (unsigned)v; break;
		case O_MR2_AT: bad = parse_secs(optarg, &o->mr2_at) || o->mr2_at <= 0; break;
		case O_MR2_REG_AT:
			bad = parse_secs(optarg, &o->mr2_reg_at) || o->mr2_reg_at <= 0;
			break;
		case O_INJECT:
			if (!strcmp(optarg, "corrupt-byte")) o->inject = NC_INJ_CORRUPT;
			else if (!strcmp(optarg, "dup-notify")) o->inject = NC_INJ_DUP;
			else if (!strcmp(optarg, "none")) o->inject = NC_INJ_NONE;
			else bad = 1;
			break;
		case O_INJECT_AT: bad = nc_parse_size(optarg, &o->inject_at); inject_at_set = 1; break;
		case O_QUIET: o->quiet = 1; break;
		case ':':
			snprintf(err, errlen, "option %s needs a value", argv[optind - 1]);
			return -1;
		default:
			snprintf(err, errlen, "unknown option %s", argv[optind - 1]);
			return -1;
		}
		if (bad) {
			if (li >= 0)
				snprintf(err, errlen, "bad value '%s' for --%s", optarg,
				         lopts[li].name);
			else
				snprintf(err, errlen, "bad value '%s' for -%c", optarg, c);
			return -1;
		}
	}
	if (optind < argc)
		o->server = argv[optind++];
	if (optind < argc) {
		snprintf(err, errlen, "unexpected argument '%s'", argv[optind]);
		return -1;
	}
	if (o->iters == 0 && o->duration <= 0)
		o->iters = 1000;
	if (!inject_at_set)
		o->inject_at = (o->iters && o->iters <= 20) ? o->iters / 2 : 10;
	return nc_opts_validate(o, err, errlen);
}
