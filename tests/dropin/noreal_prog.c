/*
 * A verbs program for tests/dropin/noreal.sh: lists the devices the way
 * ibv_devices does and reports the failure the way an application would.
 * Exits 0 with the count, 1 with the error; a signal means the library
 * under it aborted. With an argument it then calls ibv_wc_status_str,
 * which a real library without that symbol cannot serve.
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);

	if (!list) {
		int e = errno;

		fprintf(stderr, "noreal_prog: ibv_get_device_list: %s (errno %d)\n",
			strerror(e), e);
		return 1;
	}
	printf("noreal_prog: %d devices\n", n);
	ibv_free_device_list(list);
	(void)argv;
	if (argc > 1)
		printf("noreal_prog: %s\n", ibv_wc_status_str(IBV_WC_SUCCESS));
	return 0;
}
