/*
 * Logging back end: formats one whole line and writes it with a single
 * write(2), so lines of concurrent threads and processes do not interleave.
 */
#include "shift/base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
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

void shift_log_emit(enum shift_log_level level, const char *fmt, ...)
{
	char line[1024];
	int n = snprintf(line, sizeof(line), "shift: %s: [%d] ",
			 shift_log_level_name(level), (int)getpid());
	va_list ap;

	if (n < 0)
		return;
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		return;
	n += m;
	if ((size_t)n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, (size_t)n);
	(void)w;
}
