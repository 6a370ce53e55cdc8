/*
 * Are the application's threads all asleep in the kernel? (see quiesce.h)
 */
#include "shift/base/quiesce.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* SHIFT's own threads' ids (0: free slot) */
static int own[SHIFT_QUIESCE_OWN];

static int my_tid(void)
{
	return (int)syscall(SYS_gettid);
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

void shift_quiesce_unregister(void)
{
	int tid = my_tid();

	for (int i = 0; i < SHIFT_QUIESCE_OWN; i++) {
		int mine = tid;

		if (__atomic_compare_exchange_n(&own[i], &mine, 0, false, __ATOMIC_ACQ_REL,
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

/* The state letter of thread tid (/proc/self/task/TID/stat: the field
 * after the command, which is in parentheses and may hold anything), or
 * 0 if it cannot be read (a thread that exited meanwhile: '\0' too). */
static char thread_state(int dir_fd, const char *tid)
{
	char path[64], buf[512];
	int fd;
	ssize_t n;

	if (strlen(tid) > 20)
		return 0;
	strcpy(path, tid);
	strcat(path, "/stat");
	fd = openat(dir_fd, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	char *p = strrchr(buf, ')');

	return p && p[1] == ' ' ? p[2] : 0;
}

bool shift_quiesce_others_asleep(void)
{
	DIR *dir = opendir("/proc/self/task");
	int me = my_tid(), seen = 0;
	bool asleep = dir != NULL;
	struct dirent *e;

	while (asleep && (e = readdir(dir))) {
		char *end;
		long tid = strtol(e->d_name, &end, 10);

		if (e->d_name[0] == '.' || *end || tid <= 0)
			continue;
		if (++seen > SHIFT_QUIESCE_MAX_THREADS) {
			asleep = false;
			break;
		}
		if (tid == me || is_own((int)tid))
			continue;
		char st = thread_state(dirfd(dir), e->d_name);

		/* (a thread gone since readdir: nothing of it runs) */
		if (st != 'S' && !(st == 0 && faccessat(dirfd(dir), e->d_name, F_OK, 0)))
			asleep = false;
	}
	if (dir)
		closedir(dir);
	return asleep;
}
