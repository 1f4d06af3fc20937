/* The file store: every operation with its values, the byte format
 * PyTorch's FileStore writes, waits satisfied by a second handle and by
 * another process, timeouts, cancellation, bad and corrupt files, the
 * "cleanup/" count that removes the file, and interop with a real PyTorch
 * 1.13 FileStore (/usr/bin/python3) sharing the same file. */
#define _GNU_SOURCE /* memmem */
#include "tap.h"
#include "uvccl.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define PYTHON "/usr/bin/python3"

static uv_loop_t loop;
static int closed;
static char path[64];

static void on_closed(uvccl_store_t *s) { closed++; }
static int run(uvccl_work_t *w) { return uvccl_work_wait(w); }

static int cb_status;
static int cb_calls;
static void on_done(uvccl_work_t *w, int status) {
  cb_status = status;
  cb_calls++;
}

/* A fresh, empty file (an empty file is an empty store). */
static void new_path(void) {
  int fd;
  snprintf(path, sizeof(path), "/tmp/uvccl-fs-XXXXXX");
  fd = mkstemp(path);
  if (fd < 0) {
    printf("Bail out! mkstemp %s: %s\n", path, strerror(errno));
    exit(1);
  }
  close(fd);
}

/* A fresh name with no file behind it. */
static void new_missing_path(void) {
  new_path();
  unlink(path);
}

static int exists(const char *p) { return access(p, F_OK) == 0; }

static char *slurp(const char *p, size_t *len) {
  FILE *f = fopen(p, "rb");
  char *buf;
  long n;
  *len = 0;
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = malloc((size_t)n + 1);
  if (fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
  fclose(f);
  *len = (size_t)n;
  return buf;
}

static void spit(const char *p, const void *b, size_t len) {
  FILE *f = fopen(p, "wb");
  if (f == NULL) {
    printf("Bail out! write %s: %s\n", p, strerror(errno));
    exit(1);
  }
  fwrite(b, 1, len, f);
  fclose(f);
}

/* Whether the file holds these exact bytes somewhere. */
static int file_has(const char *p, const void *b, size_t len) {
  size_t n;
  char *buf = slurp(p, &n);
  int found = buf != NULL && memmem(buf, n, b, len) != NULL;
  free(buf);
  return found;
}
#define FILE_HAS(p, lit) file_has((p), (lit), sizeof(lit) - 1)

static void close_store(uvccl_store_t *s) {
  int before = closed;
  uvccl_store_close(s, on_closed);
  while (closed == before && uv_run(&loop, UV_RUN_ONCE) != 0) {}
}

static int64_t num_keys(uvccl_store_t *s) {
  uvccl_work_t w = {0};
  int64_t n;
  uvccl_store_num_keys(s, &w, NULL);
  n = run(&w) == 0 ? w.result : -1;
  uvccl_work_cleanup(&w);
  return n;
}

static int check1(uvccl_store_t *s, const char *key) {
  uvccl_work_t w = {0};
  int r;
  uvccl_store_check(s, &w, &key, 1, NULL);
  r = run(&w) == 0 ? (int)w.result : -1;
  uvccl_work_cleanup(&w);
  return r;
}

/* ---- every operation on one handle --------------------------------------- */

static void test_ops(void) {
  uvccl_store_t a, x;
  uvccl_work_t w = {0}, wg = {0};
  const char *ks[] = {"x", "y"}, *mk[] = {"y", "x", "k"};
  const char *both[] = {"k", "n"}, *miss[] = {"k", "zz"};
  uvccl_buf_t vs[] = {{"1", 1}, {"22", 2}};
  size_t len, i;
  char *buf;
  int found;

  note("operations on one handle");
  new_path();
  is_int(uvccl_file_store_init(&loop, &x, "", 1), UV_EINVAL, "empty path");
  is_int(uvccl_file_store_init(&loop, &x, NULL, 1), UV_EINVAL, "NULL path");
  tap_require(uvccl_file_store_init(&loop, &a, path, -1) == 0, "init %s",
              path);
  is_int(a.type, UVCCL_STORE_FILE, "type file");

  uvccl_store_set(&a, &w, "k", "v", 1, NULL);
  is_int(run(&w), 0, "set");
  buf = slurp(path, &len);
  ok(len == 11 && memcmp(buf, "\x02\0\0\0/k\x01\0\0\0v", 11) == 0,
     "the file is PyTorch's entry: u32 len, '/' + key, u32 len, value");
  free(buf);
  uvccl_store_get(&a, &w, "k", NULL);
  is_int(run(&w), 0, "get");
  is_mem(w.value, w.value_len, "v", "get returns the value");
  uvccl_store_set(&a, &w, "k", "v2", 2, NULL);
  run(&w);
  uvccl_store_get(&a, &w, "k", NULL);
  run(&w);
  is_mem(w.value, w.value_len, "v2", "the latest entry wins");

  uvccl_store_add(&a, &w, "n", 5, NULL);
  is_int(run(&w), 0, "add");
  is_int(w.result, 5, "add on a missing key starts at 0");
  uvccl_store_add(&a, &w, "n", 3, NULL);
  run(&w);
  is_int(w.result, 8, "add again");
  uvccl_store_add(&a, &w, "n", -10, NULL);
  run(&w);
  is_int(w.result, -2, "add a negative delta");
  uvccl_store_get(&a, &w, "n", NULL);
  run(&w);
  is_mem(w.value, w.value_len, "-2", "add stores decimal text");
  ok(FILE_HAS(path, "\x02\0\0\0/n\x02\0\0\0-2"), "as its own entry");
  uvccl_store_add(&a, &w, "k", 1, NULL);
  is_int(run(&w), UVCCL_ENOTNUM, "add on text fails");
  ok(strstr(w.msg, "'k'") != NULL, "naming the key: %s", w.msg);
  uvccl_store_set(&a, &w, "e", "", 0, NULL);
  run(&w);
  uvccl_store_add(&a, &w, "e", 4, NULL);
  is_int(run(&w), 0, "add on an empty value");
  is_int(w.result, 4, "counts it as 0, as PyTorch");
  uvccl_store_set(&a, &w, "sp", " 12abc", 6, NULL);
  run(&w);
  uvccl_store_add(&a, &w, "sp", 1, NULL);
  run(&w);
  is_int(w.result, 13, "add parses as std::stoll (spaces, trailing junk)");

  uvccl_store_compare_set(&a, &w, "c", "", 0, "new", 3, NULL);
  is_int(run(&w), 0, "compare_set");
  is_mem(w.value, w.value_len, "new", "compare_set creates a missing key");
  uvccl_store_compare_set(&a, &w, "c", "old", 3, "x", 1, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "new", "mismatch returns the current value");
  uvccl_store_compare_set(&a, &w, "c", "new", 3, "newer", 5, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "newer", "match sets the desired value");
  uvccl_store_compare_set(&a, &w, "cm", "e", 1, "d", 1, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "e", "missing key, expected given: expected");
  is_int(check1(&a, "cm"), 0, "and the key is not created");

  uvccl_store_check(&a, &w, both, 2, NULL);
  is_int(run(&w), 0, "check");
  is_int(w.result, 1, "check: both present");
  uvccl_store_check(&a, &w, miss, 2, NULL);
  run(&w);
  is_int(w.result, 0, "check: one missing");
  uvccl_store_check(&a, &w, NULL, 0, NULL);
  run(&w);
  is_int(w.result, 1, "check of no keys");

  uvccl_store_append(&a, &w, "ap", "ab", 2, NULL);
  is_int(run(&w), 0, "append creates");
  uvccl_store_append(&a, &w, "ap", "cd", 2, NULL);
  run(&w);
  uvccl_store_get(&a, &w, "ap", NULL);
  run(&w);
  is_mem(w.value, w.value_len, "abcd", "append concatenates");

  uvccl_store_multi_set(&a, &w, ks, vs, 2, NULL);
  is_int(run(&w), 0, "multi_set");
  uvccl_store_multi_get(&a, &w, mk, 3, NULL);
  is_int(run(&w), 0, "multi_get");
  ok(w.nvalues == 3 && w.values[0].len == 2 &&
         memcmp(w.values[0].base, "22", 2) == 0 && w.values[1].len == 1 &&
         memcmp(w.values[1].base, "1", 1) == 0 &&
         strcmp(w.values[2].base, "v2") == 0,
     "multi_get values in key order");

  uvccl_store_set(&a, &w, "bin", "a\0b", 3, NULL);
  run(&w);
  uvccl_store_get(&a, &w, "bin", NULL);
  run(&w);
  ok(w.value_len == 3 && memcmp(w.value, "a\0b", 3) == 0,
     "binary values round-trip");

  /* k n e sp c ap x y bin */
  is_int(num_keys(&a), 9, "num_keys");
  uvccl_store_delete_key(&a, &w, "k", NULL);
  is_int(run(&w), 0, "delete_key");
  is_int(w.result, 1, "delete_key of a present key: 1");
  ok(FILE_HAS(path, "\x03\0\0\0-/k\0\0\0\0"),
     "delete appends PyTorch's tombstone '-/k' with an empty value");
  uvccl_store_delete_key(&a, &w, "k", NULL);
  run(&w);
  is_int(w.result, 0, "delete_key of a missing key: 0");
  is_int(check1(&a, "k"), 0, "a deleted key is gone");
  is_int(num_keys(&a), 8, "num_keys after delete");

  uvccl_store_list_keys(&a, &w, NULL);
  is_int(run(&w), 0, "list_keys");
  is_int(w.nvalues, 8, "list_keys: every key");
  for (found = 0, i = 0; i < w.nvalues; i++)
    if (strcmp(w.values[i].base, "ap") == 0 ||
        strcmp(w.values[i].base, "bin") == 0)
      found++;
  is_int(found, 2, "without the '/' prefix");

  uvccl_work_cleanup(&w);
  is_int(uvccl_store_queue_push(&a, &w, "q", "1", 1, NULL), UVCCL_ENOTSUP,
         "queue_push: not supported");
  is_int(uvccl_store_queue_pop(&a, &w, "q", 0, NULL), UVCCL_ENOTSUP,
         "queue_pop: not supported");
  is_int(uvccl_store_queue_len(&a, &w, "q", NULL), UVCCL_ENOTSUP,
         "queue_len: not supported");
  is_int(w.state, UVCCL_WORK_IDLE, "and the work never started");

  /* A get waiting on a key that a later operation of the same handle
   * sets: the blocked get must not hold up the set. */
  cb_calls = 0;
  is_int(uvccl_store_get(&a, &wg, "late", on_done), 0, "get of a missing key");
  uvccl_store_set(&a, &w, "late", "L", 1, NULL);
  is_int(run(&w), 0, "a set on the same handle behind it");
  is_int(run(&wg), 0, "the get completes");
  is_mem(wg.value, wg.value_len, "L", "with the value");
  is_int(cb_calls, 1, "its callback ran once");

  uvccl_work_cleanup(&w);
  uvccl_work_cleanup(&wg);
  close_store(&a);
  ok(exists(path), "world_size -1: the file stays");
  ok(FILE_HAS(path, "\x08\0\0\0cleanup/\x01\0\0\0" "1"),
     "close adds 1 to 'cleanup/', as PyTorch's destructor");
  tap_require(uvccl_file_store_init(&loop, &a, path, -1) == 0, "reopen");
  is_int(num_keys(&a), 10, "num_keys counts 'cleanup/' (as PyTorch)");
  uvccl_store_get(&a, &w, "ap", NULL);
  run(&w);
  is_mem(w.value, w.value_len, "abcd", "a new handle replays the file");
  uvccl_work_cleanup(&w);
  close_store(&a);
  unlink(path);
}

/* ---- two handles, timeouts, cancellation --------------------------------*/

static void test_handles(void) {
  uvccl_store_t a, b;
  uvccl_work_t w = {0}, wa = {0};
  const char *wk[] = {"w1", "w2"}, *mk[] = {"m1", "m2"}, *nk[] = {"never"};
  uvccl_buf_t vs[] = {{"1", 1}, {"2", 1}};
  uint64_t t0;

  note("two handles on one file");
  new_path();
  tap_require(uvccl_file_store_init(&loop, &a, path, -1) == 0, "init a");
  tap_require(uvccl_file_store_init(&loop, &b, path, -1) == 0, "init b");

  uvccl_store_get(&a, &wa, "x", NULL);
  uv_run(&loop, UV_RUN_NOWAIT);
  ok(!uvccl_work_done(&wa), "a's get waits for the key");
  uvccl_store_set(&b, &w, "x", "from-b", 6, NULL);
  is_int(run(&w), 0, "b sets it");
  is_int(run(&wa), 0, "a's get completes");
  is_mem(wa.value, wa.value_len, "from-b", "with b's value");

  uvccl_store_wait(&a, &wa, wk, 2, 5000, NULL);
  uvccl_store_set(&b, &w, "w1", "1", 1, NULL);
  run(&w);
  uv_run(&loop, UV_RUN_NOWAIT);
  ok(!uvccl_work_done(&wa), "wait needs every key");
  uvccl_store_multi_set(&b, &w, wk, vs, 2, NULL);
  run(&w);
  is_int(run(&wa), 0, "wait completes once b has set them all");

  uvccl_store_multi_get(&a, &wa, mk, 2, NULL);
  uvccl_store_set(&b, &w, "m2", "two", 3, NULL);
  run(&w);
  uvccl_store_set(&b, &w, "m1", "one", 3, NULL);
  run(&w);
  is_int(run(&wa), 0, "multi_get waits for every key");
  ok(wa.nvalues == 2 && strcmp(wa.values[0].base, "one") == 0 &&
         strcmp(wa.values[1].base, "two") == 0,
     "multi_get values from b");

  t0 = uv_now(&loop);
  uvccl_store_wait(&a, &wa, nk, 1, 100, NULL);
  is_int(run(&wa), UV_ETIMEDOUT, "wait on a key nobody sets times out");
  is_int(wa.state, UVCCL_WORK_TIMED_OUT, "state TIMED_OUT");
  ok(uv_now(&loop) - t0 >= 95, "after its timeout (%llu ms)",
     (unsigned long long)(uv_now(&loop) - t0));
  ok(strstr(wa.msg, "never") && strstr(wa.msg, path), "message: %s", wa.msg);

  uvccl_store_set_timeout(&a, 50);
  uvccl_store_get(&a, &wa, "never", NULL);
  is_int(run(&wa), UV_ETIMEDOUT, "get honours the store's timeout");
  uvccl_store_set_timeout(&a, 0);

  uvccl_store_get(&a, &wa, "never", NULL);
  uv_run(&loop, UV_RUN_NOWAIT);
  is_int(uvccl_work_cancel(&wa), 0, "cancel a waiting get");
  is_int(run(&wa), UV_ECANCELED, "it completes cancelled");
  is_int(wa.state, UVCCL_WORK_CANCELLED, "state CANCELLED");
  /* Cancelled while its job is on the thread pool: the job's result must
   * be dropped without touching the work. */
  uvccl_store_get(&a, &wa, "x", NULL);
  uvccl_work_cancel(&wa);
  is_int(run(&wa), UV_ECANCELED, "cancel right after submit");
  uvccl_work_cleanup(&wa);
  uvccl_store_set(&a, &w, "after", "ok", 2, NULL);
  is_int(run(&w), 0, "the handle still works");
  uvccl_store_get(&b, &w, "after", NULL);
  run(&w);
  is_mem(w.value, w.value_len, "ok", "and b sees it");

  cb_calls = 0;
  cb_status = 0;
  uvccl_store_get(&a, &wa, "never", on_done);
  uv_run(&loop, UV_RUN_NOWAIT);
  close_store(&a);
  is_int(cb_calls, 1, "close completes a pending get");
  is_int(cb_status, UV_ECANCELED, "with UV_ECANCELED");
  is_int(uvccl_store_get(&a, &wa, "x", NULL), UVCCL_ECLOSING,
         "a closed store refuses work");
  close_store(&b);
  uvccl_work_cleanup(&w);
  uvccl_work_cleanup(&wa);
  unlink(path);
}

/* ---- files that cannot be used ------------------------------------------- */

static void test_bad_files(void) {
  uvccl_store_t a, b;
  uvccl_work_t w = {0}, wg = {0};
  static const char corrupt[] = "\x02\0\0\0/a\x01\0\0\0x"
                                "\x02\0\0\0/b\xff\0\0\0xy";
  static const char huge[] = "\xff\xff\xff\xff/zzzz";
  static const char half[] = "\x02\0";
  char missing[96], first[64];

  note("bad and corrupt files");
  /* Closing a store on a bad file warns that its cleanup failed. */
  uvccl_log_set_level(UVCCL_LOG_ERROR);
  snprintf(missing, sizeof(missing), "/nonexistent-uvccl-dir/store");
  tap_require(uvccl_file_store_init(&loop, &a, missing, 1) == 0, "init");
  uvccl_store_set(&a, &w, "k", "v", 1, NULL);
  is_int(run(&w), UV_ENOENT, "set in a missing directory: ENOENT");
  ok(strstr(w.msg, missing) != NULL, "naming the path: %s", w.msg);
  is_int(check1(&a, "k"), 0, "check on a missing file: nothing there");
  is_int(num_keys(&a), 0, "num_keys on a missing file: 0");
  close_store(&a);
  ok(!exists(missing), "close does not create the file");

  tap_require(uvccl_file_store_init(&loop, &a, "/tmp", -1) == 0, "init dir");
  uvccl_store_set(&a, &w, "k", "v", 1, NULL);
  is_int(run(&w), UV_EISDIR, "set on a directory: EISDIR");
  uvccl_store_get(&a, &w, "k", NULL);
  is_int(run(&w), UV_EISDIR, "get on a directory: EISDIR");
  ok(strstr(w.msg, "/tmp") != NULL, "naming the path: %s", w.msg);
  close_store(&a);

  new_path();
  spit(path, corrupt, sizeof(corrupt) - 1);
  tap_require(uvccl_file_store_init(&loop, &a, path, -1) == 0, "init");
  uvccl_store_get(&a, &w, "a", NULL);
  is_int(run(&w), UVCCL_EPROTO, "a length past the end: EPROTO");
  ok(strstr(w.msg, "corrupt") && strstr(w.msg, path), "message: %s", w.msg);
  is_int(num_keys(&a), -1, "every read fails the same way");
  close_store(&a);

  spit(path, huge, sizeof(huge) - 1);
  tap_require(uvccl_file_store_init(&loop, &a, path, -1) == 0, "init");
  uvccl_store_get(&a, &w, "a", NULL);
  is_int(run(&w), UVCCL_EPROTO, "a 4 GiB length field: EPROTO, no crash");
  close_store(&a);

  spit(path, half, sizeof(half) - 1);
  tap_require(uvccl_file_store_init(&loop, &a, path, -1) == 0, "init");
  uvccl_store_check(&a, &w, NULL, 0, NULL);
  is_int(run(&w), UVCCL_EPROTO, "a truncated length field: EPROTO");
  ok(strstr(w.msg, "truncated") != NULL, "message: %s", w.msg);
  close_store(&a);
  unlink(path);

  /* A get polling a good file fails when the file turns bad. */
  new_path();
  tap_require(uvccl_file_store_init(&loop, &a, path, -1) == 0, "init");
  uvccl_store_get(&a, &wg, "z", NULL);
  uv_run(&loop, UV_RUN_NOWAIT);
  spit(path, corrupt, sizeof(corrupt) - 1);
  is_int(run(&wg), UVCCL_EPROTO, "a polling get fails on corruption");
  snprintf(first, sizeof(first), "%s", path);

  /* A removed and recreated file is a new history, not a continuation. */
  new_path();
  tap_require(uvccl_file_store_init(&loop, &b, path, -1) == 0, "init");
  uvccl_store_set(&b, &w, "a", "1111111111", 10, NULL);
  run(&w);
  uvccl_store_get(&b, &w, "a", NULL);
  run(&w);
  unlink(path);
  spit(path, "\x02\0\0\0/a\x01\0\0\0" "2", 11);
  uvccl_store_get(&b, &w, "a", NULL);
  is_int(run(&w), 0, "get after the file was replaced");
  is_mem(w.value, w.value_len, "2", "reads the new file, not a stale map");
  close_store(&a);
  close_store(&b);
  uvccl_log_set_level(UVCCL_LOG_WARN);
  uvccl_work_cleanup(&w);
  uvccl_work_cleanup(&wg);
  unlink(first);
  unlink(path);
}

/* ---- "cleanup/" and removing the file ------------------------------------ */

static void test_cleanup(void) {
  uvccl_store_t a, b;

  note("cleanup on close");
  new_path();
  tap_require(uvccl_file_store_init(&loop, &a, path, 2) == 0, "init a");
  tap_require(uvccl_file_store_init(&loop, &b, path, 2) == 0, "init b");
  is_int(uvccl_store_set_sync(&a, "k", "v", 1), 0, "set");
  close_store(&a);
  ok(exists(path), "world_size 2: the file stays after one close");
  ok(FILE_HAS(path, "\x08\0\0\0cleanup/\x01\0\0\0" "1"), "cleanup/ is 1");
  close_store(&b);
  ok(!exists(path), "the second close removes it");

  new_missing_path();
  tap_require(uvccl_file_store_init(&loop, &a, path, 1) == 0, "init");
  close_store(&a);
  ok(!exists(path), "an unused store creates no file on close");

  new_path();
  tap_require(uvccl_file_store_init(&loop, &a, path, 3) == 0, "init a");
  tap_require(uvccl_file_store_init(&loop, &b, path, 3) == 0, "init b");
  close_store(&a);
  close_store(&b);
  ok(exists(path) && FILE_HAS(path, "\x08\0\0\0cleanup/\x01\0\0\0" "2"),
     "world_size 3, two closes: the file stays, cleanup/ is 2");
  tap_require(uvccl_file_store_init(&loop, &a, path, 0) == 0, "init a");
  close_store(&a);
  ok(exists(path), "world_size 0 never removes the file");
  tap_require(uvccl_file_store_init(&loop, &a, path, 3) == 0, "init a");
  close_store(&a);
  ok(exists(path), "past world_size (count 4 != 3) it stays, as PyTorch");
  unlink(path);
}

/* ---- two processes ------------------------------------------------------- */

#define FORK_ADDS 100

static int child_main(void) {
  uv_loop_t cl;
  uvccl_store_t s;
  void *v = NULL;
  size_t len;
  const char *done = "parent/done";
  int i, bad = 0;

  alarm(30);
  uv_loop_init(&cl);
  if (uvccl_file_store_init(&cl, &s, path, -1) != 0) return 1;
  if (uvccl_store_get_sync(&s, "parent/k", &v, &len) != 0 ||
      len != 11 || memcmp(v, "from-parent", 11) != 0)
    bad |= 2;
  free(v);
  if (uvccl_store_set_sync(&s, "child/k", "from-child", 10) != 0) bad |= 4;
  for (i = 0; i < FORK_ADDS; i++)
    if (uvccl_store_add_sync(&s, "cnt", 1, NULL) != 0) bad |= 8;
  if (uvccl_store_wait_sync(&s, &done, 1, 20000) != 0) bad |= 16;
  uvccl_store_close(&s, NULL);
  uv_run(&cl, UV_RUN_DEFAULT);
  if (uv_loop_close(&cl) != 0) bad |= 32;
  /* _exit skips libuv's destructor: join its thread pool here so leak
   * checkers see a clean child. */
  uv_library_shutdown();
  return bad;
}

static void test_fork(void) {
  uvccl_store_t a;
  void *v = NULL;
  size_t len;
  int i, st = -1, adds = 0;
  pid_t pid;

  note("two processes");
  new_path();
  fflush(stdout);
  pid = fork();
  if (pid == 0) _exit(child_main());
  tap_require(pid > 0, "fork");
  tap_require(uvccl_file_store_init(&loop, &a, path, -1) == 0, "init");
  is_int(uvccl_store_set_sync(&a, "parent/k", "from-parent", 11), 0,
         "parent sets a key");
  for (i = 0; i < FORK_ADDS; i++)
    adds += uvccl_store_add_sync(&a, "cnt", 1, NULL) == 0;
  is_int(adds, FORK_ADDS, "parent adds while the child adds");
  is_int(uvccl_store_get_sync(&a, "child/k", &v, &len), 0,
         "parent gets the child's key");
  is_mem(v, len, "from-child", "with the child's value");
  free(v);
  uvccl_store_set_sync(&a, "parent/done", "1", 1);
  waitpid(pid, &st, 0);
  ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
     "the child read the parent's key and finished (status %d)", st);
  is_int(uvccl_store_get_sync(&a, "cnt", &v, &len), 0, "get the counter");
  ok(v && atoi(v) == 2 * FORK_ADDS,
     "no add was lost between the processes: %s", v ? (char *)v : "?");
  free(v);
  close_store(&a);
  unlink(path);
}

/* ---- PyTorch 1.13 FileStore ---------------------------------------------- */

#define PY_TESTS 29

/* Runs a Python script with the store path as argv[1]; returns its stdout
 * pipe (the script runs concurrently until py_end). */
static FILE *py_start(const char *code, char *script, size_t n) {
  char cmd[256];
  int fd;
  snprintf(script, n, "/tmp/uvccl-fs-py-XXXXXX");
  fd = mkstemp(script);
  if (fd < 0) return NULL;
  if (write(fd, code, strlen(code)) < 0) { /* popen fails below */ }
  close(fd);
  snprintf(cmd, sizeof(cmd), PYTHON " %s %s", script, path);
  return popen(cmd, "r");
}

/* Collects its output; returns its exit status (-1 if it did not run). */
static int py_end(FILE *f, char *script, char *out, size_t n) {
  size_t got = 0, r;
  int st;
  out[0] = '\0';
  if (f == NULL) return -1;
  while (got + 1 < n && (r = fread(out + got, 1, n - 1 - got, f)) > 0)
    got += r;
  out[got] = '\0';
  st = pclose(f);
  unlink(script);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int py(const char *code, char *out, size_t n) {
  char script[64];
  FILE *f = py_start(code, script, sizeof(script));
  return py_end(f, script, out, n);
}

#define PY_HEAD                                                              \
  "import sys, datetime\n"                                                   \
  "import torch.distributed as dist\n"

static void test_python(void) {
  uvccl_store_t a;
  uvccl_work_t w = {0};
  char out[512], script[64], pyfile[64], ourfile[64];
  char *b1, *b2;
  size_t l1, l2;
  int i, before = tap__n;
  FILE *f;
  void *v = NULL;
  size_t len;
  const char *ks[] = {"c/m1", "c/m2"};
  uvccl_buf_t vs[] = {{"one", 3}, {"two", 3}};

  note("PyTorch FileStore interop");
  if (system(PYTHON " -c 'import torch.distributed' >/dev/null 2>&1") != 0) {
    for (i = 0; i < PY_TESTS; i++) {
      ++tap__n;
      printf("ok %d # SKIP no python3-torch\n", tap__n);
    }
    return;
  }

  /* The same operations give byte-identical files. */
  new_path();
  snprintf(pyfile, sizeof(pyfile), "%s", path);
  is_int(py(PY_HEAD
            "s = dist.FileStore(sys.argv[1], -1)\n"
            "s.set('k', 'v'); s.add('n', 5); s.add('n', -7)\n"
            "s.compare_set('c', '', 'x'); s.set('d', 'gone')\n"
            "s.delete_key('d')\n",
            out, sizeof(out)),
         0, "python writes a file");
  new_path();
  snprintf(ourfile, sizeof(ourfile), "%s", path);
  tap_require(uvccl_file_store_init(&loop, &a, path, -1) == 0, "init");
  uvccl_store_set_sync(&a, "k", "v", 1);
  uvccl_store_add_sync(&a, "n", 5, NULL);
  uvccl_store_add_sync(&a, "n", -7, NULL);
  uvccl_store_compare_set(&a, &w, "c", "", 0, "x", 1, NULL);
  run(&w);
  uvccl_store_set_sync(&a, "d", "gone", 4);
  uvccl_store_delete_key(&a, &w, "d", NULL);
  run(&w);
  close_store(&a);
  b1 = slurp(pyfile, &l1);
  b2 = slurp(ourfile, &l2);
  ok(b1 && b2 && l1 == l2 && l1 > 0 && memcmp(b1, b2, l1) == 0,
     "the same operations write byte-identical files (%zu, %zu bytes)", l1,
     l2);
  free(b1);
  free(b2);
  unlink(pyfile);
  unlink(ourfile);

  /* Python writes, we read. */
  new_path();
  is_int(py(PY_HEAD
            "s = dist.FileStore(sys.argv[1], -1)\n"
            "s.set('py/a', 'hello'); s.add('py/n', 7); s.add('py/n', 3)\n"
            "s.set('py/gone', 'x'); s.delete_key('py/gone')\n"
            "print(s.num_keys())\n",
            out, sizeof(out)),
         0, "python sets, adds and deletes");
  is_str(out, "2\n", "python counts 2 keys");
  tap_require(uvccl_file_store_init(&loop, &a, path, -1) == 0, "init");
  is_int(uvccl_store_get_sync(&a, "py/a", &v, &len), 0, "we get py/a");
  is_mem(v, len, "hello", "python's value");
  free(v);
  uvccl_store_add(&a, &w, "py/n", 0, NULL);
  run(&w);
  is_int(w.result, 10, "python's adds");
  is_int(check1(&a, "py/gone"), 0, "python's delete");
  is_int(num_keys(&a), 3, "num_keys: python's 2 plus its 'cleanup/'");

  /* We write, python reads. */
  uvccl_store_set_sync(&a, "c/a", "world", 5);
  uvccl_store_add_sync(&a, "c/n", 5, NULL);
  uvccl_store_compare_set(&a, &w, "c/cs", "", 0, "made", 4, NULL);
  run(&w);
  uvccl_store_append(&a, &w, "c/ap", "ab", 2, NULL);
  run(&w);
  uvccl_store_append(&a, &w, "c/ap", "cd", 2, NULL);
  run(&w);
  uvccl_store_multi_set(&a, &w, ks, vs, 2, NULL);
  run(&w);
  uvccl_store_set_sync(&a, "py/a", "bye", 3);
  uvccl_store_delete_key(&a, &w, "py/n", NULL);
  run(&w);
  is_int(py(PY_HEAD
            "s = dist.FileStore(sys.argv[1], -1)\n"
            "s.set_timeout(datetime.timedelta(milliseconds=300))\n"
            "g = lambda k: s.get(k).decode()\n"
            "print(g('c/a'), s.add('c/n', 1), g('c/cs'), g('c/ap'),\n"
            "      g('c/m1'), g('c/m2'), g('py/a'), s.num_keys())\n"
            "try:\n"
            "  s.get('py/n'); print('visible')\n"
            "except Exception:\n"
            "  print('deleted')\n",
            out, sizeof(out)),
         0, "python reads our keys");
  /* py/a c/a c/n c/cs c/ap c/m1 c/m2 cleanup/ */
  is_str(out, "world 6 made abcd one two bye 8\ndeleted\n",
         "python sees our set, add, compare_set, append, multi_set, delete");
  uvccl_store_get(&a, &w, "c/n", NULL);
  run(&w);
  is_mem(w.value, w.value_len, "6", "and we see python's add");
  is_int(num_keys(&a), 8, "both count the same keys");

  /* Each side waits for the other. */
  f = py_start(PY_HEAD
               "s = dist.FileStore(sys.argv[1], -1)\n"
               "print(s.get('late/u').decode(), flush=True)\n"
               "s.set('late/p', 'from-py')\n",
               script, sizeof(script));
  ok(f != NULL, "python waits for a key");
  uvccl_store_set_sync(&a, "late/u", "from-uvccl", 10);
  uvccl_store_get(&a, &w, "late/p", NULL);
  is_int(run(&w), 0, "we wait for python's key");
  is_mem(w.value, w.value_len, "from-py", "with python's value");
  is_int(py_end(f, script, out, sizeof(out)), 0, "python finished");
  is_str(out, "from-uvccl\n", "python's get saw our value");
  uvccl_work_cleanup(&w);
  close_store(&a);
  unlink(path);

  /* The cleanup count is shared: the last of world_size removes it. */
  new_path();
  tap_require(uvccl_file_store_init(&loop, &a, path, 2) == 0, "init");
  is_int(py(PY_HEAD
            "s = dist.FileStore(sys.argv[1], 2)\n"
            "s.set('r', 'py')\n",
            out, sizeof(out)),
         0, "python (world_size 2) sets and exits");
  ok(exists(path), "the file stays after python's close");
  close_store(&a);
  ok(!exists(path), "our close, the second, removes it");

  new_path();
  tap_require(uvccl_file_store_init(&loop, &a, path, 2) == 0, "init");
  uvccl_store_set_sync(&a, "r", "us", 2);
  close_store(&a);
  ok(exists(path), "the file stays after our close");
  is_int(py(PY_HEAD
            "s = dist.FileStore(sys.argv[1], 2)\n"
            "print(s.get('r').decode())\n",
            out, sizeof(out)),
         0, "python (world_size 2) reads");
  is_str(out, "us\n", "our value");
  ok(!exists(path), "python's close, the second, removes it");
  unlink(path);

  if (tap__n - before != PY_TESTS)
    note("PY_TESTS is %d but %d ran", PY_TESTS, tap__n - before);
}

int main(void) {
  tap_alarm(60);
  uv_loop_init(&loop);
  test_ops();
  test_handles();
  test_bad_files();
  test_cleanup();
  test_fork();
  test_python();
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(uv_loop_close(&loop), 0, "the loop closes: nothing left behind");
  return done_testing();
}
