# kv/ unit tests: test_kv (URL/namespace parsing, in-memory backend) and
# test_kv_redis (Redis backend against a real redis-server that the test
# starts on a free 127.0.0.1 port; it fails, never skips, without one).
shift_unit_test(test_kv
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kv.c
  LIBS shift_kv)
shift_unit_test(test_kv_redis
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kv_redis.c ${CMAKE_CURRENT_LIST_DIR}/redis_proc.c
  LIBS shift_kv)
# test_kv_deadline: the Redis backend's total per-command deadline and reply
# size limit against a fake server thread (silent, slow AUTH, one byte per
# 100 ms, a 10 MiB value); needs no redis-server.
shift_unit_test(test_kv_deadline
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kv_deadline.c
  LIBS shift_kv)
# test_kv_sentinel: redis-sentinel:// against a real primary, replica and
# sentinel the test starts; the primary is killed and the handle follows the
# promotion (about 2 s).
shift_unit_test(test_kv_sentinel
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kv_sentinel.c ${CMAKE_CURRENT_LIST_DIR}/redis_proc.c
  LIBS shift_kv)
# test_kv_auth: authenticated records (HMAC-SHA256 under a per-job secret
# file) on the in-memory backend: forged, altered, moved and other-job
# records read as absent and are counted; the secret file is checked.
shift_unit_test(test_kv_auth
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kv_auth.c
  LIBS shift_kv)
# test_kv_job: the job run in every key (SHIFT_JOB_ID, else the
# scheduler's job id): runs of one job in one namespace never see each other.
shift_unit_test(test_kv_job
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kv_job.c
  LIBS shift_kv)
# kv_tls_stunnel: TLS to Redis through a per-host stunnel (redis-server with
# only a TLS port and client certificates); plaintext, a wrong CA and a
# missing client certificate refused; the password in no output.
add_test(NAME kv_tls_stunnel COMMAND ${CMAKE_SOURCE_DIR}/tests/kv/tls_stunnel.sh ${CMAKE_BINARY_DIR}/bin)
set_tests_properties(kv_tls_stunnel PROPERTIES LABELS unit TIMEOUT 60)
# kv_tls_native: rediss:// in SHIFT's own client (kv/kv_tls.c) against the
# same TLS-only redis-server; another CA, a host the certificate does not
# name, no client certificate, plaintext either way refused.
add_test(NAME kv_tls_native COMMAND ${CMAKE_SOURCE_DIR}/tests/kv/tls_native.sh ${CMAKE_BINARY_DIR}/bin)
set_tests_properties(kv_tls_native PROPERTIES LABELS unit TIMEOUT 60)
# kv_tls_replicated: rediss-cluster:// at a TLS-only Redis Cluster (three
# primaries, tls-cluster) and rediss-sentinel:// at a TLS sentinel watching
# a TLS primary; another CA and the plaintext schemes refused.
add_test(NAME kv_tls_replicated COMMAND ${CMAKE_SOURCE_DIR}/tests/kv/tls_replicated.sh ${CMAKE_BINARY_DIR}/bin)
set_tests_properties(kv_tls_replicated PROPERTIES LABELS unit TIMEOUT 90)
# test_kv_cluster: redis-cluster:// against a real Redis Cluster the test
# builds (three primaries, a replica): slots and hash tags as the server
# computes them, CLUSTER NODES parsing (hand-made replies too), MOVED and
# ASK followed, one MGET per slot, a primary killed and its replica
# promoted under the same handle (about 2 s).
shift_unit_test(test_kv_cluster
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kv_cluster.c ${CMAKE_CURRENT_LIST_DIR}/redis_proc.c
  LIBS shift_kv)
