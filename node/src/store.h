// The store client and server wrappers (store.cc).
#ifndef UVCCL_NODE_STORE_H
#define UVCCL_NODE_STORE_H

#include "addon.h"

namespace uvccl_node {

// uvccl's store or server, beside what Box keeps (addon.h).
struct StoreBox : Box {
  uvccl_store_t store{};
  std::string host;
  explicit StoreBox(Napi::Env e) : Box(e) { store.data = static_cast<Box *>(this); }
  void Close() override;
  void Orphan() override;
};

struct ServerBox : Box {
  uvccl_store_server_t server{};
  explicit ServerBox(Napi::Env e) : Box(e) { server.data = static_cast<Box *>(this); }
  void Close() override;
  void Orphan() override;
};

class Store : public Napi::ObjectWrap<Store> {
public:
  static Napi::Function Define(Napi::Env env);
  explicit Store(const Napi::CallbackInfo &info);
  ~Store() override;
  StoreBox *box = nullptr;
  uvccl_store_t *Open(Napi::Env env, const char *opname);

private:
  Napi::Value Connect(const Napi::CallbackInfo &info);
  Napi::Value Set(const Napi::CallbackInfo &info);
  Napi::Value KeyOp(const Napi::CallbackInfo &info);
  Napi::Value NumKeys(const Napi::CallbackInfo &info);
  Napi::Value CompareSet(const Napi::CallbackInfo &info);
  Napi::Value KeysOp(const Napi::CallbackInfo &info);
  Napi::Value MultiGet(const Napi::CallbackInfo &info);
  Napi::Value MultiSet(const Napi::CallbackInfo &info);
  Napi::Value ListKeys(const Napi::CallbackInfo &info);
  Napi::Value SetTimeout(const Napi::CallbackInfo &info);
  Napi::Value Close(const Napi::CallbackInfo &info);
};

class Server : public Napi::ObjectWrap<Server> {
public:
  static Napi::Function Define(Napi::Env env);
  explicit Server(const Napi::CallbackInfo &info);
  ~Server() override;
  ServerBox *box = nullptr;

private:
  Napi::Value GetPort(const Napi::CallbackInfo &info);
  Napi::Value Close(const Napi::CallbackInfo &info);
};

} // namespace uvccl_node

#endif
