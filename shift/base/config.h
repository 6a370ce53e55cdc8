/*
 * Configuration: every SHIFT_* environment variable is one row of a table
 * {name, default, doc, parser}, read once at start (shift_config_load()).
 * `shiftctl config` prints the table with each knob's doc and value.
 * A bad value (unparsable, too long, a control character, a namespace
 * outside [A-Za-z0-9._-] or longer than 64) disables SHIFT for the process (enable = false:
 * pure pass-through) with one error line naming the setting and the reason;
 * never a silent fallback to a default. Secrets are never printed.
 */
#ifndef SHIFT_CONFIG_H
#define SHIFT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

struct shift_config {
	bool enable;              /* SHIFT_ENABLE */
	int log_level;            /* SHIFT_LOG_LEVEL (enum shift_log_level) */
	char real_lib[512];       /* SHIFT_REAL_LIBIBVERBS */
	char backup[256];         /* SHIFT_BACKUP */
	char kv_url[512];         /* SHIFT_KV_URL */
	char kv_namespace[128];   /* SHIFT_KV_NAMESPACE */
	char job_id[72];          /* SHIFT_JOB_ID, else the scheduler's (job_id_from) */
	char job_id_from[32];     /* where job_id came from; "" if none */
	unsigned kv_timeout_ms;   /* SHIFT_KV_TIMEOUT_MS */
	size_t kv_max_reply;      /* SHIFT_KV_MAX_REPLY */
	char kv_secret_file[512]; /* SHIFT_KV_SECRET_FILE */
	char kv_tls_ca[512];      /* SHIFT_KV_TLS_CA */
	char kv_tls_cert[512];    /* SHIFT_KV_TLS_CERT */
	char kv_tls_key[512];     /* SHIFT_KV_TLS_KEY */
	unsigned probe_ms;        /* SHIFT_PROBE_MS */
	unsigned port_down_ms;    /* SHIFT_PORT_DOWN_MS */
	unsigned kv_wait_ms;      /* SHIFT_KV_WAIT_MS */
	unsigned kv_ttl_s;        /* SHIFT_KV_TTL_S */
	unsigned poke_ms;         /* SHIFT_POKE_MS */
	unsigned idle_ms;         /* SHIFT_IDLE_MS */
	bool native_wq;           /* SHIFT_NATIVE_WQ */
	bool key_mailbox;         /* SHIFT_KEY_MAILBOX */
	bool datagrams;           /* SHIFT_DATAGRAMS */
	char status_dir[256];     /* SHIFT_STATUS_DIR */

	/* Not environment knobs: the timing of the background work, in
	 * shift_clock ms, and how it runs. shift_config_load() sets the
	 * defaults; a program that drives SHIFT's passes itself (inline_passes,
	 * with a logical clock: the simulator) sets its own after loading. */
	unsigned episode_wait_ms; /* SHIFT_FAILOVER_MS: a failover waits this long for the peer */
	/* ... for the peer's handshake message (SHIFT_FAILOVER_MS too; a
	 * simulator's logical clock, one ms per pass, needs more: the network
	 * moves a step per pass, and hundreds of QPs fail over together) */
	unsigned handshake_wait_ms;
	unsigned bk_restart_ms;   /* a lone backup failure restarts after this (500) */
	unsigned peer_warn_ms;    /* logged once when the peer published no backup (10000) */
	/* memory lock-free readers may still hold is freed after this
	 * (shift/dp/limbo.h; 1000, 0 inline: no concurrent reader) */
	unsigned free_grace_ms;
	/* no per-RNIC threads: the program calls shift_rnic_pass_all() */
	bool inline_passes;
};

extern struct shift_config shift_config;

/*
 * Reset to defaults, then read the environment. real_lib_default is the
 * path found at build time. Returns the number of variables rejected.
 */
int shift_config_load(const char *real_lib_default);

/*
 * Copy value v of knob name into out (size bytes, NUL-terminated) with any
 * secret masked: the password of a SHIFT_KV_URL becomes ***.
 */
size_t shift_config_mask(const char *name, const char *v, char *out, size_t size);

/* The per-user status directory when SHIFT_STATUS_DIR is unset:
 * $XDG_RUNTIME_DIR/shift, else /run/shift/UID (if /run/shift is usable),
 * else /tmp/shift-UID. */
void shift_status_dir_default(char *out, size_t size);

/*
 * Set knob key (the env name lowercased without SHIFT_, e.g. "kv_url") to v,
 * from origin ("env", "FILE:LINE"). 0, -1 for a bad value, -2 for an
 * unknown key; a bad value is logged here (naming origin).
 */
int shift_config_set(const char *key, const char *v, const char *origin);

/*
 * The config files (config_file.c): /etc/shift/shift.conf, then
 * ${XDG_CONFIG_HOME:-~/.config}/shift/shift.conf, or only $SHIFT_CONFIG
 * ('' = none). Lines 'key = value', '#' comments. Returns the number of
 * bad settings (each logged once with FILE:LINE).
 */
int shift_config_files_load(void);

/* Print every knob: name, current value, default, doc. */
void shift_config_print(FILE *out);

#endif /* SHIFT_CONFIG_H */
