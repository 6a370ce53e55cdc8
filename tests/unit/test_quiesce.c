/*
 * base/quiesce.h: the background pass ends its grace period at once only
 * when every thread of the application is asleep in the kernel (none can
 * be inside a fast-path poll). A thread blocked in read() counts as
 * asleep; one that spins does not, unless it is one of SHIFT's own.
 */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "shift/base/quiesce.h"

static int pipe_fd[2];
static bool stop_spin, registered; /* (atomic) */
static int spinner_tid; /* (atomic) */

static void *blocked(void *arg)
{
	char c;

	(void)arg;
	if (read(pipe_fd[0], &c, 1) < 0)
		return NULL;
	return NULL;
}

static void *spinning(void *arg)
{
	bool own = arg != NULL;

	if (own) {
		shift_quiesce_register();
		__atomic_store_n(&registered, true, __ATOMIC_RELEASE);
	}
	__atomic_store_n(&spinner_tid, shift_quiesce_tid(), __ATOMIC_RELEASE);
	while (!__atomic_load_n(&stop_spin, __ATOMIC_ACQUIRE))
		;
	if (own)
		shift_quiesce_unregister();
	return NULL;
}

/* asleep() within 2 s (a thread just started is not asleep at once) */
static bool becomes_asleep(void)
{
	for (int i = 0; i < 200; i++) {
		if (shift_quiesce_others_asleep(NULL, 0))
			return true;
		usleep(10 * 1000);
	}
	return false;
}

static void test_blocked_thread_is_asleep(void **state)
{
	pthread_t t;
	(void)state;

	assert_int_equal(pipe(pipe_fd), 0);
	assert_int_equal(pthread_create(&t, NULL, blocked, NULL), 0);
	assert_true(becomes_asleep());
	assert_int_equal(write(pipe_fd[1], "x", 1), 1);
	pthread_join(t, NULL);
	close(pipe_fd[0]);
	close(pipe_fd[1]);
}

/* A thread of the application's that spins is seen awake at every
 * check; once it ends, the others are asleep again (nothing else runs). */
static void spinner_seen(void)
{
	pthread_t t;

	__atomic_store_n(&stop_spin, false, __ATOMIC_RELEASE);
	assert_int_equal(pthread_create(&t, NULL, spinning, NULL), 0);
	usleep(50 * 1000);
	for (int i = 0; i < 20; i++)
		assert_false(shift_quiesce_others_asleep(NULL, 0));
	__atomic_store_n(&stop_spin, true, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	assert_true(becomes_asleep());
}

static void test_spinning_thread_is_not(void **state)
{
	(void)state;
	spinner_seen();
}

/* open fds of the process on a stat file of /proc (the cache's) */
static int stat_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d))) {
		char path[300], to[256];
		ssize_t len;

		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		len = readlink(path, to, sizeof(to) - 1);
		if (len <= 0)
			continue;
		to[len] = '\0';
		n += !strncmp(to, "/proc/", 6) && len > 5 && !strcmp(to + len - 5, "/stat");
	}
	closedir(d);
	return n;
}

/* ... and once the last of SHIFT's threads leaves, the cache's fds are
 * closed: the application's process keeps none of them. */
static void test_own_spinning_thread_is_ignored(void **state)
{
	pthread_t t;
	(void)state;

	__atomic_store_n(&stop_spin, false, __ATOMIC_RELEASE);
	__atomic_store_n(&registered, false, __ATOMIC_RELEASE);
	assert_int_equal(pthread_create(&t, NULL, spinning, (void *)1), 0);
	while (!__atomic_load_n(&registered, __ATOMIC_ACQUIRE))
		usleep(1000);
	assert_true(becomes_asleep());
	assert_true(stat_fds() > 0); /* (the cache's) */
	__atomic_store_n(&stop_spin, true, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	assert_int_equal(stat_fds(), 0);
}

/* The threads' stat files are kept open between checks (quiesce.c): a
 * thread that exits and another that starts keep the process's thread
 * count, so the cache must notice the old one's file no longer reads and
 * find the new one, which spins. */
static void test_thread_replaced_under_cache(void **state)
{
	pthread_t a;
	(void)state;

	assert_int_equal(pipe(pipe_fd), 0);
	assert_int_equal(pthread_create(&a, NULL, blocked, NULL), 0);
	assert_true(becomes_asleep());
	assert_true(shift_quiesce_others_asleep(NULL, 0)); /* (from the cache) */
	assert_int_equal(write(pipe_fd[1], "x", 1), 1);
	pthread_join(a, NULL);
	spinner_seen();
	close(pipe_fd[0]);
	close(pipe_fd[1]);
}

/* A thread started after the cache was filled changes the count: seen. */
static void test_new_thread_after_cache(void **state)
{
	(void)state;

	assert_true(becomes_asleep());
	assert_true(shift_quiesce_others_asleep(NULL, 0));
	spinner_seen();
}

/* A spinning thread the caller names (one known outside the fast path:
 * it left a slow poll since the switch) counts as asleep, from the scan
 * and from the cache; a second one, not named, keeps the answer no. */
static void test_named_spinner_counts_asleep(void **state)
{
	pthread_t t, u;
	int tid;
	(void)state;

	__atomic_store_n(&stop_spin, false, __ATOMIC_RELEASE);
	__atomic_store_n(&spinner_tid, 0, __ATOMIC_RELEASE);
	assert_int_equal(pthread_create(&t, NULL, spinning, NULL), 0);
	while (!(tid = __atomic_load_n(&spinner_tid, __ATOMIC_ACQUIRE)))
		usleep(1000);
	assert_int_not_equal(tid, shift_quiesce_tid());
	usleep(50 * 1000);
	for (int i = 0; i < 20; i++) {
		assert_false(shift_quiesce_others_asleep(NULL, 0));
		assert_true(shift_quiesce_others_asleep(&tid, 1));
	}
	__atomic_store_n(&spinner_tid, 0, __ATOMIC_RELEASE);
	assert_int_equal(pthread_create(&u, NULL, spinning, NULL), 0);
	while (!__atomic_load_n(&spinner_tid, __ATOMIC_ACQUIRE))
		usleep(1000);
	usleep(50 * 1000);
	for (int i = 0; i < 20; i++)
		assert_false(shift_quiesce_others_asleep(&tid, 1));
	__atomic_store_n(&stop_spin, true, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	pthread_join(u, NULL);
	assert_true(becomes_asleep());
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_blocked_thread_is_asleep),
		cmocka_unit_test(test_spinning_thread_is_not),
		cmocka_unit_test(test_own_spinning_thread_is_ignored),
		cmocka_unit_test(test_thread_replaced_under_cache),
		cmocka_unit_test(test_new_thread_after_cache),
		cmocka_unit_test(test_named_spinner_counts_asleep),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
