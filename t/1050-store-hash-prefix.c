/* The in-process hash store and the prefix store over it: every operation
 * with its values, waits across prefixes, namespacing and list_keys. */
#include "tap.h"
#include "uvccl.h"

static uv_loop_t loop;
static int closed;
static void on_closed(uvccl_store_t *s) { closed++; }
static int run(uvccl_work_t *w) { return uvccl_work_wait(w); }

int main(void) {
  uvccl_store_t h, p, pp;
  uvccl_work_t w = {0}, w2 = {0};
  const char *ks[] = {"x", "y"};
  uvccl_buf_t vs[] = {{"1", 1}, {"22", 2}};
  size_t i;
  int found;

  tap_alarm(30);
  uv_loop_init(&loop);
  tap_require(uvccl_hash_store_init(&loop, &h) == 0, "hash store");
  tap_require(uvccl_prefix_store_init(&p, "grp", &h) == 0, "prefix store");
  tap_require(uvccl_prefix_store_init(&pp, "sub", &p) == 0, "nested prefix");
  is_int(h.type, UVCCL_STORE_HASH, "type hash");
  is_int(p.type, UVCCL_STORE_PREFIX, "type prefix");

  uvccl_store_set(&p, &w, "k", "v", 1, NULL);
  is_int(run(&w), 0, "set through the prefix");
  uvccl_store_get(&h, &w, "grp/k", NULL);
  is_int(run(&w), 0, "base sees grp/k");
  is_mem(w.value, w.value_len, "v", "value under the joined key");
  uvccl_store_set(&pp, &w, "k", "deep", 4, NULL);
  run(&w);
  uvccl_store_get(&h, &w, "grp/sub/k", NULL);
  run(&w);
  is_mem(w.value, w.value_len, "deep", "nested prefixes join as c10d's");

  uvccl_store_add(&p, &w, "n", 7, NULL);
  run(&w);
  is_int(w.result, 7, "add through the prefix");
  uvccl_store_set(&h, &w, "grp/bad", "abc", 3, NULL);
  run(&w);
  uvccl_store_add(&p, &w, "bad", 1, NULL);
  is_int(run(&w), UVCCL_ENOTNUM, "add on text fails");
  ok(strstr(w.msg, "bad") != NULL, "and says which key: %s", w.msg);

  uvccl_store_compare_set(&p, &w, "c", "", 0, "new", 3, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "new", "compare_set creates");
  uvccl_store_compare_set(&p, &w, "c", "old", 3, "x", 1, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "new", "compare_set mismatch");

  uvccl_store_check(&p, &w, ks, 2, NULL);
  run(&w);
  is_int(w.result, 0, "check before multi_set");
  uvccl_store_multi_set(&p, &w, ks, vs, 2, NULL);
  run(&w);
  uvccl_store_check(&p, &w, ks, 2, NULL);
  run(&w);
  is_int(w.result, 1, "check after multi_set");
  uvccl_store_multi_get(&p, &w, ks, 2, NULL);
  run(&w);
  is_int(w.nvalues, 2, "multi_get count");
  if (w.nvalues == 2) {
    is_mem(w.values[0].base, w.values[0].len, "1", "multi_get x");
    is_mem(w.values[1].base, w.values[1].len, "22", "multi_get y");
  }
  uvccl_store_append(&p, &w, "x", "+", 1, NULL);
  run(&w);
  uvccl_store_get(&p, &w, "x", NULL);
  run(&w);
  is_mem(w.value, w.value_len, "1+", "append");

  /* A get through one prefix released by a set through the base. */
  uvccl_store_get(&pp, &w, "later", NULL);
  uvccl_store_set(&h, &w2, "grp/sub/later", "L", 1, NULL);
  is_int(run(&w), 0, "blocking get across layers");
  is_mem(w.value, w.value_len, "L", "its value");

  uvccl_store_delete_key(&p, &w, "x", NULL);
  run(&w);
  is_int(w.result, 1, "delete through the prefix");
  uvccl_store_num_keys(&h, &w, NULL);
  run(&w);
  is_int(w.result, 7, "num_keys counts every key of the base");

  uvccl_store_list_keys(&p, &w, NULL);
  is_int(run(&w), 0, "list_keys through the prefix");
  found = 0;
  for (i = 0; i < w.nvalues; i++) {
    ok(strncmp(w.values[i].base, "grp/", 4) != 0, "listed without prefix: %s",
       (char *)w.values[i].base);
    if (strcmp(w.values[i].base, "sub/k") == 0) found++;
  }
  is_int(w.nvalues, 7, "all 7 keys are under grp/");
  is_int(found, 1, "nested key listed relative to the prefix");

  uvccl_store_queue_push(&p, &w, "q", "a", 1, NULL);
  run(&w);
  uvccl_store_queue_len(&p, &w, "q", NULL);
  run(&w);
  is_int(w.result, 1, "queue through the prefix");
  uvccl_store_queue_pop(&p, &w, "q", 1, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "a", "queue_pop");

  uvccl_work_cleanup(&w);
  uvccl_work_cleanup(&w2);
  uvccl_store_close(&pp, on_closed);
  uvccl_store_close(&p, on_closed);
  uvccl_store_close(&h, on_closed);
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(closed, 3, "all closed");
  is_int(uv_loop_close(&loop), 0, "loop closes clean");
  return done_testing();
}
