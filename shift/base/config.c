/*
 * The configuration table. Adding a knob = one row here and one field in
 * struct shift_config; the parsers below are shared by every row of a type.
 */
#include "shift/base/config.h"
#include "shift/base/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

struct shift_config shift_config;

struct config_row {
	const char *name;
	const char *def;
	const char *doc;
	int (*parse)(const struct config_row *row, const char *value);
	size_t offset;
	size_t size; /* for strings: buffer size */
	unsigned long lo, hi; /* parse_bounded: accepted range */
};

#define FIELD_RANGE(f, lo, hi) \
	offsetof(struct shift_config, f), sizeof(((struct shift_config *)0)->f), lo, hi
#define FIELD(f) FIELD_RANGE(f, 0, 0)

static void *field(const struct config_row *row)
{
	return (char *)&shift_config + row->offset;
}

static int parse_bool(const struct config_row *row, const char *v)
{
	bool *b = field(row);

	if (!strcmp(v, "1") || !strcasecmp(v, "yes") || !strcasecmp(v, "true") ||
	    !strcasecmp(v, "on") || !strcasecmp(v, "y")) {
		*b = true;
		return 0;
	}
	if (!strcmp(v, "0") || !strcasecmp(v, "no") || !strcasecmp(v, "false") ||
	    !strcasecmp(v, "off") || !strcasecmp(v, "n")) {
		*b = false;
		return 0;
	}
	return -1;
}

static int parse_level(const struct config_row *row, const char *v)
{
	enum shift_log_level l;

	if (shift_log_level_parse(v, &l))
		return -1;
	*(int *)field(row) = (int)l;
	return 0;
}

static int parse_string(const struct config_row *row, const char *v)
{
	size_t n = strlen(v);

	if (n >= row->size)
		return -1;
	memcpy(field(row), v, n + 1);
	return 0;
}

/* A job id as kv accepts it (docs/kv.md): 1..64 of letters, digits, . _ -
 * (no ':', which would forge another namespace's key prefix). */
static bool valid_id(const char *v)
{
	return *v && strlen(v) <= 64 &&
	       strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
			 "0123456789._-") == strlen(v);
}

static int parse_namespace(const struct config_row *row, const char *v)
{
	if (!valid_id(v))
		return -1;
	return parse_string(row, v);
}

/* SHIFT_JOB_ID: as a namespace, or empty (then the scheduler's, below) */
static int parse_job_id(const struct config_row *row, const char *v)
{
	return *v ? parse_namespace(row, v) : parse_string(row, v);
}

/* The job id of the scheduler's environment, if one is there and valid
 * (untrusted: the same rules as SHIFT_JOB_ID, else none). */
static void job_id_derive(void)
{
	const char *slurm = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
	const char *te = getenv("TORCHELASTIC_RUN_ID");
	char id[sizeof(shift_config.job_id)];
	const char *from = NULL;
	int n = -1;

	if (slurm && *slurm) {
		n = step && *step ? snprintf(id, sizeof(id), "%s.%s", slurm, step)
				  : snprintf(id, sizeof(id), "%s", slurm);
		from = step && *step ? "SLURM_JOB_ID.SLURM_STEP_ID" : "SLURM_JOB_ID";
	} else if (te && *te) {
		n = snprintf(id, sizeof(id), "%s", te);
		from = "TORCHELASTIC_RUN_ID";
	}
	if (n <= 0 || (size_t)n >= sizeof(id) || !valid_id(id))
		return;
	memcpy(shift_config.job_id, id, (size_t)n + 1);
	snprintf(shift_config.job_id_from, sizeof(shift_config.job_id_from), "%s", from);
}

static int parse_uint(const struct config_row *row, const char *v)
{
	char *end;
	unsigned long x;

	errno = 0;
	x = strtoul(v, &end, 10);
	if (errno || end == v || *end || x > 3600000UL || v[0] == '-')
		return -1;
	*(unsigned *)field(row) = (unsigned)x;
	return 0;
}

/* A number in [row->lo, row->hi] into an unsigned or a size_t field. */
static int parse_bounded(const struct config_row *row, const char *v)
{
	char *end;
	unsigned long x;

	errno = 0;
	x = strtoul(v, &end, 10);
	if (errno || end == v || *end || v[0] == '-' || x < row->lo || x > row->hi)
		return -1;
	if (row->size == sizeof(size_t))
		*(size_t *)field(row) = (size_t)x;
	else
		*(unsigned *)field(row) = (unsigned)x;
	return 0;
}

/* '' (no status) or an absolute path. */
static int parse_status_dir(const struct config_row *row, const char *v)
{
	if (*v && *v != '/')
		return -1;
	return parse_string(row, v);
}

void shift_status_dir_default(char *out, size_t size)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	unsigned uid = (unsigned)geteuid();
	struct stat st;

	if (xdg && xdg[0] == '/' && strlen(xdg) + sizeof("/shift") <= size &&
	    !strpbrk(xdg, "\n\r\t")) {
		snprintf(out, size, "%s/shift", xdg);
		return;
	}
	if (!stat("/run/shift", &st) && S_ISDIR(st.st_mode) && !access("/run/shift", W_OK | X_OK)) {
		snprintf(out, size, "/run/shift/%u", uid);
		return;
	}
	snprintf(out, size, "/tmp/shift-%u", uid);
}

static const struct config_row rows[] = {
	{ "SHIFT_ENABLE", "1",
	  "0 turns SHIFT into a pure pass-through to the real libibverbs",
	  parse_bool, FIELD(enable) },
	{ "SHIFT_LOG_LEVEL", "warn",
	  "error, warn, info or debug; lines go to stderr prefixed 'shift:'",
	  parse_level, FIELD(log_level) },
	{ "SHIFT_REAL_LIBIBVERBS", NULL,
	  "absolute path of the distro's libibverbs.so.1 that SHIFT wraps (default: searched at run time: "
	  "<libdir>/shift/real, the build-time path, the system library directories; docs/dropin.md)",
	  parse_string, FIELD(real_lib) },
	{ "SHIFT_BACKUP", "",
	  "backup NIC map, e.g. rxe0:rxe1,rxe1:rxe0 (default: an active device with the same link layer, "
	  "same NUMA node first, in natural name order, port p to port p)",
	  parse_string, FIELD(backup) },
	{ "SHIFT_KV_URL", "redis://127.0.0.1:6379",
	  "where backup attributes are exchanged: redis://[user:password@]host:port[/db], redis-sentinel://[user:password@]s1[:port][,s2...]/MASTER[/db], redis-cluster://[user:password@]n1[:port][,n2...] (rediss://, rediss-sentinel://, rediss-cluster://: the same over TLS) or mem://NAME",
	  parse_string, FIELD(kv_url) },
	{ "SHIFT_KV_NAMESPACE", "default",
	  "job id; every KV key carries it (1..64 of A-Z a-z 0-9 . _ -)",
	  parse_namespace, FIELD(kv_namespace) },
	{ "SHIFT_JOB_ID", "",
	  "this run of the job, in every KV key after the namespace, so that a job never reads "
	  "an earlier run's records (1..64 of A-Z a-z 0-9 . _ -; default: SLURM_JOB_ID.SLURM_STEP_ID, "
	  "else TORCHELASTIC_RUN_ID, else none)",
	  parse_job_id, FIELD(job_id) },
	{ "SHIFT_KV_TIMEOUT_MS", "300",
	  "total deadline of one KV command in ms (reconnect, write and the whole reply; "
	  "10..10000): a store that does not answer, or answers slowly, fails the command "
	  "after this long and its connection is dropped",
	  parse_bounded, FIELD_RANGE(kv_timeout_ms, 10, 10000) },
	{ "SHIFT_KV_MAX_REPLY", "65536",
	  "largest value a KV reply may carry, in bytes (1024..1048576; SHIFT's records are "
	  "a few hundred bytes): a larger one is refused unread, its connection dropped, "
	  "with one log line",
	  parse_bounded, FIELD_RANGE(kv_max_reply, 1024, 1048576) },
	{ "SHIFT_KV_SECRET_FILE", "",
	  "file holding the job's secret (16..4096 bytes, mode 0600/0400, owned by you or "
	  "root): every KV record is sealed with HMAC-SHA256 under it and a record that "
	  "does not verify is ignored; '' = records are not authenticated (docs/security.md)",
	  parse_string, FIELD(kv_secret_file) },
	{ "SHIFT_KV_TLS_CA", "",
	  "TLS schemes (rediss*://) only: CA file (PEM) the Redis server's certificate must chain to; its "
	  "name or IP must be the URL's host; '' = the system's trust store",
	  parse_string, FIELD(kv_tls_ca) },
	{ "SHIFT_KV_TLS_CERT", "",
	  "TLS schemes (rediss*://) only: client certificate (PEM chain) for a server with tls-auth-clients; "
	  "with SHIFT_KV_TLS_KEY; '' = none",
	  parse_string, FIELD(kv_tls_cert) },
	{ "SHIFT_KV_TLS_KEY", "",
	  "TLS schemes (rediss*://) only: the client certificate's private key (PEM); '' = none",
	  parse_string, FIELD(kv_tls_key) },
	{ "SHIFT_PROBE_MS", "250",
	  "period of the recovery probe on a failed default path, in ms (doubling per failed "
	  "probe up to 8x); 0 = no failback: a failed-over QP stays on its backup",
	  parse_uint, FIELD(probe_ms) },
	{ "SHIFT_KV_TTL_S", "600",
	  "lifetime of each record SHIFT writes to the KV store, in seconds (30..86400): "
	  "written again every third of it while its process lives, deleted at a clean "
	  "exit; what a killed process left expires after this long",
	  parse_bounded, FIELD_RANGE(kv_ttl_s, 30, 86400) },
	{ "SHIFT_KV_WAIT_MS", "3000",
	  "how long a failover waits for what it needs from the KV store (the peer's backup "
	  "key of an rkey a WR uses), in ms (100..60000): the background thread reads it; "
	  "until then the WR and those after it are held, after that it fails as the "
	  "default path would have failed it",
	  parse_bounded, FIELD_RANGE(kv_wait_ms, 100, 60000) },
	{ "SHIFT_FAILOVER_MS", "10000",
	  "how long a failover may take to finish, in ms (1000..600000): the peer's answer "
	  "to the handshake, its joining a new failover after a backup failure, a return "
	  "to the default path; after it the connection fails as it would have without "
	  "SHIFT (every outstanding WR in error, the QP in ERR), with one log line",
	  parse_bounded, FIELD_RANGE(episode_wait_ms, 1000, 600000) },
	{ "SHIFT_PORT_DOWN_MS", "300",
	  "fail a QP over once its default port has not been ACTIVE for this long, without "
	  "waiting for an error completion (soft-RoCE never reports one on a cut link); "
	  "0 = only on error completions",
	  parse_uint, FIELD(port_down_ms) },
	{ "SHIFT_POKE_MS", "1000",
	  "how often each process reads whether a peer failed over alone and lost its backup "
	  "path, and needs it to follow (one KV read per context); 0 = never (such a "
	  "connection fails)",
	  parse_uint, FIELD(poke_ms) },
	{ "SHIFT_IDLE_MS", "250",
	  "longest sleep of each RNIC's background thread while nothing fails, in ms "
	  "(10..10000): it wakes at once on what it watches (port events, a peer's handshake "
	  "on a backup CQ, the application's control verbs); this bounds the rest (a backup "
	  "CQ of an application channel nobody waits on, status, KV refresh and retries)",
	  parse_bounded, FIELD_RANGE(idle_ms, 10, 10000) },
	{ "SHIFT_NATIVE_WQ", "1",
	  "read a failed QP's outstanding work requests back from the provider's own queues "
	  "where its provider lets SHIFT (mlx5), so that a post copies nothing; 0 = mirror "
	  "every posted work request on every device",
	  parse_bool, FIELD(native_wq) },
	{ "SHIFT_KEY_MAILBOX", "1",
	  "give each protected QP whose backup grants remote writes a small mailbox on the "
	  "backup NIC, through which a failed-over connection asks the peer itself for an "
	  "MR's backup key the KV store cannot give (memory registered while the store was "
	  "gone); 0 = none: such a WR fails after SHIFT_KV_WAIT_MS",
	  parse_bool, FIELD(key_mailbox) },
	{ "SHIFT_DATAGRAMS", "1",
	  "send each failover record to the peer also as a datagram, over a UD QP of SHIFT's "
	  "own on the backup NIC, so that a second failover of an episode, a return to the "
	  "default QPs or a failover only one end saw is agreed without the KV store; 0 = "
	  "through the KV store only",
	  parse_bool, FIELD(datagrams) },
	{ "SHIFT_STATUS_DIR", NULL,
	  "where each process writes its per-QP status for shiftctl ('' = none; default "
	  "$XDG_RUNTIME_DIR/shift, else /run/shift/UID, else /tmp/shift-UID; must be owned "
	  "by the user, mode 0700)",
	  parse_status_dir, FIELD(status_dir) },
};

#define NROWS (sizeof(rows) / sizeof(rows[0]))

/* Where each knob's value came from ("" = default) and the raw value. */
static struct {
	char origin[300];
	char value[600];
} set_by[NROWS];

size_t shift_config_mask(const char *name, const char *v, char *out, size_t size)
{
	const char *scheme = strstr(v, "://");
	const char *at = scheme ? strrchr(scheme + 3, '@') : NULL;
	const char *colon = at ? memchr(scheme + 3, ':', (size_t)(at - scheme - 3)) : NULL;

	if (!size)
		return 0;
	if (strcmp(name, "SHIFT_KV_URL") || !colon)
		return (size_t)snprintf(out, size, "%s", v);
	return (size_t)snprintf(out, size, "%.*s:***%s", (int)(colon - v), v, at);
}

/* Why v is refused for row, or NULL if it is not (before parsing). */
static const char *config_reject(const struct config_row *row, const char *v)
{
	for (const char *c = v; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			return "contains a control character";
	if (row->parse == parse_string || row->parse == parse_namespace ||
	    row->parse == parse_status_dir)
		if (strlen(v) >= row->size)
			return "too long";
	return NULL;
}

/*
 * Parse v into row; a bad value is one error line naming the setting, the
 * origin (env or file:line) and the reason, the value masked. The caller
 * then disables SHIFT for the process: never a silent fallback.
 */
static int config_apply(const struct config_row *row, const char *v, const char *origin)
{
	const char *why = config_reject(row, v);
	char shown[160];

	if (!why && !row->parse(row, v)) {
		size_t i = (size_t)(row - rows);

		snprintf(set_by[i].origin, sizeof(set_by[i].origin), "%s", origin);
		snprintf(set_by[i].value, sizeof(set_by[i].value), "%s", v);
		return 0;
	}
	if (!why)
		why = "invalid value";
	shift_config_mask(row->name, v, shown, sizeof(shown));
	shift_err("SHIFT disabled for this process (application runs unprotected): "
		  "%s='%s%s' from %s: %s (%s)", row->name, shown,
		  strlen(v) >= sizeof(shown) ? "..." : "", origin, why, row->doc);
	return -1;
}

int shift_config_set(const char *key, const char *v, const char *origin)
{
	char name[64];
	size_t n = strlen(key);

	if (n + sizeof("SHIFT_") > sizeof(name))
		return -2;
	memcpy(name, "SHIFT_", 6);
	for (size_t i = 0; i <= n; i++)
		name[6 + i] = (char)(key[i] >= 'a' && key[i] <= 'z' ? key[i] - 'a' + 'A' : key[i]);
	for (size_t i = 0; i < NROWS; i++)
		if (!strcmp(rows[i].name, name))
			return config_apply(&rows[i], v, origin);
	return -2;
}

int shift_config_load(const char *real_lib_default)
{
	int bad = 0;

	memset(&shift_config, 0, sizeof(shift_config));
	memset(set_by, 0, sizeof(set_by));
	for (size_t i = 0; i < NROWS; i++) {
		const char *def = rows[i].def;

		if (!strcmp(rows[i].name, "SHIFT_REAL_LIBIBVERBS"))
			def = real_lib_default ? real_lib_default : "libibverbs.so.1";
		if (rows[i].parse == parse_status_dir) {
			shift_status_dir_default(shift_config.status_dir,
						 sizeof(shift_config.status_dir));
			continue;
		}
		if (rows[i].parse(&rows[i], def))
			bad++; /* a default that does not parse is a bug */
	}
	bad += shift_config_files_load();
	for (size_t i = 0; i < NROWS; i++) {
		const char *v = getenv(rows[i].name);

		/* set but empty: the default, except where '' means none */
		if (!v || (!*v && rows[i].parse != parse_status_dir))
			continue;
		if (config_apply(&rows[i], v, "env"))
			bad++;
	}
	if (bad)
		shift_config.enable = false;
	if (shift_config.job_id[0])
		snprintf(shift_config.job_id_from, sizeof(shift_config.job_id_from), "SHIFT_JOB_ID");
	else
		job_id_derive();
	shift_config.handshake_wait_ms = shift_config.episode_wait_ms;
	shift_config.bk_restart_ms = 500;
	shift_config.peer_warn_ms = 10000;
	shift_config.free_grace_ms = 1000;
	shift_log_level = (enum shift_log_level)shift_config.log_level;
	return bad;
}

void shift_config_print(FILE *out)
{
	for (size_t i = 0; i < NROWS; i++) {
		const char *v = set_by[i].value;
		bool set = set_by[i].origin[0] != '\0';
		char shown[600];

		if (set)
			shift_config_mask(rows[i].name, v, shown, sizeof(shown));
		else if (!rows[i].def) /* computed at load: the field holds it */
			snprintf(shown, sizeof(shown), "%s", (const char *)field(&rows[i]));
		else
			snprintf(shown, sizeof(shown), "%s", rows[i].def);
		fprintf(out, "%-22s = %s  (%s)\n    %s\n", rows[i].name, set && !*v ? "''" : shown,
			set ? set_by[i].origin : "default", rows[i].doc);
	}
}
