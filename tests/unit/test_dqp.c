/*
 * Unit tests of the work-queue mirror (shift/dqp.[ch]) on its own: what a
 * post records, where (power-of-two strides, wrap-around), what a signaled
 * completion retires, the receive-consumer count, and the single bound the
 * fast paths test (room and the Default state at once).
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "shift/dp/dqp.h"
#include "shift/dp/state.h"
#include "test_env.h"

struct fixture {
	struct ibv_qp qp;
	struct shift_dqp *d;
	uint8_t buf[256];
};

/* (the recorders' stop, where a test does not look at it) */
static const struct ibv_send_wr *stop_send;
static const struct ibv_recv_wr *stop_recv;

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	struct ibv_qp_cap cap = { .max_send_wr = 6, .max_recv_wr = 5, .max_send_sge = 3,
				  .max_recv_sge = 2, .max_inline_data = 40 };

	assert_non_null(f);
	f->qp.qp_num = 77;
	f->d = shift_dqp_create(&f->qp, &cap, 0);
	assert_non_null(f->d);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	shift_dqp_destroy(f->d);
	free(f);
	return 0;
}

static struct ibv_send_wr wr_of(struct ibv_sge *sge, enum ibv_wr_opcode op, unsigned flags,
				uint64_t id)
{
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = sge, .num_sge = 1, .opcode = op,
				  .send_flags = flags, .imm_data = (uint32_t)id * 3 };

	wr.wr.rdma.remote_addr = 0x1000 + id;
	wr.wr.rdma.rkey = 0x40 + (uint32_t)id;
	return wr;
}

/* post one common WR the way the fast path does; false if it would not */
static bool fast_post(struct shift_dqp *d, const struct ibv_send_wr *wr)
{
	bool ok;

	shift_dqp_lock(d);
	ok = shift_dqp_send_is_common(wr) && shift_dqp_sq_room(d);
	if (ok)
		shift_dqp_record_one(d, wr);
	shift_dqp_unlock(d);
	return ok;
}

static void complete_send(struct shift_dqp *d)
{
	struct ibv_wc wc = { .status = IBV_WC_SUCCESS, .opcode = IBV_WC_RDMA_WRITE };

	shift_dqp_retire(d, &wc);
}

static void test_geometry(void **state)
{
	struct fixture *f = *state;
	struct shift_dqp *d = f->d;

	assert_int_equal(d->sq_size, 16); /* twice max_send_wr: see dqp.h on syncs */
	assert_int_equal(d->rq_size, 8);
	/* strides of exactly the header, the SGEs and the inline bytes (8-byte
	 * aligned), not rounded up to a power of two */
	assert_int_equal(d->sq_stride, sizeof(struct shift_swqe) + 3 * sizeof(struct ibv_sge) + 40);
	assert_int_equal(d->rq_stride, sizeof(struct shift_rwqe) + 2 * sizeof(struct ibv_sge));
	assert_int_equal(d->sq_stride % 8, 0);
	assert_int_equal((uintptr_t)d->rq % 8, 0);
	assert_ptr_equal(d->rq, d->sq + d->sq_size * d->sq_stride);
	/* index i and i + size share an entry; neighbours do not overlap */
	for (uint64_t i = 0; i < 3 * d->sq_size; i++) {
		uint8_t *e = (uint8_t *)shift_dqp_swqe(d, i);

		assert_ptr_equal(e, shift_dqp_swqe(d, i + d->sq_size));
		assert_true(e >= d->sq && e + d->sq_stride <= d->sq + d->sq_size * d->sq_stride);
		assert_int_equal((uint64_t)(e - d->sq), (i % d->sq_size) * d->sq_stride);
	}
	for (uint64_t i = 0; i < 2 * d->rq_size; i++)
		assert_int_equal((uint64_t)((uint8_t *)shift_dqp_rwqe(d, i) - d->rq),
				 (i % d->rq_size) * d->rq_stride);
}

static void test_records_and_retires(void **state)
{
	struct fixture *f = *state;
	struct shift_dqp *d = f->d;
	struct ibv_sge sge = { .addr = (uintptr_t)f->buf, .length = 64, .lkey = 9 };

	/* 1 unsignaled, 2 signaled, 3 unsignaled, 4 signaled */
	for (uint64_t id = 1; id <= 4; id++) {
		struct ibv_send_wr wr = wr_of(&sge, id == 3 ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE,
					      id % 2 ? 0 : IBV_SEND_SIGNALED, id);

		assert_true(fast_post(d, &wr));
		sge.length++; /* the application may reuse its SGE list */
	}
	assert_int_equal(d->sq_head, 4);
	for (uint64_t i = 0; i < 4; i++) {
		struct shift_swqe *e = shift_dqp_swqe(d, i);

		assert_int_equal(e->wr_id, i + 1);
		assert_int_equal(e->num_sge, 1);
		assert_int_equal(e->opcode, i == 2 ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE);
		assert_int_equal(e->imm, (uint32_t)(i + 1) * 3);
		assert_int_equal(e->remote_addr, 0x1000 + i + 1);
		assert_int_equal(e->rkey, 0x40 + i + 1);
		assert_int_equal(e->sge[0].length, 64 + i);
		assert_int_equal(e->sge[0].lkey, 9);
	}
	/* the first signaled completion retires WR 1 (unsignaled) and WR 2 */
	complete_send(d);
	shift_dqp_sync(d);
	assert_int_equal(d->sq_tail, 2);
	complete_send(d);
	shift_dqp_sync(d);
	assert_int_equal(d->sq_tail, 4);
	/* a sync with nothing new completed changes nothing */
	shift_dqp_sync(d);
	assert_int_equal(d->sq_tail, 4);
	/* and the ring wraps: 16 more fit, the 17th does not until one retires */
	for (uint64_t id = 5; id < 21; id++) {
		struct ibv_send_wr wr = wr_of(&sge, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, id);

		assert_true(fast_post(d, &wr));
	}
	struct ibv_send_wr wr = wr_of(&sge, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 21);

	assert_false(fast_post(d, &wr));
	complete_send(d);
	assert_true(fast_post(d, &wr));
	assert_int_equal(shift_dqp_swqe(d, 20)->wr_id, 21);
	assert_int_equal(shift_dqp_swqe(d, 5)->wr_id, 6);
	assert_int_equal(d->send_state, SHIFT_SEND_DEFAULT);
}

/* Retirement walks back over the signaled WRs still outstanding: several
 * completions counted between syncs, unsignaled runs, unsignaled WRs after
 * the last signaled one (retired only by a later signaled completion). */
static void test_retire_walk(void **state)
{
	struct fixture *f = *state;
	struct shift_dqp *d = f->d;
	struct ibv_sge sge = { .addr = (uintptr_t)f->buf, .length = 8, .lkey = 9 };
	/* s u u s s u s u u: signaled at 0, 3, 4, 6 */
	static const bool sig[] = { 1, 0, 0, 1, 1, 0, 1, 0, 0 };
	/* sq_tail after the k-th signaled completion */
	static const uint64_t tail_after[] = { 0, 1, 4, 5, 7 };

	for (uint64_t i = 0; i < 9; i++) {
		struct ibv_send_wr wr = wr_of(&sge, IBV_WR_RDMA_WRITE,
					      sig[i] ? IBV_SEND_SIGNALED : 0, i);

		assert_true(fast_post(d, &wr));
	}
	assert_int_equal(d->sig_head, 4);
	complete_send(d);
	complete_send(d); /* two counted before one sync */
	shift_dqp_sync(d);
	assert_int_equal(d->sq_tail, tail_after[2]);
	complete_send(d);
	shift_dqp_sync(d);
	assert_int_equal(d->sq_tail, tail_after[3]);
	complete_send(d);
	shift_dqp_sync(d);
	assert_int_equal(d->sq_tail, tail_after[4]); /* WRs 7 and 8 stay outstanding */
	assert_int_equal(d->sq_head, 9);
	/* a refused signaled WR is forgotten, its count with it */
	struct ibv_send_wr wr = wr_of(&sge, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 9);

	assert_true(fast_post(d, &wr));
	assert_int_equal(d->sig_head, 5);
	shift_dqp_lock(d);
	shift_dqp_unrecord_last_send(d);
	shift_dqp_unlock(d);
	assert_int_equal(d->sig_head, 4);
	assert_int_equal(d->sq_head, 9);
}

static void test_uncommon_wrs(void **state)
{
	struct fixture *f = *state;
	struct shift_dqp *d = f->d;
	struct ibv_sge sge[3] = {
		{ .addr = (uintptr_t)f->buf, .length = 5, .lkey = 1 },
		{ .addr = (uintptr_t)f->buf + 5, .length = 7, .lkey = 2 },
		{ .addr = (uintptr_t)f->buf + 12, .length = 3, .lkey = 3 },
	};
	struct ibv_send_wr two = wr_of(sge, IBV_WR_SEND, IBV_SEND_SIGNALED, 1);
	struct ibv_send_wr inl = wr_of(sge, IBV_WR_RDMA_WRITE, IBV_SEND_INLINE, 2);
	struct ibv_send_wr fadd = wr_of(sge, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_SEND_SIGNALED, 3);

	for (int i = 0; i < 20; i++)
		f->buf[i] = (uint8_t)(0xa0 + i);
	two.num_sge = 3;
	inl.num_sge = 2;
	fadd.wr.atomic.remote_addr = 0x5000;
	fadd.wr.atomic.compare_add = 7;
	fadd.wr.atomic.swap = 8;
	fadd.wr.atomic.rkey = 0x77;
	/* none of them is the fast path's */
	assert_false(shift_dqp_send_is_common(&two));
	assert_false(shift_dqp_send_is_common(&inl));
	assert_false(shift_dqp_send_is_common(&fadd));
	two.next = &inl;
	inl.next = &fadd;
	shift_dqp_lock(d);
	assert_int_equal(shift_dqp_record_send(d, &two, &stop_send), 0);
	shift_dqp_unlock(d);
	memset(f->buf, 0, 20); /* inline: SHIFT kept its own copy */

	struct shift_swqe *e = shift_dqp_swqe(d, 0);
	assert_int_equal(e->num_sge, 3);
	assert_int_equal(e->sge[2].lkey, 3);
	e = shift_dqp_swqe(d, 1);
	assert_true(e->send_flags & IBV_SEND_INLINE);
	assert_int_equal(e->inline_len, 12);
	for (int i = 0; i < 12; i++)
		assert_int_equal(((uint8_t *)&e->sge[d->max_send_sge])[i], 0xa0 + i);
	e = shift_dqp_swqe(d, 2);
	assert_int_equal(e->remote_addr, 0x5000);
	assert_int_equal(e->compare_add, 7);
	assert_int_equal(e->swap, 8);
	assert_int_equal(e->rkey, 0x77);
	/* inline bytes over the QP's max_inline_data, or more SGEs than its
	 * max_send_sge, after a good WR: the recorder stops there (the
	 * provider refuses that WR), the QP stays protected */
	struct ibv_send_wr good = wr_of(sge, IBV_WR_RDMA_WRITE, 0, 4);
	struct ibv_send_wr big = wr_of(sge, IBV_WR_RDMA_WRITE, IBV_SEND_INLINE, 5);
	struct ibv_sge bsge = { .addr = (uintptr_t)f->buf, .length = 41 };
	const struct ibv_send_wr *stop = NULL;

	big.sg_list = &bsge;
	good.next = &big;
	shift_dqp_lock(d);
	assert_int_equal(shift_dqp_record_send(d, &good, &stop), 1);
	assert_ptr_equal(stop, &big);
	assert_int_equal(d->sq_head, 4);
	bsge.length = 40; /* (at the limit: mirrored) */
	stop = NULL;
	assert_int_equal(shift_dqp_record_send(d, &big, &stop), 0);
	assert_null(stop);
	assert_int_equal(shift_dqp_swqe(d, 4)->inline_len, 40);
	struct ibv_send_wr many = two;

	many.next = NULL;
	many.num_sge = (int)d->max_send_sge + 1;
	assert_int_equal(shift_dqp_record_send(d, &many, &stop), 1);
	assert_ptr_equal(stop, &many);
	assert_int_equal(d->sq_head, 5);
	shift_dqp_unlock(d);
	assert_int_equal(d->send_state, SHIFT_SEND_DEFAULT);
}

static void test_consumers_posted(void **state)
{
	struct fixture *f = *state;
	struct shift_dqp *d = f->d;
	struct ibv_sge sge = { .addr = (uintptr_t)f->buf, .length = 8 };
	const enum ibv_wr_opcode ops[] = { IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM,
					   IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_READ };
	uint64_t want = 0;

	for (unsigned i = 0; i < 5; i++) {
		struct ibv_send_wr wr = wr_of(&sge, ops[i], IBV_SEND_SIGNALED, i);

		assert_true(fast_post(d, &wr));
		want += shift_wr_consumes_recv(ops[i]);
		complete_send(d);
	}
	assert_int_equal(want, 3);
	assert_int_equal(shift_dqp_consumers_posted(d), want);
	/* the slow path's opcodes, and an unknown one, counted alike */
	struct ibv_send_wr inv = wr_of(&sge, IBV_WR_SEND_WITH_INV, 0, 9);
	struct ibv_send_wr odd = wr_of(&sge, (enum ibv_wr_opcode)99, 0, 10);

	shift_dqp_lock(d);
	assert_int_equal(shift_dqp_record_send(d, &inv, &stop_send), 0);
	assert_int_equal(shift_dqp_record_send(d, &odd, &stop_send), 0);
	assert_int_equal(shift_dqp_consumers_posted(d), want + 1);
	/* the provider refused the last two: forgotten, count with them */
	shift_dqp_unrecord_last_send(d);
	shift_dqp_unrecord_last_send(d);
	shift_dqp_unlock(d);
	assert_int_equal(shift_dqp_consumers_posted(d), want);
	assert_int_equal(d->posted_by_op[shift_dqp_opslot(99)], 0);
}

/* the fast paths' bound: room and the Default state, in one compare */
static void test_bound_follows_state(void **state)
{
	struct fixture *f = *state;
	struct shift_dqp *d = f->d;
	struct ibv_sge sge = { .addr = (uintptr_t)f->buf, .length = 8 };
	struct ibv_send_wr wr = wr_of(&sge, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1);
	struct ibv_recv_wr rwr = { .wr_id = 5, .sg_list = &sge, .num_sge = 1 };

	assert_true(fast_post(d, &wr));
	shift_dqp_lock(d);
	assert_true(shift_dqp_rq_room(d));
	/* leaving Default (as failover does, under post_lock) */
	shift_dqp_set_send_state(d, SHIFT_SEND_FALLBACK, "test");
	shift_dqp_set_recv_state(d, SHIFT_RECV_FALLBACK, "test");
	assert_false(shift_dqp_sq_room(d));
	assert_false(shift_dqp_rq_room(d));
	/* the generic recorders still find the room there is */
	assert_true(shift_dqp_sq_free(d));
	assert_true(shift_dqp_rq_free(d));
	assert_int_equal(shift_dqp_record_send(d, &wr, &stop_send), 0);
	assert_int_equal(shift_dqp_record_recv(d, &rwr, &stop_recv), 0);
	assert_int_equal(d->send_state, SHIFT_SEND_FALLBACK);
	/* a sync while failed over keeps the bound shut */
	shift_dqp_sync_locked(d);
	assert_false(shift_dqp_sq_room(d));
	/* receives back, sends not yet: still no receive fast path */
	shift_dqp_set_recv_state(d, SHIFT_RECV_DEFAULT, "test");
	assert_false(shift_dqp_rq_room(d));
	/* back to Default: the next post computes the bound again */
	shift_dqp_set_send_state(d, SHIFT_SEND_DEFAULT, "test");
	assert_true(shift_dqp_sq_room(d));
	assert_true(shift_dqp_rq_room(d));
	shift_dqp_unlock(d);
	assert_true(fast_post(d, &wr));
	assert_int_equal(d->sq_head, 3);
	assert_int_equal(d->rq_head, 1);
}

static void test_receive_overflow(void **state)
{
	struct fixture *f = *state;
	struct shift_dqp *d = f->d;
	struct ibv_sge sge = { .addr = (uintptr_t)f->buf, .length = 8 };
	struct ibv_recv_wr rwr = { .sg_list = &sge, .num_sge = 1 };

	shift_dqp_lock(d);
	for (unsigned i = 0; i < d->rq_size; i++) {
		assert_true(shift_dqp_rq_room(d));
		rwr.wr_id = i;
		shift_dqp_record_recv_one(d, &rwr, 1);
	}
	assert_false(shift_dqp_rq_room(d));
	assert_int_equal(shift_dqp_record_recv(d, &rwr, &stop_recv), -1);
	shift_dqp_unlock(d);
	assert_int_equal(d->send_state, SHIFT_SEND_UNPROTECTED);
	assert_int_equal(shift_dqp_rwqe(d, 3)->wr_id, 3);
}

/* The state machine: legal changes counted, an illegal one counted as
 * such (and made: the caller's view holds), no change is no change, and a
 * send state change shuts the fast paths' bounds. */
static void test_state_machine(void **state)
{
	struct fixture *f = *state;
	struct shift_dqp *d = f->d;
	unsigned long fb = shift_dqp_transitions(true, SHIFT_SEND_DEFAULT, SHIFT_SEND_FALLBACK);
	unsigned long ws = shift_dqp_transitions(true, SHIFT_SEND_FALLBACK, SHIFT_SEND_WAIT_SIGNALED);
	unsigned long rf = shift_dqp_transitions(false, SHIFT_RECV_DEFAULT, SHIFT_RECV_FALLBACK);
	unsigned long bad = shift_dqp_illegal_transitions();

	d->sq_limit = d->sq_size;
	d->rq_limit = d->rq_size;
	shift_dqp_set_send_state(d, SHIFT_SEND_FALLBACK, "test");
	assert_int_equal(d->send_state, SHIFT_SEND_FALLBACK);
	assert_int_equal(d->sq_limit, 0);
	assert_int_equal(d->rq_limit, 0);
	shift_dqp_set_recv_state(d, SHIFT_RECV_FALLBACK, "test");
	shift_dqp_set_recv_state(d, SHIFT_RECV_FALLBACK, "test"); /* no change */
	shift_dqp_set_send_state(d, SHIFT_SEND_WAIT_SIGNALED, "test");
	assert_int_equal(shift_dqp_transitions(true, SHIFT_SEND_DEFAULT, SHIFT_SEND_FALLBACK), fb + 1);
	assert_int_equal(shift_dqp_transitions(true, SHIFT_SEND_FALLBACK, SHIFT_SEND_WAIT_SIGNALED),
			 ws + 1);
	assert_int_equal(shift_dqp_transitions(false, SHIFT_RECV_DEFAULT, SHIFT_RECV_FALLBACK), rf + 1);
	assert_int_equal(shift_dqp_illegal_transitions(), bad);
	/* WaitSignaled -> Default skips the fence: illegal */
	shift_dqp_set_send_state(d, SHIFT_SEND_DEFAULT, "test");
	assert_int_equal(shift_dqp_illegal_transitions(), bad + 1);
	assert_int_equal(d->send_state, SHIFT_SEND_DEFAULT);
	/* Unprotected is final */
	shift_dqp_set_send_state(d, SHIFT_SEND_UNPROTECTED, "test");
	shift_dqp_set_send_state(d, SHIFT_SEND_FALLBACK, "test");
	assert_int_equal(shift_dqp_illegal_transitions(), bad + 2);
	assert_string_equal(shift_send_state_name(SHIFT_SEND_WAIT_DRAINED), "waitdrain");
	assert_string_equal(shift_recv_state_name(SHIFT_RECV_FALLBACK), "fallback");
}

static double clock_ms(clockid_t c)
{
	struct timespec ts;

	clock_gettime(c, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

struct holder {
	struct shift_dqp *d;
	cpu_set_t cpu;
	int locked;
};

/* holds post_lock for 150 ms of its own CPU time (a poster inside a
 * provider that transmits in post_send, as soft-RoCE does) */
static void *hold_lock(void *arg)
{
	struct holder *h = arg;

	pthread_setaffinity_np(pthread_self(), sizeof(h->cpu), &h->cpu);
	shift_dqp_lock(h->d);
	__atomic_store_n(&h->locked, 1, __ATOMIC_RELEASE);
	double until = clock_ms(CLOCK_THREAD_CPUTIME_ID) + 150;

	while (clock_ms(CLOCK_THREAD_CPUTIME_ID) < until)
		;
	shift_dqp_unlock(h->d);
	return NULL;
}

/*
 * A thread waiting for post_lock on the CPU its holder runs on gives the
 * holder that CPU: its own CPU time while it waits is a small share of the
 * wait. A waiter that only spun took its fair half of the CPU for the
 * whole wait (a failover behind an application's post on a one-CPU guest,
 * docs/failover.md).
 */
static void test_lock_wait_yields(void **state)
{
	struct fixture *f = *state;
	struct holder h = { .d = f->d };
	cpu_set_t mine;
	pthread_t t;

	assert_int_equal(sched_getaffinity(0, sizeof(mine), &mine), 0);
	CPU_ZERO(&h.cpu);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &mine)) {
			CPU_SET(c, &h.cpu);
			break;
		}
	assert_int_equal(pthread_setaffinity_np(pthread_self(), sizeof(h.cpu), &h.cpu), 0);
	assert_int_equal(pthread_create(&t, NULL, hold_lock, &h), 0);
	while (!__atomic_load_n(&h.locked, __ATOMIC_ACQUIRE))
		sched_yield();
	double w0 = clock_ms(CLOCK_MONOTONIC), c0 = clock_ms(CLOCK_THREAD_CPUTIME_ID);

	shift_dqp_lock(f->d);
	double waited = clock_ms(CLOCK_MONOTONIC) - w0, spent = clock_ms(CLOCK_THREAD_CPUTIME_ID) - c0;

	shift_dqp_unlock(f->d);
	pthread_join(t, NULL);
	pthread_setaffinity_np(pthread_self(), sizeof(mine), &mine);
	print_message("waited %.1f ms for post_lock, %.1f ms of it on the CPU\n", waited, spent);
	assert_true(waited > 100);
	assert_true(spent < waited / 4);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_geometry, setup, teardown),
		cmocka_unit_test_setup_teardown(test_retire_walk, setup, teardown),
		cmocka_unit_test_setup_teardown(test_records_and_retires, setup, teardown),
		cmocka_unit_test_setup_teardown(test_uncommon_wrs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_consumers_posted, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bound_follows_state, setup, teardown),
		cmocka_unit_test_setup_teardown(test_receive_overflow, setup, teardown),
		cmocka_unit_test_setup_teardown(test_state_machine, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lock_wait_yields, setup, teardown),
	};

	return test_env_run_group_tests(tests);
}
