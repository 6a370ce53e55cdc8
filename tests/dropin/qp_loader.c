/*
 * Issue 22's must-show for LD_LIBRARY_PATH: a program that does not link
 * libibverbs dlopen()s (RTLD_LOCAL) modules that do and that create QPs
 * (tests/dropin/qpmod.c: one connected pair each, on devices of their own:
 * two contexts of one device in one process share one status file name);
 * every one of those QPs
 * must be listed as protected (SHADOW "ready") by `shiftctl status`. With
 * the real library in the global scope, the second module's verbs would
 * bind to it and its QPs would not be SHIFT's at all.
 * Usage: qp_loader SHIFTCTL STATUS_DIR MODULE...   (run with LD_LIBRARY_PATH
 * naming the drop-in's directory, SHIFT_REAL_LIBIBVERBS at the simulated
 * libibverbs, SHIFT_STATUS_DIR=STATUS_DIR, SHIFT_KV_URL=mem://...)
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Rows of this process that shiftctl lists with SHADOW "ready"; out gets
 * the whole listing. */
static int count_ready(const char *shiftctl, const char *dir, char *out, size_t cap)
{
	char cmd[1024], line[1024], pid[16];
	size_t used = 0;
	int ready = 0;
	FILE *p;

	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	snprintf(cmd, sizeof(cmd), "'%s' status '%s'", shiftctl, dir);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	out[0] = '\0';
	while (fgets(line, sizeof(line), p)) {
		char f0[16], f1[64], f2[16], f3[16], f4[16];

		if (used + strlen(line) < cap) {
			memcpy(out + used, line, strlen(line) + 1);
			used += strlen(line);
		}
		if (sscanf(line, "%15s %63s %15s %15s %15s", f0, f1, f2, f3, f4) == 5 &&
		    !strcmp(f0, pid) && (!strcmp(f4, "ready") || !strcmp(f4, "protected")))
			ready++;
	}
	pclose(p);
	return ready;
}

int main(int argc, char **argv)
{
	static char listing[16384];
	int want = 0, got = 0;

	if (argc < 4 || argc > 4 + 1) {
		fprintf(stderr, "usage: %s SHIFTCTL STATUS_DIR MODULE [MODULE]\n", argv[0]);
		return 2;
	}
	for (int i = 3; i < argc; i++) {
		void *h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
		int (*conn)(const char *, const char *);
		char a[16], b[16];

		if (!h) {
			fprintf(stderr, "FAIL: dlopen %s: %s\n", argv[i], dlerror());
			return 1;
		}
		*(void **)&conn = dlsym(h, "qpmod_connect");
		/* each module its own devices: sim0_0-sim1_0, sim0_2-sim1_2
		 * (backups sim0_1, sim0_3, ...) */
		snprintf(a, sizeof(a), "sim0_%d", 2 * (i - 3));
		snprintf(b, sizeof(b), "sim1_%d", 2 * (i - 3));
		if (!conn || conn(a, b)) {
			fprintf(stderr, "FAIL: module %s could not connect its QPs\n", argv[i]);
			return 1;
		}
		want += 2;
	}
	/* SHIFT's per-RNIC threads shadow the QPs in the background */
	for (int t = 0; t < 100 && got < want; t++) {
		struct timespec ts = { 0, 100 * 1000 * 1000 };

		nanosleep(&ts, NULL);
		got = count_ready(argv[1], argv[2], listing, sizeof(listing));
	}
	fputs(listing, stdout);
	if (got < want) {
		printf("FAIL: %d of the modules' %d QPs listed as protected\n", got, want);
		return 1;
	}
	printf("ok: all %d QPs of %d modules listed as protected\n", want, argc - 3);
	return 0;
}
