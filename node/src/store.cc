// Stores: a TCPStore client (PyTorch's wire protocol), a HashStore in the
// process, and a TCPStore server, each on Node's loop.
#include "store.h"

namespace uvccl_node {

static void store_closed(uvccl_store_t *st) { close_done(static_cast<Box *>(st->data)); }

static void server_closed(uvccl_store_server_t *sv) {
  close_done(static_cast<Box *>(sv->data));
}

void StoreBox::Close() { uvccl_store_close(&store, store_closed); }
void StoreBox::Orphan() { static_cast<Store *>(owner)->box = nullptr; }
void ServerBox::Close() { uvccl_store_server_close(&server, server_closed); }
void ServerBox::Orphan() { static_cast<Server *>(owner)->box = nullptr; }

// close(): the Promise settles in the close callback, at once where there
// is nothing left to close.
template <typename B> static Napi::Value close_wrapper(Napi::Env env, B **slot) {
  Napi::Promise::Deferred d = Napi::Promise::Deferred::New(env);
  B *box = *slot;
  if (box == nullptr) {
    d.Resolve(env.Undefined());
    return d.Promise();
  }
  *slot = nullptr;
  box->owner = nullptr;
  box->closed = new Napi::Promise::Deferred(d);
  close_box(box);
  return d.Promise();
}

// A collected wrapper closes what it had.
template <typename B> static void wrapper_gone(B *box) {
  if (box == nullptr) return;
  box->owner = nullptr;
  close_box(box);
}

// ---- Store -----------------------------------------------------------------

enum KeyOps { KEY_GET, KEY_ADD, KEY_DELETE, KEY_QUEUE_LEN, KEY_QUEUE_POP };
enum KeyValueOps { KV_SET, KV_APPEND, KV_QUEUE_PUSH };
enum KeysOps { KEYS_WAIT, KEYS_CHECK };

Napi::Function Store::Define(Napi::Env env) {
  return DefineClass(
      env, "CoreStore",
      {InstanceMethod("connect", &Store::Connect),
       InstanceMethod("set", &Store::Set, napi_default, reinterpret_cast<void *>(KV_SET)),
       InstanceMethod("append", &Store::Set, napi_default, reinterpret_cast<void *>(KV_APPEND)),
       InstanceMethod("queuePush", &Store::Set, napi_default,
                      reinterpret_cast<void *>(KV_QUEUE_PUSH)),
       InstanceMethod("queueLen", &Store::KeyOp, napi_default,
                      reinterpret_cast<void *>(KEY_QUEUE_LEN)),
       InstanceMethod("queuePop", &Store::KeyOp, napi_default,
                      reinterpret_cast<void *>(KEY_QUEUE_POP)),
       InstanceMethod("multiGet", &Store::MultiGet),
       InstanceMethod("multiSet", &Store::MultiSet),
       InstanceMethod("listKeys", &Store::ListKeys),
       InstanceMethod("get", &Store::KeyOp, napi_default, reinterpret_cast<void *>(KEY_GET)),
       InstanceMethod("add", &Store::KeyOp, napi_default, reinterpret_cast<void *>(KEY_ADD)),
       InstanceMethod("deleteKey", &Store::KeyOp, napi_default,
                      reinterpret_cast<void *>(KEY_DELETE)),
       InstanceMethod("numKeys", &Store::NumKeys),
       InstanceMethod("compareSet", &Store::CompareSet),
       InstanceMethod("wait", &Store::KeysOp, napi_default, reinterpret_cast<void *>(KEYS_WAIT)),
       InstanceMethod("check", &Store::KeysOp, napi_default,
                      reinterpret_cast<void *>(KEYS_CHECK)),
       InstanceMethod("setTimeout", &Store::SetTimeout),
       InstanceMethod("close", &Store::Close)});
}

// new CoreStore("tcp", host, port, timeoutMs, worldSize) or
// new CoreStore("hash")
Store::Store(const Napi::CallbackInfo &info) : Napi::ObjectWrap<Store>(info) {
  Napi::Env env = info.Env();
  std::string kind = str_or(info[0], "");
  std::unique_ptr<StoreBox> b(new StoreBox(env));
  int rc;
  if (kind == "tcp") {
    if (!info[1].IsString() || !info[2].IsNumber())
      throw Napi::TypeError::New(env, "TCPStore: a host (string) and a port");
    uvccl_tcp_store_options_t o{};
    b->host = info[1].As<Napi::String>().Utf8Value();
    o.host = b->host.c_str();
    o.port = info[2].As<Napi::Number>().Int32Value();
    o.timeout_ms = timeout_of(info[3]);
    o.world_size = info[4].IsNumber() ? info[4].As<Napi::Number>().Int32Value() : 0;
    rc = uvccl_tcp_store_init(addon_of(env)->loop, &b->store, &o);
  } else if (kind == "hash") {
    rc = uvccl_hash_store_init(addon_of(env)->loop, &b->store);
  } else {
    throw Napi::TypeError::New(env, "CoreStore: \"tcp\" or \"hash\"");
  }
  if (rc < 0) throw_status(env, rc, kind == "tcp" ? "TCPStore" : "HashStore",
                           nullptr, nullptr);
  b->store.data = static_cast<Box *>(b.get());
  b->live = true;
  b->owner = this;
  box = b.release();
}

Store::~Store() { wrapper_gone(box); }

uvccl_store_t *Store::Open(Napi::Env env, const char *opname) {
  if (box == nullptr) throw_status(env, UVCCL_ECLOSING, opname, "the store is closed",
                                   nullptr);
  return &box->store;
}

// Runs body, which starts an operation or throws: a throw rejects.
template <typename F> static Napi::Value guarded(Napi::Env env, F body) {
  try {
    return body();
  } catch (const Napi::Error &e) {
    return rejected(env, e);
  }
}

// A key or value: a string (UTF-8) or bytes.
static std::string bytes_of(Napi::Env env, Napi::Value v, const char *opname,
                            const char *what) {
  if (v.IsString()) return v.As<Napi::String>().Utf8Value();
  if (v.IsTypedArray()) {
    Napi::TypedArray ta = v.As<Napi::TypedArray>();
    const char *p = static_cast<const char *>(ta.ArrayBuffer().Data()) + ta.ByteOffset();
    return std::string(p, ta.ByteLength());
  }
  if (v.IsArrayBuffer()) {
    Napi::ArrayBuffer ab = v.As<Napi::ArrayBuffer>();
    return std::string(static_cast<const char *>(ab.Data()), ab.ByteLength());
  }
  throw Napi::TypeError::New(env, std::string(opname) + ": " + what +
                                      " must be a string, Buffer or TypedArray");
}

static std::string key_of(Napi::Env env, Napi::Value v, const char *opname) {
  if (!v.IsString())
    throw Napi::TypeError::New(env, std::string(opname) + ": the key must be a string");
  return v.As<Napi::String>().Utf8Value();
}

Napi::Value Store::Connect(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    uvccl_store_t *st = Open(env, "store.connect");
    Op *op = new Op(env, Value(), RES_NONE);
    if (st->type != UVCCL_STORE_TCP) {
      Napi::Promise p = op->deferred.Promise();
      op->deferred.Resolve(env.Undefined());
      delete op;
      return p;
    }
    return started(op, uvccl_tcp_store_connect(st, &op->work, op_done), "store.connect");
  });
}

// set, append and queuePush (key, value)
Napi::Value Store::Set(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  KeyValueOps which = static_cast<KeyValueOps>(reinterpret_cast<intptr_t>(info.Data()));
  static const char *const names[] = {"store.set", "store.append", "store.queuePush"};
  const char *name = names[which];
  return guarded(env, [&]() -> Napi::Value {
    uvccl_store_t *st = Open(env, name);
    std::string key = key_of(env, info[0], name);
    std::string v = bytes_of(env, info[1], name, "the value");
    Op *op = new Op(env, Value(), RES_NONE);
    op->keys = {key, v}; // kept until completion
    const char *k = op->keys[0].c_str();
    const std::string &val = op->keys[1];
    int rc;
    switch (which) {
    case KV_SET: rc = uvccl_store_set(st, &op->work, k, val.data(), val.size(), op_done); break;
    case KV_APPEND:
      rc = uvccl_store_append(st, &op->work, k, val.data(), val.size(), op_done);
      break;
    default: rc = uvccl_store_queue_push(st, &op->work, k, val.data(), val.size(), op_done);
    }
    return started(op, rc, name);
  });
}

// The keys of an array, into op (the pointers beside the strings).
static void keys_into(Napi::Env env, Op *op, Napi::Value v, const char *name) {
  if (!v.IsArray())
    throw Napi::TypeError::New(env, std::string(name) + ": an array of keys");
  Napi::Array a = v.As<Napi::Array>();
  for (uint32_t i = 0; i < a.Length(); i++) op->keys.push_back(key_of(env, a.Get(i), name));
  for (auto &k : op->keys) op->key_ptrs.push_back(k.c_str());
}

// multiGet(keys) -> [Buffer]: waits for every key
Napi::Value Store::MultiGet(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  std::unique_ptr<Op> op;
  return guarded(env, [&]() -> Napi::Value {
    uvccl_store_t *st = Open(env, "store.multiGet");
    op.reset(new Op(env, Value(), RES_VALUES));
    keys_into(env, op.get(), info[0], "store.multiGet");
    Op *o = op.release();
    return started(o, uvccl_store_multi_get(st, &o->work, o->key_ptrs.data(),
                                            o->key_ptrs.size(), op_done),
                   "store.multiGet");
  });
}

// multiSet(keys, values)
Napi::Value Store::MultiSet(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  std::unique_ptr<Op> op;
  return guarded(env, [&]() -> Napi::Value {
    uvccl_store_t *st = Open(env, "store.multiSet");
    op.reset(new Op(env, Value(), RES_NONE));
    keys_into(env, op.get(), info[0], "store.multiSet");
    if (!info[1].IsArray() || info[1].As<Napi::Array>().Length() != op->keys.size())
      throw Napi::TypeError::New(env, "store.multiSet: an array of values, one a key");
    Napi::Array vals = info[1].As<Napi::Array>();
    std::vector<std::string> held;
    for (uint32_t i = 0; i < vals.Length(); i++)
      held.push_back(bytes_of(env, vals.Get(i), "store.multiSet", "each value"));
    size_t n = op->keys.size();
    op->keys.insert(op->keys.end(), held.begin(), held.end()); // values after keys
    op->key_ptrs.clear();
    for (size_t i = 0; i < n; i++) op->key_ptrs.push_back(op->keys[i].c_str());
    for (size_t i = 0; i < n; i++)
      op->bufs.push_back(uvccl_buf_t{&op->keys[n + i][0], op->keys[n + i].size()});
    Op *o = op.release();
    return started(o, uvccl_store_multi_set(st, &o->work, o->key_ptrs.data(), o->bufs.data(),
                                            n, op_done),
                   "store.multiSet");
  });
}

// listKeys() -> [string]
Napi::Value Store::ListKeys(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    uvccl_store_t *st = Open(env, "store.listKeys");
    Op *op = new Op(env, Value(), RES_KEYS);
    return started(op, uvccl_store_list_keys(st, &op->work, op_done), "store.listKeys");
  });
}

Napi::Value Store::KeyOp(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  KeyOps which = static_cast<KeyOps>(reinterpret_cast<intptr_t>(info.Data()));
  static const char *const names[] = {"store.get", "store.add", "store.deleteKey",
                                      "store.queueLen", "store.queuePop"};
  static const Result results[] = {RES_VALUE, RES_RESULT, RES_BOOL, RES_RESULT, RES_VALUE};
  const char *name = names[which];
  return guarded(env, [&]() -> Napi::Value {
    uvccl_store_t *st = Open(env, name);
    std::string key = key_of(env, info[0], name);
    int64_t delta = 1;
    if (which == KEY_ADD && !info[1].IsUndefined()) {
      if (!info[1].IsNumber())
        throw Napi::TypeError::New(env, "store.add: the amount must be a number");
      delta = info[1].As<Napi::Number>().Int64Value();
    }
    Op *op = new Op(env, Value(), results[which]);
    int rc;
    switch (which) {
    case KEY_GET: rc = uvccl_store_get(st, &op->work, key.c_str(), op_done); break;
    case KEY_ADD: rc = uvccl_store_add(st, &op->work, key.c_str(), delta, op_done); break;
    case KEY_QUEUE_LEN: rc = uvccl_store_queue_len(st, &op->work, key.c_str(), op_done); break;
    case KEY_QUEUE_POP: // info[1]: wait for an item (up to the store's timeout)
      rc = uvccl_store_queue_pop(st, &op->work, key.c_str(), info[1].ToBoolean(), op_done);
      break;
    default: rc = uvccl_store_delete_key(st, &op->work, key.c_str(), op_done);
    }
    return started(op, rc, name);
  });
}

Napi::Value Store::NumKeys(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    uvccl_store_t *st = Open(env, "store.numKeys");
    Op *op = new Op(env, Value(), RES_RESULT);
    return started(op, uvccl_store_num_keys(st, &op->work, op_done), "store.numKeys");
  });
}

Napi::Value Store::CompareSet(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    uvccl_store_t *st = Open(env, "store.compareSet");
    std::string key = key_of(env, info[0], "store.compareSet");
    std::string e = bytes_of(env, info[1], "store.compareSet", "the expected value");
    std::string d = bytes_of(env, info[2], "store.compareSet", "the desired value");
    Op *op = new Op(env, Value(), RES_VALUE);
    return started(op, uvccl_store_compare_set(st, &op->work, key.c_str(), e.data(),
                                               e.size(), d.data(), d.size(), op_done),
                   "store.compareSet");
  });
}

// wait(keys, timeoutMs) and check(keys) -> boolean; the keys live in the op
Napi::Value Store::KeysOp(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  bool check = reinterpret_cast<intptr_t>(info.Data()) == KEYS_CHECK;
  const char *name = check ? "store.check" : "store.wait";
  return guarded(env, [&]() -> Napi::Value {
    uvccl_store_t *st = Open(env, name);
    if (!info[0].IsArray())
      throw Napi::TypeError::New(env, std::string(name) + ": an array of keys");
    Napi::Array a = info[0].As<Napi::Array>();
    std::vector<std::string> keys;
    for (uint32_t i = 0; i < a.Length(); i++) keys.push_back(key_of(env, a.Get(i), name));
    uint64_t to = timeout_of(info[1]);
    Op *o = new Op(env, Value(), check ? RES_BOOL : RES_NONE);
    o->keys = std::move(keys);
    for (auto &k : o->keys) o->key_ptrs.push_back(k.c_str());
    int rc = check ? uvccl_store_check(st, &o->work, o->key_ptrs.data(),
                                       o->key_ptrs.size(), op_done)
                   : uvccl_store_wait(st, &o->work, o->key_ptrs.data(),
                                      o->key_ptrs.size(),
                                      to > 0 ? to : UVCCL_DEFAULT_TIMEOUT, op_done);
    return started(o, rc, name);
  });
}

Napi::Value Store::SetTimeout(const Napi::CallbackInfo &info) {
  uvccl_store_set_timeout(Open(info.Env(), "store.setTimeout"), timeout_of(info[0]));
  return info.Env().Undefined();
}

Napi::Value Store::Close(const Napi::CallbackInfo &info) {
  return close_wrapper(info.Env(), &box);
}

// ---- Server ----------------------------------------------------------------

Napi::Function Server::Define(Napi::Env env) {
  return DefineClass(env, "CoreServer",
                     {InstanceAccessor("port", &Server::GetPort, nullptr),
                      InstanceMethod("close", &Server::Close)});
}

// new CoreServer(host or null, port): serving when constructed
Server::Server(const Napi::CallbackInfo &info) : Napi::ObjectWrap<Server>(info) {
  Napi::Env env = info.Env();
  std::unique_ptr<ServerBox> b(new ServerBox(env));
  std::string host = str_or(info[0], "");
  uvccl_store_server_options_t o{};
  o.host = host.empty() ? nullptr : host.c_str();
  o.port = info[1].IsNumber() ? info[1].As<Napi::Number>().Int32Value() : 0;
  o.listen_fd = -1;
  int rc = uvccl_store_server_init(addon_of(env)->loop, &b->server, &o);
  if (rc < 0) throw_status(env, rc, "StoreServer", nullptr, nullptr);
  b->server.data = static_cast<Box *>(b.get());
  b->live = true;
  b->owner = this;
  box = b.release();
}

Server::~Server() { wrapper_gone(box); }

Napi::Value Server::GetPort(const Napi::CallbackInfo &info) {
  return Napi::Number::New(info.Env(), box ? box->server.port : -1);
}

Napi::Value Server::Close(const Napi::CallbackInfo &info) {
  return close_wrapper(info.Env(), &box);
}

void init_store(Napi::Env env, Napi::Object exports) {
  Addon *a = addon_of(env);
  Napi::Function s = Store::Define(env), v = Server::Define(env);
  a->store_ctor = Napi::Persistent(s);
  a->server_ctor = Napi::Persistent(v);
  exports.Set("CoreStore", s);
  exports.Set("CoreServer", v);
}

} // namespace uvccl_node
