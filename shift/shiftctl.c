/*
 * shiftctl: look at SHIFT from outside the application.
 *   shiftctl --version            SHIFT's version
 *   shiftctl check                KV store reachable, backup NICs present
 *   shiftctl config               every SHIFT_* knob, its value here (secrets
 *                                 masked) and its doc; exit 1 on a bad value
 *   shiftctl status [--json] [DIR]
 *                                 per process, each default QP and its backup
 *                                 QP, from the status files SHIFT writes in
 *                                 the per-user status directory (root: every
 *                                 user's); directories and files it does not
 *                                 trust are skipped with the reason
 *   shiftctl stats [--json] [DIR] per process, SHIFT's counters (records read,
 *                                 key mailbox, datagrams, WQEs read back...)
 */
#include "shift/base/config.h"
#include "shift/base/version.h"
#include "shift/check.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

struct status_row {
	int pid;
	char dev[64], st[16], sh[16], bk[64], bks[16], ss[16], rs[16], when[16], wq[16];
	unsigned qpn, bkqpn, peer, gen;
	int mrs; /* peer MR keys read ahead (-1: an older writer's line) */
	char mbox[16]; /* key mailboxes: both, mine, peer, none ("": an older writer's) */
	char dgram[16]; /* paths of its records as datagrams: both, backup, default, none */
	unsigned long fo, fb, retx;
	const char *note;
};

struct status_out {
	bool json;
	bool stats; /* shiftctl stats: the #stats lines, once per process */
	unsigned rows;
	unsigned files;
	unsigned nseen;
	int seen[256]; /* processes whose counters were shown */
};

static int usage(FILE *out, int rc)
{
	fprintf(out,
		"usage: shiftctl COMMAND\n"
		"  --version              SHIFT's version\n"
		"  check                  the KV store answers and the backup NICs exist\n"
		"  config                 each SHIFT_* setting: value (passwords masked), whether\n"
		"                         it is the default, and its meaning; exit 1 if one is bad\n"
		"  status [--json] [DIR]  each QP of each process using SHIFT: its state, backup\n"
		"                         and failover counts (DIR: one status directory; default:\n"
		"                         the caller's, and every user's for root)\n"
		"  stats [--json] [DIR]   each process's counters: records read, key mailbox,\n"
		"                         datagrams, WQEs read back (one line per counter)\n"
		"  --help                 this text\n");
	return rc;
}

/* s as a JSON string: quotes, backslashes and control characters escaped. */
static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

/* s for a terminal: control characters as '?'. */
static const char *plain(char *s)
{
	for (char *c = s; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			*c = '?';
	return s;
}

static void row_print(struct status_out *o, struct status_row *r)
{
	if (!o->json) {
		char mrs[16] = "-";

		if (r->mrs >= 0)
			snprintf(mrs, sizeof(mrs), "%d", r->mrs);
		printf("%-7d %-8s %-8u %-6s %-11s %-8s %-8u %-6s %-8u %-9s %-8s %4lu %4lu %6lu %4u "
		       "%-8s %-6s %8s %-5s %-7s %s\n", r->pid, plain(r->dev), r->qpn, plain(r->st),
		       plain(r->sh), plain(r->bk), r->bkqpn, plain(r->bks), r->peer, plain(r->ss),
		       plain(r->rs), r->fo, r->fb, r->retx, r->gen, r->when, plain(r->wq), mrs,
		       r->mbox[0] ? plain(r->mbox) : "-", r->dgram[0] ? plain(r->dgram) : "-",
		       plain((char *)r->note));
		return;
	}
	printf("%s\n  {\"pid\": %d, \"dev\": ", o->rows ? "," : "", r->pid);
	json_str(r->dev);
	printf(", \"qpn\": %u, \"state\": ", r->qpn);
	json_str(r->st);
	printf(", \"shadow\": ");
	json_str(r->sh);
	printf(", \"backup\": ");
	json_str(r->bk);
	printf(", \"backup_qpn\": %u, \"backup_state\": ", r->bkqpn);
	json_str(r->bks);
	printf(", \"peer_backup_qpn\": %u, \"send\": ", r->peer);
	json_str(r->ss);
	printf(", \"recv\": ");
	json_str(r->rs);
	printf(", \"failovers\": %lu, \"failbacks\": %lu, \"retransmitted\": %lu, "
	       "\"generation\": %u, \"switched\": ", r->fo, r->fb, r->retx, r->gen);
	json_str(r->when);
	printf(", \"wq\": ");
	json_str(r->wq);
	if (r->mrs >= 0)
		printf(", \"peer_mrs\": %d", r->mrs);
	if (r->mbox[0]) {
		printf(", \"key_mailbox\": ");
		json_str(r->mbox);
	}
	if (r->dgram[0]) {
		printf(", \"datagrams\": ");
		json_str(r->dgram);
	}
	printf(", \"note\": ");
	json_str(r->note);
	putchar('}');
}

static void line_parse(struct status_out *o, char *line)
{
	struct status_row r = { .when = "-", .mrs = -1 };
	unsigned long long last;
	int off = 0;

	if (line[0] == '#')
		return;
	if (sscanf(line, "%d %63s %u %15s %15s %63s %u %15s %u %15s %15s %lu %lu %lu %u %llu %15s %n",
		   &r.pid, r.dev, &r.qpn, r.st, r.sh, r.bk, &r.bkqpn, r.bks, &r.peer, r.ss, r.rs,
		   &r.fo, &r.fb, &r.retx, &r.gen, &last, r.wq, &off) < 17)
		return;
	line[strcspn(line, "\n")] = '\0';
	if (last) {
		time_t t = (time_t)last;
		struct tm tm;

		if (localtime_r(&t, &tm))
			strftime(r.when, sizeof(r.when), "%H:%M:%S", &tm);
	}
	int moff = 0;

	if (off && sscanf(line + off, "mrs=%d %n", &r.mrs, &moff) == 1 && moff)
		off += moff;
	else
		r.mrs = -1;
	moff = 0;
	if (off && sscanf(line + off, "mbox=%15s %n", r.mbox, &moff) == 1 && moff)
		off += moff;
	else
		r.mbox[0] = '\0';
	moff = 0;
	if (off && sscanf(line + off, "dgram=%15s %n", r.dgram, &moff) == 1 && moff)
		off += moff;
	else
		r.dgram[0] = '\0';
	r.note = off ? line + off : "";
	row_print(o, &r);
	o->rows++;
}

/* A counter's name as SHIFT writes it: [a-z0-9_], 1..31 characters. */
static bool stat_name_ok(const char *n, size_t len)
{
	if (!len || len > 31)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!((n[i] >= 'a' && n[i] <= 'z') || (n[i] >= '0' && n[i] <= '9') || n[i] == '_'))
			return false;
	return true;
}

/* A "#stats name=value ..." line of process pid's file: shown unless that
 * process's counters were (each of its RNICs' files has a copy). A token
 * that is not name=decimal ends the line (a file is not trusted). */
static void stats_parse(struct status_out *o, int pid, char *line)
{
	char *save = NULL, *t;
	unsigned shown = 0;

	if (strncmp(line, "#stats ", 7))
		return;
	for (unsigned i = 0; i < o->nseen; i++)
		if (o->seen[i] == pid)
			return;
	if (o->nseen == sizeof(o->seen) / sizeof(o->seen[0]))
		return;
	o->seen[o->nseen++] = pid;
	line[strcspn(line, "\n")] = '\0';
	for (t = strtok_r(line + 7, " ", &save); t && shown < 64; t = strtok_r(NULL, " ", &save)) {
		char *eq = strchr(t, '='), *end;

		if (!eq || !stat_name_ok(t, (size_t)(eq - t)) || eq[1] < '0' || eq[1] > '9')
			break;
		errno = 0;
		unsigned long long v = strtoull(eq + 1, &end, 10);
		if (*end || errno)
			break;
		*eq = '\0';
		if (o->json) {
			printf("%s", shown ? ", " : o->rows ? ",\n  {" : "\n  {");
			if (!shown)
				printf("\"pid\": %d, ", pid);
			printf("\"%s\": %llu", t, v);
		} else {
			printf("%-7d %-24s %llu\n", pid, t, v);
		}
		shown++;
	}
	if (o->json && shown)
		putchar('}');
	if (shown)
		o->rows++;
}

/* One status file of dfd, opened without following a link. */
static void file_read(struct status_out *o, int dfd, const char *name)
{
	char line[2048];
	struct stat st;
	int pid = 0, fd;

	if (strncmp(name, "shift-", 6) || !strstr(name, ".status") || strstr(name, ".tmp"))
		return;
	if (sscanf(name, "shift-%d-", &pid) == 1 && kill(pid, 0) && errno == ESRCH)
		return;
	fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		if (fd >= 0)
			close(fd);
		return;
	}
	FILE *f = fdopen(fd, "r");
	if (!f) {
		close(fd);
		return;
	}
	o->files++;
	while (fgets(line, sizeof(line), f)) {
		if (o->stats)
			stats_parse(o, pid, line);
		else
			line_parse(o, line);
	}
	fclose(f);
}

/* Why dir is not read ("" if it is), for a caller with effective uid. */
static const char *dir_distrust(int dfd, uid_t uid, char *why, size_t size)
{
	struct stat st;

	why[0] = '\0';
	if (fstat(dfd, &st))
		snprintf(why, size, "cannot stat: %s", strerror(errno));
	else if (uid != 0 && st.st_uid != uid)
		snprintf(why, size, "owned by uid %u, not you", (unsigned)st.st_uid);
	else if (st.st_mode & 022)
		snprintf(why, size, "writable by group or others (mode %04o)",
			 (unsigned)(st.st_mode & 07777));
	return why;
}

static void dir_read(struct status_out *o, const char *dir, bool quiet_missing)
{
	char why[128];
	struct dirent *e;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (dfd < 0) {
		if (errno != ENOENT || !quiet_missing)
			fprintf(stderr, "shiftctl: skipped %s: %s\n", dir,
				errno == ELOOP || errno == ENOTDIR ? "not a directory (a link?)"
								   : strerror(errno));
		return;
	}
	if (*dir_distrust(dfd, geteuid(), why, sizeof(why))) {
		fprintf(stderr, "shiftctl: skipped %s: %s\n", dir, why);
		close(dfd);
		return;
	}
	DIR *d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		return;
	}
	while ((e = readdir(d)))
		file_read(o, dirfd(d), e->d_name);
	closedir(d);
}

/* Root: every user's status directory under the usual places. */
static void dirs_of_all_users(struct status_out *o, const char *own)
{
	static const char *const patterns[] = { "/run/user/*/shift", "/run/shift/*",
						"/tmp/shift-[0-9]*" };
	glob_t g;

	for (size_t p = 0; p < sizeof(patterns) / sizeof(patterns[0]); p++) {
		if (glob(patterns[p], GLOB_NOSORT, NULL, &g))
			continue;
		for (size_t i = 0; i < g.gl_pathc; i++)
			if (strcmp(g.gl_pathv[i], own))
				dir_read(o, g.gl_pathv[i], true);
		globfree(&g);
	}
}

static int status(int argc, char **argv, bool stats)
{
	struct status_out o = { .stats = stats };
	const char *dir = NULL;

	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			o.json = true;
		else if (!dir && argv[i][0] != '-')
			dir = argv[i];
		else
			return usage(stderr, 2);
	}
	if (stats && !o.json)
		printf("%-7s %-24s %s\n", "PID", "COUNTER", "VALUE");
	else if (!o.json)
		printf("%-7s %-8s %-8s %-6s %-11s %-8s %-8s %-6s %-8s %-9s %-8s %4s %4s %6s %4s "
		       "%-8s %-6s %8s %-5s %-7s %s\n", "PID", "DEV", "QPN", "STATE", "SHADOW", "BACKUP",
		       "BK_QPN", "BK_ST", "PEER_BK", "SEND", "RECV", "FO", "FB", "RETX", "GEN",
		       "SWITCHED", "WQ", "PEER_MRS", "MBOX", "DGRAM", "NOTE");
	else
		printf("[");
	if (dir) {
		dir_read(&o, dir, false);
	} else if (shift_config.status_dir[0]) {
		dir_read(&o, shift_config.status_dir, true);
		if (geteuid() == 0)
			dirs_of_all_users(&o, shift_config.status_dir);
	}
	if (o.json)
		printf("%s]\n", o.rows ? "\n" : "");
	else if (!o.files)
		printf("(no process with SHIFT has reported yet)\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage(stderr, 2);
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))
		return usage(stdout, 0);
	if (!strcmp(argv[1], "--version")) {
		printf("shiftctl (SHIFT) %s\n", SHIFT_VERSION);
		return 0;
	}
	int bad = shift_config_load("");
	if (!strcmp(argv[1], "config")) {
		shift_config_print(stdout);
		return bad ? 1 : 0;
	}
	if (!strcmp(argv[1], "check"))
		return shiftctl_check();
	if (!strcmp(argv[1], "status"))
		return status(argc, argv, false);
	if (!strcmp(argv[1], "stats"))
		return status(argc, argv, true);
	return usage(stderr, 2);
}
