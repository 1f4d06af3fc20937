/* The KV engine under the store: values, add's stoll rules, compare_set's
 * table, queues, the memory cap, PyTorch's wait bookkeeping (including
 * callbacks that re-enter), and a randomized run against a naive model. */
#include "uvccl.h"
#include "loop/internal.h" /* uvccl__free for popped items */
#include "store/kv.h"
#include "tap.h"

#include <errno.h>
#include <stddef.h>
#include <time.h>

#define S(s) (s), strlen(s)

static int set_s(uvccl__kv_t *kv, const char *k, const char *v) {
  return uvccl__kv_set(kv, S(k), S(v));
}

/* 1 if key k holds exactly v ("" counts), 0 if it differs or is missing. */
static int val_is(uvccl__kv_t *kv, const char *k, const char *v) {
  const void *p;
  size_t n;
  if (!uvccl__kv_get(kv, S(k), &p, &n)) return 0;
  return n == strlen(v) && memcmp(p, v, n) == 0;
}

static uvccl__kv_stats_t stats(uvccl__kv_t *kv) {
  uvccl__kv_stats_t st;
  uvccl__kv_stats(kv, &st);
  return st;
}

/* ---- A waiter with a wake counter and an optional hook ----------------- */

typedef struct tw_s {
  uvccl__kv_waiter_t w;
  uvccl__kv_t *kv;
  int woken;
  void (*hook)(struct tw_s *t);
  const char *next_key; /* for hooks that wait again */
  struct tw_s *other;   /* for hooks that cancel another */
} tw_t;

static tw_t *tw_of(uvccl__kv_waiter_t *w) {
  return (tw_t *)((char *)w - offsetof(tw_t, w));
}

static void tw_wake(uvccl__kv_waiter_t *w) {
  tw_t *t = tw_of(w);
  t->woken++;
  if (t->hook != NULL) t->hook(t);
}

static void tw_init(tw_t *t, uvccl__kv_t *kv) {
  memset(t, 0, sizeof(*t));
  t->kv = kv;
}

/* Starts a wait on n keys; returns wait_end's result. */
static int tw_wait(tw_t *t, int n, ...) {
  va_list ap;
  int i, r;
  uvccl__kv_wait_begin(t->kv, &t->w, tw_wake);
  va_start(ap, n);
  for (i = 0; i < n; i++) {
    const char *k = va_arg(ap, const char *);
    r = uvccl__kv_wait_add_key(t->kv, &t->w, S(k));
    if (r != 0) {
      va_end(ap);
      return r;
    }
  }
  va_end(ap);
  return uvccl__kv_wait_end(t->kv, &t->w);
}

/* ---- Basics ------------------------------------------------------------- */

static void test_basic(void) {
  uvccl__kv_t *kv = uvccl__kv_new(0);
  const void *p;
  size_t n;
  char big[1000];
  static const char k1[] = {'a', 0, 'b'}, k2[] = {'a', 0, 'c'};

  tap_require(kv != NULL, "kv_new");
  is_int(uvccl__kv_get(kv, S("nope"), &p, &n), 0, "get missing -> 0");
  is_int(set_s(kv, "a", "1"), 0, "set a=1");
  ok(val_is(kv, "a", "1"), "get a == 1");
  is_int(uvccl__kv_exists(kv, S("a")), 1, "exists a");
  is_int(uvccl__kv_exists(kv, S("b")), 0, "exists b -> 0");

  is_int(set_s(kv, "empty", ""), 0, "set empty value");
  is_int(uvccl__kv_get(kv, S("empty"), &p, &n), 1, "empty value is a value");
  is_int(n, 0, "empty value has length 0");
  is_int(uvccl__kv_exists(kv, S("empty")), 1, "empty value exists");
  is_int(set_s(kv, "", "emptykey"), 0, "set with an empty key");
  ok(val_is(kv, "", "emptykey"), "get empty key");

  is_int(uvccl__kv_set(kv, k1, 3, "x", 1), 0, "set binary key a\\0b");
  is_int(uvccl__kv_set(kv, k2, 3, "y", 1), 0, "set binary key a\\0c");
  is_int(uvccl__kv_get(kv, k1, 3, &p, &n), 1, "get a\\0b");
  is_mem(p, n, "x", "a\\0b holds x");
  is_int(uvccl__kv_get(kv, k2, 3, &p, &n), 1, "get a\\0c");
  is_mem(p, n, "y", "a\\0c holds y");
  is_int(uvccl__kv_get(kv, "a", 1, &p, &n), 1, "key 'a' is distinct");
  is_mem(p, n, "1", "a still 1");
  is_int(uvccl__kv_set(kv, "v", 1, "\0\1\0", 3), 0, "binary value");
  ok(uvccl__kv_get(kv, "v", 1, &p, &n) && n == 3 &&
         memcmp(p, "\0\1\0", 3) == 0, "binary value round-trips");

  /* Overwrites through every storage shape: inline, own block, back. */
  is_int(set_s(kv, "a", "22"), 0, "overwrite longer");
  ok(val_is(kv, "a", "22"), "a == 22");
  memset(big, 'z', sizeof(big) - 1);
  big[sizeof(big) - 1] = 0;
  is_int(set_s(kv, "a", big), 0, "overwrite with 999 bytes");
  ok(val_is(kv, "a", big), "a == 999 z");
  big[600] = 0;
  is_int(set_s(kv, "a", big), 0, "overwrite with 600 bytes");
  ok(val_is(kv, "a", big), "a == 600 z");
  is_int(set_s(kv, "a", "3"), 0, "overwrite shorter");
  ok(val_is(kv, "a", "3"), "a == 3");
  /* A value taken from the store itself (aliasing). */
  uvccl__kv_get(kv, S("a"), &p, &n);
  is_int(uvccl__kv_set(kv, S("a2"), p, n), 0, "set from a store pointer");
  ok(val_is(kv, "a2", "3"), "a2 == 3");
  uvccl__kv_get(kv, S("a"), &p, &n);
  is_int(uvccl__kv_set(kv, S("a"), p, n), 0, "set a key to its own value");
  ok(val_is(kv, "a", "3"), "a still 3");

  is_int(uvccl__kv_num_keys(kv), 7, "num_keys 7");
  is_int(stats(kv).keys, 7, "stats.keys 7");
  /* a:1+1 empty:5+0 "":0+8 a\0b:3+1 a\0c:3+1 v:1+3 a2:2+1 */
  is_int(stats(kv).memory, 2 + 5 + 8 + 4 + 4 + 4 + 3, "stats.memory");
  is_int(uvccl__kv_delete(kv, S("a")), 1, "delete a -> 1");
  is_int(uvccl__kv_delete(kv, S("a")), 0, "delete a again -> 0");
  is_int(uvccl__kv_get(kv, S("a"), &p, &n), 0, "a gone");
  is_int(uvccl__kv_exists(kv, S("a")), 0, "a does not exist");
  is_int(uvccl__kv_num_keys(kv), 6, "num_keys 6");
  is_int(stats(kv).memory, 5 + 8 + 4 + 4 + 4 + 3, "memory after delete");
  /* NULL with length 0 is a valid empty buffer everywhere. */
  {
    const void *o;
    size_t ol;
    void *it;
    ok(uvccl__kv_set(kv, S("nul0"), NULL, 0) == 0 &&
           uvccl__kv_append(kv, S("nul0"), NULL, 0) == 0 &&
           uvccl__kv_compare_set(kv, S("nul0"), NULL, 0, NULL, 0, 1, &o,
                                 &ol) == 0 &&
           ol == 0 && uvccl__kv_queue_push(kv, S("nul0"), NULL, 0) == 0 &&
           uvccl__kv_queue_pop(kv, S("nul0"), &it, &ol) == 1 && ol == 0,
       "NULL, 0 values are accepted");
    uvccl__free(it);
    uvccl__kv_delete(kv, S("nul0"));
  }
  is_int(set_s(kv, "a", "back"), 0, "set after delete");
  ok(val_is(kv, "a", "back"), "a == back");
  uvccl__kv_free(kv);
}

static void test_append(void) {
  uvccl__kv_t *kv = uvccl__kv_new(0);
  const void *p;
  size_t n;
  int i, good = 1;
  char want[64 * 20 + 1];

  is_int(uvccl__kv_append(kv, S("k"), S("ab")), 0, "append creates");
  ok(val_is(kv, "k", "ab"), "k == ab");
  is_int(uvccl__kv_append(kv, S("k"), S("cd")), 0, "append concatenates");
  ok(val_is(kv, "k", "abcd"), "k == abcd");
  is_int(uvccl__kv_append(kv, S("k"), "", 0), 0, "append nothing");
  ok(val_is(kv, "k", "abcd"), "k still abcd");
  uvccl__kv_get(kv, S("k"), &p, &n);
  is_int(uvccl__kv_append(kv, S("k"), p, n), 0, "append a value to itself");
  ok(val_is(kv, "k", "abcdabcd"), "k == abcdabcd");
  is_int(uvccl__kv_append(kv, S("e"), "", 0), 0, "append empty creates");
  is_int(uvccl__kv_get(kv, S("e"), &p, &n), 1, "e exists with empty value");
  /* Many appends: past the inline room and through several doublings. */
  want[0] = 0;
  for (i = 0; i < 64; i++) {
    char part[21];
    snprintf(part, sizeof(part), "%019d,", i);
    good &= uvccl__kv_append(kv, S("long"), S(part)) == 0;
    strcat(want, part);
    good &= val_is(kv, "long", want);
  }
  ok(good, "64 appends of 20 bytes read back right every time");
  is_int(stats(kv).memory, 1 + 8 + 1 + 4 + 64 * 20, "memory after appends");
  uvccl__kv_get(kv, S("long"), &p, &n);
  is_int(uvccl__kv_append(kv, S("long"), p, n), 0, "self-append a big value");
  ok(uvccl__kv_get(kv, S("long"), &p, &n) && n == 2 * 64 * 20 &&
         memcmp(p, want, 64 * 20) == 0 &&
         memcmp((const char *)p + 64 * 20, want, 64 * 20) == 0,
     "big self-append doubled the value");
  uvccl__kv_free(kv);
}

static void test_add(void) {
  uvccl__kv_t *kv = uvccl__kv_new(0);
  int64_t r = 0;
  uvccl__kv_stats_t before;

  is_int(uvccl__kv_add(kv, S("c"), 5, &r), 0, "add on missing");
  is_int(r, 5, "missing counts as 0");
  ok(val_is(kv, "c", "5"), "stored as decimal text '5'");
  is_int(uvccl__kv_add(kv, S("c"), 3, &r), 0, "add on existing");
  is_int(r, 8, "5 + 3 = 8");
  ok(val_is(kv, "c", "8"), "c == '8'");
  is_int(uvccl__kv_add(kv, S("c"), -10, &r), 0, "add negative");
  ok(r == -2 && val_is(kv, "c", "-2"), "8 - 10 = -2 stored as '-2'");

  set_s(kv, "j", "12abc");
  is_int(uvccl__kv_add(kv, S("j"), 1, &r), 0, "add on '12abc'");
  ok(r == 13 && val_is(kv, "j", "13"), "'12abc' + 1 = 13 (junk ignored)");
  set_s(kv, "s", " 7");
  is_int(uvccl__kv_add(kv, S("s"), 1, &r), 0, "add on ' 7'");
  is_int(r, 8, "' 7' + 1 = 8");
  set_s(kv, "s", "\t\n\v\f\r +7x");
  is_int(uvccl__kv_add(kv, S("s"), 0, &r), 0, "add on whitespace '+7x'");
  is_int(r, 7, "isspace set and '+' accepted");
  set_s(kv, "m", "-5");
  is_int(uvccl__kv_add(kv, S("m"), 2, &r), 0, "add on '-5'");
  ok(r == -3 && val_is(kv, "m", "-3"), "-5 + 2 = -3");
  set_s(kv, "h", "0x10");
  is_int(uvccl__kv_add(kv, S("h"), 1, &r), 0, "add on '0x10'");
  is_int(r, 1, "'0x10' parses as 0 (base 10)");
  set_s(kv, "mn", "-9223372036854775808");
  is_int(uvccl__kv_add(kv, S("mn"), 0, &r), 0, "add on INT64_MIN");
  ok(r == INT64_MIN && val_is(kv, "mn", "-9223372036854775808"),
     "INT64_MIN round-trips");
  set_s(kv, "mx", "9223372036854775807");
  is_int(uvccl__kv_add(kv, S("mx"), 0, &r), 0, "add on INT64_MAX");
  is_int(r, INT64_MAX, "INT64_MAX parses");

  {
    static const char *bad[] = {"abc", "", " ", "-", "+", " -x", "x12",
                                "9223372036854775808",
                                "-9223372036854775809",
                                "99999999999999999999999"};
    size_t i;
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
      set_s(kv, "bad", bad[i]);
      before = stats(kv);
      r = 4242;
      is_int(uvccl__kv_add(kv, S("bad"), 1, &r), UVCCL_ENOTNUM,
             "add on '%s' -> UVCCL_ENOTNUM", bad[i]);
      ok(val_is(kv, "bad", bad[i]) && r == 4242 &&
             stats(kv).memory == before.memory,
         "'%s' left unchanged", bad[i]);
    }
  }
  /* A NUL stops the number like it stops strtoll on c_str(). */
  uvccl__kv_set(kv, S("nul"), "4\0" "5", 3);
  is_int(uvccl__kv_add(kv, S("nul"), 1, &r), 0, "add on '4\\0' '5'");
  is_int(r, 5, "the NUL ends the digits");
  /* A key that is only a queue has no value: counts as 0. */
  uvccl__kv_queue_push(kv, S("q"), S("item"));
  is_int(uvccl__kv_add(kv, S("q"), 2, &r), 0, "add on a queue-only key");
  ok(r == 2 && val_is(kv, "q", "2") && uvccl__kv_queue_len(kv, S("q")) == 1,
     "value 2 next to the untouched queue");
  uvccl__kv_free(kv);
}

static void test_compare_set(void) {
  int wake;
  for (wake = 0; wake <= 1; wake++) {
    uvccl__kv_t *kv = uvccl__kv_new(0);
    const void *o;
    size_t ol;

    is_int(uvccl__kv_compare_set(kv, S("k"), "", 0, S("des"), wake, &o, &ol),
           0, "[wake=%d] missing, expected empty", wake);
    is_mem(o, ol, "des", "[wake=%d] replies desired", wake);
    ok(val_is(kv, "k", "des"), "[wake=%d] key created = desired", wake);

    is_int(uvccl__kv_compare_set(kv, S("m"), S("exp"), S("des"), wake, &o,
                                 &ol),
           0, "[wake=%d] missing, expected non-empty", wake);
    is_mem(o, ol, "exp", "[wake=%d] replies expected", wake);
    is_int(uvccl__kv_exists(kv, S("m")), 0, "[wake=%d] nothing stored", wake);

    is_int(uvccl__kv_compare_set(kv, S("k"), S("des"), S("new"), wake, &o,
                                 &ol),
           0, "[wake=%d] present, equal", wake);
    is_mem(o, ol, "new", "[wake=%d] replies the new value", wake);
    ok(val_is(kv, "k", "new"), "[wake=%d] replaced", wake);

    is_int(uvccl__kv_compare_set(kv, S("k"), S("nope"), S("other"), wake, &o,
                                 &ol),
           0, "[wake=%d] present, different", wake);
    is_mem(o, ol, "new", "[wake=%d] replies the current value", wake);
    ok(val_is(kv, "k", "new"), "[wake=%d] unchanged", wake);

    set_s(kv, "e", "");
    uvccl__kv_compare_set(kv, S("e"), "", 0, S("filled"), wake, &o, &ol);
    ok(val_is(kv, "e", "filled"),
       "[wake=%d] an empty value equals an empty expected", wake);
    uvccl__kv_compare_set(kv, S("e"), S("filled"), "", 0, wake, &o, &ol);
    ok(val_is(kv, "e", "") && ol == 0,
       "[wake=%d] desired may be empty (the key stays)", wake);
    is_int(stats(kv).memory, 1 + 3 + 1, "[wake=%d] memory", wake);
    uvccl__kv_free(kv);
  }
}

static int count_cb(const void *k, size_t klen, void *arg) {
  int *n = arg;
  (*n)++;
  return 0;
}

static int find_cb(const void *k, size_t klen, void *arg) {
  int *seen = arg;
  if (klen == 2 && memcmp(k, "k", 1) == 0 && ((const char *)k)[1] >= '0' &&
      ((const char *)k)[1] <= '9')
    seen[((const char *)k)[1] - '0']++;
  else
    seen[10]++;
  return 0;
}

static int stop_cb(const void *k, size_t klen, void *arg) {
  int *n = arg;
  return ++(*n) == 3 ? 77 : 0;
}

static void test_keys(void) {
  uvccl__kv_t *kv = uvccl__kv_new(0);
  int seen[11] = {0}, n = 0, i, good = 1;
  char k[16];

  for (i = 0; i < 10; i++) {
    snprintf(k, sizeof(k), "k%d", i);
    set_s(kv, k, "v");
  }
  uvccl__kv_queue_push(kv, S("queue-only"), S("x"));
  is_int(uvccl__kv_num_keys(kv), 10, "num_keys counts values only");
  is_int(uvccl__kv_foreach_key(kv, find_cb, seen), 0, "foreach returns 0");
  for (i = 0; i < 10; i++) good &= seen[i] == 1;
  ok(good && seen[10] == 0, "foreach visits each valued key once, no queue");
  is_int(uvccl__kv_foreach_key(kv, stop_cb, &n), 77, "foreach stops early");
  is_int(n, 3, "after 3 calls");
  uvccl__kv_delete(kv, S("k3"));
  n = 0;
  uvccl__kv_foreach_key(kv, count_cb, &n);
  is_int(n, 9, "foreach after a delete sees 9");
  is_int(uvccl__kv_delete(kv, S("queue-only")), 0,
         "delete of a queue-only key -> 0");
  is_int(uvccl__kv_queue_len(kv, S("queue-only")), 1, "the queue is kept");
  uvccl__kv_free(kv);
}

static void test_queues(void) {
  uvccl__kv_t *kv = uvccl__kv_new(0);
  void *item = (void *)1;
  size_t il = 99;

  is_int(uvccl__kv_queue_len(kv, S("q")), 0, "len of a missing queue is 0");
  is_int(uvccl__kv_queue_pop(kv, S("q"), &item, &il), 0, "pop missing -> 0");
  ok(item == NULL && il == 0, "pop missing gives no item");
  uvccl__kv_queue_push(kv, S("q"), S("one"));
  uvccl__kv_queue_push(kv, S("q"), S("two"));
  uvccl__kv_queue_push(kv, S("q"), "", 0);
  is_int(uvccl__kv_queue_len(kv, S("q")), 3, "len 3");
  is_int(uvccl__kv_exists(kv, S("q")), 1, "a non-empty queue exists");
  is_int(uvccl__kv_num_keys(kv), 0, "queues are not keys");
  is_int(stats(kv).queues, 1, "stats.queues 1");
  is_int(stats(kv).memory, 1 + 3 + 3, "memory counts the key once");
  is_int(uvccl__kv_queue_pop(kv, S("q"), &item, &il), 3, "pop -> len before 3");
  is_mem(item, il, "one", "FIFO: one");
  uvccl__free(item);
  is_int(uvccl__kv_queue_pop(kv, S("q"), &item, &il), 2, "pop -> 2");
  is_mem(item, il, "two", "FIFO: two");
  uvccl__free(item);
  is_int(uvccl__kv_queue_pop(kv, S("q"), &item, &il), 1, "pop -> 1");
  ok(item != NULL && il == 0, "an empty item is a freeable block");
  uvccl__free(item);
  is_int(uvccl__kv_queue_pop(kv, S("q"), &item, &il), 0, "pop empty -> 0");
  is_int(uvccl__kv_exists(kv, S("q")), 0, "an empty queue does not exist");
  uvccl__kv_stats_t st = stats(kv);
  ok(st.queues == 0 && st.memory == 0, "stats back to zero");

  /* A key may hold a value and a queue; they do not meet. */
  set_s(kv, "both", "val");
  uvccl__kv_queue_push(kv, S("both"), S("item"));
  is_int(stats(kv).memory, 4 + 3 + 4, "key counted once for value+queue");
  is_int(uvccl__kv_delete(kv, S("both")), 1, "delete the value");
  is_int(uvccl__kv_exists(kv, S("both")), 1, "still exists via its queue");
  is_int(stats(kv).memory, 4 + 4, "memory after deleting the value");
  is_int(uvccl__kv_queue_pop(kv, S("both"), &item, &il), 1, "pop it");
  is_mem(item, il, "item", "item intact");
  uvccl__free(item);
  is_int(stats(kv).memory, 0, "memory 0");
  uvccl__kv_free(kv);
}

static void test_memory_limit(void) {
  uvccl__kv_t *kv = uvccl__kv_new(20);
  uvccl__kv_stats_t st;
  const void *o;
  size_t ol;
  int64_t r;

  is_int(set_s(kv, "a", "123456789"), 0, "10 bytes in");
  is_int(stats(kv).memory, 10, "memory 10");
  st = stats(kv);
  is_int(set_s(kv, "b", "1234567890"), UVCCL_ENOMEM_STORE,
         "11 more bytes -> UVCCL_ENOMEM_STORE");
  is_int(uvccl__kv_exists(kv, S("b")), 0, "b not created");
  is_int(uvccl__kv_append(kv, S("a"), S("12345678901")), UVCCL_ENOMEM_STORE,
         "append over -> ENOMEM_STORE");
  ok(val_is(kv, "a", "123456789"), "a unchanged");
  is_int(uvccl__kv_queue_push(kv, S("q"), S("1234567890")), UVCCL_ENOMEM_STORE,
         "queue push over -> ENOMEM_STORE");
  is_int(uvccl__kv_queue_len(kv, S("q")), 0, "queue not created");
  is_int(uvccl__kv_compare_set(kv, S("c"), "", 0, S("123456789012"), 1, &o,
                               &ol),
         UVCCL_ENOMEM_STORE, "compare_set create over -> ENOMEM_STORE");
  is_int(uvccl__kv_exists(kv, S("c")), 0, "c not created");
  set_s(kv, "a", "1");
  set_s(kv, "big", "999999999999999");
  is_int(stats(kv).memory, 20, "exactly at the limit is fine");
  is_int(uvccl__kv_add(kv, S("big"), 1, &r), UVCCL_ENOMEM_STORE,
         "add that lengthens the text over the limit -> ENOMEM_STORE");
  ok(val_is(kv, "big", "999999999999999"), "big unchanged");
  is_int(uvccl__kv_add(kv, S("big"), -1, &r), 0, "add that keeps the length");
  is_int(set_s(kv, "big", "1"), 0, "shrinking write always allowed");
  st = stats(kv);
  ok(st.keys == 2 && st.queues == 0 && st.memory == 2 + 4, "stats right");
  uvccl__kv_free(kv);
}

/* ---- Waits -------------------------------------------------------------- */

static void hook_wait_again(tw_t *t) {
  if (t->woken == 1) tw_wait(t, 1, t->next_key);
}

static void hook_free(tw_t *t) { free(t); }

static void hook_cancel_other(tw_t *t) {
  uvccl__kv_wait_cancel(t->kv, &t->other->w);
}

static void hook_set_next(tw_t *t) { set_s(t->kv, t->next_key, "x"); }

static void test_waits(void) {
  uvccl__kv_t *kv = uvccl__kv_new(0);
  tw_t a, b, c;
  uvccl__kv_stats_t st;
  const void *o;
  size_t ol;

  tw_init(&a, kv);
  tw_init(&b, kv);
  tw_init(&c, kv);

  set_s(kv, "p1", "1");
  set_s(kv, "p2", "2");
  is_int(tw_wait(&a, 2, "p1", "p2"), 1, "all present -> end returns 1");
  ok(a.woken == 0 && a.w.active == 0 && stats(kv).waiters == 0,
     "not registered, not woken");

  is_int(tw_wait(&a, 2, "p1", "w1"), 0, "one missing -> registered");
  ok(a.w.active && a.w.remaining == 1, "active, 1 remaining");
  is_int(stats(kv).waiters, 1, "stats.waiters 1");
  set_s(kv, "w1", "x");
  is_int(a.woken, 1, "set wakes it");
  ok(!a.w.active && a.w.regs == NULL && stats(kv).waiters == 0,
     "idle after the wake");

  a.woken = 0;
  is_int(tw_wait(&a, 2, "w2", "w3"), 0, "two missing");
  is_int(a.w.remaining, 2, "2 remaining");
  set_s(kv, "w2", "x");
  ok(a.woken == 0 && a.w.remaining == 1, "one set: still waiting");
  uvccl__kv_append(kv, S("w2"), S("y"));
  ok(a.woken == 0 && a.w.remaining == 1,
     "a second write to the same key counts nothing");
  set_s(kv, "w3", "x");
  is_int(a.woken, 1, "both set -> woken");

  a.woken = 0;
  is_int(tw_wait(&a, 3, "d", "d", "d"), 0, "duplicate keys");
  is_int(a.w.remaining, 3, "3 registrations");
  uvccl__kv_add(kv, S("d"), 1, NULL);
  is_int(a.woken, 1, "one add releases all three");

  a.woken = 0;
  is_int(tw_wait(&a, 1, "del"), 0, "wait on del");
  is_int(uvccl__kv_delete(kv, S("del")), 0, "delete missing");
  is_int(a.woken, 0, "delete wakes nobody");
  uvccl__kv_compare_set(kv, S("del"), "", 0, S("v"), 0, &o, &ol);
  ok(a.woken == 0 && a.w.active, "compare_set without wake: still waiting");
  is_int(uvccl__kv_delete(kv, S("del")), 1, "delete the key");
  is_int(a.woken, 0, "still not woken");
  set_s(kv, "del", "v");
  is_int(a.woken, 1, "a real set wakes it");

  a.woken = 0;
  is_int(tw_wait(&a, 1, "cx"), 0, "wait on cx");
  uvccl__kv_compare_set(kv, S("cx"), S("exp"), S("des"), 1, &o, &ol);
  ok(a.woken == 0 && a.w.active,
     "compare_set(wake) that leaves the key missing wakes nobody");
  uvccl__kv_compare_set(kv, S("cx"), "", 0, S("des"), 1, &o, &ol);
  is_int(a.woken, 1, "compare_set(wake) that creates wakes");
  a.woken = 0;
  is_int(tw_wait(&a, 1, "cy"), 0, "wait on cy");
  uvccl__kv_compare_set(kv, S("cy"), "", 0, S("v"), 0, &o, &ol);
  uvccl__kv_compare_set(kv, S("cy"), S("zz"), S("w"), 1, &o, &ol);
  ok(a.woken == 1 && val_is(kv, "cy", "v"),
     "compare_set(wake) that changes nothing still wakes (libuv server)");

  a.woken = 0;
  is_int(tw_wait(&a, 2, "cn", "cn2"), 0, "wait on cn, cn2");
  uvccl__kv_wait_cancel(kv, &a.w);
  ok(!a.w.active && a.w.regs == NULL && stats(kv).waiters == 0,
     "cancelled: idle");
  set_s(kv, "cn", "x");
  set_s(kv, "cn2", "x");
  is_int(a.woken, 0, "cancel then set: no wake");
  uvccl__kv_wait_cancel(kv, &a.w);
  uvccl__kv_wait_cancel(kv, &b.w);
  ok(1, "cancel of an idle or never-used waiter is harmless");

  /* Re-begin on a registered waiter drops the old registrations. */
  is_int(tw_wait(&a, 1, "old"), 0, "wait on old");
  is_int(tw_wait(&a, 1, "new"), 0, "wait again on new without cancel");
  is_int(stats(kv).waiters, 1, "one waiter registered");
  set_s(kv, "old", "x");
  is_int(a.woken, 0, "old key no longer wakes it");
  set_s(kv, "new", "x");
  is_int(a.woken, 1, "new key does");

  /* The hash store mallocs its waiters: begin must not trust the memory. */
  {
    tw_t *g = malloc(sizeof(*g));
    memset(g, 0xa5, sizeof(*g));
    g->kv = kv;
    g->woken = 0;
    g->hook = hook_free;
    is_int(tw_wait(g, 1, "garbage"), 0, "begin on uninitialised memory");
    set_s(kv, "garbage", "x");
    is_int(stats(kv).waiters, 0, "woken; the callback freed it");
  }

  /* A callback that starts a new wait on the same waiter. */
  a.woken = 0;
  a.hook = hook_wait_again;
  a.next_key = "again2";
  is_int(tw_wait(&a, 1, "again1"), 0, "wait on again1");
  set_s(kv, "again1", "x");
  ok(a.woken == 1 && a.w.active && a.w.remaining == 1,
     "woken, and registered again from inside the callback");
  set_s(kv, "again2", "x");
  ok(a.woken == 2 && !a.w.active, "the second wait is woken too");
  a.hook = NULL;

  /* A callback that waits again on the key being written: present now. */
  a.woken = 0;
  a.hook = hook_wait_again;
  a.next_key = "same";
  is_int(tw_wait(&a, 1, "same"), 0, "wait on same");
  set_s(kv, "same", "x");
  ok(a.woken == 1 && !a.w.active, "re-wait on the written key: present");
  a.hook = NULL;

  /* A callback that cancels another waiter due the same wake. */
  a.woken = b.woken = 0;
  a.hook = hook_cancel_other;
  a.other = &b;
  tw_wait(&a, 1, "both");
  tw_wait(&b, 1, "both");
  set_s(kv, "both", "x");
  ok(a.woken == 1 && b.woken == 0 && !b.w.active,
     "a cancel from a callback keeps the other from being woken");
  is_int(stats(kv).waiters, 0, "no waiters left");
  a.hook = NULL;

  /* A callback that writes: the nested write wakes its own waiters. */
  a.woken = b.woken = 0;
  a.hook = hook_set_next;
  a.next_key = "nest2";
  tw_wait(&a, 1, "nest1");
  tw_wait(&b, 1, "nest2");
  set_s(kv, "nest1", "x");
  ok(a.woken == 1 && b.woken == 1, "nested write woke the second waiter");
  a.hook = NULL;

  /* Queue push wakes one waiter per push, oldest first. */
  a.woken = b.woken = c.woken = 0;
  is_int(tw_wait(&a, 1, "qq"), 0, "a waits on qq");
  is_int(tw_wait(&b, 1, "qq"), 0, "b waits on qq");
  uvccl__kv_queue_push(kv, S("qq"), S("1"));
  ok(a.woken == 1 && b.woken == 0, "first push wakes exactly one (a)");
  is_int(stats(kv).waiters, 1, "b still waits");
  uvccl__kv_queue_push(kv, S("qq"), S("2"));
  ok(a.woken == 1 && b.woken == 1, "second push wakes b");
  is_int(tw_wait(&c, 1, "qq"), 1, "a non-empty queue counts as present");
  {
    void *it;
    size_t il;
    uvccl__kv_queue_pop(kv, S("qq"), &it, &il);
    uvccl__free(it);
    uvccl__kv_queue_pop(kv, S("qq"), &it, &il);
    uvccl__free(it);
  }
  /* Counted-down waiters in front of the one woken come off the list. */
  a.woken = b.woken = 0;
  is_int(tw_wait(&a, 2, "qr", "other"), 0, "a waits on qr and other");
  is_int(tw_wait(&b, 1, "qr"), 0, "b waits on qr");
  uvccl__kv_queue_push(kv, S("qr"), S("1"));
  ok(a.woken == 0 && a.w.remaining == 1 && b.woken == 1,
     "push counts a down, wakes b");
  set_s(kv, "qr", "v");
  ok(a.woken == 0 && a.w.remaining == 1, "a is no longer listed under qr");
  set_s(kv, "other", "v");
  is_int(a.woken, 1, "a woken by its other key");

  /* kv_free with a waiter registered leaves it idle. */
  tw_wait(&a, 2, "never", "never2");
  st = stats(kv);
  is_int(st.waiters, 1, "one waiter at kv_free");
  uvccl__kv_free(kv);
  ok(!a.w.active && a.w.regs == NULL && a.w.remaining == 0,
     "kv_free leaves registered waiters idle and unlinked");
  /* And such a waiter is reusable on a new kv. */
  kv = uvccl__kv_new(0);
  a.kv = kv;
  a.woken = 0;
  is_int(tw_wait(&a, 1, "fresh"), 0, "reuse after kv_free");
  set_s(kv, "fresh", "x");
  is_int(a.woken, 1, "woken on the new kv");
  /* Entries made only for registrations go away with them. */
  tw_wait(&a, 3, "r1", "r2", "r3");
  uvccl__kv_wait_cancel(kv, &a.w);
  st = stats(kv);
  ok(st.waiters == 0 && st.keys == 1 && st.memory == 6 &&
         !uvccl__kv_exists(kv, S("r1")),
     "cancel leaves nothing behind");
  uvccl__kv_free(kv);
}

/* ---- Randomized run against a naive model ------------------------------ */

#define NK 50
#define NW 8
#define MAXV 400

typedef struct {
  int has;
  char v[4 * MAXV];
  size_t vlen;
  char *q[64];
  size_t ql[64];
  int qn;
  int reg[NW * 4]; /* waiter ids listed under the key, in order */
  int nreg;
} mkey_t;

static mkey_t mk[NK];
static int mrem[NW];    /* remaining per waiter; -1 idle */
static int mwoke[NW];   /* model wakes this op */
static int rwoke[NW];   /* real wakes this op */
static uint64_t mmem;
static tw_t rw[NW];

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static void rw_wake(uvccl__kv_waiter_t *w) {
  rwoke[tw_of(w) - rw]++;
}

static size_t m_keymem(int k) {
  return mk[k].has || mk[k].qn > 0 ? 3 : 0; /* keys are "kNN" */
}

static void m_wake_all(int k) {
  int i;
  for (i = 0; i < mk[k].nreg; i++)
    if (--mrem[mk[k].reg[i]] == 0) mwoke[mk[k].reg[i]]++;
  mk[k].nreg = 0;
}

static void m_wake_one(int k) {
  while (mk[k].nreg > 0) {
    int w = mk[k].reg[0];
    memmove(mk[k].reg, mk[k].reg + 1, (size_t)--mk[k].nreg * sizeof(int));
    if (--mrem[w] == 0) {
      mwoke[w]++;
      break;
    }
  }
}

static void m_cancel(int w) {
  int k, i, j;
  for (k = 0; k < NK; k++) {
    for (i = j = 0; i < mk[k].nreg; i++)
      if (mk[k].reg[i] != w) mk[k].reg[j++] = mk[k].reg[i];
    mk[k].nreg = j;
  }
  mrem[w] = -1;
}

/* std::stoll via strtoll, as the reference. */
static int m_stoll(const char *v, size_t n, int64_t *out) {
  char buf[4 * MAXV + 1], *end;
  long long x;
  memcpy(buf, v, n);
  buf[n] = 0;
  errno = 0;
  x = strtoll(buf, &end, 10);
  if (end == buf || errno == ERANGE) return -1;
  *out = x;
  return 0;
}

static void rand_val(char *v, size_t *n) {
  static const char alpha[] = "0123456789 -+x\t";
  size_t i, len;
  switch (rnd() % 4) {
  case 0: len = 0; break;
  case 1: len = rnd() % 6; break;
  case 2: len = rnd() % 40; break;
  default: len = rnd() % MAXV; break;
  }
  for (i = 0; i < len; i++)
    v[i] = rnd() % 3 ? alpha[rnd() % 10] : alpha[rnd() % (sizeof(alpha) - 1)];
  *n = len;
}

static int test_random_fail;
static unsigned long n_full, n_notnum, n_woken, n_waits;
#define RCHECK(cond, ...)                                                    \
  do {                                                                       \
    if (!(cond) && test_random_fail++ < 5) {                                 \
      note("op %d: " #cond, opn);                                            \
      note(__VA_ARGS__);                                                     \
    }                                                                        \
  } while (0)

static void test_random(void) {
  const uint64_t maxmem = 5000;
  uvccl__kv_t *kv = uvccl__kv_new(maxmem);
  int opn, i, w, k;
  char key[4], v[MAXV];
  size_t vlen;

  for (w = 0; w < NW; w++) {
    tw_init(&rw[w], kv);
    mrem[w] = -1;
  }
  for (opn = 0; opn < 100000; opn++) {
    int op = (int)(rnd() % 21), r = 0, mr = 0;
    k = (int)(rnd() % NK);
    snprintf(key, sizeof(key), "k%02d", k);
    memset(mwoke, 0, sizeof(mwoke));
    memset(rwoke, 0, sizeof(rwoke));
    rand_val(v, &vlen);

    switch (op) {
    case 0:
    case 1: { /* set */
      uint64_t nm = mmem - m_keymem(k) - (mk[k].has ? mk[k].vlen : 0) + 3 + vlen;
      r = uvccl__kv_set(kv, key, 3, v, vlen);
      if (nm > maxmem && nm > mmem) {
        mr = UVCCL_ENOMEM_STORE;
      } else {
        mr = 0;
        mmem = nm;
        memcpy(mk[k].v, v, vlen);
        mk[k].vlen = vlen;
        mk[k].has = 1;
        m_wake_all(k);
      }
      RCHECK(r == mr, "set %s: %d vs %d", key, r, mr);
      break;
    }
    case 2: { /* append */
      size_t nl = (mk[k].has ? mk[k].vlen : 0) + vlen;
      uint64_t nm = mmem - m_keymem(k) - (mk[k].has ? mk[k].vlen : 0) + 3 + nl;
      if (nl > sizeof(mk[k].v)) break;
      r = uvccl__kv_append(kv, key, 3, v, vlen);
      if (nm > maxmem && nm > mmem) {
        mr = UVCCL_ENOMEM_STORE;
      } else {
        mr = 0;
        mmem = nm;
        memcpy(mk[k].v + (mk[k].has ? mk[k].vlen : 0), v, vlen);
        mk[k].vlen = nl;
        mk[k].has = 1;
        m_wake_all(k);
      }
      RCHECK(r == mr, "append %s: %d vs %d", key, r, mr);
      break;
    }
    case 3: { /* add */
      int64_t cur = 0, got = 0, delta = (int64_t)(rnd() % 2001) - 1000;
      char buf[32];
      size_t n;
      if (mk[k].has && m_stoll(mk[k].v, mk[k].vlen, &cur) != 0) {
        mr = UVCCL_ENOTNUM;
      } else {
        uint64_t nm;
        n = (size_t)snprintf(buf, sizeof(buf), "%lld",
                             (long long)(int64_t)((uint64_t)cur + (uint64_t)delta));
        nm = mmem - m_keymem(k) - (mk[k].has ? mk[k].vlen : 0) + 3 + n;
        if (nm > maxmem && nm > mmem) {
          mr = UVCCL_ENOMEM_STORE;
        } else {
          mr = 0;
          mmem = nm;
          memcpy(mk[k].v, buf, n);
          mk[k].vlen = n;
          mk[k].has = 1;
          m_wake_all(k);
        }
      }
      r = uvccl__kv_add(kv, key, 3, delta, &got);
      RCHECK(r == mr, "add %s: %d vs %d", key, r, mr);
      if (r == 0 && mr == 0)
        RCHECK(got == (int64_t)((uint64_t)cur + (uint64_t)delta), "add value");
      break;
    }
    case 4: { /* compare_set */
      char e[4 * MAXV];
      size_t elen;
      const void *o;
      size_t ol;
      const char *mo;
      size_t mol;
      int wake = (int)(rnd() % 2), changed = 0;
      if (rnd() % 2 && mk[k].has) {
        elen = mk[k].vlen;
        memcpy(e, mk[k].v, elen);
      } else {
        rand_val(e, &elen);
      }
      mr = 0;
      if (!mk[k].has) {
        if (elen == 0) {
          uint64_t nm = mmem - m_keymem(k) + 3 + vlen;
          if (nm > maxmem && nm > mmem) mr = UVCCL_ENOMEM_STORE;
          else { mmem = nm; changed = 1; }
          mo = v;
          mol = vlen;
        } else {
          mo = e;
          mol = elen;
        }
      } else if (mk[k].vlen == elen && memcmp(mk[k].v, e, elen) == 0) {
        uint64_t nm = mmem - mk[k].vlen + vlen;
        if (nm > maxmem && nm > mmem) mr = UVCCL_ENOMEM_STORE;
        else { mmem = nm; changed = 1; }
        mo = v;
        mol = vlen;
      } else {
        mo = mk[k].v;
        mol = mk[k].vlen;
      }
      r = uvccl__kv_compare_set(kv, key, 3, e, elen, v, vlen, wake, &o, &ol);
      RCHECK(r == mr, "cas %s: %d vs %d", key, r, mr);
      if (r == 0 && mr == 0)
        RCHECK(ol == mol && memcmp(o, mo, ol) == 0, "cas %s reply", key);
      if (mr == 0) {
        if (changed) {
          memcpy(mk[k].v, v, vlen);
          mk[k].vlen = vlen;
          mk[k].has = 1;
        }
        if (wake && (mk[k].has || mk[k].qn > 0)) m_wake_all(k);
      }
      break;
    }
    case 15:
    case 17:
    case 18:
    case 5: { /* delete */
      mr = mk[k].has;
      r = uvccl__kv_delete(kv, key, 3);
      if (mk[k].has) {
        mmem -= m_keymem(k) + mk[k].vlen;
        mk[k].has = 0;
        mmem += m_keymem(k);
      }
      RCHECK(r == mr, "delete %s: %d vs %d", key, r, mr);
      break;
    }
    case 6: { /* get + exists */
      const void *p = NULL;
      size_t n = 0;
      r = uvccl__kv_get(kv, key, 3, &p, &n);
      RCHECK(r == mk[k].has, "get %s", key);
      if (r && mk[k].has)
        RCHECK(n == mk[k].vlen && memcmp(p, mk[k].v, n) == 0, "get %s value",
               key);
      RCHECK(uvccl__kv_exists(kv, key, 3) == (mk[k].has || mk[k].qn > 0),
             "exists %s", key);
      break;
    }
    case 7:
    case 8: { /* queue push */
      uint64_t nm = mmem - m_keymem(k) + 3 + vlen;
      if (mk[k].qn == 64) break;
      r = uvccl__kv_queue_push(kv, key, 3, v, vlen);
      if (nm > maxmem && nm > mmem) {
        mr = UVCCL_ENOMEM_STORE;
      } else {
        mr = 0;
        mmem = nm;
        mk[k].q[mk[k].qn] = malloc(vlen + 1);
        memcpy(mk[k].q[mk[k].qn], v, vlen);
        mk[k].ql[mk[k].qn++] = vlen;
        m_wake_one(k);
      }
      RCHECK(r == mr, "push %s: %d vs %d", key, r, mr);
      break;
    }
    case 9:
    case 16:
    case 19:
    case 20: { /* queue pop / len */
      void *it = NULL;
      size_t il = 0;
      int64_t before = uvccl__kv_queue_pop(kv, key, 3, &it, &il);
      RCHECK(before == mk[k].qn, "pop %s: %lld vs %d", key, (long long)before,
             mk[k].qn);
      if (mk[k].qn > 0) {
        if (before > 0)
          RCHECK(il == mk[k].ql[0] && memcmp(it, mk[k].q[0], il) == 0,
                 "pop %s item", key);
        mmem -= m_keymem(k) + mk[k].ql[0];
        free(mk[k].q[0]);
        memmove(mk[k].q, mk[k].q + 1, (size_t)(mk[k].qn - 1) * sizeof(char *));
        memmove(mk[k].ql, mk[k].ql + 1, (size_t)(mk[k].qn - 1) * sizeof(size_t));
        mk[k].qn--;
        mmem += m_keymem(k);
      }
      uvccl__free(it);
      RCHECK(uvccl__kv_queue_len(kv, key, 3) == mk[k].qn, "len %s", key);
      break;
    }
    case 10:
    case 11:
    case 14: { /* wait on 1-3 keys */
      int nk = 1 + (int)(rnd() % 3), ks[3], j, missing = 0;
      w = (int)(rnd() % NW);
      if (mrem[w] >= 0) m_cancel(w);
      for (j = 0; j < nk; j++) ks[j] = (int)(rnd() % NK);
      uvccl__kv_wait_begin(kv, &rw[w].w, rw_wake);
      for (j = 0; j < nk; j++) {
        char kk[4];
        snprintf(kk, sizeof(kk), "k%02d", ks[j]);
        uvccl__kv_wait_add_key(kv, &rw[w].w, kk, 3);
        if (!(mk[ks[j]].has || mk[ks[j]].qn > 0)) {
          mk[ks[j]].reg[mk[ks[j]].nreg++] = w;
          missing++;
        }
      }
      r = uvccl__kv_wait_end(kv, &rw[w].w);
      n_waits += r == 0;
      mrem[w] = missing ? missing : -1;
      RCHECK(r == (missing ? 0 : 1), "wait end: %d, missing %d", r, missing);
      break;
    }
    case 12: /* cancel */
      w = (int)(rnd() % NW);
      uvccl__kv_wait_cancel(kv, &rw[w].w);
      if (mrem[w] >= 0) m_cancel(w);
      break;
    default: { /* consistency sweep */
      uvccl__kv_stats_t st = stats(kv);
      uint64_t keys = 0, queues = 0, nwait = 0;
      int n = 0;
      for (i = 0; i < NK; i++) {
        keys += mk[i].has;
        queues += mk[i].qn > 0;
      }
      for (w = 0; w < NW; w++) nwait += mrem[w] > 0;
      RCHECK(st.keys == keys && st.queues == queues && st.memory == mmem &&
                 st.waiters == nwait,
             "stats keys %llu/%llu queues %llu/%llu mem %llu/%llu "
             "waiters %llu/%llu",
             (unsigned long long)st.keys, (unsigned long long)keys,
             (unsigned long long)st.queues, (unsigned long long)queues,
             (unsigned long long)st.memory, (unsigned long long)mmem,
             (unsigned long long)st.waiters, (unsigned long long)nwait);
      uvccl__kv_foreach_key(kv, count_cb, &n);
      RCHECK((uint64_t)n == keys && uvccl__kv_num_keys(kv) == keys,
             "foreach %d", n);
      break;
    }
    }
    if (r == UVCCL_ENOMEM_STORE) n_full++;
    if (r == UVCCL_ENOTNUM) n_notnum++;
    /* Woken waiters: the same ones, once each. */
    for (w = 0; w < NW; w++) {
      n_woken += (unsigned long)rwoke[w];
      if (mwoke[w]) mrem[w] = -1;
      RCHECK(mwoke[w] == rwoke[w], "op %d waiter %d woken %d vs %d", op, w,
             rwoke[w], mwoke[w]);
      RCHECK((mrem[w] > 0) == (rw[w].w.active != 0) &&
                 (mrem[w] <= 0 || (size_t)mrem[w] == rw[w].w.remaining),
             "waiter %d state", w);
    }
  }
  is_int(test_random_fail, 0, "100k random ops agree with the model");
  {
    uvccl__kv_stats_t st = stats(kv);
    note("random run: %lu over the cap, %lu not numbers, %lu waits "
         "registered, %lu wakes; ended with %llu keys, %llu queues, "
         "%llu bytes, %llu waiters",
         n_full, n_notnum, n_waits, n_woken, (unsigned long long)st.keys,
         (unsigned long long)st.queues, (unsigned long long)st.memory,
         (unsigned long long)st.waiters);
  }
  uvccl__kv_free(kv);
  for (k = 0; k < NK; k++)
    for (i = 0; i < mk[k].qn; i++) free(mk[k].q[i]);
}

/* ---- Speed (a note, not an assertion) ---------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void test_speed(void) {
  uvccl__kv_t *kv = uvccl__kv_new(0);
  enum { NKEYS = 10000, NOPS = 1000000 };
  static char keys[NKEYS][16];
  static size_t klens[NKEYS];
  int i, good = 1;
  double t0, t1;
  const void *p;
  size_t n;

  for (i = 0; i < NKEYS; i++)
    klens[i] = (size_t)snprintf(keys[i], sizeof(keys[i]), "rank/%d", i);
  t0 = now_s();
  for (i = 0; i < NOPS; i++) {
    unsigned j = (unsigned)i * 7919u % NKEYS;
    good &= uvccl__kv_set(kv, keys[j], klens[j], "value-12", 8) == 0;
    good &= uvccl__kv_get(kv, keys[j], klens[j], &p, &n) == 1 && n == 8;
  }
  t1 = now_s();
  ok(good, "1M set+get on 10k keys all succeeded");
  note("speed: 1M set + 1M get on 10k keys in %.3f s = %.1f M ops/s", t1 - t0,
       2.0 * NOPS / (t1 - t0) / 1e6);
  uvccl__kv_free(kv);
}

int main(void) {
  tap_alarm(60);
  test_basic();
  test_append();
  test_add();
  test_compare_set();
  test_keys();
  test_queues();
  test_memory_limit();
  test_waits();
  test_random();
  test_speed();
  return done_testing();
}
