/*
 * The drop-in libibverbs.so.1: loads the distro's real libibverbs, points
 * every exported trampoline at the real function (or at SHIFT's entry point
 * for the verbs SHIFT handles), fills SHIFT's lower-verbs table from the real
 * library, and defines the one exported data symbol.
 *
 * Facts this rests on (see docs/dropin.md): the real library is loaded by
 * absolute path with RTLD_NOW | RTLD_LOCAL. Local, because a drop-in that is
 * itself only in a local scope (a dependency of a module dlopen()ed with
 * RTLD_LOCAL: Python extensions, transport plugins) would otherwise put the
 * real library in the global scope, ahead of every later module's own
 * scope, and those modules would bypass SHIFT. The providers it dlopens
 * still find their IBVERBS_PRIVATE_* symbols: their NEEDED libibverbs.so.1
 * is this library (matched by soname, loaded first), whose trampolines
 * forward them. Every symbol must exist at load time
 * (BIND_NOW everywhere in Debian), hence trampolines whose slots start at a
 * lazy-resolve stub and are filled here.
 */
#include "libibverbs/dropin.h"
#include "shift/base/config.h"
#include "shift/base/version.h"
#include "shift/base/log.h"
#include "shift/base/lower.h"
#include "shift/shift.h"

#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static void *real_handle;
static struct shift_lower real_lower;

/* Where a slot points when the real library lacks its symbol: the process
 * ends as the dynamic linker ends it on a symbol lookup error with plain
 * libibverbs (exit status 127), not with a signal. */
static void missing_symbol(void)
{
	static const char msg[] = "shift: error: symbol lookup error: the application called a "
		"libibverbs symbol the real library does not provide (build and run time "
		"rdma-core differ): rebuild SHIFT against this rdma-core\n";
	ssize_t w = write(STDERR_FILENO, msg, sizeof(msg) - 1);

	(void)w;
	_exit(127);
}

static void *real_sym(const char *name, const char *version)
{
	return real_handle ? dlvsym(real_handle, name, version) : NULL;
}

#define REAL(slot, name, version) (real_lower.slot = real_sym(name, version))

/*
 * mlx5's description of a QP's queues, for native work-queue access
 * (providers/mlx5.c): from the libmlx5 the real libibverbs loaded for an
 * mlx5 device (SHIFT never loads it: RTLD_NOLOAD; the libmlx5 front, if
 * that is what answers to the name, forwards to the same).
 */
static int real_mlx5dv_init_obj(struct mlx5dv_obj *obj, uint64_t obj_type)
{
	static int (*fn)(struct mlx5dv_obj *, uint64_t);
	int (*f)(struct mlx5dv_obj *, uint64_t) = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);

	if (!f) {
		void *h = dlopen("libmlx5.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);

		if (!h)
			return EOPNOTSUPP;
		*(void **)&f = dlsym(h, "mlx5dv_init_obj");
		if (!f)
			return EOPNOTSUPP;
		__atomic_store_n(&fn, f, __ATOMIC_RELEASE);
	}
	return f(obj, obj_type);
}

static void fill_lower(const char *path)
{
	static char label[600];

	snprintf(label, sizeof(label), "rdma-core %s", path);
	real_lower.name = label;
	REAL(get_device_list, "ibv_get_device_list", "IBVERBS_1.1");
	REAL(free_device_list, "ibv_free_device_list", "IBVERBS_1.1");
	REAL(get_device_name, "ibv_get_device_name", "IBVERBS_1.1");
	REAL(get_device_guid, "ibv_get_device_guid", "IBVERBS_1.1");
	REAL(open_device, "ibv_open_device", "IBVERBS_1.1");
	REAL(close_device, "ibv_close_device", "IBVERBS_1.1");
	REAL(query_device, "ibv_query_device", "IBVERBS_1.1");
	REAL(query_port, "ibv_query_port", "IBVERBS_1.1");
	REAL(query_gid, "ibv_query_gid", "IBVERBS_1.1");
	REAL(get_async_event, "ibv_get_async_event", "IBVERBS_1.1");
	REAL(ack_async_event, "ibv_ack_async_event", "IBVERBS_1.1");
	REAL(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1");
	REAL(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1");
	REAL(reg_mr, "ibv_reg_mr", "IBVERBS_1.1");
	REAL(reg_mr_iova, "ibv_reg_mr_iova", "IBVERBS_1.7");
	REAL(reg_mr_iova2, "ibv_reg_mr_iova2", "IBVERBS_1.8");
	REAL(reg_dmabuf_mr, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
	REAL(rereg_mr, "ibv_rereg_mr", "IBVERBS_1.1");
	REAL(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1");
	REAL(create_comp_channel, "ibv_create_comp_channel", "IBVERBS_1.0");
	REAL(destroy_comp_channel, "ibv_destroy_comp_channel", "IBVERBS_1.0");
	REAL(create_cq, "ibv_create_cq", "IBVERBS_1.1");
	REAL(resize_cq, "ibv_resize_cq", "IBVERBS_1.1");
	REAL(destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1");
	REAL(get_cq_event, "ibv_get_cq_event", "IBVERBS_1.1");
	REAL(ack_cq_events, "ibv_ack_cq_events", "IBVERBS_1.1");
	REAL(create_qp, "ibv_create_qp", "IBVERBS_1.1");
	REAL(modify_qp, "ibv_modify_qp", "IBVERBS_1.1");
	REAL(query_qp, "ibv_query_qp", "IBVERBS_1.1");
	REAL(destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1");
	REAL(query_ece, "ibv_query_ece", "IBVERBS_1.10");
	REAL(set_ece, "ibv_set_ece", "IBVERBS_1.10");
	REAL(qp_to_qp_ex, "ibv_qp_to_qp_ex", "IBVERBS_1.6");
	REAL(create_srq, "ibv_create_srq", "IBVERBS_1.1");
	REAL(modify_srq, "ibv_modify_srq", "IBVERBS_1.1");
	REAL(query_srq, "ibv_query_srq", "IBVERBS_1.1");
	REAL(destroy_srq, "ibv_destroy_srq", "IBVERBS_1.1");
	REAL(create_ah, "ibv_create_ah", "IBVERBS_1.1");
	REAL(destroy_ah, "ibv_destroy_ah", "IBVERBS_1.1");
	real_lower.mlx5dv_init_obj = real_mlx5dv_init_obj;
	shift_lower_set(&real_lower);
}

/*
 * Without a real library: ibv_get_device_list fails with ELIBACC, as a
 * device list that cannot be read; every verb that needs an object can then
 * never be reached with a valid one, and is given one that fails the same
 * way (NULL or 0, errno ELIBACC). The *_str helpers answer "unknown".
 */
static struct ibv_device **no_real_get_device_list(int *num)
{
	if (num)
		*num = 0;
	errno = ELIBACC;
	return NULL;
}

static long no_real_verb(void)
{
	errno = ELIBACC;
	return 0;
}

static const char *no_real_str(void)
{
	return "unknown";
}

static void *no_real_slot(const char *name)
{
	size_t n = strlen(name);

	if (!strcmp(name, "ibv_get_device_list"))
		return (void *)no_real_get_device_list;
	if (n > 4 && !strcmp(name + n - 4, "_str"))
		return (void *)no_real_str;
	return (void *)no_real_verb;
}

static void no_real_library(const char *path, const char *why)
{
	shift_err("cannot load the real libibverbs (%s: %s): no RDMA device is usable "
		  "(ibv_get_device_list fails with ELIBACC); set SHIFT_REAL_LIBIBVERBS to "
		  "the distro's libibverbs.so.1", path, why);
	for (unsigned int i = 0; i < shift_exports_count; i++)
		__atomic_store_n(shift_exports[i].slot, no_real_slot(shift_exports[i].name),
				 __ATOMIC_RELEASE);
}

static void dropin_init_once(void)
{
	static char path[SHIFT_REAL_PATH_MAX];
	const char *env = getenv("SHIFT_REAL_LIBIBVERBS");
	const char *why = NULL;
	unsigned int missing = 0;

	/* "": the search decides, unless the configuration names a file */
	shift_config_load("");
	if (env && *env && strlen(env) >= sizeof(path)) {
		no_real_library("SHIFT_REAL_LIBIBVERBS", "longer than 511 bytes");
		return;
	}
	real_handle = shift_real_open(shift_config.real_lib, path, sizeof(path), &why);
	if (!real_handle) {
		no_real_library(path, why);
		return;
	}

	for (unsigned int i = 0; i < shift_exports_count; i++) {
		const struct shift_export *e = &shift_exports[i];
		void *real = dlvsym(real_handle, e->name, e->version);

		if (!real) {
			missing++;
			shift_debug("real library lacks %s@%s", e->name, e->version);
			real = (void *)missing_symbol;
		}
		if (e->mode == SHIFT_EXPORT_SHIFT && shift_config.enable)
			__atomic_store_n(e->slot, e->shift_fn, __ATOMIC_RELEASE);
		else
			__atomic_store_n(e->slot, real, __ATOMIC_RELEASE);
	}
	/* data symbols start with the real library's value */
	for (const struct shift_export_data *d = shift_export_datas; d->name; d++) {
		void *real = dlvsym(real_handle, d->name, d->version);

		if (real)
			memcpy(d->storage, real, d->size);
	}
	/* (an application that calls one is told then: missing_symbol) */
	if (missing)
		shift_info("%u exported symbols missing from %s (built against another rdma-core?)",
			   missing, path);

	fill_lower(path);
	shift_info("SHIFT " SHIFT_VERSION " %s over %s", shift_config.enable ? "enabled" : "disabled (pass-through)",
		   path);
}

void shift_dropin_init(void)
{
	pthread_once(&init_once, dropin_init_once);
}

__attribute__((constructor)) static void shift_dropin_ctor(void)
{
	shift_dropin_init();
}
