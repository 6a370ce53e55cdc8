/*
 * shift/base/prefault: every page of a loaded object made resident ahead
 * of use. A module of 4 MiB of read-only data (prefault_cold.c), loaded
 * and never read: few of its pages are mapped (the kernel's fault-around
 * maps a few around the pages the loader touched). After
 * shift_prefault_object() on an address inside it, /proc/self/pagemap
 * shows every one of them present, and the count returned covers the
 * whole array. An address no object holds touches nothing.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include <cmocka.h>

#include "shift/base/prefault.h"

#ifndef PREFAULT_COLD_SO
#error "PREFAULT_COLD_SO: the path of the cold module"
#endif

enum { COLD_BYTES = 4u << 20 };

/* Pages of [p, p + n) that the page table maps (pagemap bit 63). */
static size_t present(const void *p, size_t n)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), in = 0;
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);

	assert_true(fd >= 0);
	for (uintptr_t a = (uintptr_t)p & ~(page - 1); a < (uintptr_t)p + n; a += page) {
		uint64_t e = 0;

		assert_int_equal(pread(fd, &e, sizeof(e), (off_t)(a / page * sizeof(e))),
				 (ssize_t)sizeof(e));
		in += (e >> 63) & 1;
	}
	close(fd);
	return in;
}

static void test_cold_module_made_resident(void **state)
{
	(void)state;
	void *h = dlopen(PREFAULT_COLD_SO, RTLD_NOW | RTLD_LOCAL);

	assert_non_null(h);
	const unsigned char *cold = dlsym(h, "shift_test_cold");
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t pages = COLD_BYTES / page;

	assert_non_null(cold);
	/* (cold: at most a quarter mapped, whatever fault-around did) */
	assert_true(present(cold, COLD_BYTES) < pages / 4);
	size_t n = shift_prefault_object(cold + COLD_BYTES / 2);

	assert_true(n >= pages);
	assert_int_equal(present(cold, COLD_BYTES), (COLD_BYTES + page - 1) / page +
			 ((uintptr_t)cold % page != 0));
	dlclose(h);
}

static void test_self_and_nothing(void **state)
{
	static const char here = 0;
	(void)state;

	assert_true(shift_prefault_self() > 0);
	assert_true(shift_prefault_object(&here) > 0); /* (this test's own) */
	/* an address no loaded object holds */
	assert_int_equal(shift_prefault_object((const void *)(uintptr_t)16), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cold_module_made_resident),
		cmocka_unit_test(test_self_and_nothing),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
