/*
 * Logging back end: formats one whole line and writes it with a single
 * write(2), so lines of concurrent threads and processes do not interleave.
 */
#include "shift/base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

enum shift_log_level shift_log_level = SHIFT_LOG_WARN;

static const char *const level_names[] = {
	[SHIFT_LOG_ERROR] = "error",
	[SHIFT_LOG_WARN] = "warn",
	[SHIFT_LOG_INFO] = "info",
	[SHIFT_LOG_DEBUG] = "debug",
};

const char *shift_log_level_name(enum shift_log_level level)
{
	if ((unsigned)level > SHIFT_LOG_DEBUG)
		return "?";
	return level_names[level];
}

int shift_log_level_parse(const char *s, enum shift_log_level *out)
{
	for (unsigned i = 0; i <= SHIFT_LOG_DEBUG; i++) {
		if (!strcasecmp(s, level_names[i]) ||
		    (s[0] == (char)('0' + i) && s[1] == '\0')) {
			*out = (enum shift_log_level)i;
			return 0;
		}
	}
	if (!strcasecmp(s, "warning")) {
		*out = SHIFT_LOG_WARN;
		return 0;
	}
	return -1;
}

/* "2026-11-26T22:40:01.123Z host" into out; "" if the clock fails. */
static int log_stamp(char *out, size_t size)
{
	static char host[65];
	struct timespec ts;
	struct tm tm;
	char day[32];

	if (!host[0] && gethostname(host, sizeof(host) - 1))
		strcpy(host, "?");
	for (char *c = host; *c; c++)
		if ((unsigned char)*c <= 0x20 || *c == 0x7f)
			*c = '?';
	if (clock_gettime(CLOCK_REALTIME, &ts) || !gmtime_r(&ts.tv_sec, &tm) ||
	    !strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm))
		return snprintf(out, size, "- %s", host);
	return snprintf(out, size, "%s.%03ldZ %s", day, ts.tv_nsec / 1000000L, host);
}

/*
 * Escape every control character of msg (a line break in an interpolated
 * value cannot start a forged line) into out: \xNN. Returns the length.
 */
static size_t log_escape(const char *msg, char *out, size_t size)
{
	static const char hex[] = "0123456789abcdef";
	size_t n = 0;

	for (; *msg && n + 5 < size; msg++) {
		unsigned char c = (unsigned char)*msg;

		if (c < 0x20 || c == 0x7f) {
			out[n++] = '\\';
			out[n++] = 'x';
			out[n++] = hex[c >> 4];
			out[n++] = hex[c & 15];
		} else {
			out[n++] = (char)c;
		}
	}
	out[n] = '\0';
	return n;
}

void shift_log_emit(enum shift_log_level level, const char *fmt, ...)
{
	char msg[1024], stamp[128], line[1400];
	va_list ap;

	va_start(ap, fmt);
	int m = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (m < 0)
		return;
	log_stamp(stamp, sizeof(stamp));
	int n = snprintf(line, sizeof(line), "shift: %s: %s[%d] ", shift_log_level_name(level),
			 stamp, (int)getpid());
	if (n < 0 || (size_t)n >= sizeof(line))
		return;
	n += (int)log_escape(msg, line + n, sizeof(line) - (size_t)n - 1);
	line[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, (size_t)n);
	(void)w;
}
