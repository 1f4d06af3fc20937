// The Node.js addon's shared parts: the per-environment state, the
// operation that a Promise stands for, buffers and dtypes, errors.
//
// uvccl runs on Node's own loop (napi_get_uv_event_loop): every uvccl
// callback runs on the thread that runs JavaScript, and settles the
// Promise of the call that started the operation there, inside a callback
// scope, so that the awaiting code continues at once (the microtask queue
// drains when the scope closes), as it does after Node's own I/O.
#ifndef UVCCL_NODE_ADDON_H
#define UVCCL_NODE_ADDON_H

#include <napi.h>
#include <uv.h>

#include <memory>
#include <string>
#include <vector>

#include "uvccl.h"

namespace uvccl_node {

struct Box;

// One per Node environment (the main thread, each worker thread). It
// outlives the environment while uvccl still holds memory of the addon's
// (boxes, operations): when a worker thread ends, Node tears its
// environment down and then runs its loop once more, and uvccl's close
// and completion callbacks arriving then must find it, and must not call
// into JavaScript (`gone`).
struct Addon {
  uv_loop_t *loop = nullptr;
  Napi::FunctionReference error_factory; // (code, message, failure) -> Error
  Napi::FunctionReference group_ctor, store_ctor, server_ctor;
  std::unique_ptr<Napi::AsyncContext> context; // settles run in its scope
  bool gone = false;  // the environment is being torn down: no N-API
  int refs = 1;       // the environment's, each box's, each operation's
  std::vector<Box *> boxes; // every group, store and server of this env
  napi_async_cleanup_hook_handle hook = nullptr;
  int hook_closing = 0; // closes the cleanup hook started, not yet done

  void ref() { refs++; }
  void unref() {
    if (--refs == 0) delete this;
  }
};

Addon *addon_of(Napi::Env env);

// What a group, store or server keeps beside uvccl's object (which comes
// first in each, for the close callbacks' casts): memory that outlives its
// JS object until uvccl's close callback. `live` once uvccl's object was
// made; `closing` once its close began.
struct Box {
  Addon *addon;
  napi_env env;
  bool live = false, closing = false;
  Napi::Promise::Deferred *closed = nullptr; // close()'s, if any
  void *owner = nullptr; // the wrapper whose box this is (it forgets it at
                         // teardown)
  explicit Box(Napi::Env e);
  virtual ~Box();
  virtual void Close() = 0; // starts uvccl's close
  // At teardown, before Close: a group aborts (this rank is leaving).
  virtual void Leave() {}
  // The wrapper has gone: it no longer points here.
  virtual void Orphan() {}
};

// What a completed operation resolves its Promise with.
enum Result {
  RES_NONE,     // undefined
  RES_VALUE,    // a Buffer of work->value
  RES_RESULT,   // work->result as a number
  RES_BOOL,     // work->result != 0
  RES_VALUES,   // an Array of Buffers of work->values, or null
  RES_KEYS,     // an Array of the strings in work->values
  RES_RECV,     // {source, length}
  RES_BATCH,    // per p2p op: null (send) or {source, length} (receive)
  RES_GROUP,    // the group made (Op::made)
  RES_HELD,     // a held buffer (Op::value_at: the output), or null
};

class Group;

// One operation in flight: a Promise, the JS objects it keeps alive (its
// group or store, its buffers), the memory its arguments point into.
struct Op {
  uvccl_work_t work{};
  napi_env env;
  Napi::Promise::Deferred deferred;
  Napi::ObjectReference owner;                  // a store or server
  std::vector<Napi::Reference<Napi::Value>> held; // buffers, pinned
  int value_at = -1;                            // RES_HELD's: held[value_at]
  Group *group = nullptr;                       // the owner, where a group
  Napi::ObjectReference made;                   // RES_GROUP's wrapper
  Group *made_group = nullptr;
  Result result;
  std::vector<size_t> counts;
  std::vector<void *> ptrs;
  std::vector<uvccl_buf_t> bufs;
  std::vector<int> ranks;
  std::vector<uvccl_p2p_op_t> p2p;
  std::vector<std::string> keys;
  std::vector<const char *> key_ptrs;

  Addon *addon;

  Op(Napi::Env e, Napi::Object own, Result r);
  explicit Op(Napi::Env e, Group *g, Result r); // g held until the op's end
  ~Op();
  // At teardown: its references are let go without N-API.
  void Abandon();
};

// The uvccl_pg_t of the owner, for the failure an error carries.
typedef const uvccl_pg_t *(*pg_of_fn)(Op *op);

void op_done(uvccl_work_t *w, int status);
// After the call that starts op: on rc < 0 the Promise rejects (with the
// work's message) and op is freed; the Promise is returned either way.
Napi::Value started(Op *op, int rc, const char *name);
// The Promise of a call that failed before it started anything; with an
// op, the op's own Promise (the op is freed).
Napi::Value rejected(Napi::Env env, const Napi::Error &e);
Napi::Value rejected(Op *op, const Napi::Error &e);

// Settles a Deferred from a uv callback, in a callback scope.
void settle(Napi::Env env, Napi::Promise::Deferred &d, int status,
            const char *msg, Napi::Value value, const uvccl_pg_t *pg);

Napi::Value make_error(Napi::Env env, int status, const char *msg,
                       const uvccl_pg_t *pg);
[[noreturn]] void throw_status(Napi::Env env, int status, const char *op,
                               const char *msg, const uvccl_pg_t *pg);
Napi::Value failure_of(Napi::Env env, const uvccl_pg_t *pg);

// A buffer held by an operation: its bytes and the dtype its type names.
struct View {
  void *data = nullptr;
  size_t len = 0;
  int dtype = -1; // uvccl_dtype_t, or -1 where the type names none
  const char *type = "ArrayBuffer";
};

// Holds v (a TypedArray, DataView, ArrayBuffer or Buffer) in op.
View hold(Op *op, Napi::Value v, const char *opname, const char *what);
// The dtype of a held view: dtname's if given, else its type's; `moving`
// (no reduction) takes an unknown type as bytes. Returns the count.
size_t dtype_of(Napi::Env env, const View &v, const std::string &dtname,
                bool moving, const char *opname, uvccl_dtype_t *dt);
uvccl_redop_t redop_of(Napi::Env env, Napi::Value v, const char *opname);
uint64_t timeout_of(Napi::Value v); // ms; undefined/0: the default
std::string str_or(Napi::Value v, const char *dflt);

// A close callback's end (groups, stores, servers): the box is freed
// and the Promise of the close call, if any, settles, in a callback scope
// (none at teardown).
void close_done(Box *box);
// Starts closing a live box (once).
void close_box(Box *box);

void init_group(Napi::Env env, Napi::Object exports);
void init_store(Napi::Env env, Napi::Object exports);

} // namespace uvccl_node

#endif
