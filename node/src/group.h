// The ProcessGroup wrapper (group.cc).
#ifndef UVCCL_NODE_GROUP_H
#define UVCCL_NODE_GROUP_H

#include "addon.h"

namespace uvccl_node {

class Group;

// The group's memory outlives the JS object until uvccl_pg_destroy's
// callback; the Promise of destroy(), if any, settles there.
struct PgBox : Box {
  uvccl_pg_t pg{};
  explicit PgBox(Napi::Env e) : Box(e) { pg.data = static_cast<Box *>(this); }
  void Close() override;
  void Orphan() override;
  void Leave() override;
};

class Group : public Napi::ObjectWrap<Group> {
public:
  enum State { CREATING, READY, GONE };
  static Napi::Function Define(Napi::Env env);
  // A new wrapper (state CREATING) for a group about to be made.
  static Napi::Object Make(Napi::Env env, Group **out);

  explicit Group(const Napi::CallbackInfo &info);
  ~Group() override;

  Addon *addon;
  PgBox *box = nullptr;
  State state = CREATING;
  int pending = 0; // operations in flight: the wrapper is held while > 0

  // Keeps the wrapper (and so the group) alive while operations are in
  // flight: one reference toggled, rather than one created a call.
  void Hold() {
    if (pending++ == 0) Ref();
  }
  void Release() {
    if (--pending == 0) Unref();
  }

  // The group of a finished creation: ready, or gone (destroyed here).
  void Created(int status);
  uvccl_pg_t *Ready(Napi::Env env, const char *opname);
  const uvccl_pg_t *pg() const { return state == READY ? &box->pg : nullptr; }

private:
  Napi::Value Coll(const Napi::CallbackInfo &info);
  Napi::Value AllreduceCoalesced(const Napi::CallbackInfo &info);
  Napi::Value Allgatherv(const Napi::CallbackInfo &info);
  Napi::Value ReduceScatterv(const Napi::CallbackInfo &info);
  Napi::Value Alltoallv(const Napi::CallbackInfo &info);
  Napi::Value Barrier(const Napi::CallbackInfo &info);
  Napi::Value P2pBatch(const Napi::CallbackInfo &info);
  Napi::Value BytesColl(const Napi::CallbackInfo &info);
  Napi::Value PremulSum(const Napi::CallbackInfo &info);
  Napi::Value MonitoredBarrier(const Napi::CallbackInfo &info);
  Napi::Value Send(const Napi::CallbackInfo &info);
  Napi::Value Recv(const Napi::CallbackInfo &info);
  Napi::Value Split(const Napi::CallbackInfo &info);
  Napi::Value Shrink(const Napi::CallbackInfo &info);
  Napi::Value NewGroup(const Napi::CallbackInfo &info);
  Napi::Value Revoke(const Napi::CallbackInfo &info);
  Napi::Value Abort(const Napi::CallbackInfo &info);
  Napi::Value Destroy(const Napi::CallbackInfo &info);
  Napi::Value Failure(const Napi::CallbackInfo &info);
  Napi::Value GlobalRank(const Napi::CallbackInfo &info);
  Napi::Value PeerTransport(const Napi::CallbackInfo &info);
  Napi::Value SetTimeout(const Napi::CallbackInfo &info);
  Napi::Value GetRank(const Napi::CallbackInfo &info);
  Napi::Value GetSize(const Napi::CallbackInfo &info);
};

} // namespace uvccl_node

#endif
