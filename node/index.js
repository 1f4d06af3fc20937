'use strict';
// uvccl for Node.js: collectives that complete on Node's own event loop.
//
// The addon runs uvccl on the loop Node itself runs (napi_get_uv_event_loop):
// no thread of its own, no polling; every operation is a Promise settled by
// a uvccl callback on the thread that runs JavaScript, and the loop stays
// free while collectives move data (uvccl bounds the work of each callback).
//
//   const pg = await uvccl.initProcessGroup('env://');
//   await pg.allreduce(float32Array);          // in place, sum
//
// Buffers are TypedArrays (Float32Array, Float64Array, Int32Array,
// BigInt64Array, Int8Array, Uint8Array), Buffers, DataViews or ArrayBuffers;
// the dtype comes from the array's type, or from {dtype} where the type
// cannot say (a Uint16Array of 'bfloat16' or 'float16'). A buffer is kept
// alive until its operation completes; do not transfer or resize it then.
// Timeouts are in milliseconds.

const path = require('path');
const v8 = require('v8');

function loadCore() {
  const tried = [];
  for (const dir of ['Release', 'Debug']) {
    const p = path.join(__dirname, 'build', dir, 'uvccl.node');
    try {
      return require(p);
    } catch (e) {
      if (e.code !== 'MODULE_NOT_FOUND') throw e;
      tried.push(p);
    }
  }
  throw new Error('uvccl: the addon is not built (tried ' + tried.join(', ') +
                  '); run `make` in the uvccl checkout or `npm install ./node`');
}

const core = loadCore();
const codes = core.codes;

// ---- errors ------------------------------------------------------------------

// A uvccl error: errno (negative), code ('UVCCL_EPEER', ...), message
// (uvccl's, naming the peer, key or op) and, where a rank failed, failure
// ({cause, rank, globalRank, address, reporter, failedRanks, hostLost}) with
// rank the group rank that failed first.
class UvcclError extends Error {
  constructor(errno, message, failure) {
    super(message);
    this.errno = errno;
    this.code = core.strerror(errno)[0];
    this.failure = failure || null;
    this.rank = failure ? failure.rank : null;
    this.globalRank = failure ? failure.globalRank : null;
  }
}
// A rank of the group failed (died, stopped, cut off, aborted).
class PeerError extends UvcclError {}
// The group was revoked (revoke(), here or on another rank).
class RevokedError extends UvcclError {}
// This rank aborted the group (abort()).
class AbortedError extends UvcclError {}
// The operation ran past its timeout.
class TimeoutError extends UvcclError {}
// The operation was cancelled (its group or store was closed).
class CancelledError extends UvcclError {}
// The ranks called mismatched collectives (the fingerprint check).
class MismatchError extends UvcclError {}
// uvccl refused the arguments (a root out of range, sizes, ...).
class InvalidArgumentError extends UvcclError {}

for (const C of [UvcclError, PeerError, RevokedError, AbortedError, TimeoutError,
                 CancelledError, MismatchError, InvalidArgumentError])
  Object.defineProperty(C.prototype, 'name', { value: C.name });

const CLASSES = new Map([
  [codes.EPEER, PeerError],
  [codes.EREVOKED, RevokedError],
  [codes.EABORTED, AbortedError],
  [codes.ETIMEDOUT, TimeoutError],
  [codes.ECANCELED, CancelledError],
  [codes.EMISMATCH, MismatchError],
  [codes.EINVAL, InvalidArgumentError],
]);

core.setErrorFactory((errno, message, failure) =>
  new (CLASSES.get(errno) || UvcclError)(errno, message, failure));

// ---- process groups --------------------------------------------------------------

const NONE = Object.freeze({});
// Options: an object, or for brevity the reduce op's name.
const opts = (o) => (o === undefined || o === null ? NONE
                     : typeof o === 'string' ? { op: o } : o);

class ProcessGroup {
  constructor(g) { this._g = g; }

  get rank() { return this._g.rank; }
  get size() { return this._g.size; }

  // Collectives. Each returns a Promise of its output buffer.
  allreduce(buf, o) { o = opts(o); return this._g.allreduce(buf, null, 0, o.op, o.dtype, o.timeout); }
  broadcast(buf, o) { o = opts(o); return this._g.broadcast(buf, null, o.src || 0, null, o.dtype, o.timeout); }
  reduce(buf, o) { o = opts(o); return this._g.reduce(buf, null, o.dst || 0, o.op, o.dtype, o.timeout); }
  allgather(output, input, o) { o = opts(o); return this._g.allgather(output, input, 0, null, o.dtype, o.timeout); }
  reduceScatter(output, input, o) { o = opts(o); return this._g.reduceScatter(output, input, 0, o.op, o.dtype, o.timeout); }
  alltoall(output, input, o) { o = opts(o); return this._g.alltoall(output, input, 0, null, o.dtype, o.timeout); }
  // gather(input, output) -> the output at dst, null elsewhere
  gather(input, output, o) { o = opts(o); return this._g.gather(output, input, o.dst || 0, null, o.dtype, o.timeout); }
  // scatter(output, input) -> the output; the input is dst's only
  scatter(output, input, o) { o = opts(o); return this._g.scatter(output, input, o.src || 0, null, o.dtype, o.timeout); }
  allreduceCoalesced(bufs, o) { o = opts(o); return this._g.allreduceCoalesced(bufs, o.op, o.dtype, o.timeout); }
  // outputs[i] receives rank i's input, whatever its length
  allgatherv(outputs, input, o) { o = opts(o); return this._g.allgatherv(outputs, input, o.dtype, o.timeout); }
  reduceScatterv(output, input, counts, o) { o = opts(o); return this._g.reduceScatterv(output, input, counts, o.op, o.dtype, o.timeout); }
  alltoallv(output, input, sendCounts, recvCounts, o) {
    o = opts(o);
    return this._g.alltoallv(output, input, sendCounts, recvCounts, o.dtype, o.timeout);
  }
  barrier(o) { o = opts(o); return this._g.barrier(o.timeout); }
  // Reports every rank that did not arrive (waitAll) or the first.
  monitoredBarrier(o) { o = opts(o); return this._g.monitoredBarrier(!!o.waitAll, o.timeout); }

  // Byte payloads of any length (the ranks' may differ): broadcastBytes
  // resolves to src's bytes (a Buffer) everywhere, allgatherBytes to every
  // rank's, gatherBytes to every rank's at dst (null elsewhere),
  // scatterBytes to this rank's of src's list.
  broadcastBytes(buf, o) { o = opts(o); return this._g.broadcastBytes(buf, o.src || 0, o.timeout); }
  allgatherBytes(buf, o) { o = opts(o); return this._g.allgatherBytes(buf, 0, o.timeout); }
  gatherBytes(buf, o) { o = opts(o); return this._g.gatherBytes(buf, o.dst || 0, o.timeout); }
  scatterBytes(bufs, o) { o = opts(o); return this._g.scatterBytes(bufs, o.src || 0, o.timeout); }

  // c10d's object collectives, on any value the structured clone algorithm
  // takes (v8.serialize: objects, arrays, TypedArrays, Maps, ...).
  async broadcastObject(obj, o) {
    o = opts(o);
    const src = o.src || 0;
    return v8.deserialize(await this.broadcastBytes(this.rank === src ? v8.serialize(obj) : null, o));
  }
  async allGatherObject(obj, o) {
    return (await this.allgatherBytes(v8.serialize(obj), o)).map((b) => v8.deserialize(b));
  }
  async gatherObject(obj, o) {
    const all = await this.gatherBytes(v8.serialize(obj), o);
    return all === null ? null : all.map((b) => v8.deserialize(b));
  }
  async scatterObject(objs, o) {
    o = opts(o);
    const src = o.src || 0;
    const bufs = this.rank === src ? objs.map((x) => v8.serialize(x)) : null;
    return v8.deserialize(await this.scatterBytes(bufs, o));
  }

  // c10d's batch_isend_irecv: [{op: 'send' | 'recv', buf, peer, tag}], all
  // started at once; resolves to one entry an op: null for a send,
  // {source, length} for a receive.
  batchIsendIrecv(ops, o) {
    o = opts(o);
    if (!Array.isArray(ops))
      return Promise.reject(new TypeError('batchIsendIrecv: an array of {op, buf, peer, tag}'));
    const list = [];
    for (const p of ops) {
      const kind = p && p.op;
      if (!['send', 'isend', 'recv', 'irecv'].includes(kind))
        return Promise.reject(new TypeError(`batchIsendIrecv: op must be 'send' or 'recv', not ${kind}`));
      list.push([kind === 'send' || kind === 'isend', p.buf, p.peer, p.tag || 0]);
    }
    return this._g.p2pBatch(list, o.timeout);
  }

  // A reduce op of this group: the sum of each rank's input times factor
  // (c10d's premul_sum); use as {op: pg.premulSum(0.5)}.
  premulSum(factor) { return this._g.premulSum(factor); }

  // Point-to-point: recv resolves to {source, length}; src -1 takes any.
  send(buf, dst, o) { o = opts(o); return this._g.send(buf, dst, o.tag || 0, o.timeout); }
  recv(buf, o) {
    o = typeof o === 'number' ? { src: o } : opts(o);
    return this._g.recv(buf, o.src === undefined ? -1 : o.src, o.tag || 0, o.timeout);
  }

  // c10d's split: the ranks of one color form a group, ordered by key
  // (default: this rank). Collective; null where color < 0.
  async split(color, o) {
    o = opts(o);
    const g = await this._g.split(color, o.key === undefined ? this.rank : o.key);
    return g === null ? null : new ProcessGroup(g);
  }
  // A subgroup of these ranks, made locally (every rank of this group calls
  // it, in the same order); null where this rank is not in it.
  newGroup(ranks, o) {
    o = opts(o);
    const g = this._g.newGroup(ranks, o.tag);
    return g === null ? null : new ProcessGroup(g);
  }
  // The group of the survivors, without the ranks that failed (or those
  // excluded). Collective over the survivors.
  async shrink(o) {
    o = opts(o);
    return new ProcessGroup(await this._g.shrink(o.exclude || []));
  }
  // Fails every operation of the group, here and on every rank, with
  // RevokedError carrying the reason.
  revoke(reason) { this._g.revoke(reason); }
  // Gives up this rank's membership at once: pending operations fail
  // here with AbortedError, the other ranks hear of it as this rank's failure.
  abort(reason) { this._g.abort(reason); }
  failure() { return this._g.failure(); }
  globalRank(groupRank) { return this._g.globalRank(groupRank); }
  peerTransport(groupRank) { return this._g.peerTransport(groupRank); }
  setTimeout(ms) { this._g.setTimeout(ms); }
  // Closes the group's connections (its pending operations are cancelled).
  destroy() { return this._g.destroy(); }
}
ProcessGroup.prototype.allReduce = ProcessGroup.prototype.allreduce;
ProcessGroup.prototype.allGather = ProcessGroup.prototype.allgather;
ProcessGroup.prototype.allToAll = ProcessGroup.prototype.alltoall;
if (Symbol.asyncDispose)
  ProcessGroup.prototype[Symbol.asyncDispose] = ProcessGroup.prototype.destroy;

// The world group, from a URL ('env://': RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, as torchrun sets them; 'tcp://HOST:PORT' and 'file:///PATH'
// with {rank, worldSize}) or a store ({store, rank, worldSize}). turnUs and turnBytes bound each
// uvccl callback on the loop (default: uvccl's, or $UVCCL_TURN_US and
// $UVCCL_TURN_BYTES).
async function initProcessGroup(initMethod, o) {
  if (typeof initMethod === 'object' && initMethod !== null && o === undefined) {
    o = initMethod;
    initMethod = undefined;
  }
  o = opts(o);
  let store = null;
  if (o.store !== undefined) {
    if (!(o.store instanceof Store))
      throw new TypeError('initProcessGroup: store must be a uvccl store');
    if (!(o.rank >= 0) || !(o.worldSize > 0))
      throw new TypeError('initProcessGroup: a store needs rank and worldSize');
    store = o.store._s;
    initMethod = null;
  } else if (initMethod === undefined) {
    initMethod = 'env://';
  }
  const rank = o.rank === undefined ? -1 : o.rank;
  const size = o.worldSize === undefined ? -1 : o.worldSize;
  const g = await core.initGroup(initMethod, store, rank, size, o.timeout,
                                 o.prefix, o.turnBytes, o.turnUs);
  return new ProcessGroup(g);
}

// The flight recorder's dump (docs/trace-format.md): the last operations of
// every group on this thread's loop, pending ones with the peers they wait
// for.
function flightRecorder(reason) {
  return JSON.parse(core.traceJson(reason));
}

// ---- stores ----------------------------------------------------------------------

class Store {
  constructor(s) { this._s = s; }
  set(key, value) { return this._s.set(key, value); }
  // Waits (up to the store's timeout) for the key; its value, a Buffer.
  get(key) { return this._s.get(key); }
  add(key, amount) { return this._s.add(key, amount === undefined ? 1 : amount); }
  // Sets desired where the value is expected (or absent and expected is
  // empty); the value after, a Buffer.
  compareSet(key, expected, desired) { return this._s.compareSet(key, expected, desired); }
  wait(keys, o) { o = opts(o); return this._s.wait(keys, o.timeout); }
  check(keys) { return this._s.check(keys); }
  deleteKey(key) { return this._s.deleteKey(key); }
  numKeys() { return this._s.numKeys(); }
  append(key, value) { return this._s.append(key, value); }
  // Waits for every key; their values, Buffers, in order.
  multiGet(keys) { return this._s.multiGet(keys); }
  multiSet(keys, values) { return this._s.multiSet(keys, values); }
  listKeys() { return this._s.listKeys(); }
  // Queues (the newer TCPStore dialect, and in-process stores). queuePop
  // with {block: true} waits (up to the store's timeout) for an item, else
  // fails at once where the queue is empty.
  queuePush(key, value) { return this._s.queuePush(key, value); }
  queuePop(key, o) { o = opts(o); return this._s.queuePop(key, !!o.block); }
  queueLen(key) { return this._s.queueLen(key); }
  setTimeout(ms) { this._s.setTimeout(ms); }
  close() { return this._s.close(); }
}
if (Symbol.asyncDispose) Store.prototype[Symbol.asyncDispose] = Store.prototype.close;

// A client of a TCPStore server (uvccl's or PyTorch's).
class TCPStore extends Store {
  static async connect(host, port, o) {
    o = opts(o);
    const s = new TCPStore(new core.CoreStore('tcp', host, port, o.timeout, o.worldSize));
    try {
      await s._s.connect();
    } catch (e) {
      await s.close();
      throw e;
    }
    return s;
  }
}

// A store in this process (for worlds of threads, and tests).
class HashStore extends Store {
  constructor() { super(new core.CoreStore('hash')); }
}

// A TCPStore server on this loop, serving once constructed; port 0 picks one.
class StoreServer {
  constructor(o) {
    o = opts(o);
    this._v = new core.CoreServer(o.host === undefined ? null : o.host, o.port || 0);
  }
  get port() { return this._v.port; }
  close() { return this._v.close(); }
}
if (Symbol.asyncDispose) StoreServer.prototype[Symbol.asyncDispose] = StoreServer.prototype.close;

module.exports = {
  initProcessGroup, ProcessGroup, flightRecorder,
  Store, TCPStore, HashStore, StoreServer,
  UvcclError, PeerError, RevokedError, AbortedError, TimeoutError,
  CancelledError, MismatchError, InvalidArgumentError,
  version: core.version,
  // The libuv this addon runs on: Node's own (the addon links no other).
  uvVersion: core.uvVersion,
};
