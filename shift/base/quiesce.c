/*
 * Are the application's threads all asleep in the kernel? (see quiesce.h)
 */
#include "shift/base/quiesce.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* SHIFT's own threads' ids (0: free slot) */
static int own[SHIFT_QUIESCE_OWN];

static __thread int tid_kept;

static int my_tid(void)
{
	return (int)syscall(SYS_gettid);
}

int shift_quiesce_tid(void)
{
	if (__builtin_expect(!tid_kept, 0))
		tid_kept = my_tid();
	return tid_kept;
}

void shift_quiesce_register(void)
{
	int tid = my_tid();

	for (int i = 0; i < SHIFT_QUIESCE_OWN; i++) {
		int free_slot = 0;

		if (__atomic_compare_exchange_n(&own[i], &free_slot, tid, false, __ATOMIC_ACQ_REL,
						__ATOMIC_RELAXED))
			return;
	}
}

static bool is_own(int tid)
{
	for (int i = 0; i < SHIFT_QUIESCE_OWN; i++)
		if (__atomic_load_n(&own[i], __ATOMIC_ACQUIRE) == tid)
			return true;
	return false;
}

/* The fields of a stat file (/proc/self/stat, /proc/self/task/TID/stat)
 * after the command, which is in parentheses and may hold anything, read
 * afresh from its open fd into buf; NULL if it cannot be read (a thread
 * that exited: its file reads nothing, or an error). */
static const char *stat_fields(int fd, char *buf, size_t size)
{
	ssize_t n = pread(fd, buf, size - 1, 0);

	if (n <= 0)
		return NULL;
	buf[n] = '\0';
	char *p = strrchr(buf, ')');

	return p && p[1] == ' ' ? p + 2 : NULL;
}

/* The state letter in a thread's stat file, 0 if unreadable. */
static char fd_state(int fd)
{
	char buf[512];
	const char *f = stat_fields(fd, buf, sizeof(buf));

	return f ? f[0] : 0;
}

/* The process's thread count (/proc/self/stat: num_threads, the 18th
 * field after the command), or -1. */
static long fd_threads(int fd)
{
	char buf[1024];
	const char *f = stat_fields(fd, buf, sizeof(buf));

	for (int i = 1; f && i < 18; i++) {
		f = strchr(f, ' ');
		f = f ? f + 1 : NULL;
	}
	return f ? strtol(f, NULL, 10) : -1;
}

/*
 * The stat files of a process of few threads, kept open: while its thread
 * count is the one they were opened at and each of them still reads, they
 * are all its threads, and a check is one pread of the count and one per
 * thread. On the passive end of a failover the check is on the answer's
 * path: the scan of /proc/self/task opened the directory, listed it and
 * opened, read and closed each file (9 system calls for one application
 * thread, each costly under emulation), the cache makes it 2. A count
 * that changed, a file that no longer reads (its thread exited, maybe
 * replaced by another) or an unregistered thread the cache skipped: a
 * scan again. A process of more than QUIESCE_CACHE threads (each an open
 * fd of the application's process) is scanned every time. The child of a
 * fork starts without it (the fds name the parent).
 */
#define QUIESCE_CACHE 8
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	int self_fd;                 /* /proc/self/stat; -1: no cache */
	long nthreads;               /* the count when filled */
	int n;
	int tid[QUIESCE_CACHE];
	int fd[QUIESCE_CACHE];       /* -1: a thread of SHIFT's own, not read */
} cache = { .self_fd = -1 };

static void cache_drop(void)
{
	for (int i = 0; i < cache.n; i++)
		if (cache.fd[i] >= 0)
			close(cache.fd[i]);
	if (cache.self_fd >= 0)
		close(cache.self_fd);
	cache.self_fd = -1;
	cache.n = 0;
}

void shift_quiesce_unregister(void)
{
	int tid = my_tid();
	bool any = false;

	for (int i = 0; i < SHIFT_QUIESCE_OWN; i++) {
		int mine = tid;

		if (__atomic_compare_exchange_n(&own[i], &mine, 0, false, __ATOMIC_ACQ_REL,
						__ATOMIC_RELAXED))
			break;
	}
	for (int i = 0; i < SHIFT_QUIESCE_OWN && !any; i++)
		any = __atomic_load_n(&own[i], __ATOMIC_ACQUIRE) != 0;
	if (!any) {
		/* the last of SHIFT's threads: the application's process keeps
		 * none of the cache's fds (below) after it */
		pthread_mutex_lock(&cache_lock);
		cache_drop();
		pthread_mutex_unlock(&cache_lock);
	}
}

void shift_quiesce_fork_child(void)
{
	/* (only SHIFT's threads check, held outside their passes by the
	 * fork: the lock is free; the fds name the parent's threads) */
	pthread_mutex_init(&cache_lock, NULL);
	cache_drop();
	tid_kept = 0; /* (the parent's thread's: the child is another) */
}

/* Is tid the caller's, one of SHIFT's own or one of the n in out? */
static bool skipped(int tid, int me, const int *out, unsigned n)
{
	if (tid == me || is_own(tid))
		return true;
	for (unsigned i = 0; i < n; i++)
		if (out[i] == tid)
			return true;
	return false;
}

/* The cached answer: 1 asleep, 0 not, -1 the cache does not hold. */
static int cached_asleep(int me, const int *out, unsigned n)
{
	if (cache.self_fd < 0 || fd_threads(cache.self_fd) != cache.nthreads)
		return -1;
	for (int i = 0; i < cache.n; i++) {
		if (skipped(cache.tid[i], me, out, n))
			continue;
		if (cache.fd[i] < 0)
			return -1;
		char st = fd_state(cache.fd[i]);

		if (!st)
			return -1; /* (exited: the count may hide a new thread) */
		if (st != 'S')
			return 0; /* (alive, and not asleep) */
	}
	return 1;
}

/* A thread seen by the scan (its stat file opened, fd, or -1 for SHIFT's
 * own), kept for the cache if it has room. */
static void cache_keep(int tid, int fd)
{
	if (cache.n < QUIESCE_CACHE) {
		cache.tid[cache.n] = tid;
		cache.fd[cache.n++] = fd;
	} else if (fd >= 0) {
		close(fd);
	}
}

static bool scan_asleep(int me, const int *out, unsigned n)
{
	DIR *dir = opendir("/proc/self/task");
	int seen = 0;
	bool asleep = dir != NULL;
	struct dirent *e;

	cache_drop();
	cache.self_fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
	/* (the count before the listing: a thread created meanwhile makes
	 * them differ, and the next check scans again) */
	cache.nthreads = cache.self_fd >= 0 ? fd_threads(cache.self_fd) : -1;
	/* (all of them while the cache may hold them, else up to the first
	 * thread awake) */
	while (dir && (asleep || seen < QUIESCE_CACHE) && (e = readdir(dir))) {
		char *end;
		long tid = strtol(e->d_name, &end, 10);
		char path[64];

		if (e->d_name[0] == '.' || *end || tid <= 0 || strlen(e->d_name) > 20)
			continue;
		if (++seen > SHIFT_QUIESCE_MAX_THREADS) {
			asleep = false;
			break;
		}
		if (is_own((int)tid) && tid != me) {
			cache_keep((int)tid, -1);
			continue;
		}
		strcpy(path, e->d_name);
		strcat(path, "/stat");
		int fd = openat(dirfd(dir), path, O_RDONLY | O_CLOEXEC);
		char st = fd >= 0 ? fd_state(fd) : 0;

		cache_keep((int)tid, fd);
		if (skipped((int)tid, me, out, n))
			continue;
		/* (a thread gone since readdir: nothing of it runs) */
		if (st != 'S' && !(st == 0 && faccessat(dirfd(dir), e->d_name, F_OK, 0)))
			asleep = false;
	}
	if (dir)
		closedir(dir);
	if (!dir || seen > QUIESCE_CACHE || seen != cache.nthreads)
		cache_drop();
	return asleep;
}

bool shift_quiesce_others_asleep(const int *out, unsigned n)
{
	int me = shift_quiesce_tid();

	pthread_mutex_lock(&cache_lock);
	int c = cached_asleep(me, out, n);
	bool asleep = c >= 0 ? c == 1 : scan_asleep(me, out, n);

	pthread_mutex_unlock(&cache_lock);
	return asleep;
}
