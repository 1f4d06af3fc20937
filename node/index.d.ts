// TypeScript declarations of uvccl for Node.js (index.js).

/** A buffer uvccl reads or writes in place; kept alive until completion. */
export type Buf = ArrayBufferView | ArrayBuffer;
/** A name, or a group's op from premulSum(factor). */
export type ReduceOp = 'sum' | 'avg' | 'product' | 'min' | 'max' | 'band' | 'bor' | 'bxor' | number;
/** Overrides the dtype the array's type gives (e.g. 'bfloat16' on a Uint16Array). */
export type DType =
  | 'int8' | 'uint8' | 'bool' | 'int32' | 'int64' | 'float16' | 'bfloat16'
  | 'float32' | 'float64' | 'complex64' | 'complex128' | 'float8_e4m3' | 'float8_e5m2';

export interface CommonOptions {
  dtype?: DType;
  /** milliseconds; 0 or absent: the group's */
  timeout?: number;
}
export interface ReduceOptions extends CommonOptions { op?: ReduceOp; }

export interface Failure {
  cause: string;
  rank: number;
  globalRank: number;
  reporter: number;
  err: number;
  address: string;
  message: string;
  hostLost: boolean;
  failedRanks: number[];
}

export class UvcclError extends Error {
  /** negative: uvccl's, libuv's or -errno */
  errno: number;
  /** 'UVCCL_EPEER', 'ETIMEDOUT', ... */
  code: string;
  failure: Failure | null;
  /** the group rank that failed first, where one did */
  rank: number | null;
  globalRank: number | null;
}
export class PeerError extends UvcclError {}
export class RevokedError extends UvcclError {}
export class AbortedError extends UvcclError {}
export class TimeoutError extends UvcclError {}
export class CancelledError extends UvcclError {}
export class MismatchError extends UvcclError {}
export class InvalidArgumentError extends UvcclError {}

export class ProcessGroup {
  readonly rank: number;
  readonly size: number;
  allreduce<T extends Buf>(buf: T, opts?: ReduceOptions | ReduceOp): Promise<T>;
  allReduce<T extends Buf>(buf: T, opts?: ReduceOptions | ReduceOp): Promise<T>;
  broadcast<T extends Buf>(buf: T, opts?: CommonOptions & { src?: number }): Promise<T>;
  reduce<T extends Buf>(buf: T, opts?: ReduceOptions & { dst?: number }): Promise<T>;
  allgather<T extends Buf>(output: T, input: Buf, opts?: CommonOptions): Promise<T>;
  allGather<T extends Buf>(output: T, input: Buf, opts?: CommonOptions): Promise<T>;
  reduceScatter<T extends Buf>(output: T, input: Buf, opts?: ReduceOptions | ReduceOp): Promise<T>;
  alltoall<T extends Buf>(output: T, input: Buf, opts?: CommonOptions): Promise<T>;
  allToAll<T extends Buf>(output: T, input: Buf, opts?: CommonOptions): Promise<T>;
  gather<T extends Buf>(input: Buf, output: T | null, opts?: CommonOptions & { dst?: number }): Promise<T | null>;
  scatter<T extends Buf>(output: T, input: Buf | null, opts?: CommonOptions & { src?: number }): Promise<T>;
  allreduceCoalesced<T extends Buf[]>(bufs: T, opts?: ReduceOptions | ReduceOp): Promise<T>;
  allgatherv<T extends Buf[]>(outputs: T, input: Buf, opts?: CommonOptions): Promise<T>;
  reduceScatterv<T extends Buf>(output: T, input: Buf, counts: number[], opts?: ReduceOptions | ReduceOp): Promise<T>;
  alltoallv<T extends Buf>(output: T, input: Buf, sendCounts: number[], recvCounts: number[], opts?: CommonOptions): Promise<T>;
  broadcastBytes(buf: Buf | null, opts?: { src?: number; timeout?: number }): Promise<Buffer>;
  allgatherBytes(buf: Buf, opts?: { timeout?: number }): Promise<Buffer[]>;
  gatherBytes(buf: Buf, opts?: { dst?: number; timeout?: number }): Promise<Buffer[] | null>;
  scatterBytes(bufs: Buf[] | null, opts?: { src?: number; timeout?: number }): Promise<Buffer>;
  broadcastObject<T = unknown>(obj: T, opts?: { src?: number; timeout?: number }): Promise<T>;
  allGatherObject<T = unknown>(obj: T, opts?: { timeout?: number }): Promise<T[]>;
  gatherObject<T = unknown>(obj: T, opts?: { dst?: number; timeout?: number }): Promise<T[] | null>;
  scatterObject<T = unknown>(objs: T[] | null, opts?: { src?: number; timeout?: number }): Promise<T>;
  batchIsendIrecv(ops: Array<{ op: 'send' | 'isend' | 'recv' | 'irecv'; buf: Buf; peer: number; tag?: number }>,
                  opts?: { timeout?: number }): Promise<Array<{ source: number; length: number } | null>>;
  premulSum(factor: number): number;
  barrier(opts?: { timeout?: number }): Promise<void>;
  monitoredBarrier(opts?: { waitAll?: boolean; timeout?: number }): Promise<void>;
  send(buf: Buf, dst: number, opts?: { tag?: number; timeout?: number }): Promise<void>;
  recv(buf: Buf, opts?: number | { src?: number; tag?: number; timeout?: number }): Promise<{ source: number; length: number }>;
  split(color: number, opts?: { key?: number }): Promise<ProcessGroup | null>;
  newGroup(ranks: number[], opts?: { tag?: string }): ProcessGroup | null;
  shrink(opts?: { exclude?: number[] }): Promise<ProcessGroup>;
  revoke(reason?: string): void;
  abort(reason?: string): void;
  failure(): Failure | null;
  globalRank(groupRank: number): number;
  peerTransport(groupRank: number): string;
  setTimeout(ms: number): void;
  destroy(): Promise<void>;
}

export interface InitOptions {
  rank?: number;
  worldSize?: number;
  store?: Store;
  /** milliseconds */
  timeout?: number;
  prefix?: string;
  turnUs?: number;
  turnBytes?: number;
}
export function initProcessGroup(initMethod?: string, opts?: InitOptions): Promise<ProcessGroup>;
export function initProcessGroup(opts: InitOptions): Promise<ProcessGroup>;

export function flightRecorder(reason?: string): Record<string, unknown>;

type Bytes = string | ArrayBufferView | ArrayBuffer;
export class Store {
  set(key: string, value: Bytes): Promise<void>;
  get(key: string): Promise<Buffer>;
  add(key: string, amount?: number): Promise<number>;
  compareSet(key: string, expected: Bytes, desired: Bytes): Promise<Buffer>;
  wait(keys: string[], opts?: { timeout?: number }): Promise<void>;
  check(keys: string[]): Promise<boolean>;
  deleteKey(key: string): Promise<boolean>;
  numKeys(): Promise<number>;
  append(key: string, value: Bytes): Promise<void>;
  multiGet(keys: string[]): Promise<Buffer[]>;
  multiSet(keys: string[], values: Bytes[]): Promise<void>;
  listKeys(): Promise<string[]>;
  queuePush(key: string, value: Bytes): Promise<void>;
  queuePop(key: string, opts?: { block?: boolean }): Promise<Buffer>;
  queueLen(key: string): Promise<number>;
  setTimeout(ms: number): void;
  close(): Promise<void>;
}
export class TCPStore extends Store {
  static connect(host: string, port: number, opts?: { timeout?: number; worldSize?: number }): Promise<TCPStore>;
}
export class HashStore extends Store {
  constructor();
}
export class StoreServer {
  constructor(opts?: { host?: string; port?: number });
  readonly port: number;
  close(): Promise<void>;
}

export const version: string;
/** The libuv the addon runs on: Node's own. */
export const uvVersion: string;
