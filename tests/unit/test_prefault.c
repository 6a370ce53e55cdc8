/*
 * shift/base/prefault: every page of a loaded object made resident ahead
 * of use (MADV_POPULATE_READ; the tests skip on a kernel without it). A
 * module of 4 MiB of read-only data (prefault_cold.c), loaded and never
 * read: few of its pages are mapped (the kernel's fault-around maps a few
 * around the pages the loader touched). After shift_prefault_object() on
 * an address inside it, /proc/self/pagemap shows every one of them
 * present, and the count returned covers the whole array. A copy of the
 * module truncated on disk once loaded (a library replaced in place) is
 * populated without a SIGBUS. An address no object holds touches nothing.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "shift/base/prefault.h"

#if !defined(PREFAULT_COLD_SO) || !defined(PREFAULT_CUT_SO)
#error "PREFAULT_COLD_SO, PREFAULT_CUT_SO: the paths of the cold modules"
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

/* Can this kernel populate a mapping (Linux 5.14)? Else the tests skip:
 * shift_prefault_object() does nothing there, by design. */
static bool can_populate(void)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	void *m = mmap(NULL, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	bool ok = m != MAP_FAILED && !madvise(m, page, 22 /* MADV_POPULATE_READ */);

	if (m != MAP_FAILED)
		munmap(m, page);
	return ok;
}

static void test_cold_module_made_resident(void **state)
{
	(void)state;
	if (!can_populate())
		skip();

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

/* The module to cut's bytes into fd. */
static void copy_module(int fd)
{
	char buf[65536];
	int in = open(PREFAULT_CUT_SO, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	assert_true(in >= 0);
	while ((n = read(in, buf, sizeof(buf))) > 0)
		assert_int_equal(write(fd, buf, (size_t)n), n);
	close(in);
}

/* The module copied to a file of its own, loaded, then cut to 64 KiB:
 * its pages beyond the new end would SIGBUS if read (prefault_cut: the
 * cold module without constructors or destructors). */
static void test_truncated_module_no_sigbus(void **state)
{
	char path[] = "/tmp/shift_prefault_XXXXXX";
	(void)state;

	if (!can_populate())
		skip();
	int out = mkstemp(path);

	assert_true(out >= 0);
	copy_module(out);
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);

	assert_non_null(h);
	const unsigned char *cold = dlsym(h, "shift_test_cold");

	assert_non_null(cold);
	assert_int_equal(ftruncate(out, 65536), 0);
	/* (alive, and the segment past the end not counted as resident) */
	assert_true(shift_prefault_object(cold) < COLD_BYTES / (size_t)sysconf(_SC_PAGESIZE));
	/* Whole again, for whatever reads its pages at exit (LeakSanitizer
	 * scans every writable segment). Left loaded: its relocated pages
	 * went with the cut, so it cannot be unloaded, and it has no
	 * destructor for the exit to run. */
	assert_int_equal(lseek(out, 0, SEEK_SET), 0);
	copy_module(out);
	close(out);
	unlink(path);
}

static void test_self_and_nothing(void **state)
{
	static const char here = 0;
	(void)state;

	if (!can_populate())
		skip();
	assert_true(shift_prefault_self() > 0);
	assert_true(shift_prefault_object(&here) > 0); /* (this test's own) */
	/* an address no loaded object holds */
	assert_int_equal(shift_prefault_object((const void *)(uintptr_t)16), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cold_module_made_resident),
		cmocka_unit_test(test_truncated_module_no_sigbus),
		cmocka_unit_test(test_self_and_nothing),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
