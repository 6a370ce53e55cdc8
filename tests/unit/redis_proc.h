/*
 * tests/unit/redis_proc.h - real redis-server processes for the kv tests:
 * find the binary ($SHIFT_REDIS_SERVER, else PATH), pick a free loopback
 * port, start a server with extra arguments (it dies with the test), wait
 * until it answers, run a command on it, kill it.
 */
#ifndef SHIFT_TESTS_REDIS_PROC_H
#define SHIFT_TESTS_REDIS_PROC_H

#include <stdint.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

uint64_t rp_now_ms(void);
void rp_sleep_ms(int ms);
/* The redis-server binary, or NULL. */
const char *rp_server_path(void);
/* A loopback TCP port nobody listens on right now, or -1. */
int rp_free_port(void);
/* Start redis-server with args (NULL-terminated, after the binary) and
 * wait up to 10 s until 127.0.0.1:port answers PING (AUTH pw first, if
 * pw).  The pid, or -1. */
pid_t rp_start(int port, const char *pw, const char *const *args);
/* An authenticated connection to 127.0.0.1:port, or NULL. */
redisContext *rp_connect(int port, const char *pw);
/* One command on a fresh connection; the reply (freeReplyObject) or NULL. */
redisReply *rp_command(int port, const char *pw, const char *fmt, ...);
void rp_kill(pid_t *pid);
/* Remove the directory dir and everything in it (nothing if dir is ""). */
void rp_rmtree(const char *dir);

#endif /* SHIFT_TESTS_REDIS_PROC_H */
