/* bootstrap.c - the TCP side channel of shift-nccl-check: connect/accept with
 * deadlines, and fixed-size messages of big-endian 64-bit words, blocking
 * (set-up, end of run) or polled from the event loop (the peer's TXDONE/FIN).
 * Nothing here touches verbs; the socket never blocks past its deadline. */
#include "nccl_check.h"

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void nodelay(int fd)
{
	int one = 1;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int nc_tcp_connect(const char *host, unsigned port, double timeout)
{
	char svc[16];
	snprintf(svc, sizeof(svc), "%u", port);
	double deadline = nc_now() + timeout;
	int last_err = 0;

	for (;;) {
		struct addrinfo hints = {.ai_family = AF_UNSPEC,
		                         .ai_socktype = SOCK_STREAM};
		struct addrinfo *res = NULL;
		int rc = getaddrinfo(host, svc, &hints, &res);
		if (rc) {
			nc_log("cannot resolve %s: %s", host, gai_strerror(rc));
			return -1;
		}
		for (struct addrinfo *a = res; a; a = a->ai_next) {
			int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
			if (fd < 0)
				continue;
			if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
				freeaddrinfo(res);
				nodelay(fd);
				return fd;
			}
			last_err = errno;
			close(fd);
		}
		freeaddrinfo(res);
		if (nc_now() >= deadline)
			break;
		/* The server may not be listening yet: retry. */
		struct timespec ts = {0, 200 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	nc_log("cannot connect to %s:%u: %s", host, port, strerror(last_err));
	errno = last_err;
	return -1;
}

int nc_tcp_accept(unsigned port, double timeout)
{
	int lfd = socket(AF_INET6, SOCK_STREAM, 0);
	int v6 = 1;
	if (lfd < 0) { /* no IPv6: plain IPv4 */
		lfd = socket(AF_INET, SOCK_STREAM, 0);
		v6 = 0;
	}
	if (lfd < 0)
		return -1;
	int one = 1, zero = 0;
	(void)setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	int rc;
	if (v6) {
		(void)setsockopt(lfd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
		struct sockaddr_in6 sa = {.sin6_family = AF_INET6,
		                          .sin6_port = htons((uint16_t)port),
		                          .sin6_addr = IN6ADDR_ANY_INIT};
		rc = bind(lfd, (struct sockaddr *)&sa, sizeof(sa));
	} else {
		struct sockaddr_in sa = {.sin_family = AF_INET,
		                         .sin_port = htons((uint16_t)port),
		                         .sin_addr.s_addr = htonl(INADDR_ANY)};
		rc = bind(lfd, (struct sockaddr *)&sa, sizeof(sa));
	}
	if (rc || listen(lfd, 1)) {
		nc_log("cannot listen on port %u: %s", port, strerror(errno));
		close(lfd);
		return -1;
	}
	struct pollfd p = {.fd = lfd, .events = POLLIN};
	rc = poll(&p, 1, (int)(timeout * 1000));
	if (rc <= 0) {
		nc_log("no client within %.0f s on port %u", timeout, port);
		close(lfd);
		return -1;
	}
	int fd = accept(lfd, NULL, NULL);
	close(lfd);
	if (fd >= 0)
		nodelay(fd);
	return fd;
}

int nc_tcp_send_u64(int fd, const uint64_t *v, size_t n)
{
	uint64_t w[2 + NC_MAX_QPS + NC_REMOTE_WORDS];
	size_t done = 0, len = n * 8;
	if (n > sizeof(w) / 8)
		return -1;
	for (size_t i = 0; i < n; i++)
		w[i] = htobe64(v[i]);
	while (done < len) {
		ssize_t r = send(fd, (uint8_t *)w + done, len - done, MSG_NOSIGNAL);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		done += (size_t)r;
	}
	return 0;
}

int nc_tcp_recv_u64(int fd, uint64_t *v, size_t n, double timeout)
{
	size_t done = 0, len = n * 8;
	uint8_t *p = (uint8_t *)v;
	double deadline = nc_now() + timeout;
	while (done < len) {
		double left = deadline - nc_now();
		if (left <= 0)
			return errno = ETIMEDOUT, -1;
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		int rc = poll(&pf, 1, (int)(left * 1000) + 1);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc <= 0)
			continue; /* re-check the deadline */
		ssize_t r = recv(fd, p + done, len - done, 0);
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r <= 0)
			return errno = r ? errno : ECONNRESET, -1;
		done += (size_t)r;
	}
	for (size_t i = 0; i < n; i++)
		v[i] = be64toh(v[i]);
	return 0;
}

int nc_tcp_poll_u64(struct nc_ctx *c, uint64_t *v, size_t n)
{
	size_t len = n * 8;
	if (len > sizeof(c->rxb))
		return -1;
	while (c->rxb_have < len) {
		ssize_t r = recv(c->sock, c->rxb + c->rxb_have, len - c->rxb_have,
		                 MSG_DONTWAIT);
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		c->rxb_have += (size_t)r;
	}
	memcpy(v, c->rxb, len);
	for (size_t i = 0; i < n; i++)
		v[i] = be64toh(v[i]);
	c->rxb_have = 0;
	return 1;
}
