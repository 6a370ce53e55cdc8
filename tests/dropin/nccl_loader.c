/*
 * NCCL-style loader test: NCCL dlopen()s "libibverbs.so" and resolves each
 * verb with dlvsym(h, name, "IBVERBS_1.1") (plus a few newer versions). Each
 * must resolve, and resolve inside the SHIFT library (dladdr says which
 * object holds the address).
 * Usage: nccl_loader <path of the drop-in's libibverbs.so>
 *        nccl_loader <name to dlopen> <path of the drop-in>   (NCCL's own
 *        dlopen("libibverbs.so") under LD_PRELOAD: must reach the drop-in)
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
	const char *name;
	const char *version;
} wanted[] = {
	{ "ibv_get_device_list", "IBVERBS_1.1" },
	{ "ibv_free_device_list", "IBVERBS_1.1" },
	{ "ibv_get_device_name", "IBVERBS_1.1" },
	{ "ibv_open_device", "IBVERBS_1.1" },
	{ "ibv_close_device", "IBVERBS_1.1" },
	{ "ibv_get_async_event", "IBVERBS_1.1" },
	{ "ibv_ack_async_event", "IBVERBS_1.1" },
	{ "ibv_query_device", "IBVERBS_1.1" },
	{ "ibv_query_port", "IBVERBS_1.1" },
	{ "ibv_query_gid", "IBVERBS_1.1" },
	{ "ibv_query_qp", "IBVERBS_1.1" },
	{ "ibv_alloc_pd", "IBVERBS_1.1" },
	{ "ibv_dealloc_pd", "IBVERBS_1.1" },
	{ "ibv_reg_mr", "IBVERBS_1.1" },
	{ "ibv_dereg_mr", "IBVERBS_1.1" },
	{ "ibv_create_cq", "IBVERBS_1.1" },
	{ "ibv_destroy_cq", "IBVERBS_1.1" },
	{ "ibv_create_qp", "IBVERBS_1.1" },
	{ "ibv_modify_qp", "IBVERBS_1.1" },
	{ "ibv_destroy_qp", "IBVERBS_1.1" },
	{ "ibv_fork_init", "IBVERBS_1.1" },
	{ "ibv_event_type_str", "IBVERBS_1.1" },
	{ "ibv_reg_mr_iova2", "IBVERBS_1.8" },
	{ "ibv_reg_dmabuf_mr", "IBVERBS_1.12" },
	{ "ibv_query_ece", "IBVERBS_1.10" },
	{ "ibv_set_ece", "IBVERBS_1.10" },
};

int main(int argc, char **argv)
{
	char want[PATH_MAX], got[PATH_MAX];
	int bad = 0;

	if (argc != 2 && argc != 3) {
		fprintf(stderr, "usage: %s <drop-in libibverbs.so> | <name> <drop-in>\n", argv[0]);
		return 2;
	}
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) {
		fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
		return 1;
	}
	if (!realpath(argv[argc - 1], want)) {
		perror("realpath");
		return 1;
	}
	for (size_t i = 0; i < sizeof(wanted) / sizeof(wanted[0]); i++) {
		void *p = dlvsym(h, wanted[i].name, wanted[i].version);
		Dl_info info;

		if (!p) {
			printf("FAIL %s@%s: not resolved\n", wanted[i].name, wanted[i].version);
			bad++;
			continue;
		}
		if (!dladdr(p, &info) || !info.dli_fname || !realpath(info.dli_fname, got)) {
			printf("FAIL %s@%s: dladdr found no object\n", wanted[i].name,
			       wanted[i].version);
			bad++;
			continue;
		}
		if (strcmp(got, want)) {
			printf("FAIL %s@%s: resolves in %s, not in SHIFT (%s)\n", wanted[i].name,
			       wanted[i].version, got, want);
			bad++;
			continue;
		}
		printf("ok   %s@%s -> %s\n", wanted[i].name, wanted[i].version, got);
	}
	/* and calling through it behaves like the real library */
	struct ibv_device **(*get_list)(int *) =
		(struct ibv_device **(*)(int *))dlvsym(h, "ibv_get_device_list", "IBVERBS_1.1");
	void (*free_list)(struct ibv_device **) =
		(void (*)(struct ibv_device **))dlvsym(h, "ibv_free_device_list", "IBVERBS_1.1");
	int n = -1;
	struct ibv_device **list = get_list ? get_list(&n) : NULL;
	printf("ibv_get_device_list through the drop-in: %s, %d devices\n",
	       list ? "a list" : "NULL", n);
	if (list && free_list)
		free_list(list);
	printf("%zu symbols: %d failed\n", sizeof(wanted) / sizeof(wanted[0]), bad);
	return bad ? 1 : 0;
}
