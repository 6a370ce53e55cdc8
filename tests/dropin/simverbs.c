/*
 * A stand-in for the distro's libibverbs.so.1 over the simulated RNIC, for
 * tests of the drop-in's loading paths without RDMA hardware
 * (tests/dropin/qp_loader.c): point SHIFT_REAL_LIBIBVERBS at it. It exports
 * the verbs SHIFT's lower table takes from the real library (libibverbs/
 * dropin.c fill_lower) under their real names and versions, each calling
 * the simulated world's locked table (sim_locked.h: SHIFT's threads and the
 * application call in concurrently). The world, made when the library is
 * loaded: two hosts of four devices each (sim0_0..sim0_3, sim1_0..sim1_3),
 * so one process holds both ends of connections and their backups.
 */
#include <infiniband/verbs.h>

#include "sim.h"
#include "sim_locked.h"

static const struct shift_lower *L;

__attribute__((constructor)) static void simverbs_init(void)
{
	struct sim_world_opts o = { .seed = 1 };
	struct sim_world *w = sim_world_create(&o);

	sim_host_create(w, 4);
	sim_host_create(w, 4);
	L = sim_locked_lower(w);
}

/* sv_NAME bound to NAME@@VERSION (simverbs.map names the nodes) */
#define EXPORT(n, ver) __asm__(".symver sv_" #n ", ibv_" #n "@@" ver)
#define F1(n, ver, R, T1) \
	R sv_##n(T1 a); R sv_##n(T1 a) { return L->n(a); } EXPORT(n, ver)
#define F2(n, ver, R, T1, T2) \
	R sv_##n(T1 a, T2 b); R sv_##n(T1 a, T2 b) { return L->n(a, b); } EXPORT(n, ver)
#define F3(n, ver, R, T1, T2, T3) \
	R sv_##n(T1 a, T2 b, T3 c); \
	R sv_##n(T1 a, T2 b, T3 c) { return L->n(a, b, c); } EXPORT(n, ver)
#define F4(n, ver, R, T1, T2, T3, T4) \
	R sv_##n(T1 a, T2 b, T3 c, T4 d); \
	R sv_##n(T1 a, T2 b, T3 c, T4 d) { return L->n(a, b, c, d); } EXPORT(n, ver)
#define F5(n, ver, R, T1, T2, T3, T4, T5) \
	R sv_##n(T1 a, T2 b, T3 c, T4 d, T5 e); \
	R sv_##n(T1 a, T2 b, T3 c, T4 d, T5 e) { return L->n(a, b, c, d, e); } EXPORT(n, ver)
#define F6(n, ver, R, T1, T2, T3, T4, T5, T6) \
	R sv_##n(T1 a, T2 b, T3 c, T4 d, T5 e, T6 f); \
	R sv_##n(T1 a, T2 b, T3 c, T4 d, T5 e, T6 f) { return L->n(a, b, c, d, e, f); } \
	EXPORT(n, ver)
#define V1(n, ver, T1) \
	void sv_##n(T1 a); void sv_##n(T1 a) { L->n(a); } EXPORT(n, ver)
#define V2(n, ver, T1, T2) \
	void sv_##n(T1 a, T2 b); void sv_##n(T1 a, T2 b) { L->n(a, b); } EXPORT(n, ver)

typedef struct ibv_device **devlist;
typedef struct ibv_device *dev;
typedef struct ibv_context *ctx;
typedef struct ibv_pd *pd;
typedef struct ibv_mr *mr;
typedef struct ibv_cq *cq;
typedef struct ibv_qp *qp;
typedef struct ibv_srq *srq;
typedef struct ibv_comp_channel *chan;
typedef const char *cstr;

F1(get_device_list, "IBVERBS_1.1", devlist, int *);
V1(free_device_list, "IBVERBS_1.1", devlist);
F1(get_device_name, "IBVERBS_1.1", cstr, dev);
F1(get_device_guid, "IBVERBS_1.1", __be64, dev);
F1(open_device, "IBVERBS_1.1", ctx, dev);
F1(close_device, "IBVERBS_1.1", int, ctx);
F2(query_device, "IBVERBS_1.1", int, ctx, struct ibv_device_attr *);
F3(query_port, "IBVERBS_1.1", int, ctx, uint8_t, struct ibv_port_attr *);
F4(query_gid, "IBVERBS_1.1", int, ctx, uint8_t, int, union ibv_gid *);
F2(get_async_event, "IBVERBS_1.1", int, ctx, struct ibv_async_event *);
V1(ack_async_event, "IBVERBS_1.1", struct ibv_async_event *);
F1(alloc_pd, "IBVERBS_1.1", pd, ctx);
F1(dealloc_pd, "IBVERBS_1.1", int, pd);
F4(reg_mr, "IBVERBS_1.1", mr, pd, void *, size_t, int);
F5(reg_mr_iova, "IBVERBS_1.7", mr, pd, void *, size_t, uint64_t, int);
F5(reg_mr_iova2, "IBVERBS_1.8", mr, pd, void *, size_t, uint64_t, unsigned int);
F6(reg_dmabuf_mr, "IBVERBS_1.12", mr, pd, uint64_t, size_t, uint64_t, int, int);
F6(rereg_mr, "IBVERBS_1.1", int, mr, int, pd, void *, size_t, int);
F1(dereg_mr, "IBVERBS_1.1", int, mr);
F1(create_comp_channel, "IBVERBS_1.0", chan, ctx);
F1(destroy_comp_channel, "IBVERBS_1.0", int, chan);
F5(create_cq, "IBVERBS_1.1", cq, ctx, int, void *, chan, int);
F2(resize_cq, "IBVERBS_1.1", int, cq, int);
F1(destroy_cq, "IBVERBS_1.1", int, cq);
F3(get_cq_event, "IBVERBS_1.1", int, chan, struct ibv_cq **, void **);
V2(ack_cq_events, "IBVERBS_1.1", cq, unsigned int);
F2(create_qp, "IBVERBS_1.1", qp, pd, struct ibv_qp_init_attr *);
F3(modify_qp, "IBVERBS_1.1", int, qp, struct ibv_qp_attr *, int);
F4(query_qp, "IBVERBS_1.1", int, qp, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
F1(destroy_qp, "IBVERBS_1.1", int, qp);
F2(query_ece, "IBVERBS_1.10", int, qp, struct ibv_ece *);
F2(set_ece, "IBVERBS_1.10", int, qp, struct ibv_ece *);
F2(create_srq, "IBVERBS_1.1", srq, pd, struct ibv_srq_init_attr *);
F3(modify_srq, "IBVERBS_1.1", int, srq, struct ibv_srq_attr *, int);
F2(query_srq, "IBVERBS_1.1", int, srq, struct ibv_srq_attr *);
F1(destroy_srq, "IBVERBS_1.1", int, srq);
