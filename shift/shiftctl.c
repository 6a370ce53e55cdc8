/*
 * shiftctl: look at SHIFT from outside the application.
 *   shiftctl --version       SHIFT's version
 *   shiftctl check           KV store reachable, backup NICs present
 *   shiftctl config          every SHIFT_* knob, its value here and its doc
 *   shiftctl status [DIR]    per process, each default QP and its backup QP
 *                            (from the status files SHIFT's threads write in
 *                            $SHIFT_STATUS_DIR, default /tmp/shift)
 */
#include "shift/base/config.h"
#include "shift/base/version.h"
#include "shift/check.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <sys/types.h>

static int errno_is_esrch(void) { return errno == ESRCH; }

static int usage(void)
{
	fprintf(stderr, "usage: shiftctl --version | check | config | status [DIR]\n");
	return 2;
}

static int status(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int files = 0;

	if (!d) {
		printf("no SHIFT status in %s (no process running with SHIFT?)\n", dir);
		return 0;
	}
	printf("%-7s %-8s %-8s %-6s %-11s %-8s %-8s %-6s %-8s %-9s %-8s %4s %4s %6s %4s %-8s %s\n",
	       "PID", "DEV", "QPN", "STATE", "SHADOW", "BACKUP", "BK_QPN", "BK_ST", "PEER_BK", "SEND",
	       "RECV", "FO", "FB", "RETX", "GEN", "SWITCHED", "NOTE");
	while ((e = readdir(d))) {
		char path[4096], line[1024];
		int pid;

		if (strncmp(e->d_name, "shift-", 6) || !strstr(e->d_name, ".status") ||
		    strstr(e->d_name, ".tmp"))
			continue;
		if (sscanf(e->d_name, "shift-%d-", &pid) == 1 && kill(pid, 0) && errno_is_esrch())
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		files++;
		while (fgets(line, sizeof(line), f)) {
			char dev[64], st[16], sh[16], bk[64], bks[16], ss[16], rs[16], when[16] = "-";
			unsigned qpn, bkqpn, peer, gen;
			unsigned long fo, fb, retx;
			unsigned long long last;
			int p, off = 0;

			if (line[0] == '#')
				continue;
			if (sscanf(line, "%d %63s %u %15s %15s %63s %u %15s %u %15s %15s %lu %lu %lu %u %llu %n",
				   &p, dev, &qpn, st, sh, bk, &bkqpn, bks, &peer, ss, rs, &fo, &fb, &retx, &gen,
				   &last, &off) < 16)
				continue;
			line[strcspn(line, "\n")] = '\0';
			if (last) {
				time_t t = (time_t)last;
				struct tm tm;

				if (localtime_r(&t, &tm))
					strftime(when, sizeof(when), "%H:%M:%S", &tm);
			}
			printf("%-7d %-8s %-8u %-6s %-11s %-8s %-8u %-6s %-8u %-9s %-8s %4lu %4lu %6lu %4u %-8s %s\n",
			       p, dev, qpn, st, sh, bk, bkqpn, bks, peer, ss, rs, fo, fb, retx, gen, when,
			       off ? line + off : "");
		}
		fclose(f);
	}
	closedir(d);
	if (!files)
		printf("(no process with SHIFT has reported yet)\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage();
	if (!strcmp(argv[1], "--version")) {
		printf("shiftctl (SHIFT) %s\n", SHIFT_VERSION);
		return 0;
	}
	shift_config_load(NULL);
	if (!strcmp(argv[1], "config")) {
		shift_config_print(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "check"))
		return shiftctl_check();
	if (!strcmp(argv[1], "status"))
		return status(argc > 2 ? argv[2] : shift_config.status_dir);
	return usage();
}
