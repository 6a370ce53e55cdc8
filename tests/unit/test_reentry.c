/*
 * The real libibverbs calls its own exported registration verbs through
 * its PLT (rdma-core 44: ibv_reg_mr and ibv_reg_mr_iova call
 * ibv_reg_mr_iova2), and the global scope binds those calls to SHIFT's
 * exports. One application registration must give one shadow MR, and
 * its dereg must end it: a second record outlived the dereg and was
 * replayed on a freed PD (rdma_server's SIGSEGV at exit on the testbed).
 * Here the lower's reg_mr and reg_mr_iova call SHIFT's reg_mr_iova2 entry
 * as the real library's PLT does.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "sim_pair.h"

static struct sim_ep a, b;
static struct sim_pair pair;
static struct shift_lower nested;

static struct ibv_mr *plt_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return shift_ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

static struct ibv_mr *plt_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
				      uint64_t iova, int access)
{
	return shift_ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned)access);
}

static unsigned long mrs_ready(void)
{
	struct shift_shadow_stats st;

	for (int i = 0; i < 3; i++)
		shift_rnic_pass_all();
	shift_shadow_stats_get(&st);
	return st.mrs_ready;
}

static void one_record_per_registration(int via_iova)
{
	static char buf[8192];

	sim_pair_open(&pair, &a, &b, "reentry", 0);
	sim_pair_connect(&pair);
	const struct shift_lower *real = shift_lower;
	unsigned long base = mrs_ready();

	nested = *real;
	nested.reg_mr = plt_reg_mr;
	nested.reg_mr_iova = plt_reg_mr_iova;
	shift_lower_set(&nested);
	struct ibv_mr *mr = via_iova ?
		shift_ibv_reg_mr_iova(a.pd, buf, sizeof(buf), 0x1000, IBV_ACCESS_LOCAL_WRITE) :
		shift_ibv_reg_mr(a.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	shift_lower_set(real);
	assert_non_null(mr);
	assert_int_equal(mrs_ready(), base + 1); /* one backup MR, not two */
	assert_int_equal(shift_ibv_dereg_mr(mr), 0);
	assert_int_equal(mrs_ready(), base); /* and the dereg ended it */
	sim_pair_close(&pair);
}

static void test_reg_mr_through_iova2_records_once(void **state)
{
	(void)state;
	one_record_per_registration(0);
}

static void test_reg_mr_iova_through_iova2_records_once(void **state)
{
	(void)state;
	one_record_per_registration(1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reg_mr_through_iova2_records_once),
		cmocka_unit_test(test_reg_mr_iova_through_iova2_records_once),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
