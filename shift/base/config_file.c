/*
 * The config files: untrusted input read with care. A file must be a
 * regular file (never through a link), owned by root or the user, not
 * writable by group or others, at most CONF_MAX_SIZE bytes, lines at most
 * CONF_MAX_LINE bytes; each line is blank, a '#' comment or 'key = value'
 * with key the env name lowercased without SHIFT_. Anything else is a bad
 * setting naming FILE:LINE, which disables SHIFT like a bad env value.
 */
#include "shift/base/config.h"
#include "shift/base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CONF_MAX_SIZE 65536
#define CONF_MAX_LINE 1024

static char *trim(char *s)
{
	char *e = s + strlen(s);

	while (*s == ' ' || *s == '\t')
		s++;
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
		*--e = '\0';
	return s;
}

/* One line (NUL-terminated, no '\n'); 0 or 1 bad setting. */
static int conf_line(const char *path, unsigned no, char *line)
{
	char origin[300], *eq, *key, *val;
	int rc;

	snprintf(origin, sizeof(origin), "%s:%u", path, no);
	key = trim(line);
	if (!*key || *key == '#')
		return 0;
	eq = strchr(key, '=');
	if (!eq) {
		shift_err("SHIFT disabled for this process (application runs unprotected): "
			  "%s: not 'key = value'", origin);
		return 1;
	}
	*eq = '\0';
	key = trim(key);
	val = trim(eq + 1);
	if (strspn(key, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(key) || !*key ||
	    !strcmp(key, "config"))
		rc = -2;
	else
		rc = shift_config_set(key, val, origin);
	if (rc == -2)
		shift_err("SHIFT disabled for this process (application runs unprotected): "
			  "%s: unknown key '%.64s'", origin, key);
	return rc ? 1 : 0;
}

/* Why the opened file fd is not trusted, or NULL. */
static const char *conf_distrust(int fd)
{
	struct stat st;

	if (fstat(fd, &st) || !S_ISREG(st.st_mode))
		return "not a regular file";
	if (st.st_uid != 0 && st.st_uid != geteuid())
		return "owned by another user";
	if (st.st_mode & 022)
		return "writable by group or others";
	if (st.st_size > CONF_MAX_SIZE)
		return "larger than 64 KiB";
	return NULL;
}

static int conf_parse(const char *path, char *buf, size_t n)
{
	unsigned no = 0;
	int bad = 0;

	for (size_t at = 0; at < n;) {
		char *nl = memchr(buf + at, '\n', n - at);
		size_t len = nl ? (size_t)(nl - (buf + at)) : n - at;

		no++;
		buf[at + len] = '\0';
		if (len > CONF_MAX_LINE || strlen(buf + at) != len) {
			shift_err("SHIFT disabled for this process (application runs unprotected): "
				  "%s:%u: line longer than %d bytes or holding a NUL", path, no,
				  CONF_MAX_LINE);
			bad++;
		} else {
			bad += conf_line(path, no, buf + at);
		}
		at += len + 1;
	}
	return bad;
}

/* One file: 0 if absent or good, else the number of bad settings. */
static int conf_file(const char *path)
{
	static char buf[CONF_MAX_SIZE + 1];
	const char *why;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);

	if (fd < 0 && errno == ENOENT)
		return 0;
	if (fd < 0)
		why = errno == ELOOP ? "a symbolic link" : strerror(errno);
	else
		why = conf_distrust(fd);
	if (!why) {
		n = read(fd, buf, sizeof(buf));
		if (n < 0 || n > CONF_MAX_SIZE)
			why = n < 0 ? strerror(errno) : "larger than 64 KiB";
	}
	if (fd >= 0)
		close(fd);
	if (why) {
		shift_err("SHIFT disabled for this process (application runs unprotected): "
			  "config file %s: %s", path, why);
		return 1;
	}
	return conf_parse(path, buf, (size_t)n);
}

int shift_config_files_load(void)
{
	const char *env = getenv("SHIFT_CONFIG");
	const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
	char user[1024];
	int bad;

	if (env)
		return *env ? conf_file(env) : 0;
	bad = conf_file("/etc/shift/shift.conf");
	if (xdg && xdg[0] == '/')
		snprintf(user, sizeof(user), "%s/shift/shift.conf", xdg);
	else if (home && home[0] == '/')
		snprintf(user, sizeof(user), "%s/.config/shift/shift.conf", home);
	else
		return bad;
	return bad + conf_file(user);
}
