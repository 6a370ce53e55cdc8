/*
 * Plugin-style loading (Python extension modules, UCX/libfabric transports,
 * NCCL net plugins): modules that need libibverbs.so.1 are dlopen()ed with
 * RTLD_LOCAL one after another while the drop-in is found through
 * LD_LIBRARY_PATH. Every module, not just the first, must bind its verbs to
 * the drop-in: if the real library the drop-in loads were in the global scope,
 * later modules would bind to it and bypass SHIFT.
 * Usage: scope_loader <drop-in libibverbs.so.1> <module>...   (run with
 * LD_LIBRARY_PATH naming the drop-in's directory)
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int same_file(const char *a, const char *b)
{
	char ra[PATH_MAX], rb[PATH_MAX];

	return realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb);
}

int main(int argc, char **argv)
{
	int bad = 0;

	if (argc < 3) {
		fprintf(stderr, "usage: %s DROPIN MODULE...\n", argv[0]);
		return 2;
	}
	for (int i = 2; i < argc; i++) {
		void *h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
		void *(*ref)(void);
		Dl_info info;

		if (!h) {
			fprintf(stderr, "FAIL: dlopen %s: %s\n", argv[i], dlerror());
			return 1;
		}
		*(void **)&ref = dlsym(h, "scope_mod_ref");
		if (!ref || !dladdr(ref(), &info) || !info.dli_fname) {
			fprintf(stderr, "FAIL: %s: no scope_mod_ref or no object for it\n", argv[i]);
			return 1;
		}
		if (!same_file(info.dli_fname, argv[1])) {
			fprintf(stderr, "FAIL: module %d (%s) binds ibv_alloc_pd to %s, not the drop-in\n",
				i - 1, argv[i], info.dli_fname);
			bad++;
		} else {
			printf("ok: module %d binds ibv_alloc_pd to the drop-in\n", i - 1);
		}
	}
	return bad ? 1 : 0;
}
