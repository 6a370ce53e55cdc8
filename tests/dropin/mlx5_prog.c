/*
 * An mlx5 direct-verbs caller for ctest dropin_mlx5_front: without mlx5
 * hardware, mlx5dv_create_qp on a context that is not an mlx5 one fails
 * with EOPNOTSUPP in the real libmlx5 (its device's ops are not mlx5's).
 * Through the front it must fail the same way, after one line saying that
 * objects made this way are not protected (once, however many calls).
 */
#include <errno.h>
#include <infiniband/mlx5dv.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
	/* a device whose verbs_device ops (right after it) are NULL */
	static _Alignas(64) unsigned char devbuf[4096];
	struct ibv_context ctx;
	struct ibv_qp_init_attr_ex attr;
	int rc = 0;

	memset(&ctx, 0, sizeof(ctx));
	memset(&attr, 0, sizeof(attr));
	ctx.device = (struct ibv_device *)devbuf;
	for (int i = 0; i < 2; i++) {
		errno = 0;
		struct ibv_qp *qp = mlx5dv_create_qp(&ctx, &attr, NULL);

		printf("mlx5dv_create_qp: %s (errno %d)\n", qp ? "a QP" : "NULL", errno);
		rc |= qp != NULL;
	}
	return rc;
}
