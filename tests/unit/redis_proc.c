/*
 * tests/unit/redis_proc.c - see redis_proc.h.
 */
#include "redis_proc.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

uint64_t rp_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void rp_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

const char *rp_server_path(void)
{
	static char path[512];
	const char *env = getenv("SHIFT_REDIS_SERVER");
	const char *p = getenv("PATH");

	if (env && *env)
		return access(env, X_OK) ? NULL : env;
	for (p = p ? p : "/usr/local/bin:/usr/bin:/bin"; *p;) {
		const char *c = strchr(p, ':');
		size_t n = c ? (size_t)(c - p) : strlen(p);

		snprintf(path, sizeof(path), "%.*s/redis-server", (int)n, p);
		if (n && access(path, X_OK) == 0)
			return path;
		p += n + (c ? 1 : 0);
	}
	return NULL;
}

int rp_free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof(a)) &&
	    !getsockname(fd, (struct sockaddr *)&a, &len))
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

redisContext *rp_connect(int port, const char *pw)
{
	struct timeval tv = { 0, 500000 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
	redisReply *r;

	if (!c || c->err) {
		if (c)
			redisFree(c);
		return NULL;
	}
	redisSetTimeout(c, tv);
	if (pw) {
		r = redisCommand(c, "AUTH %s", pw);
		if (r)
			freeReplyObject(r);
	}
	r = redisCommand(c, "PING");
	if (!r || r->type != REDIS_REPLY_STATUS || strcmp(r->str, "PONG")) {
		if (r)
			freeReplyObject(r);
		redisFree(c);
		return NULL;
	}
	freeReplyObject(r);
	return c;
}

redisReply *rp_command(int port, const char *pw, const char *fmt, ...)
{
	redisContext *c = rp_connect(port, pw);
	redisReply *r;
	va_list ap;

	if (!c)
		return NULL;
	va_start(ap, fmt);
	r = redisvCommand(c, fmt, ap);
	va_end(ap);
	redisFree(c);
	return r;
}

static void rp_exec(const char *bin, const char *const *args)
{
	const char *argv[64];
	int n = 0, devnull = open("/dev/null", O_RDWR);

	prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
	if (devnull >= 0) {
		dup2(devnull, 0);
		dup2(devnull, 1);
		dup2(devnull, 2);
	}
	argv[n++] = bin;
	while (*args && n < 63)
		argv[n++] = *args++;
	argv[n] = NULL;
	execv(bin, (char *const *)argv);
	_exit(127);
}

pid_t rp_start(int port, const char *pw, const char *const *args)
{
	const char *bin = rp_server_path();
	uint64_t t0 = rp_now_ms();
	pid_t pid;

	if (!bin)
		return -1;
	pid = fork();
	if (pid == 0)
		rp_exec(bin, args);
	if (pid < 0)
		return -1;
	while (rp_now_ms() - t0 < 10000) {
		redisContext *c;
		int st;

		if (waitpid(pid, &st, WNOHANG) == pid) {
			fprintf(stderr, "redis-server on %d exited early (status %d)\n",
				port, st);
			return -1;
		}
		c = rp_connect(port, pw);
		if (c) {
			redisFree(c);
			return pid;
		}
		rp_sleep_ms(20);
	}
	fprintf(stderr, "redis-server did not answer on port %d\n", port);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

void rp_kill(pid_t *pid)
{
	if (*pid > 0) {
		kill(*pid, SIGKILL);
		waitpid(*pid, NULL, 0);
		*pid = -1;
	}
}

static int rp_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

void rp_rmtree(const char *dir)
{
	if (dir[0])
		nftw(dir, rp_rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}
