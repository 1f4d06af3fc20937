// The addon's entry: per-environment state on Node's own loop, group
// creation, the flight recorder, error codes.
#include <dlfcn.h>

#include "addon.h"
#include "group.h"
#include "store.h"

namespace uvccl_node {

static Napi::Value SetErrorFactory(const Napi::CallbackInfo &info) {
  if (!info[0].IsFunction())
    throw Napi::TypeError::New(info.Env(), "setErrorFactory: a function");
  addon_of(info.Env())->error_factory = Napi::Persistent(info[0].As<Napi::Function>());
  return info.Env().Undefined();
}

// strerror(code) -> [name, message]
static Napi::Value StrError(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  int code = info[0].IsNumber() ? info[0].As<Napi::Number>().Int32Value() : 0;
  Napi::Array a = Napi::Array::New(env, 2);
  a.Set(0u, uvccl_err_name(code));
  a.Set(1u, uvccl_strerror(code));
  return a;
}

static Napi::Value DtypeSize(const Napi::CallbackInfo &info) {
  uvccl_dtype_t dt;
  std::string name = str_or(info[0], "");
  if (uvccl_dtype_from_name(name.c_str(), &dt) < 0)
    throw Napi::RangeError::New(info.Env(), "unknown dtype '" + name + "'");
  return Napi::Number::New(info.Env(), static_cast<double>(uvccl_dtype_size(dt)));
}

// initGroup(url or null, store or null, rank, size, timeoutMs, prefix,
//           turnBytes, turnUs) -> Promise of a CoreGroup
static Napi::Value InitGroup(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  Addon *a = addon_of(env);
  Op *op = nullptr;
  try {
    std::string url = str_or(info[0], "");
    Store *store = nullptr;
    if (info[1].IsObject() && info[1].As<Napi::Object>().InstanceOf(a->store_ctor.Value()))
      store = Store::Unwrap(info[1].As<Napi::Object>());
    else if (!info[1].IsNull() && !info[1].IsUndefined())
      throw Napi::TypeError::New(env, "initProcessGroup: store must be a uvccl store");
    if (url.empty() && store == nullptr)
      throw Napi::TypeError::New(env, "initProcessGroup: give a URL or a store");
    uvccl_store_t *st = store ? store->Open(env, "initProcessGroup") : nullptr;
    uvccl_pg_options_t o{};
    o.rank = info[2].IsNumber() ? info[2].As<Napi::Number>().Int32Value() : -1;
    o.size = info[3].IsNumber() ? info[3].As<Napi::Number>().Int32Value() : -1;
    o.timeout_ms = timeout_of(info[4]);
    std::string prefix = str_or(info[5], "");
    double tb = info[6].IsNumber() ? info[6].As<Napi::Number>().DoubleValue() : 0;
    double tu = info[7].IsNumber() ? info[7].As<Napi::Number>().DoubleValue() : 0;
    if (tb < 0 || tu < 0)
      throw Napi::RangeError::New(env, "initProcessGroup: turnBytes and turnUs "
                                       "must not be negative");
    o.turn_bytes = static_cast<size_t>(tb);
    o.turn_us = static_cast<unsigned>(tu);
    Group *g;
    Napi::Object made = Group::Make(env, &g);
    op = new Op(env, store ? info[1].As<Napi::Object>() : Napi::Object(), RES_GROUP);
    op->made = Napi::Persistent(made);
    op->made_group = g;
    // the options' strings are read during the call
    o.prefix = prefix.empty() ? nullptr : prefix.c_str();
    Op *started_op = op;
    op = nullptr;
    int rc = store ? uvccl_pg_init(a->loop, &g->box->pg, st, &o, &started_op->work, op_done)
                   : uvccl_pg_init_url(a->loop, &g->box->pg, url.c_str(), &o,
                                       &started_op->work, op_done);
    return started(started_op, rc, "initProcessGroup");
  } catch (const Napi::Error &e) {
    return rejected(op, e);
  }
}

// traceJson(reason) -> the flight recorder's dump of this loop's groups
static Napi::Value TraceJson(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  std::string reason = str_or(info[0], "");
  char *json = nullptr;
  size_t len = 0;
  int rc = uvccl_trace_json(addon_of(env)->loop, reason.empty() ? nullptr : reason.c_str(),
                            &json, &len);
  if (rc < 0) throw_status(env, rc, "traceJson", nullptr, nullptr);
  Napi::String s = Napi::String::New(env, json, len);
  free(json);
  return s;
}

// Node unloads an addon with the worker thread that loaded it, while the
// thread's loop may still run close callbacks of uvccl's: the addon stays
// loaded to the end of the process instead.
static void stay_loaded() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void *>(&stay_loaded), &info) != 0 && info.dli_fname != nullptr)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

// The environment is being torn down (a worker thread ends): every group,
// store and server still open closes (a group aborts first: this rank is
// leaving), and the teardown waits for their close callbacks. Nothing
// calls into JavaScript from here on.
static void teardown(napi_async_cleanup_hook_handle hook, void *arg) {
  Addon *a = static_cast<Addon *>(arg);
  std::vector<Box *> live;
  a->gone = true;
  a->hook = hook;
  for (Box *b : a->boxes)
    if (b->live) live.push_back(b);
  a->hook_closing = static_cast<int>(live.size());
  if (live.empty()) {
    napi_remove_async_cleanup_hook(hook);
    a->hook = nullptr;
    a->unref();
    return;
  }
  for (Box *b : live) {
    if (!b->closing) b->Leave();
    close_box(b);
  }
}

// The instance data's end: the environment's own reference goes (the
// addon lives on while uvccl holds boxes or operations of it).
static void addon_finalize(Napi::Env env, Addon *a) {
  a->gone = true;
  a->error_factory.Reset();
  a->group_ctor.Reset();
  a->store_ctor.Reset();
  a->server_ctor.Reset();
  a->context.reset();
  a->unref();
}

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  stay_loaded();
  Addon *a = new Addon();
  env.SetInstanceData<Addon, addon_finalize>(a);
  a->ref(); // the cleanup hook's
  if (napi_add_async_cleanup_hook(env, teardown, a, nullptr) != napi_ok) a->unref();
  if (napi_get_uv_event_loop(env, &a->loop) != napi_ok || a->loop == nullptr)
    throw Napi::Error::New(env, "uvccl: no uv loop in this environment");
  a->context.reset(new Napi::AsyncContext(env, "uvccl"));
  exports.Set("setErrorFactory", Napi::Function::New(env, SetErrorFactory));
  exports.Set("strerror", Napi::Function::New(env, StrError));
  exports.Set("dtypeSize", Napi::Function::New(env, DtypeSize));
  exports.Set("initGroup", Napi::Function::New(env, InitGroup));
  exports.Set("traceJson", Napi::Function::New(env, TraceJson));
  exports.Set("version", uvccl_version_string());
  exports.Set("uvVersion", uv_version_string());
  Napi::Object codes = Napi::Object::New(env);
#define ERR(name, code, msg) codes.Set(#name, static_cast<int>(UVCCL_##name));
  UVCCL_ERRNO_MAP(ERR)
#undef ERR
  codes.Set("ETIMEDOUT", static_cast<int>(UV_ETIMEDOUT));
  codes.Set("ECANCELED", static_cast<int>(UV_ECANCELED));
  codes.Set("EINVAL", static_cast<int>(UV_EINVAL));
  exports.Set("codes", codes);
  init_group(env, exports);
  init_store(env, exports);
  return exports;
}

} // namespace uvccl_node

static Napi::Object InitAddon(Napi::Env env, Napi::Object exports) {
  return uvccl_node::Init(env, exports);
}

NODE_API_MODULE(uvccl, InitAddon)
