/* opts.h - command-line options of shift-nccl-check.
 *
 * Parsing is pure (no I/O besides the caller's error buffer), so the unit
 * tests can check defaults, size suffixes and rejected combinations. */
#ifndef SHIFT_TOOLS_NC_OPTS_H
#define SHIFT_TOOLS_NC_OPTS_H

#include <stddef.h>
#include <stdint.h>

enum nc_mode { NC_WRITE = 0, NC_SEND = 1, NC_READ = 2 };
enum nc_inject { NC_INJ_NONE = 0, NC_INJ_CORRUPT = 1, NC_INJ_DUP = 2 };

#define NC_DEFAULT_TCP_PORT 18600u
#define NC_MAX_QPS 256u
#define NC_MAX_SLOTS 1024u

struct nc_opts {
	const char *dev;       /* -d: RDMA device; NULL = first one */
	unsigned ib_port;      /* -i: device port (1) */
	int gid_idx;           /* -g: GID index (0) */
	unsigned tcp_port;     /* -p: bootstrap TCP port */
	const char *server;    /* positional: server address; NULL = be the server */
	enum nc_mode mode;     /* --mode */
	unsigned qps;          /* -q */
	uint64_t msg_size;     /* -s */
	uint64_t chunk_size;   /* -c (write and read modes) */
	unsigned slots;        /* -S: ring slots = messages in flight */
	uint64_t iters;        /* -n: messages per QP per direction (0 = by time) */
	double duration;       /* -D: seconds (0 = by count) */
	int bidir;             /* --bidir */
	const char *json_path; /* --json; NULL = JSON on stdout */
	double watchdog;       /* --watchdog: seconds without progress */
	unsigned mtu;          /* --mtu bytes */
	unsigned timeout;      /* --timeout: QP ack timeout exponent */
	enum nc_inject inject; /* --inject */
	uint64_t inject_at;    /* --inject-at: message seq to tamper with */
	int quiet;             /* --quiet: no per-second lines */
	double mr2_at;         /* --mr2-at: from SECS on, the peer's second MR (0: never) */
	double mr2_reg_at;     /* --mr2-reg-at: the second MR registered then, its key
	                        * sent over TCP (0: at setup, with the rest) */
};

/* Parse argv into o (defaults first). Returns 0 to run, 1 if help was asked
 * (usage is in err), -1 on a bad command line (reason in err). */
int nc_opts_parse(struct nc_opts *o, int argc, char **argv, char *err,
                  size_t errlen);
/* Check cross-option constraints (used again after the server adopts the
 * client's parameters). 0 or -1 with the reason in err. */
int nc_opts_validate(const struct nc_opts *o, char *err, size_t errlen);
/* Parse "64", "8K", "1M", "1G" (binary multiples). 0 or -1. */
int nc_parse_size(const char *s, uint64_t *out);

const char *nc_mode_name(enum nc_mode m);
const char *nc_inject_name(enum nc_inject i);
extern const char nc_usage[];

#endif
